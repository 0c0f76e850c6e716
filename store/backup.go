package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/outpost-edge/outpost/internal/fsync"
	"go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the store to w while others keep
// writing: bbolt copies the file as of one read transaction. It returns the
// bytes written.
func (d *DB) Backup(ctx context.Context, w io.Writer) (int64, error) {
	n, _, err := d.backup(ctx, w)
	return n, err
}

// backup is Backup, and returns the stream count the copy holds too.
func (d *DB) backup(ctx context.Context, w io.Writer) (n int64, count uint64, err error) {
	err = d.view(func(tx *bbolt.Tx) error {
		copyProgressOf(ctx).start(tx.Size())
		count = streamCount(tx)
		var err error
		n, err = tx.WriteTo(ctxWriter{ctx, w})
		return err
	})
	if cerr := ctx.Err(); err != nil && cerr != nil {
		err = cerr // bbolt flattens the writer's error into text
	}
	if err != nil {
		return n, 0, fmt.Errorf("backup store %s: %w", d.path, err)
	}
	return n, count, nil
}

// BackupFile writes a consistent copy of the store to a new file at path,
// fsynced before it appears under its name, and stamps it a backup
// (stampBackup). It refuses to overwrite.
func (d *DB) BackupFile(ctx context.Context, path string) error {
	return writeNewFile(path, func(f *os.File) error {
		_, count, err := d.backup(ctx, f)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return err
		}
		return stampBackup(f.Name(), count)
	})
}

// A backup restored in place of its store takes the event stream's start
// count (NextStreamEpoch) back to what it was when the backup was taken,
// while the store it replaces may have started since and given a console
// client events under the counts that follow: the restored store would
// give new events numbers the client saw. So a backup is stamped in its
// meta pages (stampEpoch), which bbolt carries from one meta page to the
// next, with backupStamp, the hour it was taken and the count it holds;
// and the first start of a store whose count is still the one its stamp
// names moves the count past any its original can have reached
// (restoredEpoch). After that start the count differs from the stamp's,
// and the count goes on by one.

const (
	// backupStamp marks an epoch stamp as a backup's (stampBackup).
	backupStamp = 1 << 62
	// stampCountBits are the low bits of a backup's stamp, which hold
	// the count: counts stay below 2^21 (NextStreamEpoch). The bits
	// above, up to backupStamp, hold the hour it was taken (epochHours).
	stampCountBits = 21
)

// stampBackup stamps the backup at path, taken when the stream count was
// count (stampEpoch). A copy whose meta pages are not whole is not
// stamped: it does not check clean, and db backup removes it and says
// why; nor is one whose count does not fit.
func stampBackup(path string, count uint64) error {
	if count >= 1<<stampCountBits {
		return nil
	}
	err := stampEpoch(path, backupStamp|epochHours()<<stampCountBits|count)
	if err != nil && !errors.Is(err, ErrDamaged) {
		return fmt.Errorf("stamp the backup: %w", err)
	}
	return nil
}

// backupOf reads the epoch stamp of a backup (stampBackup): the count it
// holds and the hour it was taken; ok is false for any other stamp.
func backupOf(stamp uint64) (count, hour uint64, ok bool) {
	if stamp&backupStamp == 0 {
		return 0, 0, false
	}
	return stamp & (1<<stampCountBits - 1), stamp &^ backupStamp >> stampCountBits, true
}

// streamCount is the stream count (NextStreamEpoch) that tx reads, 0
// where the store has none.
func streamCount(tx *bbolt.Tx) uint64 {
	if meta := tx.Bucket([]byte(bucketMeta)); meta != nil && len(meta.Get(metaStreamEpoch)) == 8 {
		return binary.BigEndian.Uint64(meta.Get(metaStreamEpoch))
	}
	return 0
}

// restoredEpoch is the stream count from which a restored backup, taken
// when the count was count, in the hour hour (stampBackup), goes on at its
// first start: the greater of
//
//   - the floor plus the hours since salvageEpochBase (lostEpoch), above
//     any count a store that was never salvaged or restored reaches by
//     counting its starts;
//   - count plus salvageEpochStep plus the hours since the backup was
//     taken: past any count the original reached unless it started more
//     than that many times since.
//
// Both rise with the hour the backup is restored, so that the same backup
// restored again later goes on past the first restore's count, as long as
// that one started fewer times than the hours between. The count stays
// below 2^21 for 2^19 hours (60 years) from salvageEpochBase.
func restoredEpoch(count, hour uint64) uint64 {
	now := epochHours()
	return max(count+salvageEpochStep+now-min(hour, now), salvageEpochFloor+now)
}

