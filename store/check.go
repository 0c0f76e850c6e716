package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/outpost-edge/outpost/engine"
)

// CheckReport is the outcome of Check. The store is sound when Problems is
// empty.
type CheckReport struct {
	// Records counts the records read, by bucket.
	Records  map[string]int `json:"records"`
	Problems []Problem      `json:"problems"`
	// Space is how the file's bytes are used; nil when bbolt's page check
	// found problems, since the pages are then not safe to count.
	Space *Space `json:"space,omitempty"`
	// Leftovers names the files beside a data folder's store that work
	// which stopped midway left there (see Leftovers). They are of no use
	// and take room; the store is sound all the same.
	Leftovers []string `json:"leftovers,omitempty"`
	// Stranded names the runs waiting for a person that cannot go on,
	// because the bundle each is pinned to is on disk nowhere (or does
	// not load), and the runs held for their pinned bundles (Held). The
	// store cannot tell: the caller that reads the data folder's firmware
	// fills it in (outpost db check). The store is sound all the same.
	Stranded []StrandedRun `json:"stranded,omitempty"`
}

// StrandedRun is a run waiting for a person whose pinned bundle cannot be
// had, and why; or, with Held, a run left unfinished (stored as queued or
// running) that waits for its pinned bundle, unavailable until the same
// bundle is installed again (engine.Run.Held).
type StrandedRun struct {
	Run    string           `json:"run"`
	Bundle engine.BundleRef `json:"bundle"`
	Reason string           `json:"reason"`
	Held   bool             `json:"held,omitempty"`
}

// Space is how a store file's bytes are used. Pages in use and free pages
// lie below the high-water mark; the file beyond it is room to grow into.
type Space struct {
	PageSize  int   `json:"page_size"`
	FileBytes int64 `json:"file_bytes"`
	// UsedBytes is the pages that hold data, the two meta pages included.
	UsedBytes int64 `json:"used_bytes"`
	// FreeBytes is the free pages below the high-water mark: new pages go
	// there first, and db compact gives them back to the file system.
	FreeBytes int64 `json:"free_bytes"`
}

// MarshalJSON writes an empty Problems as [], not null, so that a script
// reading db check --json gets a list either way.
func (r CheckReport) MarshalJSON() ([]byte, error) {
	type plain CheckReport
	if r.Problems == nil {
		r.Problems = []Problem{}
	}
	return json.Marshal(plain(r))
}

// OK reports whether Check found nothing wrong.
func (r *CheckReport) OK() bool { return len(r.Problems) == 0 }

// Problem is one thing Check found wrong. Bucket and Key are empty for
// problems of the file itself.
type Problem struct {
	Bucket string `json:"bucket,omitempty"`
	// Key is printable: blob keys as references, outcome keys as seq
	// numbers, others as they are when printable text, Go-quoted otherwise.
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	switch {
	case p.Bucket == "":
		return p.Message
	case p.Key == "":
		return fmt.Sprintf("%s: %s", p.Bucket, p.Message)
	}
	return fmt.Sprintf("%s %s: %s", p.Bucket, p.Key, p.Message)
}

// spaceOf counts the pages of the store tx reads.
func spaceOf(tx *bbolt.Tx) *Space {
	ps := int64(tx.DB().Info().PageSize)
	st := tx.Cursor().Bucket().Stats() // the root bucket, and every bucket in it
	pages := int64(st.BranchPageN+st.BranchOverflowN+st.LeafPageN+st.LeafOverflowN) + 2
	sp := &Space{PageSize: int(ps), UsedBytes: pages * ps, FreeBytes: max(tx.Size()-pages*ps, 0)}
	if fi, err := os.Stat(tx.DB().Path()); err == nil {
		sp.FileBytes = fi.Size()
	}
	return sp
}

