//go:build unix

package store

import (
	"errors"
	"os"
	"syscall"
	"time"
)

var errLocked = errors.New("locked")

// lockStore takes the store's lock file beside path (LockFile):
// exclusively to write, shared to read. Unlike the store file, the lock
// file is not replaced, so an Open that waits for it finds the file at
// path as it is when it gets the lock, even when a compaction renamed a new
// file into place meanwhile. Without it, an Open waiting on the old file's
// own lock would get that lock once the compaction let go, and write to a
// file no longer in the folder. A read-only Open creates nothing: it takes
// the lock file when there is one, and goes without otherwise (it writes
// nothing that could be lost).
func lockStore(path string, readOnly bool, timeout time.Duration) (*os.File, error) {
	f, _, err := takeLock(path, readOnly, timeout)
	return f, err
}

// takeLock is lockStore, and says whether it made the lock file, which a
// failed Open then removes (dropNewLock). A lock file can therefore go
// while others wait on it: whoever gets a lock checks that the folder
// still names the file it locked, and starts again when it does not, so
// that two writers never hold locks on two different files.
func takeLock(path string, readOnly bool, timeout time.Duration) (f *os.File, created bool, err error) {
	name := LockFile(path)
	deadline := time.Now().Add(timeout)
	for {
		switch {
		case readOnly:
			if f, err = os.Open(name); err != nil {
				return nil, false, nil
			}
		default:
			f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			created = err == nil
			if errors.Is(err, os.ErrExist) {
				f, err = os.OpenFile(name, os.O_RDWR, 0)
				if errors.Is(err, os.ErrNotExist) {
					continue // removed meanwhile: make it
				}
			}
			if err != nil {
				return nil, false, err
			}
		}
		if err := flockWithin(f, readOnly, max(time.Until(deadline), time.Nanosecond)); err != nil {
			f.Close()
			return nil, false, err
		}
		if namesFile(name, f) {
			return f, created, nil
		}
		f.Close() // a failed Open removed it while this one waited
		if time.Now().After(deadline) {
			return nil, false, errLocked
		}
	}
}

// dropNewLock removes the lock file f, which the caller made (takeLock)
// and holds, and lets go of it: a failed Open leaves no lock file that was
// not there before. The file is removed only while it is held and the
// folder still names it, so a lock file another process holds is never
// removed, and one that waits on it starts again on a new one (takeLock).
// A removal that fails leaves the file, which is harmless: the next Open
// takes it as it is.
func dropNewLock(path string, f *os.File) error {
	if name := LockFile(path); namesFile(name, f) {
		_ = os.Remove(name)
	}
	return f.Close()
}

// namesFile reports whether name is the file f has open.
func namesFile(name string, f *os.File) bool {
	held, err := f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Stat(name)
	return err == nil && os.SameFile(held, now)
}

// flockWithin takes a flock on f, shared to read and exclusive to write,
// trying until timeout; errLocked when it could not.
func flockWithin(f *os.File, readOnly bool, timeout time.Duration) error {
	how := syscall.LOCK_EX
	if readOnly {
		how = syscall.LOCK_SH
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return errLocked
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// guardFile checks the store file at path (see checkFile) under the lock
// bbolt takes, so that a file another process is writing is not read;
// errLocked means that lock was not had within timeout. A missing file is
// left to bbolt: a writable Open has made it by now (createStore), and a
// read-only one fails on it.
func guardFile(path string, readOnly bool, timeout time.Duration) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := flockWithin(f, readOnly, timeout); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return checkFile(f)
}
