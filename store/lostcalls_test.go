package store

import (
	"path/filepath"
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
