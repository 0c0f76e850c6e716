//go:build unix

package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// folderNames lists the names in dir.
func folderNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// A store refused when it is opened (empty, all zeros, cut short, another
// application's file) leaves its folder as it was: no lock file appears
// beside it. A lock file that was there before stays.
func TestRefusedStoreLeavesNoLockFile(t *testing.T) {
	good, ps := damageFixture(t)
	foreign := func(t *testing.T) []byte {
		p := filepath.Join(t.TempDir(), "x.db")
		db, err := bbolt.Open(p, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("theirs")); return err }))
		require.NoError(t, db.Close())
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name string
		file func(t *testing.T) []byte
		want error
	}{
		{"empty", func(*testing.T) []byte { return []byte{} }, ErrDamaged},
		{"all zeros", func(*testing.T) []byte { return make([]byte, 4*ps) }, ErrDamaged},
		{"cut short", func(*testing.T) []byte { return good[:len(good)/2] }, ErrDamaged},
		{"another application's bbolt file", foreign, ErrFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.file(t)
			for _, readOnly := range []bool{false, true} {
				path := writeStore(t, b)
				_, err := Open(path, Options{ReadOnly: readOnly})
				require.ErrorIs(t, err, tc.want)
				assert.Equal(t, []string{FileName}, folderNames(t, filepath.Dir(path)), "read-only %v", readOnly)
				after, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, b, after, "the refused file was changed")
			}

			path := writeStore(t, b)
			require.NoError(t, os.WriteFile(LockFile(path), nil, 0o600))
			_, err := Open(path, Options{})
			require.ErrorIs(t, err, tc.want)
			assert.FileExists(t, LockFile(path), "a lock file that was there before was removed")
		})
	}

	// One that another process holds is never removed: the refused Open
	// did not make it.
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	_, err = OpenDir(dir, Options{Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse)
	assert.FileExists(t, LockFile(filepath.Join(dir, FileName)))
	require.NoError(t, d.Close())
}

// An opener that waits on a lock file that a failed Open then removes
// does not keep a lock on a file no longer in the folder, where a third
// opener could make a new lock file and hold it too: it starts again,
// and holds the lock file the folder names.
func TestLockFileRemovedWhileAnotherWaits(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	first, created, err := takeLock(path, false, time.Second)
	require.NoError(t, err)
	require.True(t, created)

	type taken struct {
		f       *os.File
		created bool
		err     error
	}
	waiter := make(chan taken, 1)
	go func() {
		f, created, err := takeLock(path, false, 5*time.Second)
		waiter <- taken{f, created, err}
	}()
	time.Sleep(200 * time.Millisecond) // the waiter has the file open and waits for its lock
	require.NoError(t, dropNewLock(path, first))

	got := <-waiter
	require.NoError(t, got.err)
	defer got.f.Close()
	assert.True(t, namesFile(LockFile(path), got.f), "the waiter holds a lock file no longer in the folder")
	assert.True(t, got.created, "the waiter made the new lock file")

	_, _, err = takeLock(path, false, 100*time.Millisecond)
	require.ErrorIs(t, err, errLocked, "a third opener got the lock while the waiter holds it")
	_, err = Open(path, Options{Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse)
	assert.FileExists(t, LockFile(path), "a failed Open removed a lock file another holds")
}

// LockDir takes the lock Open takes, without opening the store: refused
// while an Open holds the folder, and it leaves no lock file it made.
func TestLockDir(t *testing.T) {
	dir := t.TempDir()
	release, err := LockDir(dir, 0)
	require.NoError(t, err)
	_, err = LockDir(dir, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrInUse, "a second holder")
	_, err = OpenDir(dir, Options{Timeout: 50 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse, "an Open while LockDir holds the folder")
	require.NoError(t, release())
	require.NoFileExists(t, LockFile(filepath.Join(dir, FileName)), "the lock file LockDir made goes with it")

	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	_, err = LockDir(dir, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrInUse, "while an Open holds the folder")
	require.NoError(t, d.Close())
	release, err = LockDir(dir, 0)
	require.NoError(t, err)
	require.NoError(t, release())
	require.FileExists(t, LockFile(filepath.Join(dir, FileName)), "a lock file there before stays")
}
