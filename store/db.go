package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// FileName is the store's file inside a data folder.
const FileName = "outpost.db"

// The format name and version live in the meta bucket. The version changes
// when a binary could misread an older file; it is checked at every Open.
//
// Version 2 keys checkpoints by ID first and adds the heads and branches
// buckets. Version 3 stores blobs as a log with an index (bloblog.go);
// a version 2 file is migrated when it is first opened for writing.
// Version 4 writes run records in a binary layout (run.go). This binary
// reads a version 3 file as it is, and stamps it version 4 when it first
// opens it for writing: from then on it may hold records that a version 3
// binary would report as corrupt, and that binary refuses it instead.
// Version 5 adds the recent bucket (recent.go), where a thread's newest
// checkpoints wait; a binary of version 4 would not see them. A version 3
// or 4 file is read as it is, and stamped version 5 (with an empty recent
// bucket) when first opened for writing.
// Version 6 keeps each run's outcome index in the runs bucket, beside the
// run's record, instead of in the outcomeruns bucket (ledger.go); a binary
// of version 5 would read those entries as corrupt run records. A file of
// version 3 to 5 is read as it is, and migrated and stamped version 6 when
// first opened for writing.
// Version 7 adds the unfinished bucket (unfinished.go), which indexes the
// runs that are queued, running or interrupted, kept in step with their
// records by every commit. A binary of version 6 would write run records
// without it, and the index would then miss runs that recovery must
// resume: it refuses the file instead. A file of version 3 to 6 is read
// as it is (its listings walk the run records), and stamped version 7,
// with the index built from its run records, when first opened for
// writing. The index is derived: a writable open that finds it missing
// builds it, whatever the version says.
// Version 1 files are refused: no store of that version was deployed, so
// there is no migration.
const (
	formatName    = "outpost-store"
	formatVersion = 7
)

// FormatVersion is the format version of the store files this binary
// writes; it reads older ones too (see above).
const FormatVersion = formatVersion

// Bucket names. Keys:
//
//	checkpoints  checkpointID \x00 thread \x00 ns
//	recent       as checkpoints: the newest few, kept inline (recent.go)
//	heads        thread \x00 ns                    -> the namespace's newest checkpoint ID
//	branches     thread \x00 ns \x00 checkpointID  -> empty
//	writes       thread \x00 ns \x00 checkpointID \x00 seq (8 bytes, big endian)
//	bloblog      seq (8 bytes) | hash (8 bytes) | length (4 bytes), big endian
//	blobindex    hash (8 bytes) | length (4 bytes)  -> seq (8 bytes)
//	runs         run ID; run ID \x00 "o" -> the run's outcome index entry
//	unfinished   run ID -> its status, for runs queued, running or interrupted
//	toolcalls    idempotency key
//
// Checkpoint IDs are time-ordered, so keying checkpoints by ID first makes
// the inserts of concurrent threads land together at the right edge of the
// B+tree: a group commit of many threads dirties a few leaf pages instead
// of one per thread. A namespace is then not a key range; it is reached
// from its heads and branches entries along parent links (see leaves.go).
const (
	bucketMeta        = "meta"
	bucketCheckpoints = "checkpoints"
	bucketRecent      = "recent"
	bucketHeads       = "heads"
	bucketBranches    = "branches"
	bucketWrites      = "writes"
	bucketBlobLog     = "bloblog"
	bucketBlobIndex   = "blobindex"
	bucketRuns        = "runs"
	bucketToolCalls   = "toolcalls"
	// bucketUnfinished (unfinished.go) is defined with the index.
	//
	// The outcome ledger (ledger.go): outcomes by seq (8 bytes, big
	// endian), and the uplink cursor.
	bucketOutcomes = "outcomes"
	bucketUplink   = "uplink"
	// Files of version 5 and before index each run's latest outcome by
	// run ID in a bucket of its own, which the first writable open moves
	// into the runs bucket (migrateOutcomeIndex).
	bucketOutcomeRuns = "outcomeruns"
)

var dataBuckets = []string{bucketCheckpoints, bucketRecent, bucketHeads, bucketBranches, bucketWrites, bucketBlobLog, bucketBlobIndex, bucketRuns, bucketToolCalls,
	bucketOutcomes, bucketUplink, bucketUnfinished}

