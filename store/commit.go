package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/outpost-edge/outpost/engine"
)

// fillPercent is how full a write transaction packs a bucket's pages when
// they split. bbolt's default, one half, suits random inserts. Keys that
// arrive in order append at the right edge, where a split page is never
// filled again, so they are packed: checkpoints (by ID) and runs (by run
// ID, time-ordered, each run's outcome index entry beside its record)
// nearly full, leaving a little room for a record rewritten larger;
// ledger records and the blob log, whose records are never rewritten
// larger, full. With 64 threads
// that saved about a tenth of the page writes of a group commit.
var fillPercent = map[string]float64{
	bucketCheckpoints: 0.9, bucketRuns: 0.9, bucketOutcomes: 1, bucketBlobLog: 1,
}

// maxBatch bounds one group commit, so a burst of committers does not build
// one huge transaction while the next batch waits.
const maxBatch = 256

// request is one caller's write, queued for a group commit.
type request struct {
	// validate, when set, checks the request against the batch's
	// transaction before anything of it is written; its error fails only
	// this request.
	validate func(tx *bbolt.Tx) error
	// apply writes the request. An error here may leave partial writes in
	// the transaction, so the batch is rolled back and retried without it.
	apply func(tx *bbolt.Tx) error

	err  error
	wake chan bool // true: the waiter now leads the next batch
}

// committer is a commit queue with a rotating leader. The first caller to
// find no leader becomes it, drains every queued request into one bbolt
// transaction (one fsync), takes in those that queue while it applies them
// (see run), wakes their callers and hands leadership to the first request
// that queued meanwhile. A lone committer therefore pays no added delay,
// and many concurrent ones share transactions.
type committer struct {
	db *bbolt.DB
	// tail is the blob log's unindexed end, brought up to date after each
	// committed transaction.
	tail *blobTail
	// runway, when set, keeps written blocks ahead of the pages in use.
	runway  *runway
	mu      sync.Mutex
	queue   []*request
	leading bool
	// broken, once set, fails every write: a transaction's write or fsync
	// failed (see ErrWriteFailed).
	broken error

	commits, failed, txs, syncs, retries, maxBatch atomic.Uint64
	// waited sums, in nanoseconds, the time requests spent queued and
	// committing.
	waited atomic.Int64
}

// Stats counts the store's write activity since Open, for tests and
// benchmarks.
type Stats struct {
	// Commits is the number of write requests (Commit, PutBlob, tool-call
	// records) that succeeded; Failed, those that returned an error.
	Commits, Failed uint64
	// Transactions is the number of write transactions the commit queue
	// committed, and Syncs how many of them were fsynced (all of them:
	// every commit is made durable before it returns).
	Transactions, Syncs uint64
	// Retries counts batches re-run without a request whose apply failed.
	Retries uint64
	// MaxBatch is the largest number of requests that shared a
	// transaction.
	MaxBatch uint64
	// Waited is the time requests spent queued and committing, in all:
	// divided by Commits+Failed, what a commit costs its caller.
	Waited time.Duration
}

// WriteErr reports why the store takes no more writes (ErrWriteFailed,
// with the failure), or nil while it does.
func (d *DB) WriteErr() error {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	return d.q.broken
}

// Stats reports the write counters.
func (d *DB) Stats() Stats {
	q := &d.q
	return Stats{
		Commits: q.commits.Load(), Failed: q.failed.Load(),
		Transactions: q.txs.Load(), Syncs: q.syncs.Load(),
		Retries: q.retries.Load(), MaxBatch: q.maxBatch.Load(), Waited: time.Duration(q.waited.Load()),
	}
}

// do queues r and returns once it is durable or has failed.
func (q *committer) do(r *request) error {
	start := time.Now()
	defer func() { q.waited.Add(int64(time.Since(start))) }()
	r.wake = make(chan bool, 1)
	q.mu.Lock()
	if err := q.broken; err != nil {
		q.mu.Unlock()
		return err
	}
	q.queue = append(q.queue, r)
	if q.leading {
		q.mu.Unlock()
		if lead := <-r.wake; !lead {
			return r.err
		}
		// Leadership was handed to us; r is still queued.
	} else {
		q.leading = true
		q.mu.Unlock()
	}
	q.lead(r)
	return r.err
}

