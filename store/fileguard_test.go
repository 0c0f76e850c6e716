package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// damageFixture writes a small store with checkpoints, blobs, runs, an
// outcome and a nested namespace, and returns its bytes and page size.
func damageFixture(t *testing.T) ([]byte, int) {
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
	return b, int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
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
	t.Logf("%d damaged files refused, %d opened (their damage was to free pages or to records)", refused, opened)
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
