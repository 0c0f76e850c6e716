package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// growStore commits blobs of random sizes, a few at a time, until the
// pages in use pass n bytes, and returns what it committed.
func growStore(t *testing.T, d *DB, seed uint64, n int64) map[engine.BlobRef][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	all := map[engine.BlobRef][]byte{}
	for i := 1; highWater(t, d) < n; i++ {
		c := stepCommit("t", i)
		for range 3 {
			b := make([]byte, 600+rng.IntN(40_000))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			ref := engine.RefOf(b)
			c.Blobs[ref], all[ref] = b, b
		}
		require.NoError(t, d.Commit(bg, c))
	}
	return all
}

func highWater(t *testing.T, d *DB) (n int64) {
	t.Helper()
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil }))
	return n
}

// allocated is the bytes of the file that the file system has blocks for.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no block counts on this system")
	}
	return st.Blocks * 512
}

// needHolesAndZeros skips a test on a file system that keeps no holes, or
// stores written zeros without allocating blocks for them (compression):
// block counts then cannot show what the runway does.
func needHolesAndZeros(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "probe")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4<<20))
	_, err = f.WriteAt(make([]byte, 1<<20), 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	switch held := allocated(t, path); {
	case held >= 4<<20:
		t.Skip("this file system leaves no holes")
	case held < 1<<20:
		t.Skip("this file system does not allocate blocks for written zeros")
	}
}

// The runway zeroes the file ahead of the pages in use, so commits write
// into blocks the file system already holds; without it, the file's end is
// a hole.
func TestRunwayZeroesAheadOfPagesInUse(t *testing.T) {
	needHolesAndZeros(t)
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("runway=%v", on), func(t *testing.T) {
			d := openTest(t)
			require.NotNil(t, d.q.runway)
			if !on {
				require.NoError(t, d.q.runway.close())
				d.q.runway = nil
			}
			growStore(t, d, 1, 3<<20)
			// On until bbolt grows the file again, by growStep, and one
			// more commit, to top the runway up after that growth.
			before := fileSize(t, d.path)
			for seed := uint64(2); fileSize(t, d.path) == before; seed++ {
				growStore(t, d, seed, highWater(t, d)+1)
			}
			require.NoError(t, d.Commit(bg, &engine.Commit{Run: &engine.Run{ID: "r", Thread: "t", Status: engine.StatusQueued}}))
			hw, size, held := highWater(t, d), fileSize(t, d.path), allocated(t, d.path)
			t.Logf("pages in use %d, file %d, blocks for %d", hw, size, held)
			require.GreaterOrEqual(t, size-hw, int64(runwayMin), "the test needs room beyond the pages in use")
			if !on {
				assert.Less(t, held, size-runwayMin, "the test needs a file whose end is a hole without the runway")
				return
			}
			r := d.q.runway
			assert.NotNil(t, r.f, "the runway was given up")
			assert.Equal(t, size, r.zeroed, "the runway was not topped up to the file's end")
			assert.GreaterOrEqual(t, held, r.zeroed, "the runway's blocks are not allocated")
		})
	}
}

// Zeros go only where no page in use lies: a store grown with the runway
// holds every record, checks clean, and is no larger than bbolt makes it
// without one.
func TestRunwayKeepsEveryRecord(t *testing.T) {
	for _, on := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), FileName)
		d, err := Open(path, Options{})
		require.NoError(t, err)
		if !on {
			require.NoError(t, d.q.runway.close())
			d.q.runway = nil
		}
		blobs := growStore(t, d, 7, 2<<20)
		if on {
			require.Positive(t, d.q.runway.zeroed, "the runway never ran")
		}
		require.NoError(t, d.Close())

		d, err = Open(path, Options{ReadOnly: true})
		require.NoError(t, err)
		rep, err := d.Check(bg)
		require.NoError(t, err)
		assert.True(t, rep.OK(), "%v", rep.Problems)
		for ref, want := range blobs {
			got, err := d.Blob(bg, ref)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "blob %s", ref)
		}
		hw := highWater(t, d)
		require.NoError(t, d.Close())
		size := fileSize(t, path)
		assert.LessOrEqual(t, size, hw+growStep+64<<10, "runway %v: the file grew past what bbolt gives it", on)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// A runway that cannot write gives itself up; the commits go on, and the
// store closes cleanly.
func TestRunwayFailureLeavesCommitsAlone(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.q.runway.f.Close()) // every write now fails
	blobs := growStore(t, d, 3, 1<<20)
	assert.Nil(t, d.q.runway.f, "the runway was not given up")
	for ref, want := range blobs {
		got, err := d.Blob(bg, ref)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))
	}
	require.NoError(t, d.Close())
}

// A read-only store writes nothing, zeros included.
func TestReadOnlyStoreHasNoRunway(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	d, err = Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	defer d.Close()
	assert.Nil(t, d.q.runway)
}