// knownBuckets are the buckets a store file may hold: the meta bucket, the
// data buckets, and those of older versions that a writable open migrates.
var knownBuckets = append([]string{bucketMeta, bucketOutcomeRuns}, dataBuckets...)

var (
	// metaStreamEpoch counts the starts of the appliance's event stream
	// (NextStreamEpoch), 8 bytes big-endian.
	metaStreamEpoch = []byte("stream_epoch")
	metaFormat      = []byte("format")
	metaVersion     = []byte("version")
)

// Options configure Open.
type Options struct {
	// Timeout bounds Open's wait for the store's locks, all of them
	// together (the lock file, then the store file's own lock, which the
	// open-time check and bbolt take in turn). Zero means DefaultTimeout.
	Timeout time.Duration
	// ReadOnly opens the file without writing to it. Other read-only
	// openers may share it; a writer may not.
	ReadOnly bool
	// InitialMmapSize is how much of the file bbolt maps at open, in
	// bytes; zero means DefaultMmapSize. It takes address space, not
	// memory or disk.
	InitialMmapSize int
	// PageSize is the page size of a new store file, a power of two from
	// 1 KB up; zero means DefaultPageSize. A store keeps the page size it
	// was made with.
	PageSize int
	// ApplianceID is the id the ledger's outcomes carry. Empty keeps the
	// one recorded at first start (minted then when none was given). It
	// can change only while the ledger is empty (ErrApplianceID).
	ApplianceID string
	// Copy says the file is a copy of a store, such as a backup, opened to
	// be checked before it is restored: a refusal of a damaged file then
	// says that the copy cannot be restored, where a data folder's store
	// is told to be restored from the last backup.
	Copy bool
	// locked says that the caller already holds the store's lock file
	// (LockDir), which Open then does not take again: a compaction reads
	// its source read-only, so that it commits nothing to it, while it
	// holds the lock that keeps writers out.
	locked bool
}

// DamageAdvice is what to do about a store file found damaged, in the
// words a refusal to open it uses: for a copy (Copy), that it cannot be
// restored; for a data folder's store, to restore the last backup.
func (o Options) DamageAdvice() string { return o.damageAdvice(false) }

// damageAdvice is what to do about a store file refused as damaged;
// hollow, it holds nothing of a store at all.
func (o Options) damageAdvice(hollow bool) string {
	switch {
	case o.Copy:
		return "this copy cannot be restored: check an older backup, or, while the store itself is sound, take a new one (outpost db backup FILE)"
	case hollow:
		return "restore the last backup (outpost db backup makes one), or, if this is a new appliance whose first start never finished, remove the file and start again"
	}
	return "restore the last backup (outpost db backup makes one)"
}

// DefaultTimeout is how long Open waits for a store that another process
// holds before it fails with ErrInUse: half a second, so that a second
// process on the same data folder is told within a second that the folder
// is in use (the requirement), rather than hanging. The locks are tried
// every 50 ms; TestSecondOpenFailsFast measures the error at 0.502 s, where
// a one-second wait gave 1.005 s. Half a second still rides out another
// command that holds the store for a moment; a process that owns it, such
// as serve, does not let go however long one waits.
const DefaultTimeout = 500 * time.Millisecond

// DefaultPageSize is the page size of a new store: 8 KB, twice the usual
// OS page. A commit writes every page from a changed record up to its
// bucket's root, so shallower trees mean fewer pages per commit, and the
// fsync that follows costs more per page than per byte. On the reference
// workload, against 4 KB pages: 3.6 pages per transaction instead of 4.1
// with one thread, 17 instead of 21 with 64, and 1.08 and 1.12 times the
// turns a second (interleaved runs, medians).
const DefaultPageSize = 8192

// DefaultMmapSize is how much of a store file is mapped at open: 1 GiB of
// address space on 64-bit systems (on 32-bit ones, zero: bbolt's own
// default). bbolt otherwise maps a file at its size rounded up, and maps it
// again, twice as large, each time its pages outgrow the map: that waits
// for every read transaction to end, holds up the new ones, and stalls the
// write that needed it, a dozen times while a store grows to a few
// megabytes. On the reference workload with 64 threads, with growStep
// (interleaved runs, 8 pairs a round, medians of the pair ratios): 1.04 to
// 1.11 times the turns a second in exit durability (three rounds), 1.02 to
// 1.05 in sync (three rounds); with one thread, 1.03 (5 pairs).
const DefaultMmapSize = 1 << 30 >> (64 - strconv.IntSize)

