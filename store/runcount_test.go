package store

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// CountRuns reads the runs' statuses alone: no blob, where a summary
// listing reads an input or output between BlobThreshold and SummaryBytes
// whole. It counts a record it cannot read as damaged, leaves out the runs
// it is told to skip, and counts the same across the read transactions a
// long walk takes.
func TestCountRunsReadsStatusesAlone(t *testing.T) {
	defer func(n int) { countBatch = n }(countBatch)
	countBatch = 2
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	mid := json.RawMessage(`"` + strings.Repeat("I forgot my dose. ", 100) + `"`)  // about 2 KiB: a blob, listed whole
	big := json.RawMessage(`"` + strings.Repeat("I forgot my dose. ", 1000) + `"`) // over SummaryBytes: a preview
	for _, r := range []struct {
		id     string
		status engine.RunStatus
		input  json.RawMessage
	}{
		{"run_1", engine.StatusCompleted, mid}, {"run_2", engine.StatusInterrupted, big}, {"run_3", engine.StatusRunning, nil},
		{"run_4", engine.StatusCompleted, nil}, {"run_5", engine.StatusQueued, mid}, {"run_6", engine.StatusCompleted, mid},
	} {
		c := finalCommit("t"+r.id, r.id, r.status, "000"+r.id[4:], nil)
		c.Run.Input = r.input
		require.NoError(t, d.Commit(bg, c))
	}
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		runs := bucket(tx, bucketRuns)
		v := bytes.Clone(runs.Get([]byte("run_4")))
		v[len(v)/2] ^= 0xff
		return runs.Put([]byte("run_4"), v)
	}))

	var loads []engine.BlobRef
	probe.blobLoaded = func(ref engine.BlobRef) { loads = append(loads, ref) }
	defer func() { probe.blobLoaded = nil }()
	_, err = d.Runs(bg, engine.RunFilter{Summary: true, Damaged: func(string, error) {}})
	require.NoError(t, err)
	require.NotEmpty(t, loads, "a summary listing reads a mid-sized input whole")

	loads = nil
	counts, damaged, err := d.CountRuns(bg, map[string]bool{"run_5": true})
	require.NoError(t, err)
	assert.Empty(t, loads, "a count reads no blob")
	assert.Equal(t, map[engine.RunStatus]int{engine.StatusCompleted: 2, engine.StatusInterrupted: 1, engine.StatusRunning: 1}, counts)
	assert.Equal(t, 1, damaged)

	for _, batch := range []int{1, 3, 10000} {
		countBatch = batch
		counts, damaged, err := d.CountRuns(bg, nil)
		require.NoError(t, err)
		assert.Equal(t, map[engine.RunStatus]int{engine.StatusCompleted: 2, engine.StatusInterrupted: 1, engine.StatusRunning: 1,
			engine.StatusQueued: 1}, counts, "batches of %d", batch)
		assert.Equal(t, 1, damaged)
	}
}
