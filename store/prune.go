package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// PruneReport says what Prune removed and what it left alone.
type PruneReport struct {
	// Threads is the number of threads whose history was cut.
	Threads int `json:"threads"`
	// Rewritten counts kept checkpoints rewritten as full snapshots.
	Rewritten          int   `json:"rewritten"`
	CheckpointsRemoved int   `json:"checkpoints_removed"`
	WritesRemoved      int   `json:"writes_removed"`
	BlobsRemoved       int   `json:"blobs_removed"`
	BlobBytesRemoved   int64 `json:"blob_bytes_removed"`
	// CallsRemoved counts the tool-call records (model calls among them)
	// of runs that have no run record, removed (see Prune).
	CallsRemoved int `json:"calls_removed"`
	// KeptRemoved counts the copies of embedded bundles kept beside the
	// store, in the data folder's firmware folder, for the runs pinned to
	// them, that were removed because no run refers to them any more. The
	// store holds no such copy: the process that prunes it counts them
	// (db prune's, or the owner's ControlOptions.AfterPrune). It is nil
	// (null) when no one looked at them: Prune alone, or an owner whose
	// socket has no AfterPrune (or predates the field).
	KeptRemoved *int `json:"kept_removed"`
	// Skipped lists threads that qualified but could not be cut, and why.
	Skipped []Problem `json:"skipped"`
}

// MarshalJSON writes an empty Skipped as [], not null, so that a script
// reading db prune --json gets a list either way (as CheckReport does).
func (r PruneReport) MarshalJSON() ([]byte, error) {
	type plain PruneReport
	if r.Skipped == nil {
		r.Skipped = []Problem{}
	}
	return json.Marshal(plain(r))
}

// Prune drops the history of finished threads, then collects blobs.
//
// A thread qualifies when none of its runs is still queued, running or
// interrupted and its newest checkpoint was created before now-olderThan.
// In each of its namespaces Prune keeps only the newest checkpoint and that
// checkpoint's pending writes. Checkpoints record only changed channels, and
// append channels only their new items, so before its ancestors go the
// kept checkpoint is rewritten as a full snapshot (every channel, whole
// values, no parent): the thread's state is unchanged. The namespace's
// branches go with their checkpoints; its heads entry stays as it was.
//
// The tool-call records of a run that has no run record, and that no
// checkpoint or outcome names (a run whose record alone was lost, to db
// salvage say, keeps them), are removed once they are as old as an
// unreferenced blob must be to go: those of a run
// in exit durability that a crash cut short before it stored anything
// (its model calls: a tool call stores the run first), which no recovery
// will resume, and whose records would otherwise keep their blobs for
// ever. A run still in flight has a record within blobGrace of its
// start, but for one in exit durability that runs longer without a tool
// call: Prune through the control socket of the process that runs it
// keeps its records (ServeControl's run manager knows it), and no other
// process runs one while Prune has the store.
//
// Then blobs are marked and swept. A blob survives when any checkpoint,
// pending write, run or tool call names it (in a typed field or as text in
// a value), when a surviving blob names it, or when it is young: stored
// after the cutoff, or within blobGrace of now whatever the cutoff. A blob
// is stored before the record that names it commits (a model answer before
// its call record), and PutBlob of bytes stored less than blobTouchAfter
// ago keeps their old time.
//
// Everything happens in one transaction: a crash or an error leaves the
// store as it was. A corrupt record aborts the prune (run Check first),
// since the collector cannot know what it names.
func (d *DB) Prune(ctx context.Context, olderThan time.Duration, now time.Time) (*PruneReport, error) {
	return d.prune(ctx, olderThan, now, nil)
}

