package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// storeContents is what a store holds, as its readers return it.
type storeContents struct {
	Runs     map[string]engine.RunStatus
	History  map[string][]string // thread -> checkpoint IDs, newest first
	Blobs    map[engine.BlobRef]string
	Outcomes []Outcome // in seq order
}

// readContents reads back the runs, checkpoints, blobs and outcomes of d.
func readContents(t *testing.T, d *DB, blobs []engine.BlobRef) storeContents {
	t.Helper()
	c := storeContents{Runs: map[string]engine.RunStatus{}, History: map[string][]string{}, Blobs: map[engine.BlobRef]string{}}
	runs, err := d.Runs(bg, engine.RunFilter{})
	require.NoError(t, err)
	for _, r := range runs {
		c.Runs[r.ID] = r.Status
		h, err := d.History(bg, r.Thread, "", "", 0)
		require.NoError(t, err)
		for _, cp := range h {
			c.History[r.Thread] = append(c.History[r.Thread], cp.ID)
		}
	}
	for _, ref := range blobs {
		b, err := d.Blob(bg, ref)
		require.NoError(t, err, "blob %s", ref)
		c.Blobs[ref] = string(b)
	}
	outs, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	for _, o := range outs {
		c.Outcomes = append(c.Outcomes, *o)
	}
	return c
}

// writeOlderFormat writes a store file at path as a binary of format
// version old (2 to 6) left it, and returns what it holds, read before it
// was rewritten, and its blobs' references. The records go in through
// this binary; then the file is rewritten, step by step, as each older
// version laid it out: no unfinished index (6), the outcome index in a
// bucket of its own (5), no recent bucket (4), blobs keyed by reference
// (2).
func writeOlderFormat(t *testing.T, path string, old int) (storeContents, []engine.BlobRef) {
	t.Helper()
	d, err := Open(path, Options{})
	require.NoError(t, err)
	refs := commitBlobs(t, d, "old", 4)
	require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0011", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusInterrupted, "0012", nil)))
	require.NoError(t, d.Commit(bg, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t3", ID: "0013", Created: tc0},
		Run:        &engine.Run{ID: "r3", Thread: "t3", Status: engine.StatusQueued, CreatedAt: tc0}, Sync: true}))
	want := readContents(t, d, refs)
	require.Len(t, want.Outcomes, 2)
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		require.NoError(t, tx.DeleteBucket([]byte(bucketUnfinished)))
		if old <= 5 {
			outcomeIndexOfVersion5(t, tx, "r1", "r2")
		}
		if old <= 4 {
			var moved [][2][]byte
			require.NoError(t, bucket(tx, bucketRecent).ForEach(func(k, v []byte) error {
				moved = append(moved, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				return nil
			}))
			for _, kv := range moved {
				require.NoError(t, bucket(tx, bucketCheckpoints).Put(kv[0], kv[1]))
			}
			require.NoError(t, tx.DeleteBucket([]byte(bucketRecent)))
		}
		meta := bucket(tx, bucketMeta)
		if old == 2 {
			blobs, err := tx.CreateBucket([]byte("blobs"))
			require.NoError(t, err)
			require.NoError(t, bucket(tx, bucketBlobLog).ForEach(func(k, v []byte) error {
				_, ref, ok := parseBlobLogKey(k)
				require.True(t, ok)
				return blobs.Put(blobKey(ref), bytes.Clone(v))
			}))
			require.NoError(t, tx.DeleteBucket([]byte(bucketBlobLog)))
			require.NoError(t, tx.DeleteBucket([]byte(bucketBlobIndex)))
			require.NoError(t, meta.Delete(metaBlobIndexed))
		}
		return meta.Put(metaVersion, []byte(strconv.Itoa(old)))
	}))
	require.NoError(t, d.Close())
	return want, refs
}

// outcomeIndexOfVersion5 moves the outcome index entries of the runs ids
// out of the runs bucket, into the bucket of their own where binaries of
// format version 5 and before kept them.
func outcomeIndexOfVersion5(t *testing.T, tx *bbolt.Tx, ids ...string) {
	t.Helper()
	idx, err := tx.CreateBucket([]byte(bucketOutcomeRuns))
	require.NoError(t, err)
	runs := bucket(tx, bucketRuns)
	for _, id := range ids {
		v := runs.Get(outcomeIndexKey(id))
		require.NotNil(t, v, id)
		require.NoError(t, idx.Put([]byte(id), bytes.Clone(v)))
		require.NoError(t, runs.Delete(outcomeIndexKey(id)))
	}
}