// growStep is how much bbolt grows a store file by at a time (its
// AllocSize), beyond the pages the growing transaction needs. With a map
// larger than the file (DefaultMmapSize), bbolt grows the file by
// AllocSize, 16 MB by default, which would make a new store 16 MB on disk;
// a megabyte keeps a small store small, for one ftruncate and fsync per
// megabyte the store grows.
const growStep = 1 << 20

// openBolt opens the bbolt file at path with o's options and growStep.
func openBolt(path string, o Options) (*bbolt.DB, error) {
	db, err := bbolt.Open(path, 0o600, o.bolt())
	if err == nil {
		db.AllocSize = growStep // read only by write transactions, none yet
	}
	return db, err
}

// bolt is the bbolt options of a store file opened with o; a new file
// (a compacted or salvaged copy too) is made with o's page size.
func (o Options) bolt() *bbolt.Options {
	return &bbolt.Options{
		Timeout: o.Timeout,
		// The hashmap freelist keeps allocation cheap however many pages
		// are free. The array freelist, which hands out the lowest free
		// pages, ran the one-thread workload 1.025 times as fast (a
		// commit's pages lie closer together, and the fsync is cheaper
		// for it), but it searches and shifts its array on every
		// allocation: a small commit took 90 µs instead of 35 with 17,500
		// free pages, and 372 instead of 32 with 98,000, as a prune of a
		// large store leaves. Not syncing the freelist saves a page write
		// per commit; bbolt rebuilds it by scanning at open.
		FreelistType:    bbolt.FreelistMapType,
		NoFreelistSync:  true,
		ReadOnly:        o.ReadOnly,
		InitialMmapSize: cmp.Or(o.InitialMmapSize, DefaultMmapSize),
		PageSize:        cmp.Or(o.PageSize, DefaultPageSize),
	}
}

// DB is an Outpost store in one bbolt file. It implements engine.Store and
// is safe for concurrent use.
type DB struct {
	db   *bbolt.DB
	path string
	opts Options
	q    committer
	tail blobTail
	// trail holds the newest checkpoints' flags, for outcomes
	// (flagtrail.go).
	trail flagTrail
	// lock is the held lock file (see lockStore), or nil; released once.
	lock     *os.File
	unlocked sync.Once

	applianceMu sync.RWMutex
	appliance   string
	// noRecent is set when a version 3 or 4 file is opened read-only: it
	// has no recent bucket (recent.go).
	noRecent bool
	// noIndex is set when a file of version 6 or before is opened
	// read-only: it has no unfinished bucket (unfinished.go).
	noIndex bool
	// upgradedFrom is the format version of an older file that this
	// (writable) open upgraded, else 0.
	upgradedFrom int
	// lostCallsMarked is set when a run of the store may carry the mark
	// of salvage (lostcalls.go), as it opened.
	lostCallsMarked bool
}

var _ engine.Store = (*DB)(nil)

// OpenDir opens (creating them if needed) the data folder and the store in
// it.
func OpenDir(dir string, opts Options) (*DB, error) {
	if !opts.ReadOnly {
		if err := fsync.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create data folder %s: %w", dir, err)
		}
	}
	return Open(filepath.Join(dir, FileName), opts)
}

