package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// damageFixture writes a small store with checkpoints, blobs, runs, an
// outcome and a nested namespace, and returns its bytes and page size.
func damageFixture(t testing.TB) ([]byte, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 40; i++ {
		require.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%d", i%5), i)))
	}
	_, err = d.PutBlob(bg, bytes.Repeat([]byte("x"), 9000)) // an overflow page
	require.NoError(t, err)
	run := &engine.Run{ID: "run_1", Thread: "t1", Status: engine.StatusCompleted, Output: []byte(`"done"`)}
	require.NoError(t, d.Commit(bg, &engine.Commit{Run: run, Sync: true}))
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	// Up to the end of the pages in use, as compact leaves a file: beyond
	// it, bbolt's last growth left room that a cut could take away
	// without touching a page.
	ps := int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
	m0, m1 := readMeta(b), readMeta(b[ps:])
	return b[:int(max(m0.pgid, m1.pgid))*ps], ps
}

func writeStore(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return path
}

// A store file cut short is refused with a message that says so, and is
// left as it was; before, bbolt panicked while opening it.
func TestOpenRefusesATruncatedFile(t *testing.T) {
	good, ps := damageFixture(t)
	m0, m1 := readMeta(good), readMeta(good[ps:])
	hw := int(max(m0.pgid, m1.pgid)) * ps // the end of the pages in use
	require.Greater(t, hw, 8*ps)
	// Bytes past the pages in use are free: cutting them loses nothing.
	d, err := Open(writeStore(t, good[:hw]), Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	for _, n := range []int{hw - ps, hw - 1, hw / 2, 3 * ps} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cut := good[:n]
			path := writeStore(t, cut)
			for _, ro := range []bool{false, true} {
				_, err := Open(path, Options{ReadOnly: ro})
				require.ErrorIs(t, err, ErrDamaged)
				assert.ErrorContains(t, err, "cut short")
				assert.ErrorContains(t, err, "restore the last backup")
			}
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, cut, after, "nothing changed")
		})
	}
}

// A copy of a store, such as a backup, opened with Options.Copy and
// refused as damaged, is not told to "restore the last backup", nor, when
// it holds nothing, to be removed as a new appliance's file: it is said to
// be unfit to restore, with what to do instead.
func TestOpenAdvisesACopyAsACopy(t *testing.T) {
	good, _ := damageFixture(t)
	for _, b := range [][]byte{good[:len(good)/2], nil} {
		path := writeStore(t, b)
		_, err := Open(path, Options{ReadOnly: true, Copy: true})
		require.ErrorIs(t, err, ErrDamaged)
		assert.ErrorContains(t, err, "nothing was changed: this copy cannot be restored: check an older backup, "+
			"or, while the store itself is sound, take a new one (outpost db backup FILE)")
		assert.NotContains(t, err.Error(), "restore the last backup")
		assert.NotContains(t, err.Error(), "new appliance")
	}
}

// A store file that holds nothing of a store (empty, as a restore's copy
// that failed or a full disk leaves it; all zeros, as a file system that
// lost unflushed writes leaves it; a few bytes) is damage, not a new store
// nor another program's file: it is refused with ErrDamaged and advice,
// and left as it was. Before, bbolt made an empty file a new store, which
// check then called sound. A file of another program is still ErrFormat.
func TestOpenRefusesAHollowFile(t *testing.T) {
	foreign := append([]byte("SQLite format 3\x00"), make([]byte, 8192)...)
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "the file is empty (0 bytes)"},
		{"zeros", make([]byte, 64<<10), "the file holds 65536 bytes, all zeros"},
		{"a few bytes", []byte("outpost"), "the file holds only 7 bytes, fewer than the two meta pages"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeStore(t, tc.b)
			for _, ro := range []bool{false, true} {
				_, err := Open(path, Options{ReadOnly: ro})
				require.ErrorIs(t, err, ErrDamaged, "read-only %v", ro)
				assert.NotErrorIs(t, err, ErrFormat)
				assert.ErrorContains(t, err, tc.want)
				assert.ErrorContains(t, err, "there is nothing in it that outpost db salvage could copy")
				assert.ErrorContains(t, err, "nothing was changed: restore the last backup")
				assert.ErrorContains(t, err, "if this is a new appliance whose first start never finished, remove the file")
			}
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, len(tc.b), len(after))
			assert.True(t, bytes.Equal(tc.b, after), "the file changed")

			dst := filepath.Join(t.TempDir(), "salvaged.db")
			_, err = Salvage(bg, path, dst)
			require.ErrorIs(t, err, ErrDamaged)
			assert.ErrorContains(t, err, tc.want)
			assert.NoFileExists(t, dst)
		})
	}
	_, err := Open(writeStore(t, foreign), Options{})
	require.ErrorIs(t, err, ErrFormat)
	assert.NotErrorIs(t, err, ErrDamaged)
}

