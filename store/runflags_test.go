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