// Open opens the store file at path, creating it if it does not exist
// (atomically, see createStore). It fails with ErrInUse when another
// process holds the file, with ErrFormat when the file is not an Outpost
// store of a version this binary reads, and with ErrDamaged when it is a
// store whose pages are not whole, or a file that holds nothing of a store
// (empty, all zeros): an existing file is never made a new store.
func Open(path string, opts Options) (*DB, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	// One deadline for the three locks taken in turn, so that the wait
	// stays within Timeout however it is shared. Each is tried at least
	// once: a zero timeout would make bbolt wait for ever.
	deadline := time.Now().Add(opts.Timeout)
	left := func() time.Duration { return max(time.Until(deadline), time.Nanosecond) }
	inUse := func() error { return fmt.Errorf("open store: data folder %s is %w", filepath.Dir(path), ErrInUse) }
	var lock *os.File
	newLock := false
	var err error
	if !opts.locked {
		lock, newLock, err = takeLock(path, opts.ReadOnly, opts.Timeout)
	}
	switch {
	case errors.Is(err, errLocked):
		return nil, inUse()
	case err != nil:
		return nil, fmt.Errorf("open store %s: lock file: %w", path, err)
	}
	// A store refused (damaged, empty, of another format) leaves the
	// folder as it was: the lock file this Open made goes with it.
	unlock := func(err error) error {
		switch {
		case lock != nil && newLock:
			err = errors.Join(err, dropNewLock(path, lock))
		case lock != nil:
			err = errors.Join(err, lock.Close())
		}
		return err
	}
	created := false
	if !opts.ReadOnly {
		if created, err = createStore(path, opts); err != nil {
			return nil, unlock(fmt.Errorf("open store %s: create a new store: %w", path, err))
		}
	}
	var nothing *hollowError
	switch err := guardFile(path, opts.ReadOnly, left()); {
	case errors.Is(err, errLocked):
		return nil, unlock(inUse())
	case errors.As(err, &nothing):
		return nil, unlock(fmt.Errorf("open store %s: %w; nothing was changed: %s", path, err, opts.damageAdvice(true)))
	case errors.Is(err, ErrDamaged):
		return nil, unlock(fmt.Errorf("open store %s: %w; nothing was changed: %s", path, err, opts.damageAdvice(false)))
	case err != nil:
		return nil, unlock(fmt.Errorf("open store %s: %w", path, err))
	}
	bopts := opts
	bopts.Timeout = left()
	bdb, err := openBolt(path, bopts)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, unlock(inUse())
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, unlock(fmt.Errorf("open store %s: %w: not a bbolt file of a supported version (%v)", path, ErrFormat, err))
	case err != nil:
		return nil, unlock(fmt.Errorf("open store %s: %w", path, err))
	}
	d := &DB{db: bdb, path: path, opts: opts, lock: lock}
	d.q.db, d.q.tail = bdb, &d.tail
	if err := d.init(); err != nil {
		return nil, unlock(errors.Join(err, bdb.Close()))
	}
	if !opts.ReadOnly && !created {
		// bbolt fsyncs the file's pages, not the folder entry that names
		// a file: without this, a power cut could lose the whole store
		// along with commits already acknowledged. createStore does it for
		// the file it makes; every other writable open does it too, in
		// case the process that made the file (an older outpost, which let
		// bbolt make it in place) stopped before it did.
		if err := fsync.Dir(filepath.Dir(path)); err != nil {
			return nil, unlock(errors.Join(fmt.Errorf("open store %s: make the new file durable: %w", path, err), bdb.Close()))
		}
	}
	err = d.view(func(tx *bbolt.Tx) error {
		if err := d.tail.load(tx); err != nil {
			return err
		}
		observeNewestIDs(tx)
		d.lostCallsMarked = lostCallsMarked(tx, d.noIndex)
		return nil
	})
	if err != nil {
		return nil, unlock(errors.Join(fmt.Errorf("open store %s: read the blob log: %w", path, err), bdb.Close()))
	}
	if !opts.ReadOnly {
		d.q.runway = openRunway(path)
	}
	return d, nil
}

