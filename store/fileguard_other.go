//go:build !unix

package store

import (
	"errors"
	"os"
	"time"
)

var errLocked = errors.New("locked")

// guardFile does not check the file where there is no flock to keep its
// owner from writing it meanwhile; bbolt opens it as it is.
func guardFile(path string, readOnly bool, timeout time.Duration) error { return nil }

// lockStore takes no lock file where there is no flock; bbolt's own lock
// guards the store file.
func lockStore(path string, readOnly bool, timeout time.Duration) (*os.File, error) { return nil, nil }

// takeLock is lockStore; it never makes a file.
func takeLock(path string, readOnly bool, timeout time.Duration) (*os.File, bool, error) {
	return nil, false, nil
}

// dropNewLock is never called here: takeLock makes no file.
func dropNewLock(path string, f *os.File) error { return f.Close() }