// Every page of a store, damaged in several ways: opening, checking and
// reading it never panics. Either Open refuses the file, or the damage is
// in records, which Check names.
func TestDamagedPagesNeverPanic(t *testing.T) {
	good, ps := damageFixture(t)
	pages := len(good) / ps
	damages := map[string]func(p []byte){
		"zeroed":        func(p []byte) { clear(p) },
		"id off by one": func(p []byte) { binary.LittleEndian.PutUint64(p, binary.LittleEndian.Uint64(p)+1) },
		"count 0xffff":  func(p []byte) { binary.LittleEndian.PutUint16(p[10:], 0xffff) },
		"overflow huge": func(p []byte) { binary.LittleEndian.PutUint32(p[12:], 1<<30) },
		"body noise": func(p []byte) {
			for i := pageHeaderSize; i < len(p); i++ {
				p[i] = byte(i*7 + 3)
			}
		},
	}
	refused, opened := 0, 0
	for id := 2; id < pages; id++ {
		for name, damage := range damages {
			b := bytes.Clone(good)
			damage(b[id*ps : (id+1)*ps])
			path := writeStore(t, b)
			d, err := Open(path, Options{})
			if err != nil {
				refused++
				if !errors.Is(err, ErrDamaged) && !errors.Is(err, ErrFormat) {
					var ce *CorruptError
					require.ErrorAs(t, err, &ce, "page %d %s: %v", id, name, err)
				}
				continue
			}
			opened++
			rep, err := d.Check(bg)
			if err == nil {
				_ = rep.OK()
			}
			_, _ = d.Runs(bg, engine.RunFilter{})
			_, _ = d.History(bg, "t1", "", "", 0)
			require.NoError(t, d.Close())
		}
	}
	t.Logf("%d damaged files refused, %d opened, checked and read", refused, opened)
	assert.Positive(t, refused)
}

// A writable Open makes the lock file; a read-only one creates nothing
// (a backup checked after it is written gets no file beside it).
func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.FileExists(t, LockFile(path))
	_, err = Open(path, Options{ReadOnly: true, Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse, "a reader waits for the writer's lock file")
	require.NoError(t, d.Close())

	require.NoError(t, os.Remove(LockFile(path)))
	ro, err := Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, ro.Close())
	assert.NoFileExists(t, LockFile(path))
}

// Random bytes of a store overwritten, a few at a time: opening, checking
// and reading it never panics.
func TestRandomDamageNeverPanics(t *testing.T) {
	good, ps := damageFixture(t)
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 300 {
		b := bytes.Clone(good)
		for range 1 + rng.IntN(4) {
			at := rng.IntN(len(b))
			if rng.IntN(3) == 0 {
				at = rng.IntN(len(b)/ps)*ps + rng.IntN(pageHeaderSize) // a page header
			}
			b[at] = byte(rng.Uint32())
		}
		d, err := Open(writeStore(t, b), Options{})
		if err != nil {
			continue
		}
		_, _ = d.Check(bg)
		_, _ = d.Runs(bg, engine.RunFilter{})
		for th := range 5 {
			_, _ = d.History(bg, fmt.Sprintf("t%d", th), "", "", 0)
		}
		require.NoError(t, d.Close(), "case %d", i)
	}
}

