package store

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// The tool loop asks the store, before each new call of a tool not
// declared idempotent, for the mark that salvage left on the call's run.
// A store whose unfinished runs carried no mark when it opened answers
// without reading the run; one that holds a marked run reads it, and
// answers with its mark, or with none for a run that carries none. Before,
// every answer read the run's record: one more read transaction for each
// such call, in every run of every store.
func TestCallsLostThroughReadsNoRunOfAStoreWithoutMarks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		meta  map[string]string
		want  string
		reads int
	}{
		{"no run marked", map[string]string{"engine.attempt": "1"}, "", 0},
		{"a run marked", map[string]string{MetaCallsLostThrough: "0039"}, "0039", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			d, err := Open(path, Options{})
			require.NoError(t, err)
			require.NoError(t, d.Commit(bg, stepCommit("t0", 39)))
			require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-t0", Thread: "t0",
				Status: engine.StatusInterrupted, Checkpoint: "0039", Meta: tc.meta}}))
			require.NoError(t, d.Close())

			d, err = Open(path, Options{})
			require.NoError(t, err)
			defer d.Close()
			reads := countRunReads(t)
			got, err := d.CallsLostThrough(bg, "run-t0")
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.reads, *reads, "run records read")
			got, err = d.CallsLostThrough(bg, "run-t9")
			require.NoError(t, err)
			assert.Empty(t, got, "a run the store does not hold")
		})
	}
}

// A run that waits for a person, whose thread's two newest checkpoints
// fail their checksums on pages that are whole, comes back with its
// thread's head recorded anew two steps behind it, at the newest
// checkpoint left. Resumed, it runs those two steps again, the second
// under a new checkpoint, whose calls have new keys that no record
// answers: it is marked as one that may repeat a call in any step, and the
// report says so, though no page was lost. Before, salvage marked runs
// only where a page was lost, and the run would have called the tools of
// that second step again without asking.
func TestSalvageMarksARunWhoseCheckpointsFailTheirChecksums(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 5; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t0", i)))
	}
	require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-t0", Thread: "t0",
		Status: engine.StatusInterrupted, Checkpoint: "0005"}}))
	require.NoError(t, d.Close())
	want := records(t, path)

	// Damage one byte in the middle of each of the two newest
	// checkpoints, wherever the file holds them.
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, id := range []string{"0004", "0005"} {
		key := string(checkpointKey("t0", "", id))
		rec := want[bucketCheckpoints][key]
		if rec == nil {
			rec = want[bucketRecent][key]
		}
		require.NotNil(t, rec, "checkpoint %s", id)
		require.Positive(t, damageRecord(b, rec))
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, path, dst)
	require.NoError(t, err)
	c, err := Open(dst, Options{})
	require.NoError(t, err)
	defer c.Close()
	head, err := c.Checkpoint(bg, "t0", "", "")
	require.NoError(t, err)
	assert.Equal(t, "0003", head.ID)
	assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
		return p.Bucket == bucketHeads && strings.HasPrefix(p.Message, "named checkpoint 0005, which was lost (on a page that "+
			"cannot be read, or failing its checks); recorded anew at checkpoint 0003")
	}), "the report does not say that the head was recorded anew: %v", rep.Lost)
	r, err := c.Run(bg, "run-t0")
	require.NoError(t, err)
	assert.Equal(t, engine.StatusInterrupted, r.Status)
	assert.Equal(t, CallsLostInAnyStep, r.Meta[MetaCallsLostThrough], "the run is not marked: %v", rep.Lost)
	assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
		return p.Bucket == bucketRuns && p.Key == "run-t0" && strings.Contains(p.Message, "in any step, waits for a person's decision")
	}), "the report does not say what resuming the run does: %v", rep.Lost)
}