// lead commits one batch, which includes self, then hands over.
func (q *committer) lead(self *request) {
	batch, broken := q.take(maxBatch)
	if broken != nil { // requests queued before the store broke
		failAll(batch, broken)
	} else {
		batch = q.run(batch)
	}

	q.mu.Lock()
	var next *request
	if len(q.queue) > 0 {
		next = q.queue[0]
	} else {
		q.leading = false
	}
	// With as many requests queued as it committed, the queue is the
	// bottleneck: the next transaction should start at once (see below).
	hurry := next != nil && len(q.queue) >= len(batch)
	q.mu.Unlock()
	if next != nil && !hurry {
		next.wake <- true
	}
	for _, r := range batch {
		if r.err != nil {
			q.failed.Add(1)
		} else {
			q.commits.Add(1)
		}
		if r != self {
			r.wake <- false
		}
	}
	if hurry {
		// The next leader is woken last, and this goroutine yields to it,
		// so that it starts the next transaction at once. Woken first, it
		// waits behind the batch's callers (the Go scheduler runs the
		// goroutine readied last first) and behind this one's own next
		// step, and its batch grows meanwhile: what a queue that cannot
		// keep up wants to avoid, and what one that can wants, since
		// fewer transactions cost less CPU.
		//
		// Bench, 64 x 20, 10 to 20 interleaved pairs a round, medians of
		// the turns/s ratio to always waking the next leader first:
		// hurrying when len(queue) >= len(batch), sync 1.032 and 1.051,
		// exit 1.021 and 1.039; hurrying always, sync 1.000 to 1.101
		// (eight rounds, median 1.059) but exit 0.894 to 0.948 (seven
		// rounds), its transactions up from about 44 to 70 or 86.
		next.wake <- true
		runtime.Gosched()
	}
}

// take removes up to n requests from the head of the queue. It also
// returns the error the store broke down with, if it did.
func (q *committer) take(n int) ([]*request, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.queue))
	taken := q.queue[:n:n]
	q.queue = append([]*request(nil), q.queue[n:]...)
	return taken, q.broken
}

// run applies a batch in one transaction and returns the batch with the
// requests that joined it. A request that fails validation is skipped; one
// whose apply fails is dropped and the rest retried in a fresh
// transaction, so a bad request never takes its neighbours down.
//
// Requests that queue while the batch is being applied join it, until
// bbolt's commit begins: they would otherwise wait for this transaction's
// two fsyncs and then for the next one's. With many committers, about a
// sixth of the commits join that way (bench S2), and throughput rose by a
// twelfth.
func (q *committer) run(batch []*request) []*request {
	q.noteBatch(len(batch))
	pending := batch
	for len(pending) > 0 {
		if fp := failpoint.beforeCommitTx; fp != nil {
			if err := fp(len(pending)); err != nil {
				failAll(pending, fmt.Errorf("group commit: %w", err))
				return batch
			}
		}
		failed := -1
		var failErr error
		var changes *blobChanges
		applied := false // from here on, an error is bbolt's commit failing
		err := q.db.Update(func(tx *bbolt.Tx) error {
			q.runway.extend(tx)
			st := beginTxState(tx, q.tail, len(pending))
			defer endTxState(tx)
			for i := 0; ; i++ {
				if i == len(pending) {
					joined, _ := q.take(maxBatch - len(pending))
					if len(joined) == 0 {
						break
					}
					pending = append(pending, joined...)
					batch = append(batch, joined...)
					st.batch = len(pending)
					q.noteBatch(len(pending))
				}
				r := pending[i]
				r.err = nil
				if r.validate != nil {
					if r.err = r.validate(tx); r.err != nil {
						continue
					}
				}
				err := r.apply(tx)
				if fp := failpoint.applyRequest; err == nil && fp != nil {
					err = fp(i)
				}
				if err != nil {
					failed, failErr = i, err
					return err
				}
				if fp := failpoint.midGroupCommit; fp != nil {
					if err := fp(i); err != nil {
						return err
					}
				}
			}
			if err := st.blobs.flush(false); err != nil {
				return err
			}
			changes = st.blobs.ch
			applied = true
			return nil
		})
		if fp := failpoint.commitWrite; err == nil && fp != nil {
			err = fp()
		}
		if err != nil && applied && !errors.Is(err, berrors.ErrDatabaseNotOpen) {
			failAll(pending, q.breakDown(fmt.Errorf("%w: %v", ErrWriteFailed, err)))
			return batch
		}
		if err == nil {
			q.tail.apply(changes)
			q.txs.Add(1)
			q.syncs.Add(1)
			if fp := failpoint.afterCommitTx; fp != nil {
				fp(len(pending))
			}
			return batch
		}
		if failed < 0 {
			if errors.Is(err, berrors.ErrDatabaseNotOpen) {
				err = ErrClosed
			}
			failAll(pending, fmt.Errorf("group commit: %w", err))
			return batch
		}
		pending[failed].err = failErr
		pending = append(pending[:failed:failed], pending[failed+1:]...)
		q.retries.Add(1)
	}
	return batch
}