// Check verifies the whole store in one read transaction, so it can run
// while others write: bbolt's own page checks, every record's checksum and
// decoding, that every key matches its record, that every checkpoint's
// parent exists, that every pending write's checkpoint exists, that the
// heads and branches buckets record exactly each namespace's leaves, that
// the unfinished index agrees with the run records, that every blob that
// anything refers to exists, and that the outcome ledger's hash chain is
// whole (the first broken link is
// named by bucket and seq, with "broken chain" in its message). It
// returns an error only when it could not finish; what it found is in the
// report.
func (d *DB) Check(ctx context.Context) (*CheckReport, error) {
	rep := &CheckReport{Records: map[string]int{}}
	add := func(bucket string, key []byte, format string, args ...any) {
		p := Problem{Bucket: bucket, Message: fmt.Sprintf(format, args...)}
		if bucket != "" {
			p.Key = renderKey(bucket, key)
		}
		rep.Problems = append(rep.Problems, p)
	}
	// bbolt's page check reads the freelist that write transactions change
	// without a lock, so it runs inside a write transaction (rolled back):
	// commits wait for it, and it never sees a freelist mid-change.
	// A read-only handle has no writers to fear (the file lock is shared
	// with readers only), and cannot start a write transaction.
	errRollback := errors.New("rollback")
	pageCheck := func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			add("", nil, "bbolt: %v", err)
		}
		if len(rep.Problems) == 0 {
			rep.Space = spaceOf(tx)
		}
		return errRollback
	}
	var err error
	if d.opts.ReadOnly {
		err = d.db.View(pageCheck)
	} else {
		err = d.db.Update(pageCheck)
	}
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return nil, ErrClosed
	}
	if err != nil && !errors.Is(err, errRollback) {
		return rep, fmt.Errorf("check store %s: %w", d.path, err)
	}
	err = d.view(func(tx *bbolt.Tx) error {
		for _, name := range dataBuckets {
			if bucket(tx, name) == nil && d.needs(name) {
				add("", nil, "bucket %s is missing", name)
			}
		}
		if len(rep.Problems) > 0 {
			return nil // the B+trees are not safe to walk
		}
		if err := checkBlobs(ctx, tx, rep, add); err != nil {
			return err
		}
		if v := bucket(tx, bucketMeta).Get(metaStreamEpoch); v != nil && len(v) != 8 {
			add(bucketMeta, metaStreamEpoch, "the event stream's start count is not an 8-byte number")
		}
		blobs := openBlobs(tx, &d.tail, nil)
		// refsOf checks that every blob a record names exists.
		refsOf := func(bucketName string, key []byte) func(engine.BlobRef) {
			return func(ref engine.BlobRef) {
				if blobs.get(ref) == nil {
					add(bucketName, key, "refers to missing blob %s", ref)
				}
			}
		}
		lv := newLeafCheck(tx, add)
		cb := openCheckpoints(tx)
		// Checkpoints in the recent bucket count as checkpoints; a
		// problem names the bucket that holds the record.
		err = eachCheckpoint(ctx, tx, func(name string, k, v []byte) error {
			rep.Records[bucketCheckpoints]++
			if name == bucketRecent && cb.main.Get(k) != nil {
				add(name, k, "the checkpoints bucket holds this key too")
			}
			c, err := decodeCheckpoint(v)
			if err != nil {
				add(name, k, "%v", err)
				return nil
			}
			if !bytes.Equal(k, checkpointKey(c.Thread, c.NS, c.ID)) {
				add(name, k, "key does not match the record (thread %q ns %q id %q)", c.Thread, c.NS, c.ID)
			} else {
				lv.checkpoint(c)
			}
			if c.ParentID != "" && cb.Get(checkpointKey(c.Thread, c.NS, c.ParentID)) == nil {
				add(name, k, "parent checkpoint %s is missing", c.ParentID)
			}
			checkpointRefs(c, refsOf(name, k))
			return nil
		})
		if err != nil {
			return err
		}
		if err := lv.finish(ctx, rep); err != nil {
			return err
		}
		err = forEach(ctx, tx, bucketWrites, func(k, v []byte) {
			rep.Records[bucketWrites]++
			w, err := decodePendingWrite(v)
			if err != nil {
				add(bucketWrites, k, "%v", err)
				return
			}
			if _, ok := splitWriteKey(k); !ok {
				add(bucketWrites, k, "malformed key")
			} else if thread, ns, id, ck, ok := writeCheckpoint(k); ok && cb.Get(ck) == nil {
				// Nothing applies it, and a checkpoint that came to
				// have that key would be given it as its own.
				add(bucketWrites, k, "a pending write of checkpoint %s (thread %q, namespace %q), which does not exist", id, thread, ns)
			}
			writeRefs(w, refsOf(bucketWrites, k))
		})
		if err != nil {
			return err
		}
		uc := newUnfinishedCheck(tx, d.noIndex, add)
		err = forEach(ctx, tx, bucketRuns, func(k, v []byte) {
			if isOutcomeIndexKey(k) {
				checkOutcomeIndex(rep, add, bucketRuns, k, v)
				return
			}
			rep.Records[bucketRuns]++
			r, rb, err := decodeRun(v)
			if err != nil {
				add(bucketRuns, k, "%v", err)
				return
			}
			if r.ID != string(k) {
				add(bucketRuns, k, "key does not match run ID %q", r.ID)
			}
			uc.run(k, r.Status)
			runRefs(r, refsOf(bucketRuns, k))
			rb.each(refsOf(bucketRuns, k))
		})
		if err != nil {
			return err
		}
		if err := uc.finish(ctx, tx, rep); err != nil {
			return err
		}
		err = forEach(ctx, tx, bucketToolCalls, func(k, v []byte) {
			rep.Records[bucketToolCalls]++
			tc, err := decodeToolCall(v)
			if err != nil {
				add(bucketToolCalls, k, "%v", err)
				return
			}
			if tc.Key != string(k) {
				add(bucketToolCalls, k, "key does not match the record's key %q", tc.Key)
			}
			toolCallRefs(tc, refsOf(bucketToolCalls, k))
		})
		if err != nil {
			return err
		}
		return checkLedger(ctx, tx, rep, add, refsOf, blobs)
	})
	if err != nil {
		return rep, fmt.Errorf("check store %s: %w", d.path, err)
	}
	if !d.opts.Copy {
		if rep.Leftovers, err = Leftovers(filepath.Dir(d.path)); err != nil {
			return rep, fmt.Errorf("check store %s: %w", d.path, err)
		}
	}
	return rep, nil
}