// createStore makes a new, empty store file at path when there is none,
// and reports whether it did. bbolt would make it in place, and a crash or
// a full disk before its first pages reached the disk would leave an empty
// or partial file there, which no later Open can tell from a store that
// lost its contents (it refuses both as damaged). So the file is made
// under a temporary name in the same folder, with opts' page size, fsynced,
// renamed into place, and the folder fsynced: path then names a whole
// store file or nothing. The caller holds the store's lock (lockStore), so
// a temporary file already there is the leftover of a creation that
// stopped, and is replaced. The format is stamped by Open's first
// transaction, as for a file that bbolt made: a store file that holds no
// bucket is new (init).
func createStore(path string, opts Options) (bool, error) {
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		return false, nil // a file to open, or an error that opening it reports
	}
	tmp := path + ".create"
	if err := removeIfExists(tmp); err != nil {
		return false, err
	}
	err := func() error {
		bdb, err := openBolt(tmp, opts)
		if err != nil {
			return err
		}
		if err := bdb.Close(); err != nil {
			return err
		}
		// bbolt fdatasyncs the pages it writes; this makes sure of the
		// file as a whole, whatever bbolt does.
		f, err := os.OpenFile(tmp, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		return errors.Join(f.Sync(), f.Close())
	}()
	if err == nil && failpoint.storeMade != nil {
		err = failpoint.storeMade(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return false, errors.Join(err, removeIfExists(tmp))
	}
	return true, fsync.Dir(filepath.Dir(path))
}

// init stamps a new file with the format, or checks an existing file's.
func (d *DB) init() error {
	// stale is set for a file of a version before the unfinished index:
	// whatever such a bucket it holds is not to be trusted.
	stale := false
	check := func(tx *bbolt.Tx) (fresh bool, err error) {
		meta := tx.Bucket([]byte(bucketMeta))
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bbolt.Bucket) error { empty = false; return nil })
			if !empty {
				return false, fmt.Errorf("open store %s: %w: the file holds data but no format record", d.path, ErrFormat)
			}
			return true, nil
		}
		if f := meta.Get(metaFormat); string(f) != formatName {
			return false, fmt.Errorf("open store %s: %w: format %q, want %q", d.path, ErrFormat, f, formatName)
		}
		v, err := strconv.Atoi(string(meta.Get(metaVersion)))
		if err == nil && v == 2 {
			if !tx.Writable() {
				return false, &formatNote{ErrOlderFormat, fmt.Sprintf("open store %s: %v: format version 2 is upgraded to version %d the first time it is opened "+
					"for writing (outpost serve or run do that), not read-only: open it with serve or run first", d.path, ErrFormat, formatVersion)}
			}
			stale, d.upgradedFrom = true, v
			return false, migrateBlobs(tx)
		}
		if err == nil && v >= 3 && v < formatVersion {
			if !tx.Writable() {
				// Its records are all of versions this binary reads. A
				// version 3 or 4 file has no recent bucket, which reads as
				// empty; the outcome index of any of them is in its old
				// bucket, which check reads; none has the unfinished index,
				// and its listings walk the run records.
				d.noRecent, d.noIndex = v < 5, true
				return false, nil
			}
			stale, d.upgradedFrom = true, v
			return false, meta.Put(metaVersion, []byte(strconv.Itoa(formatVersion)))
		}
		if err == nil && v < formatVersion {
			return false, fmt.Errorf("open store %s: %w: format version %q, this binary reads version %d; "+
				"the file was written by an older outpost and cannot be migrated: move it aside and start with an empty data folder",
				d.path, ErrFormat, meta.Get(metaVersion), formatVersion)
		}
		if err != nil || v != formatVersion {
			return false, fmt.Errorf("open store %s: %w: format version %q, this binary reads version %d",
				d.path, ErrFormat, meta.Get(metaVersion), formatVersion)
		}
		return false, nil
	}
	if d.opts.ReadOnly {
		return d.db.View(func(tx *bbolt.Tx) error {
			fresh, err := check(tx)
			if err == nil && fresh {
				err = fmt.Errorf("open store %s: %w: the file is empty", d.path, ErrFormat)
			}
			if err == nil {
				err = d.checkBuckets(tx, false)
			}
			if err == nil {
				d.appliance = string(bucket(tx, bucketMeta).Get(metaAppliance))
			}
			return err
		})
	}
	err := d.db.Update(func(tx *bbolt.Tx) error {
		fresh, err := check(tx)
		if err != nil {
			return err
		}
		if fresh {
			meta, err := tx.CreateBucket([]byte(bucketMeta))
			if err != nil {
				return err
			}
			if err := meta.Put(metaFormat, []byte(formatName)); err != nil {
				return err
			}
			if err := meta.Put(metaVersion, []byte(strconv.Itoa(formatVersion))); err != nil {
				return err
			}
		}
		if !fresh {
			if err := d.checkBuckets(tx, true); err != nil {
				return err
			}
		}
		// Before the other buckets are made: a missing runs bucket is
		// made empty, and so is the index of its runs.
		if stale || tx.Bucket([]byte(bucketUnfinished)) == nil {
			if err := buildUnfinished(tx); err != nil {
				return err
			}
		}
		// Buckets added later within one format version are created on
		// first open, so old files of the same version stay readable.
		for _, name := range dataBuckets {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		// Whatever the version says: a salvaged copy whose format
		// records were lost is stamped with this binary's.
		if err := migrateOutcomeIndex(tx); err != nil {
			return err
		}
		d.appliance, err = initApplianceID(tx, d.opts.ApplianceID)
		return err
	})
	if err != nil && !errors.Is(err, ErrFormat) && !errors.Is(err, ErrDamaged) {
		return fmt.Errorf("initialize store %s: %w", d.path, err)
	}
	return err
}

