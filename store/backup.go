package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the store to w while others keep
// writing: bbolt copies the file as of one read transaction. It returns the
// bytes written.
func (d *DB) Backup(ctx context.Context, w io.Writer) (int64, error) {
	var n int64
	err := d.view(func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(ctxWriter{ctx, w})
		return err
	})
	if cerr := ctx.Err(); err != nil && cerr != nil {
		err = cerr // bbolt flattens the writer's error into text
	}
	if err != nil {
		return n, fmt.Errorf("backup store %s: %w", d.path, err)
	}
	return n, nil
}

// BackupFile writes a consistent copy of the store to a new file at path,
// fsynced before it appears under its name. It refuses to overwrite.
func (d *DB) BackupFile(ctx context.Context, path string) error {
	return writeNewFile(path, func(f *os.File) error {
		_, err := d.Backup(ctx, f)
		return err
	})
}

// Compact writes a compacted copy of the store to a new file at dst: free
// pages are dropped and pages refilled. The copy is made from one read
// transaction, so writers may carry on meanwhile (their later commits are
// not in the copy).
func (d *DB) Compact(ctx context.Context, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("compact store to %s: %w", dst, os.ErrExist)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("compact store: %w", err)
	}
	out, err := bbolt.Open(dst, 0o600, &bbolt.Options{
		Timeout: d.opts.Timeout, FreelistType: bbolt.FreelistMapType, NoFreelistSync: true,
	})
	if err != nil {
		return fmt.Errorf("compact store: create %s: %w", dst, err)
	}
	// bbolt commits every txMaxSize bytes, bounding memory on large stores.
	err = bbolt.Compact(out, d.db, 64<<20)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(filepath.Dir(dst))
	}
	if err != nil {
		return fmt.Errorf("compact store %s to %s: %w", d.path, dst, errors.Join(err, os.Remove(dst)))
	}
	return nil
}

// CompactFile compacts the store at path in place. It opens the store
// itself, so it fails with ErrInUse while another process holds it.
func CompactFile(ctx context.Context, path string, opts Options) (before, after int64, err error) {
	d, err := Open(path, opts)
	if err != nil {
		return 0, 0, err
	}
	if before, err = d.Size(); err != nil {
		return 0, 0, errors.Join(err, d.Close())
	}
	tmp := path + ".compact"
	_ = os.Remove(tmp) // a leftover of an interrupted compaction
	if err := d.Compact(ctx, tmp); err != nil {
		return before, 0, errors.Join(err, d.Close())
	}
	if fp := failpoint.compactCopied; fp != nil {
		fp()
	}
	// The copy takes the file's place while the store's lock is still
	// held, so an Open waiting for it opens the copy. Rename is atomic: a
	// crash leaves one whole file or the other.
	if err := os.Rename(tmp, path); err != nil {
		return before, 0, errors.Join(fmt.Errorf("compact store %s: %w", path, err), os.Remove(tmp), d.Close())
	}
	err = syncDir(filepath.Dir(path))
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return before, 0, fmt.Errorf("compact store %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return before, 0, fmt.Errorf("compact store %s: %w", path, err)
	}
	return before, fi.Size(), nil
}

// writeNewFile writes a file through a temporary name, fsyncs it and
// renames it into place, so path never holds a partial copy.
func writeNewFile(path string, write func(f *os.File) error) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("write %s: %w", path, os.ErrExist)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("write %s: %s is in the way, left by a copy that did not finish or made by someone else: "+
			"remove it if it is not yours to keep, and try again: %w", path, tmp, err)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, errors.Join(err, removeIfExists(tmp)))
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// ctxWriter stops a long copy when its context ends.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}