// leafCheck verifies the heads and branches buckets against the
// checkpoints (see leaves.go): each namespace's leaves are recorded, its
// newest checkpoint in heads and the others in branches, and nothing else
// is. A checkpoint that is neither recorded nor the parent of a newer one
// is one that History never lists.
type leafCheck struct {
	tx  *bbolt.Tx
	add func(bucket string, key []byte, format string, args ...any)
	// newest is each namespace's greatest checkpoint ID, by heads key.
	newest map[string]string
	// inner holds the keys of checkpoints that a newer one names as parent.
	inner map[string]bool
	// recorded holds the keys of checkpoints that heads or branches name.
	recorded map[string]bool
}

func newLeafCheck(tx *bbolt.Tx, add func(string, []byte, string, ...any)) *leafCheck {
	return &leafCheck{tx: tx, add: add, newest: map[string]string{}, inner: map[string]bool{}, recorded: map[string]bool{}}
}

func (l *leafCheck) checkpoint(c *engine.Checkpoint) {
	ns := string(nsKey(c.Thread, c.NS))
	if c.ID > l.newest[ns] {
		l.newest[ns] = c.ID
	}
	if c.ParentID != "" && c.ParentID < c.ID {
		l.inner[string(checkpointKey(c.Thread, c.NS, c.ParentID))] = true
	}
}

func (l *leafCheck) finish(ctx context.Context, rep *CheckReport) error {
	cb := openCheckpoints(l.tx)
	// leaf reports what is wrong with a heads or branches entry naming id.
	leaf := func(name string, k []byte, thread, ns, id string) {
		ck := checkpointKey(thread, ns, id)
		switch {
		case cb.Get(ck) == nil:
			l.add(name, k, "names checkpoint %s, which is missing", id)
		case l.inner[string(ck)]:
			l.add(name, k, "names checkpoint %s, which a newer checkpoint names as its parent", id)
		}
		l.recorded[string(ck)] = true
	}
	heads := map[string]string{}
	err := forEach(ctx, l.tx, bucketHeads, func(k, v []byte) {
		rep.Records[bucketHeads]++
		thread, ns, ok := splitNSKey(k)
		if !ok {
			l.add(bucketHeads, k, "malformed key")
			return
		}
		id, err := decodeHead(v)
		if err != nil {
			heads[string(k)] = "" // present, but what it names is unknown
			l.add(bucketHeads, k, "%v", err)
			return
		}
		heads[string(k)] = id
		leaf(bucketHeads, k, thread, ns, id)
		if newest := l.newest[string(k)]; newest != "" && newest != id {
			l.add(bucketHeads, k, "names checkpoint %s, but the namespace's newest is %s", id, newest)
		}
	})
	if err != nil {
		return err
	}
	err = forEach(ctx, l.tx, bucketBranches, func(k, v []byte) {
		rep.Records[bucketBranches]++
		thread, ns, id, ok := splitBranchKey(k)
		if !ok || id == "" {
			l.add(bucketBranches, k, "malformed key")
			return
		}
		if len(v) != 0 {
			l.add(bucketBranches, k, "holds %d bytes, want none", len(v))
		}
		head, ok := heads[string(nsKey(thread, ns))]
		switch {
		case !ok:
			l.add(bucketBranches, k, "its namespace has no heads entry")
		case head != "" && id >= head:
			l.add(bucketBranches, k, "is not older than the namespace's head %s", head)
		}
		leaf(bucketBranches, k, thread, ns, id)
	})
	if err != nil {
		return err
	}
	for ns, newest := range l.newest {
		if _, ok := heads[ns]; !ok {
			l.add(bucketHeads, []byte(ns), "is missing (the namespace's newest checkpoint is %s)", newest)
		}
	}
	return eachCheckpoint(ctx, l.tx, func(name string, k, v []byte) error {
		if l.inner[string(k)] || l.recorded[string(k)] {
			return nil
		}
		if thread, ns, id, ok := splitCheckpointKey(k); ok {
			if head := heads[string(nsKey(thread, ns))]; head == "" {
				return nil // the heads entry is missing or corrupt: reported above
			}
			if _, _, err := decodeCheckpointLink(v); err == nil {
				l.add(name, k, "checkpoint %s is neither recorded in heads or branches nor the parent of a newer one: History does not list it", id)
			}
		}
		return nil
	})
}

