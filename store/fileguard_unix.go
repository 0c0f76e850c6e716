//go:build unix

package store

import (
	"errors"
	"os"
	"syscall"
	"time"
)

var errLocked = errors.New("locked")

// guardFile checks the store file at path (see checkFile) under the lock
// bbolt takes, so that a file another process is writing is not read;
// errLocked means that lock was not had within timeout. A missing file is
// a new store.
func guardFile(path string, readOnly bool, timeout time.Duration) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	how := syscall.LOCK_EX
	if readOnly {
		how = syscall.LOCK_SH
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return errLocked
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return checkFile(f)
}