// prune is Prune, keeping the call records of the runs inFlight names
// however old they are: runs in flight that have no run record yet.
func (d *DB) prune(ctx context.Context, olderThan time.Duration, now time.Time, inFlight map[string]bool) (*PruneReport, error) {
	cutoff := now.Add(-olderThan)
	blobCutoff := cutoff
	if grace := now.Add(-blobGrace); grace.Before(blobCutoff) {
		blobCutoff = grace
	}
	var rep *PruneReport
	// It takes its turn in the commit queue, which keeps the blob log's
	// tail in step (see bloblog.go).
	err := d.q.do(&request{
		apply: func(tx *bbolt.Tx) error {
			rep = &PruneReport{} // a batch may apply a request twice
			p := &pruner{ctx: ctx, tx: tx, blobs: writeBlobs(tx), rep: rep, cutoff: cutoff, blobCutoff: blobCutoff, inFlight: inFlight}
			if err := p.cutHistories(); err != nil {
				return err
			}
			return p.collectBlobs()
		},
	})
	d.trail.reset() // it may have cut checkpoints the trail holds
	if err != nil {
		return nil, fmt.Errorf("prune store %s: %w", d.path, err)
	}
	return rep, nil
}

// blobGrace is how long an unreferenced blob is kept at least, however
// short the prune's --older-than: long enough for any step to commit that
// stored a blob before it did.
const blobGrace = 24 * time.Hour

type pruner struct {
	ctx    context.Context
	tx     *bbolt.Tx
	blobs  *blobs
	rep    *PruneReport
	cutoff time.Time
	// blobCutoff: an unreferenced blob stored before it is swept.
	blobCutoff time.Time
	// inFlight names runs whose call records stay though the runs have
	// no record (see prune).
	inFlight map[string]bool
}

func (p *pruner) cutHistories() error {
	busy := map[string]bool{}
	if err := p.walk(bucketRuns, func(k, v []byte) error {
		if isOutcomeIndexKey(k) {
			return nil
		}
		r, _, err := decodeRun(v)
		if err != nil {
			return corrupt(bucketRuns, k, err)
		}
		if !r.Status.Terminal() {
			busy[r.Thread] = true
		}
		return nil
	}); err != nil {
		return err
	}
	// Heads keys sort by thread, then namespace: one entry per namespace.
	nss := map[string][]string{}
	var order []string
	if err := p.walk(bucketHeads, func(k, _ []byte) error {
		thread, ns, ok := splitNSKey(k)
		if !ok {
			return corrupt(bucketHeads, k, errors.New("malformed key"))
		}
		if _, seen := nss[thread]; !seen {
			order = append(order, thread)
		}
		nss[thread] = append(nss[thread], ns)
		return nil
	}); err != nil {
		return err
	}
	for _, thread := range order {
		if busy[thread] {
			continue
		}
		if err := p.cutThread(thread, nss[thread]); err != nil {
			return err
		}
	}
	return nil
}

// cutThread cuts every namespace of a thread or none, so a thread is never
// half pruned. It loads one thread's history at a time.
func (p *pruner) cutThread(thread string, nss []string) error {
	histories := make([][]*engine.Checkpoint, len(nss))
	var newest time.Time
	for i, ns := range nss {
		h, err := p.history(thread, ns)
		if err != nil {
			return err
		}
		for _, c := range h {
			if c.Created.After(newest) {
				newest = c.Created
			}
		}
		histories[i] = h
	}
	if !newest.Before(p.cutoff) {
		return nil
	}
	var plans []*nsPlan
	for i, ns := range nss {
		if len(histories[i]) < 2 {
			continue
		}
		plan, err := planNS(p, thread, ns, histories[i])
		if err != nil {
			var ce *CorruptError
			if errors.As(err, &ce) {
				return err
			}
			p.rep.Skipped = append(p.rep.Skipped, Problem{Bucket: bucketCheckpoints, Key: keyText([]byte(thread)),
				Message: fmt.Sprintf("namespace %q: %v", ns, err)})
			return nil
		}
		plans = append(plans, plan)
	}
	if len(plans) == 0 {
		return nil
	}
	for _, plan := range plans {
		if err := p.apply(plan); err != nil {
			return err
		}
	}
	p.rep.Threads++
	return nil
}