// observeNewestIDs hands the newest checkpoint and run ids to the engine's
// id generator (see engine.ObserveID). Both buckets are keyed by id first,
// so the newest is the last key.
func observeNewestIDs(tx *bbolt.Tx) {
	if k := openCheckpoints(tx).lastKey(); k != nil {
		if _, _, id, ok := splitCheckpointKey(k); ok {
			engine.ObserveID(id)
		}
	}
	if k, _ := bucket(tx, bucketRuns).Cursor().Last(); k != nil {
		// The newest run's outcome index entry may follow its record.
		engine.ObserveID(strings.TrimSuffix(string(k), outcomeIndexSuffix))
	}
}

// checkBuckets refuses a store that lacks a bucket it cannot do without.
// A writable open adds the buckets a later binary of the same format
// version introduced, unless a bucket of a name the store does not know
// stands beside the missing one: then a damaged page has most likely
// changed its name, and an empty bucket in its place would hide its
// records. A read-only open cannot add them.
func (d *DB) checkBuckets(tx *bbolt.Tx, writable bool) error {
	var missing, unknown []string
	for _, name := range dataBuckets {
		if bucket(tx, name) == nil && d.needs(name) {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	_ = tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
		if !slices.Contains(knownBuckets, string(name)) {
			unknown = append(unknown, fmt.Sprintf("%q", name))
		}
		return nil
	})
	switch {
	case len(unknown) > 0:
		return fmt.Errorf("open store %s: %w: bucket %s is missing, and the file holds %s, which the store does not know: "+
			"nothing was changed: %s", d.path, ErrDamaged, strings.Join(missing, ", "), strings.Join(unknown, ", "), d.opts.damageAdvice(false))
	case !writable && d.opts.Copy:
		return &formatNote{ErrBucketsMissing, fmt.Sprintf("open store %s: %v: bucket %s is missing; a store restored from this copy gets it when it is first opened for writing (by serve or run)",
			d.path, ErrFormat, strings.Join(missing, ", "))}
	case !writable:
		return &formatNote{ErrBucketsMissing, fmt.Sprintf("open store %s: %v: bucket %s is missing; opening the store for writing once adds it",
			d.path, ErrFormat, strings.Join(missing, ", "))}
	}
	return nil
}

// needs reports whether the file must hold the data bucket name: all of
// them, but the recent bucket of a version 3 or 4 file opened read-only,
// and the unfinished bucket of a file of version 6 or before opened so.
func (d *DB) needs(name string) bool {
	switch name {
	case bucketRecent:
		return !d.noRecent
	case bucketUnfinished:
		return !d.noIndex
	}
	return true
}

// formatNote is a refusal that is an ErrFormat, and kind (ErrBucketsMissing,
// ErrOlderFormat), with what to do about it.
type formatNote struct {
	kind error
	msg  string
}

func (e *formatNote) Error() string { return e.msg }

func (e *formatNote) Is(target error) bool {
	return target == e.kind || target == ErrFormat
}

// UpgradedFrom is the format version of the older store file that this
// open upgraded to the current one (a writable open does, in its first
// transaction), or 0 when the file was of the current version.
func (d *DB) UpgradedFrom() int { return d.upgradedFrom }

// storedVersion is the format version that tx's meta bucket records, or 0
// where it records none that reads as a number.
func storedVersion(tx *bbolt.Tx) int {
	meta := tx.Bucket([]byte(bucketMeta))
	if meta == nil {
		return 0
	}
	v, _ := strconv.Atoi(string(meta.Get(metaVersion)))
	return v
}