// restoredStamp returns the epoch stamp of the store file at path where
// it is a backup that has not started since it was taken, holding count
// (stampBackup), else 0.
func restoredStamp(path string, count uint64) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	m0, m1, _ := readMetas(f, fi.Size())
	for _, m := range []boltMeta{m0, m1} {
		if c, _, ok := backupOf(m.epochStamp); m.valid && ok && c == count {
			return m.epochStamp
		}
	}
	return 0
}

// Compact writes a compacted copy of the store to a new file at dst: free
// pages are dropped and pages refilled, in the page size a new store gets
// (a store made with smaller pages takes DefaultPageSize this way). The
// copy is made from one read transaction, so writers may carry on
// meanwhile (their later commits are not in the copy).
func (d *DB) Compact(ctx context.Context, dst string) error {
	return compactTo(ctx, d.view, d.path, d.opts, dst)
}

// compactTo is Compact of the store file at path, read through view and
// opened with opts. The copy holds the file's records as they are, in its
// format version.
func compactTo(ctx context.Context, view func(func(*bbolt.Tx) error) error, path string, opts Options, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("compact store to %s: %w", dst, os.ErrExist)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("compact store: %w", err)
	}
	out, err := openBolt(dst, Options{Timeout: opts.Timeout, PageSize: opts.PageSize})
	if err != nil {
		// bbolt makes the file before it writes its first pages: on a
		// full disk that leaves an empty file, which is not a copy.
		return fmt.Errorf("compact store: create %s: %w", dst, errors.Join(err, removeIfExists(dst)))
	}
	err = view(func(tx *bbolt.Tx) error { return copyInto(ctx, out, tx, compactTxBytes) })
	var used int64
	var epoch uint64
	if err == nil {
		err = out.View(func(tx *bbolt.Tx) error {
			used = tx.Size()
			epoch = streamCount(tx)
			return nil
		})
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = trimFile(dst, used)
	}
	if err == nil {
		// The copy's transaction IDs start again from the first: its
		// stamp keeps the count it begins with (lostEpoch), and that it
		// is a backup not started since it was restored.
		stamp := epoch
		if st := restoredStamp(path, epoch); st != 0 {
			stamp = st
		}
		err = stampEpoch(dst, stamp)
	}
	if err == nil {
		err = fsync.Dir(filepath.Dir(dst))
	}
	if err != nil {
		return fmt.Errorf("compact store %s to %s: %w", path, dst, errors.Join(err, os.Remove(dst)))
	}
	return nil
}

