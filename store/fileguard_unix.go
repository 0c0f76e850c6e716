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
// file is never replaced, so an Open that waits for it finds the file at
// path as it is when it gets the lock, even when a compaction renamed a new
// file into place meanwhile. Without it, an Open waiting on the old file's
// own lock would get that lock once the compaction let go, and write to a
// file no longer in the folder. A read-only Open creates nothing: it takes
// the lock file when there is one, and goes without otherwise (it writes
// nothing that could be lost).
func lockStore(path string, readOnly bool, timeout time.Duration) (*os.File, error) {
	name := LockFile(path)
	var f *os.File
	var err error
	if readOnly {
		if f, err = os.Open(name); err != nil {
			return nil, nil
		}
	} else if f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, err
	}
	if err := flockWithin(f, readOnly, timeout); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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
