package store

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// RunFlags reads a run's flags from its outcome when the outcome is of the
// run as it stands, without walking the thread's checkpoints (here the
// checkpoint that set the flag is gone, so a walk could not find it), and
// from its checkpoints for a run that has left no outcome yet.
func TestRunFlagsFromTheOutcomeOrTheCheckpoints(t *testing.T) {
	d := openTest(t)
	flags := engine.ChannelValue{Channel: FlagsChannel, Version: 1, Value: engine.Value{Inline: []byte(`["acute"]`)}}
	other := engine.ChannelValue{Channel: "draft", Version: 1, Value: engine.Value{Inline: []byte(`"x"`)}}
	chain := func(thread string) []*engine.Checkpoint {
		var cps []*engine.Checkpoint
		for i, cv := range []engine.ChannelValue{flags, other, other} {
			cp := &engine.Checkpoint{Thread: thread, ID: fmt.Sprintf("%04d", i+1), Step: i, Created: tc0, Channels: []engine.ChannelValue{cv}}
			if i > 0 {
				cp.ParentID = cps[i-1].ID
			}
			cps = append(cps, cp)
		}
		return cps
	}
	ended, going := chain("t-ended"), chain("t-going")
	endedRun := &engine.Run{ID: "r-ended", Thread: "t-ended", Status: engine.StatusCompleted, Checkpoint: ended[2].ID, CreatedAt: tc0}
	goingRun := &engine.Run{ID: "r-going", Thread: "t-going", Status: engine.StatusRunning, Checkpoint: going[2].ID, CreatedAt: tc0}
	require.NoError(t, d.Commit(bg, &engine.Commit{Earlier: ended[:2], Checkpoint: ended[2], Run: endedRun}))
	require.NoError(t, d.Commit(bg, &engine.Commit{Earlier: going[:2], Checkpoint: going[2], Run: goingRun}))

	got, err := d.RunFlags(bg, []*engine.Run{endedRun, goingRun})
	require.NoError(t, err)
	assert.Equal(t, map[string][]string{"r-ended": {"acute"}, "r-going": {"acute"}}, got)

	// The checkpoint that set the flag, gone from the ended run's thread.
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return openCheckpoints(tx).Delete(checkpointKey("t-ended", "", ended[0].ID))
	}))
	got, err = d.RunFlags(bg, []*engine.Run{endedRun})
	require.NoError(t, err)
	assert.Equal(t, []string{"acute"}, got["r-ended"], "the outcome's flags")
}

// A run still going, on a thread whose earlier turn left many checkpoints,
// has its flags read from its own checkpoints and the earlier turn's
// outcome, not from a walk up the whole thread: the reads are counted
// (each bucket lookup opens a bbolt cursor), for an agent that never
// writes the flags channel and for one whose earlier turn raised a flag.
func TestRunFlagsOfARunGoingStopsAtTheTurnBefore(t *testing.T) {
	const earlierSteps, ownSteps = 60, 3
	for _, tc := range []struct {
		name    string
		earlier []byte // the flags the earlier turn's first step writes; nil: none
		want    []string
	}{
		{"no flags channel", nil, nil},
		{"a flag raised the turn before", []byte(`["acute"]`), []string{"acute"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := openTest(t)
			other := engine.ChannelValue{Channel: "draft", Version: 1, Value: engine.Value{Inline: []byte(`"x"`)}}
			var cps []*engine.Checkpoint
			add := func(run string, n int) {
				for range n {
					i := len(cps)
					cp := &engine.Checkpoint{Thread: "t", RunID: run, ID: fmt.Sprintf("%04d", i+1), Step: i, Created: tc0,
						Channels: []engine.ChannelValue{other}}
					if i == 0 && tc.earlier != nil {
						cp.Channels = []engine.ChannelValue{{Channel: FlagsChannel, Version: 1, Value: engine.Value{Inline: tc.earlier}}}
					}
					if i > 0 {
						cp.ParentID = cps[i-1].ID
					}
					cps = append(cps, cp)
				}
			}
			add("r-before", earlierSteps)
			before := &engine.Run{ID: "r-before", Thread: "t", Status: engine.StatusCompleted, Checkpoint: cps[len(cps)-1].ID, CreatedAt: tc0}
			require.NoError(t, d.Commit(bg, &engine.Commit{Earlier: cps[:len(cps)-1], Checkpoint: cps[len(cps)-1], Run: before}))
			add("r-going", ownSteps)
			own := cps[earlierSteps:]
			going := &engine.Run{ID: "r-going", Thread: "t", Status: engine.StatusRunning, Checkpoint: own[len(own)-1].ID, CreatedAt: tc0}
			require.NoError(t, d.Commit(bg, &engine.Commit{Earlier: own[:len(own)-1], Checkpoint: own[len(own)-1], Run: going}))

			stats := d.db.Stats()
			got, err := d.RunFlags(bg, []*engine.Run{going})
			require.NoError(t, err)
			after := d.db.Stats()
			diff := after.Sub(&stats)
			read := diff.TxStats.GetCursorCount()
			assert.ElementsMatch(t, tc.want, got["r-going"])
			// Its own outcome (none), its checkpoints, and the earlier
			// turn's outcome index and record: a few lookups for each.
			assert.LessOrEqual(t, read, int64(4*(ownSteps+3)), "lookups for a run of %d steps after one of %d", ownSteps, earlierSteps)
		})
	}
}

// A run going on is not stored again at each step, so its record names an
// older checkpoint than it stands at: its flags are read from the newest
// checkpoint of its own at the head of its thread.
func TestRunFlagsOfARunGoingAreItsNewest(t *testing.T) {
	d := openTest(t)
	first := &engine.Checkpoint{Thread: "t", RunID: "r-going", ID: "0001", Source: engine.SourceInput, Created: tc0,
		Channels: []engine.ChannelValue{{Channel: "input", Version: 1, Value: engine.Value{Inline: []byte(`"hi"`)}}}}
	flagged := &engine.Checkpoint{Thread: "t", RunID: "r-going", ID: "0002", ParentID: "0001", Step: 1, Created: tc0,
		Channels: []engine.ChannelValue{{Channel: FlagsChannel, Version: 1, Value: engine.Value{Inline: []byte(`["acute"]`)}}}}
	going := &engine.Run{ID: "r-going", Thread: "t", Status: engine.StatusRunning, Checkpoint: first.ID, CreatedAt: tc0}
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: first, Run: going}))
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: flagged}))
	stored, err := d.Run(bg, going.ID)
	require.NoError(t, err)
	require.Equal(t, first.ID, stored.Checkpoint, "the record as the engine leaves it while the run goes on")

	got, err := d.RunFlags(bg, []*engine.Run{stored})
	require.NoError(t, err)
	assert.Equal(t, []string{"acute"}, got[going.ID])
}