// A missing bucket beside one the store does not know is damage (a page
// that changed the bucket's name): the store is refused, not given an empty
// bucket that would hide the records. A bucket simply missing (added by a
// later binary of the same format) is added by a writable open.
func TestMissingBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	require.NoError(t, d.Close())
	edit := func(fn func(tx *bbolt.Tx) error) {
		bdb, err := bbolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, bdb.Update(fn))
		require.NoError(t, bdb.Close())
	}

	edit(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte(bucketUplink)) })
	_, err = Open(path, Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrFormat)
	require.ErrorIs(t, err, ErrBucketsMissing, "not an incompatible version")
	assert.ErrorContains(t, err, "opening the store for writing once adds it")
	d, err = Open(path, Options{})
	require.NoError(t, err, "a writable open adds it")
	require.NoError(t, d.Close())

	// "checkpoints" renamed "checkpointz", as a damaged byte would.
	edit(func(tx *bbolt.Tx) error {
		old := tx.Bucket([]byte(bucketCheckpoints))
		renamed, err := tx.CreateBucket([]byte("checkpointz"))
		require.NoError(t, err)
		require.NoError(t, old.ForEach(func(k, v []byte) error { return renamed.Put(k, v) }))
		return tx.DeleteBucket([]byte(bucketCheckpoints))
	})
	for _, ro := range []bool{false, true} {
		_, err = Open(path, Options{ReadOnly: ro})
		require.ErrorIs(t, err, ErrDamaged)
		assert.ErrorContains(t, err, `bucket checkpoints is missing, and the file holds "checkpointz"`)
	}
	edit(func(tx *bbolt.Tx) error {
		assert.Nil(t, tx.Bucket([]byte(bucketCheckpoints)), "nothing was added")
		return nil
	})
}

// FuzzOpenFile opens arbitrary bytes as a store file: Open refuses them or
// opens them, and neither it nor reading what it opened panics.
func FuzzOpenFile(f *testing.F) {
	good, _ := damageFixture(f)
	f.Add(good)
	f.Add(good[:len(good)/3])
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), FileName)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		d, err := Open(path, Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return
		}
		_, _ = d.Check(bg)
		_, _ = d.Runs(bg, engine.RunFilter{})
		_, _ = d.History(bg, "t1", "", "", 0)
		require.NoError(t, d.Close())
	})
}

// With the first meta page damaged, the page size comes from the second,
// which is looked for as bbolt looks for it. A store whose pages are not the
// OS page size is then still checked before bbolt reads it: a cut-short
// file is refused as such, not passed to bbolt.
func TestSecondMetaPageFoundWithoutTheFirst(t *testing.T) {
	good, ps := damageFixture(t)
	require.Equal(t, DefaultPageSize, ps)
	require.NotEqual(t, os.Getpagesize(), ps, "the test needs pages larger than the OS page")
	b := bytes.Clone(good)
	b[metaOffset+20] ^= 0xFF // the first meta page's checksum fails
	require.False(t, readMeta(b).valid)
	m1 := readMeta(b[ps:])
	require.True(t, m1.valid)

	f, err := os.Open(writeStore(t, b))
	require.NoError(t, err)
	defer f.Close()
	m, off := secondMeta(f, int64(len(b)))
	assert.True(t, m.valid)
	assert.Equal(t, int64(ps), off)
	assert.Equal(t, m1.txid, m.txid)

	// Opens on the second meta page.
	d, err := Open(writeStore(t, b), Options{ReadOnly: true})
	require.NoError(t, err)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, d.Close())

	// Cut short: refused by the check, which found the second meta page.
	hw := int(m1.pgid) * ps
	_, err = Open(writeStore(t, b[:hw-ps]), Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrDamaged)
	assert.ErrorContains(t, err, "cut short")

	// Neither meta page whole: not a store.
	b[ps+metaOffset+20] ^= 0xFF
	_, err = Open(writeStore(t, b), Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrFormat)
}

// A new store has DefaultPageSize pages; one made with smaller pages keeps
// them when reopened, until a compaction copies it into DefaultPageSize.
func TestPageSize(t *testing.T) {
	dir := t.TempDir()
	pageSize := func(path string) int {
		d, err := Open(path, Options{ReadOnly: true})
		require.NoError(t, err)
		defer d.Close()
		return d.db.Info().PageSize
	}
	fresh := filepath.Join(dir, "fresh.db")
	d, err := Open(fresh, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.Equal(t, DefaultPageSize, pageSize(fresh))

	old := filepath.Join(dir, FileName)
	d, err = Open(old, Options{PageSize: 4096})
	require.NoError(t, err)
	for i := 1; i <= 30; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	require.NoError(t, d.Close())
	assert.Equal(t, 4096, pageSize(old))
	d, err = Open(old, Options{}) // written on with the default asked for
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, stepCommit("t", 31)))
	require.NoError(t, d.Close())
	assert.Equal(t, 4096, pageSize(old))

	_, err = CompactFile(bg, old, Options{})
	require.NoError(t, err)
	assert.Equal(t, DefaultPageSize, pageSize(old))
	d, err = Open(old, Options{ReadOnly: true})
	require.NoError(t, err)
	defer d.Close()
	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, 31)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}