// history loads every checkpoint of a namespace, newest first.
func (p *pruner) history(thread, ns string) ([]*engine.Checkpoint, error) {
	t, err := openNSTree(p.tx, thread, ns)
	if err != nil {
		return nil, err
	}
	w, err := t.walk()
	if err != nil {
		return nil, err
	}
	var out []*engine.Checkpoint
	for {
		if err := p.ctx.Err(); err != nil {
			return nil, err
		}
		id, rec, ok, err := w.next()
		if err != nil || !ok {
			return out, err
		}
		c, err := decodeCheckpoint(rec)
		if err != nil {
			return nil, t.cb.corrupt(t.key(id), err)
		}
		out = append(out, c)
	}
}

// nsPlan is the cut of one namespace: the snapshot that replaces its
// newest checkpoint and the checkpoints that go.
type nsPlan struct {
	thread, ns string
	head       *engine.Checkpoint // rewritten; nil when already whole
	newBlobs   map[engine.BlobRef][]byte
	drop       []string // checkpoint IDs
}

// planNS plans the cut of a namespace whose checkpoints, newest first, are
// history.
func planNS(p *pruner, thread, ns string, history []*engine.Checkpoint) (*nsPlan, error) {
	byID := make(map[string]*engine.Checkpoint, len(history))
	drop := make([]string, 0, len(history)-1)
	for i, cp := range history {
		byID[cp.ID] = cp
		if i > 0 {
			drop = append(drop, cp.ID)
		}
	}
	head := history[0]
	plan := &nsPlan{thread: thread, ns: ns, drop: drop, newBlobs: map[engine.BlobRef][]byte{}}
	if head.ParentID == "" {
		return plan, nil
	}
	var chain []*engine.Checkpoint
	for cp := head; ; {
		chain = append(chain, cp)
		if cp.ParentID == "" {
			break
		}
		parent := byID[cp.ParentID]
		if parent == nil {
			return nil, fmt.Errorf("checkpoint %s: parent %s is missing, so its state cannot be rebuilt", cp.ID, cp.ParentID)
		}
		if len(chain) > len(history) {
			return nil, fmt.Errorf("checkpoint %s: the parent chain loops", head.ID)
		}
		cp = parent
	}
	snap, err := p.materialize(chain, plan.newBlobs)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", head.ID, err)
	}
	full := *head
	full.ParentID = ""
	full.Channels = snap
	plan.head = &full
	return plan, nil
}

// channelState is one channel's value while folding a parent chain. raw
// holds the bytes of an append channel's accumulated items; otherwise value
// is the stored value, left as it was (inline or a blob reference).
type channelState struct {
	version uint64
	value   engine.Value
	raw     []byte
	isRaw   bool
}

// materialize folds a chain (newest first) the way the engine does: a delta
// that is not null appends its items, anything else replaces the value.
// Append channels hold JSON arrays, so appending is splicing arrays.
func (p *pruner) materialize(chain []*engine.Checkpoint, newBlobs map[engine.BlobRef][]byte) ([]engine.ChannelValue, error) {
	state := map[string]*channelState{}
	for i := len(chain) - 1; i >= 0; i-- {
		for _, cv := range chain[i].Channels {
			prev := state[cv.Channel]
			if !cv.Delta || isNullValue(cv.Value) || prev == nil || (!prev.isRaw && isNullValue(prev.value)) {
				state[cv.Channel] = &channelState{version: cv.Version, value: cv.Value}
				continue
			}
			old := prev.raw
			if !prev.isRaw {
				b, err := p.resolve(prev.value)
				if err != nil {
					return nil, fmt.Errorf("channel %q: %w", cv.Channel, err)
				}
				old = b
			}
			add, err := p.resolve(cv.Value)
			if err != nil {
				return nil, fmt.Errorf("channel %q: %w", cv.Channel, err)
			}
			joined, err := joinArrays(old, add)
			if err != nil {
				return nil, fmt.Errorf("channel %q in checkpoint %s: %w", cv.Channel, chain[i].ID, err)
			}
			state[cv.Channel] = &channelState{version: cv.Version, raw: joined, isRaw: true}
		}
	}
	names := make([]string, 0, len(state))
	for name := range state {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]engine.ChannelValue, 0, len(names))
	for _, name := range names {
		st := state[name]
		v := st.value
		if st.isRaw {
			v = engine.Value{Inline: st.raw}
			if len(st.raw) > engine.BlobThreshold {
				ref := engine.RefOf(st.raw)
				newBlobs[ref] = st.raw
				v = engine.Value{Blob: ref}
			}
		}
		out = append(out, engine.ChannelValue{Channel: name, Version: st.version, Value: v})
	}
	return out, nil
}

