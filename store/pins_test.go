package store

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// PinnedBundles finds the bundle of every run, whatever its status, across
// the read transactions a long walk takes, with the oldest few IDs of
// each; a run pinned to no bundle is not counted, and a record that cannot
// be read is named, since its bundle is not known.
func TestPinnedBundlesFindsEveryRun(t *testing.T) {
	defer func(n int) { countBatch = n }(countBatch)
	countBatch = 2
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	v1 := engine.BundleRef{Name: "b", Version: 1, Digest: "sha256:11"}
	v2 := engine.BundleRef{Name: "b", Version: 2, Digest: "sha256:22"}
	for _, r := range []struct {
		id     string
		status engine.RunStatus
		bundle engine.BundleRef
	}{
		{"run_1", engine.StatusCompleted, v1}, {"run_2", engine.StatusInterrupted, v1}, {"run_3", engine.StatusRunning, v2},
		{"run_4", engine.StatusCompleted, v1}, {"run_5", engine.StatusFailed, v1}, {"run_6", engine.StatusCompleted, engine.BundleRef{}},
		{"run_7", engine.StatusCompleted, v2},
	} {
		c := finalCommit("t"+r.id, r.id, r.status, "000"+r.id[4:], nil)
		c.Run.Bundle = r.bundle
		require.NoError(t, d.Commit(bg, c))
	}
	pins, err := d.PinnedBundles(bg)
	require.NoError(t, err)
	assert.Equal(t, map[engine.BundleRef]*Pins{
		v1: {Runs: 4, First: []string{"run_1", "run_2", "run_4"}},
		v2: {Runs: 2, First: []string{"run_3", "run_7"}},
	}, pins.ByBundle)
	assert.Empty(t, pins.Damaged)

	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		runs := bucket(tx, bucketRuns)
		v := bytes.Clone(runs.Get([]byte("run_3")))
		v[len(v)/2] ^= 0xff
		return runs.Put([]byte("run_3"), v)
	}))
	pins, err = d.PinnedBundles(bg)
	require.NoError(t, err)
	assert.Equal(t, []string{"run_3"}, pins.Damaged)
	assert.Equal(t, 1, pins.ByBundle[v2].Runs)
}