// trimFile cuts the file at path down to size bytes, when it is longer,
// and fsyncs it. bbolt grows a file ahead of its pages, by up to 16 MB at a
// time; a compacted copy need not keep that room, so a store with nothing
// to drop does not come out of compaction larger than it went in.
func trimFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() > size {
		err = f.Truncate(size)
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// compactTxBytes bounds one transaction of a compaction's copy, and so
// the memory it takes on a large store.
const compactTxBytes = 64 << 20

// copyInto copies every bucket of src, nested ones and sequences included,
// into the empty store out, packing pages full, and commits every maxBytes
// of keys and values. It is bbolt's Compact, made to stop when ctx ends and
// to report the records it has copied to ctx's progress (see WithProgress).
func copyInto(ctx context.Context, out *bbolt.DB, src *bbolt.Tx, maxBytes int) error {
	tx, err := out.Begin(true)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	p, size := progressOf(ctx), 0
	// put writes one record, or makes one nested bucket (v nil), under the
	// bucket at path, after committing when the transaction is full.
	var put func(path [][]byte, k, v []byte, seq uint64) error
	put = func(path [][]byte, k, v []byte, seq uint64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if size += len(k) + len(v); size > maxBytes {
			if err := tx.Commit(); err != nil {
				return err
			}
			if tx, err = out.Begin(true); err != nil {
				return err
			}
			size = len(k) + len(v)
		}
		if len(path) == 0 { // a top-level bucket
			nb, err := tx.CreateBucket(k)
			if err != nil {
				return err
			}
			return nb.SetSequence(seq)
		}
		b := tx.Bucket(path[0])
		for _, name := range path[1:] {
			b = b.Bucket(name)
		}
		b.FillPercent = 1
		if v != nil {
			p.read()
			return b.Put(k, v)
		}
		nb, err := b.CreateBucket(k)
		if err != nil {
			return err
		}
		return nb.SetSequence(seq)
	}
	var walk func(path [][]byte, b *bbolt.Bucket) error
	walk = func(path [][]byte, b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v != nil {
				return put(path, k, v, 0)
			}
			child := b.Bucket(k)
			if err := put(path, k, nil, child.Sequence()); err != nil {
				return err
			}
			return walk(append(slices.Clip(path), k), child)
		})
	}
	err = src.ForEach(func(name []byte, b *bbolt.Bucket) error {
		if err := put(nil, name, nil, b.Sequence()); err != nil {
			return err
		}
		return walk([][]byte{name}, b)
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}

// Compaction is what CompactFile did.
type Compaction struct {
	// Before and After are the store file's sizes in bytes.
	Before, After int64
	// Removed names the leftovers of work that stopped midway (Leftovers)
	// that the compaction removed before it began.
	Removed []string
	// UpgradedFrom is the older format version of the store that the
	// compaction upgraded to the current one, or 0.
	UpgradedFrom int
}

// CompactFile compacts the store at path in place. It takes the store's
// lock, as a writer does, so it fails with ErrInUse while another process
// holds the store. It reads the store read-only: opening a store for
// writing commits (see DB.init), and a compaction that then failed (a disk
// that fills partway through the copy, an interrupt) would leave the file
// changed. The copy is written beside the store and renamed into its
// place; until then the store is byte for byte as it was. Leftovers of
// earlier work that stopped midway are removed first, under the lock.
//
// A store of an older format version comes out in the current one
// (compactUpgraded), upgraded as the first writable open would upgrade it
// in place, and checked before it takes the store's place.
func CompactFile(ctx context.Context, path string, opts Options) (c Compaction, err error) {
	if _, err := os.Stat(path); err != nil {
		return c, fmt.Errorf("compact store: %w", err)
	}
	dir := filepath.Dir(path)
	release, err := LockDir(dir, opts.Timeout)
	if err != nil {
		return c, fmt.Errorf("compact store %s: %w", path, err)
	}
	defer func() { err = errors.Join(err, release()) }()
	if c.Removed, err = removeLeftovers(dir); err != nil {
		return c, fmt.Errorf("compact store %s: remove what earlier work left: %w", path, err)
	}
	ro := opts
	ro.ReadOnly, ro.locked = true, true
	view, closeSrc, err := openToCopy(path, ro)
	if err != nil {
		return c, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return c, errors.Join(fmt.Errorf("compact store %s: %w", path, err), closeSrc())
	}
	c.Before = fi.Size()
	tmp := path + compactSuffix
	err = view(func(tx *bbolt.Tx) error {
		if v := storedVersion(tx); v < formatVersion {
			c.UpgradedFrom = v
		}
		return nil
	})
	switch {
	case err == nil && c.UpgradedFrom == 0:
		err = compactTo(ctx, view, path, opts, tmp)
	case err == nil:
		err = compactUpgraded(ctx, view, path, opts, tmp)
	}
	if err != nil {
		err = fmt.Errorf("%w; nothing was changed", err)
		if errors.Is(err, syscall.ENOSPC) {
			room := "up to its size"
			if c.UpgradedFrom != 0 {
				room = "up to twice its size (a store of an older format is copied once to be upgraded, then compacted)"
			}
			err = fmt.Errorf("%w: the copy is written beside the store and takes %s: make room in %s, and try again", err, room, dir)
		}
		return c, errors.Join(err, closeSrc())
	}
	if fp := failpoint.compactCopied; fp != nil {
		fp()
	}
	// The copy takes the file's place while the store's lock is still
	// held, so an Open waiting for it opens the copy. Rename is atomic: a
	// crash leaves one whole file or the other.
	if err := os.Rename(tmp, path); err != nil {
		return c, errors.Join(fmt.Errorf("compact store %s: %w", path, err), os.Remove(tmp), closeSrc())
	}
	err = fsync.Dir(dir)
	if cerr := closeSrc(); err == nil {
		err = cerr
	}
	if err != nil {
		return c, fmt.Errorf("compact store %s: %w", path, err)
	}
	if fi, err = os.Stat(path); err != nil {
		return c, fmt.Errorf("compact store %s: %w", path, err)
	}
	c.After = fi.Size()
	return c, nil
}

// openToCopy opens the store file at path read-only (opts) to be copied:
// through Open, or, where Open reads the file only once a writable open
// has upgraded it (ErrOlderFormat), as the bbolt file it is, whose pages
// Open has just found whole.
func openToCopy(path string, opts Options) (view func(func(*bbolt.Tx) error) error, closeFn func() error, err error) {
	d, err := Open(path, opts)
	if err == nil {
		return d.view, d.Close, nil
	}
	if !errors.Is(err, ErrOlderFormat) {
		return nil, nil, err
	}
	bdb, err := openBolt(path, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return bdb.View, bdb.Close, nil
}

// compactUpgraded is compactTo for a store of an older format version:
// the copy at dst comes out in the current version. A first copy, beside
// the store (upgradeSuffix), is upgraded by a writable open, as serve's
// first open would upgrade the store itself (DB.init), and compacted
// again, so that the pages the upgrade freed do not stay in the copy. The
// copy is then checked: one that does not check clean is removed.
func compactUpgraded(ctx context.Context, view func(func(*bbolt.Tx) error) error, path string, opts Options, dst string) error {
	stage := path + upgradeSuffix
	if err := compactTo(ctx, view, path, opts, stage); err != nil {
		return err
	}
	// The copy's upgrade and check read every record again; the progress
	// counts the records copied once.
	quiet := context.WithValue(ctx, progressKey{}, (*progress)(nil))
	err := func() error {
		up, err := Open(stage, Options{Timeout: opts.Timeout, PageSize: opts.PageSize, locked: true})
		if err != nil {
			return err
		}
		return errors.Join(up.Compact(quiet, dst), up.Close())
	}()
	if err == nil {
		err = checkCopy(quiet, dst, opts)
	}
	if err != nil {
		err = fmt.Errorf("compact store %s: the copy could not be upgraded to format version %d: %w; "+
			"open the store with serve or run first, which upgrade it in place, then compact it", path, formatVersion, err)
		return errors.Join(err, removeIfExists(stage), removeIfExists(dst))
	}
	return removeIfExists(stage)
}

// checkCopy checks the store copy at path, which must check clean.
func checkCopy(ctx context.Context, path string, opts Options) error {
	d, err := Open(path, Options{Timeout: opts.Timeout, ReadOnly: true, locked: true})
	if err != nil {
		return err
	}
	rep, err := d.Check(ctx)
	if err = errors.Join(err, d.Close()); err == nil && !rep.OK() {
		err = fmt.Errorf("check the copy: %d problem(s); first: %s", len(rep.Problems), rep.Problems[0])
	}
	return err
}

// compactSuffix ends the name of a compaction's copy, beside the store.
const compactSuffix = ".compact"

// upgradeSuffix ends the name of the first copy that the compaction of a
// store of an older format upgrades (compactUpgraded).
const upgradeSuffix = ".compact-upgrade"

// leftoverPatterns match the names of the files that work beside the store
// makes under a name of its own, and leaves behind when it stops midway (a
// crash, a kill): a compaction's copy, and the probe file that earlier
// versions made, before they took the store's lock, to see that the copy
// could be begun.
var leftoverPatterns = []string{FileName + compactSuffix, FileName + upgradeSuffix, FileName + ".probe-*"}

// Leftovers names the files in the data folder dir that work beside the
// store left when it stopped midway (leftoverPatterns). Each is of no use:
// db check names them, and the next compaction removes them.
func Leftovers(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list data folder %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		for _, p := range leftoverPatterns {
			if ok, _ := filepath.Match(p, e.Name()); ok && e.Type().IsRegular() {
				names = append(names, e.Name())
				break
			}
		}
	}
	return names, nil
}

// removeLeftovers removes the Leftovers of dir, and names them. The caller
// holds the store's lock, so none of them is in use.
func removeLeftovers(dir string) ([]string, error) {
	names, err := Leftovers(dir)
	if err != nil {
		return nil, err
	}
	for i, name := range names {
		if err := removeIfExists(filepath.Join(dir, name)); err != nil {
			return names[:i], err
		}
	}
	if len(names) > 0 {
		if err := fsync.Dir(dir); err != nil {
			return names, err
		}
	}
	return names, nil
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
		err = fsync.Dir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, errors.Join(err, removeIfExists(tmp)))
	}
	return nil
}