func isNullValue(v engine.Value) bool {
	return v.Blob.IsZero() && (len(v.Inline) == 0 || string(v.Inline) == "null")
}

// resolve returns a value's bytes, reading its blob if it has one.
func (p *pruner) resolve(v engine.Value) ([]byte, error) {
	if v.Blob.IsZero() {
		return v.Inline, nil
	}
	data, err := p.blobs.load(v.Blob)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", v.Blob, err)
	}
	return data, nil
}

// joinArrays splices two JSON arrays into one.
func joinArrays(a, b []byte) ([]byte, error) {
	ia, err := arrayItems(a)
	if err != nil {
		return nil, err
	}
	ib, err := arrayItems(b)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(ia)+len(ib)+3)
	out = append(out, '[')
	out = append(out, ia...)
	if len(ia) > 0 && len(ib) > 0 {
		out = append(out, ',')
	}
	out = append(out, ib...)
	return append(out, ']'), nil
}

// arrayItems returns the text between a JSON array's brackets.
func arrayItems(b []byte) ([]byte, error) {
	t := bytes.TrimSpace(b)
	if len(t) < 2 || t[0] != '[' || t[len(t)-1] != ']' || !json.Valid(t) {
		return nil, errors.New("an append channel's value is not a JSON array")
	}
	return bytes.TrimSpace(t[1 : len(t)-1]), nil
}

func (p *pruner) apply(plan *nsPlan) error {
	bb := p.blobs
	now := time.Now()
	for ref, data := range plan.newBlobs {
		stored, err := checkBlobCollision(bb, ref, data)
		if err != nil {
			return err
		}
		if stored {
			continue
		}
		if err := bb.add(ref, encodeBlob(data, now)); err != nil {
			return fmt.Errorf("store snapshot blob: %w", err)
		}
	}
	cb := openCheckpoints(p.tx)
	if plan.head != nil {
		if err := cb.Put(checkpointKey(plan.thread, plan.ns, plan.head.ID), encodeCheckpoint(plan.head)); err != nil {
			return fmt.Errorf("rewrite checkpoint %s: %w", plan.head.ID, err)
		}
		p.rep.Rewritten++
	}
	// The head is left alone, the only leaf now: every branch goes.
	if err := dropBranches(bucket(p.tx, bucketBranches), plan.thread, plan.ns); err != nil {
		return err
	}
	wb := bucket(p.tx, bucketWrites)
	for _, id := range plan.drop {
		if err := cb.Delete(checkpointKey(plan.thread, plan.ns, id)); err != nil {
			return fmt.Errorf("drop checkpoint %s: %w", id, err)
		}
		p.rep.CheckpointsRemoved++
		prefix := writesPrefix(plan.thread, plan.ns, id)
		var keys [][]byte
		c := wb.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := wb.Delete(k); err != nil {
				return fmt.Errorf("drop pending writes of %s: %w", id, err)
			}
		}
		p.rep.WritesRemoved += len(keys)
	}
	return nil
}