// Close releases the file. Commits still in flight finish first.
func (d *DB) Close() error {
	err := d.db.Close()
	err = errors.Join(err, d.q.runway.close()) // after bbolt's: no transaction uses it now
	if d.lock != nil {
		d.unlocked.Do(func() { err = errors.Join(err, d.lock.Close()) })
	}
	if err != nil {
		return fmt.Errorf("close store %s: %w", d.path, err)
	}
	return nil
}

// LockDir takes the store lock of the data folder dir, the one Open takes
// first, without opening the store: for work beside the store that must
// not happen while another process (serve) owns the folder. It fails with
// ErrInUse within timeout (zero means DefaultTimeout). release lets go, and
// removes the lock file when LockDir made it.
func LockDir(dir string, timeout time.Duration) (release func() error, err error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	path := filepath.Join(dir, FileName)
	lock, created, err := takeLock(path, false, timeout)
	switch {
	case errors.Is(err, errLocked):
		return nil, fmt.Errorf("data folder %s is %w", dir, ErrInUse)
	case err != nil:
		return nil, fmt.Errorf("lock data folder %s: %w", dir, err)
	}
	return func() error {
		switch {
		case lock == nil:
			return nil
		case created:
			return dropNewLock(path, lock)
		}
		return lock.Close()
	}, nil
}

// LockFile names the lock file of the store file at path: an empty file
// beside it that Open locks, and that nothing replaces. An Open that fails
// removes the one it made, so that a refused store leaves no file behind.
func LockFile(path string) string { return path + ".lock" }

// Path returns the store file's path.
func (d *DB) Path() string { return d.path }

// Size returns the store file's size in bytes.
func (d *DB) Size() (int64, error) {
	fi, err := os.Stat(d.path)
	if err != nil {
		return 0, fmt.Errorf("store size: %w", err)
	}
	return fi.Size(), nil
}