// forEach walks a bucket, stopping early only when ctx ends.
func forEach(ctx context.Context, tx *bbolt.Tx, name string, fn func(k, v []byte)) error {
	return eachRecord(ctx, tx, name, func(k, v []byte) error { fn(k, v); return nil })
}

// eachRecord calls fn for each record of a bucket until fn fails or ctx
// ends, counting the records for WithProgress.
func eachRecord(ctx context.Context, tx *bbolt.Tx, name string, fn func(k, v []byte) error) error {
	p := progressOf(ctx)
	c := bucket(tx, name).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(k, v); err != nil {
			return err
		}
		p.read()
	}
	return nil
}

// WithProgress returns a context under which Check, Prune and compaction
// call fn with the number of records they have read (or copied) so far,
// every few thousand records, so that a long run on a large store can show
// that it is moving. fn runs on the goroutine doing the work.
func WithProgress(ctx context.Context, fn func(records int)) context.Context {
	return context.WithValue(ctx, progressKey{}, &progress{fn: fn})
}

type progressKey struct{}

type progress struct {
	fn      func(records int)
	records int
}

// progressOf returns ctx's progress, or nil, whose read does nothing.
func progressOf(ctx context.Context) *progress {
	p, _ := ctx.Value(progressKey{}).(*progress)
	return p
}

// read counts a record, and reports every progressEvery.
func (p *progress) read() {
	if p == nil {
		return
	}
	if p.records++; p.records%progressEvery == 0 {
		p.fn(p.records)
	}
}

// progressEvery is how many records Check, Prune or compaction reads
// between two reports.
var progressEvery = 20000

// checkBlobs verifies the blob log and its index: every record decodes and
// hashes to its key's reference, every blob up to the indexed mark is
// indexed under its own sequence number, no reference is stored twice, and
// every index entry names a stored blob. It holds in memory only the log's
// tail above the mark, so it runs in bounded memory on a large store.
func checkBlobs(ctx context.Context, tx *bbolt.Tx, rep *CheckReport, add func(string, []byte, string, ...any)) error {
	mark, err := indexedMark(tx)
	if err != nil {
		add(bucketMeta, metaBlobIndexed, "the blob index's mark is not an 8-byte sequence number")
	}
	index, log := bucket(tx, bucketBlobIndex), bucket(tx, bucketBlobLog)
	tail := map[engine.BlobRef]uint64{}
	err = forEach(ctx, tx, bucketBlobLog, func(k, v []byte) {
		rep.Records[bucketBlobLog]++
		seq, ref, ok := parseBlobLogKey(k)
		if !ok {
			add(bucketBlobLog, k, "malformed key")
			return
		}
		data, _, err := decodeBlob(v)
		if err != nil {
			add(bucketBlobLog, k, "%v", err)
		} else if got := engine.RefOf(data); got != ref {
			add(bucketBlobLog, k, "content hashes to %s", got)
		}
		iv := index.Get(blobKey(ref))
		switch {
		case len(iv) == 8 && beUint64(iv) != seq:
			add(bucketBlobLog, k, "stores blob %s again (the index names #%d)", ref, beUint64(iv))
		case seq <= mark && iv == nil:
			add(bucketBlobLog, k, "blob %s is below the indexed mark #%d but not indexed", ref, mark)
		case seq > mark:
			if first, dup := tail[ref]; dup {
				add(bucketBlobLog, k, "stores blob %s again (first as #%d)", ref, first)
			} else {
				tail[ref] = seq
			}
		}
	})
	if err != nil {
		return err
	}
	return forEach(ctx, tx, bucketBlobIndex, func(k, v []byte) {
		rep.Records[bucketBlobIndex]++
		ref, ok := parseBlobKey(k)
		if !ok || len(v) != 8 {
			add(bucketBlobIndex, k, "malformed entry")
			return
		}
		if log.Get(blobLogKey(beUint64(v), ref)) == nil {
			add(bucketBlobIndex, k, "names #%d, which does not hold blob %s", beUint64(v), ref)
		}
	})
}