// noteBatch records n requests sharing a transaction.
func (q *committer) noteBatch(n int) {
	if uint64(n) > q.maxBatch.Load() {
		q.maxBatch.Store(uint64(n)) // only the leader writes it
	}
}

// breakDown makes every later write fail with err, and returns the error
// they fail with. After a failed write or fsync, what the transaction
// wrote may or may not be on disk, and bbolt's view of its free pages may
// disagree with the file (its meta page may already name the transaction
// it rolled back), so writing on could overwrite live pages. Restarting
// reads the file as it is.
func (q *committer) breakDown(err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken == nil {
		q.broken = err
	}
	return q.broken
}

func failAll(rs []*request, err error) {
	for _, r := range rs {
		r.err = err
	}
}

// Commit makes c durable in one transaction: its blobs, pending writes,
// checkpoint and run. Concurrent commits share a transaction and its fsync.
// Commits with Sync false are made just as durable: one fsync shared by a
// batch is cheap enough not to need a weaker mode. Events are not stored:
// the caller publishes them once Commit returns, then c.Announce, where
// Commit puts the outcome.appended event of an outcome it appended.
func (d *DB) Commit(ctx context.Context, c *engine.Commit) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	now := time.Now()
	r, appended, err := prepareCommit(c, now, d.ApplianceID(), &d.trail, d.viewBlobs)
	if err != nil {
		return err
	}
	if err := d.q.do(r); err != nil {
		return err
	}
	d.trail.add(c)
	if o := *appended; o != nil {
		// Announced by the commit's maker, after the commit's own events
		// (the step that ended or paused the run), not here, before them.
		data, _ := json.Marshal(map[string]any{"seq": o.Seq, "outcome_id": o.OutcomeID, "status": o.Status, "hash": o.Hash})
		c.Announce = append(c.Announce, engine.Event{Time: now.UTC(), Type: engine.EventOutcomeAppended, Run: o.Run, Thread: o.Thread, Data: data})
	}
	return nil
}

type encodedBlob struct {
	ref       engine.BlobRef
	data, rec []byte
	// stored is set by validate when the blob is in the store already,
	// for apply right after it in the same transaction.
	stored bool
}

// blobBatch is the blobs one request stores with its records.
type blobBatch []encodedBlob

// collide refuses a blob whose reference bb holds with other bytes, and
// notes each one bb holds already (stored), for add right after it in the
// same transaction.
func (bs blobBatch) collide(bb *blobs) error {
	for i := range bs {
		var err error
		if bs[i].stored, err = checkBlobCollision(bb, bs[i].ref, bs[i].data); err != nil {
			return err
		}
	}
	return nil
}

// add stores the blobs collide found missing. Those stored already are
// left as they are: collide compared their bytes.
func (bs blobBatch) add(bb *blobs) error {
	for _, b := range bs {
		if b.stored {
			continue
		}
		if err := bb.add(b.ref, b.rec); err != nil {
			return fmt.Errorf("blob %s: %w", b.ref, err)
		}
	}
	return nil
}

type encodedKV struct {
	key, rec []byte
}

// encodedRun is a run record to write, and its unfinished index value
// (nil when the run is not indexed).
type encodedRun struct {
	encodedKV
	unfinished []byte
}