// collectBlobs marks every blob reachable from a record and sweeps the
// rest that are older than the blob cutoff.
func (p *pruner) collectBlobs() error {
	marked := map[engine.BlobRef]bool{}
	var work []engine.BlobRef
	mark := func(ref engine.BlobRef) {
		if !marked[ref] {
			marked[ref] = true
			work = append(work, ref)
		}
	}
	traced := map[string]bool{} // runs a checkpoint or an outcome names
	if err := eachCheckpoint(p.ctx, p.tx, func(name string, k, v []byte) error {
		c, err := decodeCheckpoint(v)
		if err != nil {
			return corrupt(name, k, err)
		}
		checkpointRefs(c, mark)
		traced[c.RunID] = true
		return nil
	}); err != nil {
		return err
	}
	if err := p.walk(bucketWrites, func(k, v []byte) error {
		w, err := decodePendingWrite(v)
		if err != nil {
			return corrupt(bucketWrites, k, err)
		}
		writeRefs(w, mark)
		return nil
	}); err != nil {
		return err
	}
	if err := p.walk(bucketRuns, func(k, v []byte) error {
		if isOutcomeIndexKey(k) {
			return nil
		}
		r, rb, err := decodeRun(v)
		if err != nil {
			return corrupt(bucketRuns, k, err)
		}
		runRefs(r, mark)
		rb.each(mark)
		return nil
	}); err != nil {
		return err
	}
	if err := p.walk(bucketOutcomes, func(k, v []byte) error {
		o, ref, err := decodeOutcome(v)
		if err != nil {
			return corrupt(bucketOutcomes, k, err)
		}
		traced[o.Run] = true
		if !ref.IsZero() {
			mark(ref)
		}
		return nil
	}); err != nil {
		return err
	}
	orphans, err := p.markCalls(mark, traced)
	if err != nil {
		return err
	}
	bb := p.blobs
	// A blob's bytes may name other blobs (a large list of messages that
	// point at model responses), so marking follows them.
	for len(work) > 0 {
		ref := work[len(work)-1]
		work = work[:len(work)-1]
		data, err := bb.load(ref)
		if errors.Is(err, engine.ErrBlobNotFound) {
			continue // dangling: Check reports it
		}
		if err != nil {
			return err
		}
		scanRefs(data, mark)
	}
	var sweep []engine.BlobRef
	if err := p.walk(bucketBlobLog, func(k, v []byte) error {
		_, ref, ok := parseBlobLogKey(k)
		if !ok {
			return corrupt(bucketBlobLog, k, errMalformedKey)
		}
		if marked[ref] {
			return nil
		}
		_, created, err := decodeBlob(v)
		if err != nil {
			return corrupt(bucketBlobLog, k, err)
		}
		if created.Before(p.blobCutoff) {
			sweep = append(sweep, ref)
			p.rep.BlobBytesRemoved += int64(ref.Len)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, ref := range sweep {
		if err := bb.remove(ref); err != nil {
			return fmt.Errorf("remove blob %s: %w", ref, err)
		}
	}
	p.rep.BlobsRemoved = len(sweep)
	tb := bucket(p.tx, bucketToolCalls)
	for _, k := range orphans {
		if err := tb.Delete(k); err != nil {
			return fmt.Errorf("remove call record %s: %w", renderKey(bucketToolCalls, k), err)
		}
	}
	p.rep.CallsRemoved = len(orphans)
	return nil
}

// markCalls marks the blobs the tool-call records name, but for those of
// runs that have no run record, nor a checkpoint or outcome that traced
// names, and are older than the blob cutoff: it returns their keys
// instead, to be removed. A run that stored a checkpoint or an outcome
// was stored, and a record it lacks was lost (db salvage leaves out one
// it cannot read): its calls are the evidence of what its tools did.
func (p *pruner) markCalls(mark func(engine.BlobRef), traced map[string]bool) (orphans [][]byte, err error) {
	runs := bucket(p.tx, bucketRuns)
	lastRun, stored := "", false // the records of one run are together
	err = p.walk(bucketToolCalls, func(k, v []byte) error {
		tc, err := decodeToolCall(v)
		if err != nil {
			return corrupt(bucketToolCalls, k, err)
		}
		if tc.RunID != lastRun {
			lastRun, stored = tc.RunID, tc.RunID == "" || p.inFlight[tc.RunID] || traced[tc.RunID] || runs.Get([]byte(tc.RunID)) != nil
		}
		if !stored && tc.IntentAt.Before(p.blobCutoff) && tc.DoneAt.Before(p.blobCutoff) {
			orphans = append(orphans, bytes.Clone(k))
			return nil
		}
		toolCallRefs(tc, mark)
		return nil
	})
	return orphans, err
}

// walk visits a bucket's records, stopping at the first error.
func (p *pruner) walk(name string, fn func(k, v []byte) error) error {
	return eachRecord(p.ctx, p.tx, name, fn)
}
