package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/outpost-edge/outpost/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// restamp rewrites the store in dir, which no process has open, as a
// binary of format version v left it: a newer version is only stamped; an
// older one loses the index of unfinished runs (version 7), and a version
// 2 file keeps its blobs keyed by reference (store's own tests rewrite
// every older layout).
func restamp(t *testing.T, dir string, v int) {
	t.Helper()
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		if v < store.FormatVersion {
			require.NoError(t, tx.DeleteBucket([]byte("unfinished")))
		}
		if v == 2 {
			blobs, err := tx.CreateBucket([]byte("blobs"))
			require.NoError(t, err)
			// A blob log key is its seq (8 bytes), then the blob's
			// reference: format 2's key.
			require.NoError(t, tx.Bucket([]byte("bloblog")).ForEach(func(k, b []byte) error {
				return blobs.Put(bytes.Clone(k[8:]), bytes.Clone(b))
			}))
			require.NoError(t, tx.DeleteBucket([]byte("bloblog")))
			require.NoError(t, tx.DeleteBucket([]byte("blobindex")))
			require.NoError(t, meta.Delete([]byte("blob_indexed")))
		}
		return meta.Put([]byte("version"), []byte(strconv.Itoa(v)))
	}))
	require.NoError(t, bdb.Close())
}

// storeVersion reads the format version of the store in dir.
func storeVersion(t *testing.T, dir string) string {
	t.Helper()
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer bdb.Close()
	var v string
	require.NoError(t, bdb.View(func(tx *bbolt.Tx) error { v = string(tx.Bucket([]byte("meta")).Get([]byte("version"))); return nil }))
	return v
}

// requireSameStore checks that the store in dir checks clean, in the
// current format, and lists the runs it listed before (want).
func requireSameStore(t *testing.T, dir, want string) {
	t.Helper()
	assert.Equal(t, strconv.Itoa(store.FormatVersion), storeVersion(t, dir))
	assert.Contains(t, outpostOK(t, "db", "check", "--data", dir), "store is sound")
	assert.Equal(t, want, outpostOK(t, "runs", "list", "--data", dir, "--json"))
}

// db compact and db prune of a store of an older format upgrade it, as
// serve's first open would, and say so; the result checks clean and holds
// the same runs. Compact upgrades its copy, checked before it takes the
// store's place.
func TestDBCompactAndPruneUpgradeAnOlderFormat(t *testing.T) {
	for _, v := range []int{2, 6} {
		said := fmt.Sprintf("upgraded the store from format version %d to %d", v, store.FormatVersion)
		t.Run(fmt.Sprintf("compact %d", v), func(t *testing.T) {
			dir := storeWithRun(t)
			runs := outpostOK(t, "runs", "list", "--data", dir, "--json")
			restamp(t, dir, v)
			assert.Contains(t, outpostOK(t, "db", "compact", "--data", dir), said)
			requireSameStore(t, dir, runs)
			left, err := store.Leftovers(dir)
			require.NoError(t, err)
			assert.Empty(t, left)
		})
		t.Run(fmt.Sprintf("compact --json %d", v), func(t *testing.T) {
			dir := storeWithRun(t)
			restamp(t, dir, v)
			assert.Contains(t, outpostOK(t, "db", "compact", "--data", dir, "--json"), fmt.Sprintf(`"upgraded_from": %d`, v))
		})
		t.Run(fmt.Sprintf("prune %d", v), func(t *testing.T) {
			dir := storeWithRun(t)
			runs := outpostOK(t, "runs", "list", "--data", dir, "--json")
			restamp(t, dir, v)
			code, stdout, stderr := outpost(t, "db", "prune", "--data", dir, "--older-than", "720h")
			require.Zero(t, code, stderr)
			assert.Contains(t, stdout, "pruned 0 thread(s)")
			assert.Contains(t, stderr, said)
			requireSameStore(t, dir, runs)
		})
	}
}

// db backup of an older store reads it as it is: a version it reads
// read-only is copied as it is and checked; a version 2 store, which it
// cannot read before serve or run have upgraded it, is refused with what
// to do, and nothing is written. Neither changes the store.
func TestDBBackupOfAnOlderFormat(t *testing.T) {
	dir := storeWithRun(t)
	restamp(t, dir, 6)
	before := folderFiles(t, dir)
	dst := filepath.Join(t.TempDir(), "copy.db")
	assert.Contains(t, outpostOK(t, "db", "backup", "--data", dir, dst), "checked")
	assert.Equal(t, before, folderFiles(t, dir))
	assert.Contains(t, outpostOK(t, "db", "check", "--file", dst), "store is sound")

	dir = storeWithRun(t)
	restamp(t, dir, 2)
	before = folderFiles(t, dir)
	dst = filepath.Join(t.TempDir(), "copy.db")
	for _, args := range [][]string{{"backup", "--data", dir, dst}, {"check", "--data", dir}, {"check", "--file", filepath.Join(dir, store.FileName)}} {
		code, _, stderr := outpost(t, append([]string{"db"}, args...)...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Contains(t, stderr, "format version 2 is upgraded to version", args)
		assert.Contains(t, stderr, "open it with serve or run first", args)
		assert.NotContains(t, stderr, "incompatible outpost version", "%v: this binary reads it once upgraded", args)
	}
	assert.NoFileExists(t, dst)
	assert.Equal(t, before, folderFiles(t, dir))
}

// A store of a newer format than this binary's is refused by every db
// command that opens it, in the words every open uses, and nothing is
// written.
func TestDBCommandsRefuseANewerFormat(t *testing.T) {
	dir := storeWithRun(t)
	restamp(t, dir, store.FormatVersion+1)
	before := folderFiles(t, dir)
	dst := filepath.Join(t.TempDir(), "copy.db")
	for _, args := range [][]string{
		{"check", "--data", dir}, {"check", "--file", filepath.Join(dir, store.FileName)}, {"backup", "--data", dir, dst},
		{"compact", "--data", dir}, {"prune", "--data", dir, "--older-than", "0s"},
	} {
		code, _, stderr := outpost(t, append([]string{"db"}, args...)...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Contains(t, stderr, fmt.Sprintf(`unsupported store format: format version "%d", this binary reads version %d`,
			store.FormatVersion+1, store.FormatVersion), args)
		assert.Contains(t, stderr, "was written by an incompatible outpost version, or is not an outpost store", args)
	}
	assert.NoFileExists(t, dst)
	assert.Equal(t, before, folderFiles(t, dir))
}