// prepareCommit checks c and encodes its records outside the transaction,
// so concurrent committers encode in parallel and the leader only writes.
// When c ends the run (or pauses it at an interrupt), the run's outcome is
// appended to the ledger in the same transaction; *appended then holds it
// once the request has committed.
func prepareCommit(c *engine.Commit, now time.Time, appliance string, trail *flagTrail, view func(func(*blobs) error) error) (_ *request, appended **Outcome, _ error) {
	appended = new(*Outcome)
	var blobs blobBatch
	for ref, data := range c.Blobs {
		if engine.RefOf(data) != ref {
			return nil, nil, fmt.Errorf("commit: blob %s: %w", ref, ErrBlobMismatch)
		}
		blobs = append(blobs, encodedBlob{ref: ref, data: data, rec: encodeBlob(data, now)})
	}
	type encodedWrite struct {
		prefix, rec []byte
	}
	writes := make([]encodedWrite, 0, len(c.Writes))
	for _, w := range c.Writes {
		if err := validCheckpointKey(w.Thread, w.NS, w.CheckpointID); err != nil {
			return nil, nil, fmt.Errorf("commit pending write: %w", err)
		}
		writes = append(writes, encodedWrite{writesPrefix(w.Thread, w.NS, w.CheckpointID), encodePendingWrite(&w.Write)})
	}
	// Earlier checkpoints go in first, oldest first, so a step's checkpoint
	// finds its parent when both commit together.
	type encodedCheckpoint struct {
		cp  *engine.Checkpoint
		rec []byte
	}
	ckpts := make([]encodedCheckpoint, 0, len(c.Earlier)+1)
	for _, cp := range append(slices.Clip(c.Earlier), c.Checkpoint) {
		if cp == nil {
			continue
		}
		if err := validCheckpointKey(cp.Thread, cp.NS, cp.ID); err != nil {
			return nil, nil, fmt.Errorf("commit checkpoint: %w", err)
		}
		ckpts = append(ckpts, encodedCheckpoint{cp, encodeCheckpoint(cp)})
	}
	var run *encodedRun
	var outcome *pendingOutcome
	if c.Run != nil {
		if err := validKeyPart("run ID", c.Run.ID, true); err != nil {
			return nil, nil, fmt.Errorf("commit run: %w", err)
		}
		if c.Run.IsSummary() {
			return nil, nil, fmt.Errorf("commit run %s: %w", c.Run.ID, engine.ErrRunSummary)
		}
		rec, extra := encodeRun(c.Run)
		run = &encodedRun{encodedKV{[]byte(c.Run.ID), rec}, unfinishedValue(c.Run.Status)}
		if leavesOutcome(c.Run.Status) {
			var data []byte
			var err error
			if outcome, data, err = newPendingOutcome(c, appliance, now, trail, view); err != nil {
				return nil, nil, fmt.Errorf("commit run %s: outcome: %w", c.Run.ID, err)
			}
			if data != nil {
				if extra == nil {
					extra = map[engine.BlobRef][]byte{}
				}
				extra[outcome.outputBlob] = data
			}
		}
		for ref, data := range extra {
			if _, dup := c.Blobs[ref]; !dup {
				blobs = append(blobs, encodedBlob{ref: ref, data: data, rec: encodeBlob(data, now)})
			}
		}
	}
	return &request{
		validate: func(tx *bbolt.Tx) error {
			if err := blobs.collide(writeBlobs(tx)); err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			return nil
		},
		apply: func(tx *bbolt.Tx) error {
			if err := blobs.add(writeBlobs(tx)); err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			wb := bucket(tx, bucketWrites)
			for _, w := range writes {
				seq, err := wb.NextSequence()
				if err != nil {
					return fmt.Errorf("commit pending write: %w", err)
				}
				if err := wb.Put(appendFixed64(w.prefix, seq), w.rec); err != nil {
					return fmt.Errorf("commit pending write: %w", err)
				}
			}
			for _, e := range ckpts {
				t, err := openNSTree(tx, e.cp.Thread, e.cp.NS)
				if err == nil {
					err = t.put(e.cp, e.rec)
				}
				if err != nil {
					return fmt.Errorf("commit checkpoint %s: %w", e.cp.ID, err)
				}
			}
			if run != nil {
				if err := bucket(tx, bucketRuns).Put(run.key, run.rec); err != nil {
					return fmt.Errorf("commit run %s: %w", c.Run.ID, err)
				}
				if err := indexRun(tx, run.key, run.unfinished); err != nil {
					return fmt.Errorf("commit run %s: %w", c.Run.ID, err)
				}
			}
			*appended = nil
			if outcome != nil {
				// Last, so the run's final checkpoint is in place for its
				// flags.
				o, err := appendOutcome(tx, outcome)
				if err != nil {
					return fmt.Errorf("commit run %s: %w", c.Run.ID, err)
				}
				*appended = o
			}
			return nil
		},
	}, appended, nil
}

func validCheckpointKey(thread, ns, id string) error {
	if err := validKeyPart("thread", thread, true); err != nil {
		return err
	}
	if err := validKeyPart("namespace", ns, false); err != nil {
		return err
	}
	return validKeyPart("checkpoint ID", id, true)
}

// PageStats reports bbolt's write counters since Open: pages written, time
// spent writing them, and bytes of pages allocated. For benchmarks.
func (d *DB) PageStats() (writes int64, writeTime time.Duration, pageAllocBytes int64) {
	s := d.db.Stats().TxStats
	return s.GetWrite(), s.GetWriteTime(), s.GetPageAlloc()
}