func removeIfExists(path string) error {
	// Asked first: on a read-only file system, removing a file that is not
	// there fails with EROFS, not ENOENT.
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ctxWriter stops a long copy when its context ends, and reports the
// copy's progress to the context's WithCopyProgress function.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.w.Write(p)
	if cp := copyProgressOf(c.ctx); cp != nil {
		cp.wrote(n)
	}
	return n, err
}

// WithCopyProgress returns a context under which Backup, BackupFile and
// Control.BackupFile call fn with the bytes copied so far and the copy's
// full size, every copyProgressEvery bytes, so that a long backup can show
// that it is moving. fn runs on the goroutine doing the copy.
func WithCopyProgress(ctx context.Context, fn func(copied, total int64)) context.Context {
	return context.WithValue(ctx, copyProgressKey{}, &copyProgress{fn: fn})
}

type copyProgressKey struct{}

type copyProgress struct {
	fn                   func(copied, total int64)
	total, copied, since int64
}

// start sets the full size of the copy about to begin.
func (p *copyProgress) start(total int64) {
	if p != nil {
		p.total, p.copied, p.since = total, 0, 0
	}
}

func (p *copyProgress) wrote(n int) {
	p.copied += int64(n)
	if p.since += int64(n); p.since >= copyProgressEvery {
		p.since = 0
		p.fn(p.copied, p.total)
	}
}

// copyProgressEvery is how many bytes a backup copies between two reports.
var copyProgressEvery int64 = 4 << 20

func copyProgressOf(ctx context.Context) *copyProgress {
	p, _ := ctx.Value(copyProgressKey{}).(*copyProgress)
	return p
}
