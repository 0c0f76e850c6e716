// Package fsync makes new names durable. Fsyncing a file makes its bytes
// durable, not the folder entry that names it: after a power cut, a file
// made and fsynced a moment before may be gone unless the folder that holds
// it was fsynced too. Dir does that for one folder; MkdirAll makes folders
// and fsyncs the folder above each one it made.
package fsync

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
)

var observer struct {
	sync.Mutex
	fn func(dir string)
}

// Observe makes Dir tell fn each folder it fsyncs, until the returned
// function is called. It is for tests that check a new name is made
// durable, which nothing else can observe.
func Observe(fn func(dir string)) (stop func()) {
	observer.Lock()
	defer observer.Unlock()
	observer.fn = fn
	return func() {
		observer.Lock()
		defer observer.Unlock()
		observer.fn = nil
	}
}

// Dir fsyncs the folder dir, which makes the files and folders made in it,
// and the renames done in it, durable.
func Dir(dir string) error {
	observer.Lock()
	if fn := observer.fn; fn != nil {
		fn(dir)
	}
	observer.Unlock()
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// MkdirAll makes dir and any missing parents, like os.MkdirAll, and fsyncs
// the folder that holds each one it made, top down.
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	var made []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			break
		}
		made = append(made, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for i := len(made) - 1; i >= 0; i-- {
		if err := Dir(filepath.Dir(made[i])); err != nil {
			return err
		}
	}
	return nil
}