// fileVersion reads the format version of the store file at path.
func fileVersion(t *testing.T, path string) string {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer bdb.Close()
	var v string
	require.NoError(t, bdb.View(func(tx *bbolt.Tx) error { v = string(tx.Bucket([]byte(bucketMeta)).Get(metaVersion)); return nil }))
	return v
}

// Compacting a store of every older format this binary reads gives a copy
// in the current format, upgraded as the first writable open upgrades the
// store in place, with every record intact, that checks clean; the store
// was read-only until the copy took its place.
func TestCompactUpgradesOlderFormats(t *testing.T) {
	for old := 2; old < formatVersion; old++ {
		t.Run(strconv.Itoa(old), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			want, refs := writeOlderFormat(t, path, old)
			c, err := CompactFile(context.Background(), path, Options{})
			require.NoError(t, err)
			assert.Equal(t, old, c.UpgradedFrom)
			assert.Equal(t, strconv.Itoa(formatVersion), fileVersion(t, path))
			left, err := Leftovers(filepath.Dir(path))
			require.NoError(t, err)
			assert.Empty(t, left)

			d, err := Open(path, Options{ReadOnly: true})
			require.NoError(t, err)
			defer d.Close()
			rep, err := d.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
			assert.Equal(t, want, readContents(t, d, refs))
			waiting, err := d.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted})
			require.NoError(t, err)
			assert.Equal(t, []string{"r2"}, runIDs(waiting), "through the unfinished index the upgrade built")
		})
	}
}

// A store of the current format is compacted as it is, and said not to be
// upgraded.
func TestCompactOfTheCurrentFormatUpgradesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	commitBlobs(t, d, "now", 2)
	require.NoError(t, d.Close())
	c, err := CompactFile(bg, path, Options{})
	require.NoError(t, err)
	assert.Zero(t, c.UpgradedFrom)
	assert.Equal(t, strconv.Itoa(formatVersion), fileVersion(t, path))
}

// A copy that cannot be upgraded (a format 2 blob under a key that is no
// reference, which the upgrade refuses) leaves the store byte for byte as
// it was, and no copy beside it; the error says to open the store with
// serve or run first.
func TestCompactThatCannotUpgradeChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	writeOlderFormat(t, path, 2)
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("blobs")).Put([]byte("short"), []byte("x")) }))
	require.NoError(t, bdb.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	_, err = CompactFile(bg, path, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "could not be upgraded to format version "+strconv.Itoa(formatVersion))
	assert.Contains(t, err.Error(), "open the store with serve or run first")
	assert.Contains(t, err.Error(), "nothing was changed")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the store is as it was")
	left, err := Leftovers(filepath.Dir(path))
	require.NoError(t, err)
	assert.Empty(t, left)
}

// The first writable open of an older store says which version it
// upgraded; a read-only one upgrades nothing, and a format 2 file, which
// it cannot read, is refused as ErrOlderFormat, not as an incompatible
// format.
func TestOpenSaysWhatItUpgraded(t *testing.T) {
	for old := 2; old < formatVersion; old++ {
		t.Run(strconv.Itoa(old), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			writeOlderFormat(t, path, old)
			ro, err := Open(path, Options{ReadOnly: true})
			if old == 2 {
				require.ErrorIs(t, err, ErrOlderFormat)
				require.ErrorIs(t, err, ErrFormat)
				assert.Contains(t, err.Error(), "open it with serve or run first")
			} else {
				require.NoError(t, err)
				assert.Zero(t, ro.UpgradedFrom())
				require.NoError(t, ro.Close())
			}
			d, err := Open(path, Options{})
			require.NoError(t, err)
			assert.Equal(t, old, d.UpgradedFrom())
			require.NoError(t, d.Close())
			d, err = Open(path, Options{})
			require.NoError(t, err)
			assert.Zero(t, d.UpgradedFrom(), "upgraded once")
			require.NoError(t, d.Close())
		})
	}
}