// view runs fn in a read transaction, mapping a closed database to
// ErrClosed.
func (d *DB) view(fn func(tx *bbolt.Tx) error) error {
	err := d.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// viewBlobs runs fn in a read transaction, with the blob store as it sees
// it.
func (d *DB) viewBlobs(fn func(b *blobs) error) error {
	return d.view(func(tx *bbolt.Tx) error { return fn(openBlobs(tx, &d.tail, nil)) })
}

// bucket opens a top-level bucket. In a write transaction it sets the
// bucket's fill percent (see fillPercent), for the buckets it writes only.
func bucket(tx *bbolt.Tx, name string) *bbolt.Bucket {
	b := tx.Bucket([]byte(name))
	if b != nil && tx.Writable() {
		if fill, ok := fillPercent[name]; ok {
			b.FillPercent = fill
		}
	}
	return b
}

// Composite keys. Parts are joined with NUL, which validKeyPart keeps out of
// the parts themselves, so a prefix names exactly one thread, namespace or
// checkpoint.

// nsKey names a thread's namespace: the key of its heads entry.
func nsKey(thread, ns string) []byte {
	b := make([]byte, 0, len(thread)+len(ns)+1)
	b = append(b, thread...)
	b = append(b, 0)
	return append(b, ns...)
}

// nsPrefix starts the keys of a namespace's branches and pending writes.
func nsPrefix(thread, ns string) []byte {
	return append(nsKey(thread, ns), 0)
}

func checkpointKey(thread, ns, id string) []byte {
	b := make([]byte, 0, len(id)+len(thread)+len(ns)+2)
	b = append(b, id...)
	b = append(b, 0)
	b = append(b, thread...)
	b = append(b, 0)
	return append(b, ns...)
}

func branchKey(thread, ns, id string) []byte {
	return append(nsPrefix(thread, ns), id...)
}

func writesPrefix(thread, ns, ckpt string) []byte {
	return append(branchKey(thread, ns, ckpt), 0)
}

// splitCheckpointKey returns thread, ns and ID.
func splitCheckpointKey(k []byte) (thread, ns, id string, ok bool) {
	parts := bytes.SplitN(k, []byte{0}, 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return string(parts[1]), string(parts[2]), string(parts[0]), true
}

// splitNSKey returns the thread and namespace of a heads key.
func splitNSKey(k []byte) (thread, ns string, ok bool) {
	t, n, ok := bytes.Cut(k, []byte{0})
	if !ok || bytes.IndexByte(n, 0) >= 0 {
		return "", "", false
	}
	return string(t), string(n), true
}

// splitBranchKey returns the thread, namespace and ID of a branches key.
func splitBranchKey(k []byte) (thread, ns, id string, ok bool) {
	parts := bytes.SplitN(k, []byte{0}, 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return string(parts[0]), string(parts[1]), string(parts[2]), true
}

// splitWriteKey returns thread \x00 ns \x00 checkpointID, the part of a
// pending write's key that names its checkpoint.
func splitWriteKey(k []byte) (ckptKey []byte, ok bool) {
	if len(k) < 9 || k[len(k)-9] != 0 {
		return nil, false
	}
	return k[:len(k)-9], true
}

// writeCheckpoint returns the checkpoint a pending write's key names, and
// the key it has in the checkpoints bucket; ok is false for a malformed key.
func writeCheckpoint(k []byte) (thread, ns, id string, ckpt []byte, ok bool) {
	ck, ok := splitWriteKey(k)
	if !ok {
		return "", "", "", nil, false
	}
	if thread, ns, id, ok = splitBranchKey(ck); !ok {
		return "", "", "", nil, false
	}
	return thread, ns, id, checkpointKey(thread, ns, id), true
}

func blobKey(ref engine.BlobRef) []byte {
	k := make([]byte, 12)
	binary.BigEndian.PutUint64(k, ref.Hash)
	binary.BigEndian.PutUint32(k[8:], ref.Len)
	return k
}

func parseBlobKey(k []byte) (engine.BlobRef, bool) {
	if len(k) != 12 {
		return engine.BlobRef{}, false
	}
	return engine.BlobRef{Hash: binary.BigEndian.Uint64(k), Len: binary.BigEndian.Uint32(k[8:])}, true
}

func validKeyPart(what, s string, required bool) error {
	if required && s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalidKey, what)
	}
	if bytes.IndexByte([]byte(s), 0) >= 0 {
		return fmt.Errorf("%w: %s %q holds a NUL byte", ErrInvalidKey, what, s)
	}
	return nil
}

// lastWithPrefix positions c on the greatest key starting with prefix.
func lastWithPrefix(c *bbolt.Cursor, prefix []byte) (k, v []byte) {
	k, v = c.Seek(prefixEnd(prefix))
	if k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return nil, nil
	}
	return k, v
}

// prefixEnd returns the least key greater than every key with prefix.
// Prefixes here end in NUL, so incrementing the last byte never carries.
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// NextStreamEpoch counts one more start of the appliance's event stream
// and returns the count, from 1; the first start of a restored backup
// moves it past any its original can have reached (stampBackup), and any
// start past the greatest count a start of a store file at this path gave
// out (streamMarkFile), which it then records there. serve numbers its
// events from the count shifted 32 bits up, so that numbers go on rising
// across restarts (a client resuming from an earlier life is told so) and
// stay exact in a JavaScript number (2^21 starts of 2^32 events each).
func (d *DB) NextStreamEpoch() (uint64, error) {
	mark, err := readStreamMark(d.path)
	if err != nil {
		return 0, fmt.Errorf("count the event stream's start: %w", err)
	}
	var n uint64
	err = d.db.Update(func(tx *bbolt.Tx) error {
		meta := bucket(tx, bucketMeta)
		if v := meta.Get(metaStreamEpoch); v != nil {
			if len(v) != 8 {
				return corrupt(bucketMeta, metaStreamEpoch, errTruncated)
			}
			n = binary.BigEndian.Uint64(v)
		}
		if count, hour, ok := backupOf(restoredStamp(d.path, n)); ok {
			n = max(n, restoredEpoch(count, hour)) // see stampBackup
		}
		n = max(n, mark) + 1
		// Recorded before the count commits: a mark ahead of the file
		// only moves the next start further on.
		if err := writeStreamMark(d.path, n); err != nil {
			return err
		}
		return meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, n))
	})
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		err = ErrClosed
	}
	if err != nil {
		return 0, fmt.Errorf("count the event stream's start: %w", err)
	}
	return n, nil
}
