package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// When a truncation or a damaged page takes a page of the tree that names
// others (the root page, a branch page), the pages below it may still be
// whole, but nothing leads to them. Salvage then reads every page below
// the high-water mark that its walk did not reach, and keeps the leaf
// pages: their elements are records, and a record names its bucket by its
// shape (its key is made from what the record holds) and proves itself by
// its checksum (encoding.go). A record found this way is copied only when
//
//   - it is whole and reads as exactly one bucket's record, stored under
//     the key that bucket would give it;
//   - its key lies where the walk could not reach: a page that the walk
//     read holds the newest version of every key in its range, so a copy
//     found anywhere else is an older one;
//   - of the differing copies of a record that is rewritten, it is the
//     newest (a record never rewritten is copied as first found): a run record
//     that has ended over one that has not, then the one with more steps
//     and decisions; the head naming the newest checkpoint; a tool call
//     with its result over its intent; the furthest uplink cursor. Copies
//     that cannot be ordered are reported and all left out;
//   - it is not a run record that says the run is unfinished when the
//     run's outcome index entry or outcome says it ended: where the copy
//     holds the outcome, the record is copied as that outcome ended the
//     run (endFromOutcome), and named; else it is left out. An unfinished
//     run record that is copied is reported too, and copied as failed
//     (holdRun): where its newer versions and its outcome are all lost,
//     nothing says it ended, and serve would resume it from a thread head
//     that may be older than its last commit, or lost.
//
// bbolt keeps no list of free pages in a store's file (NoFreelistSync),
// and a free page keeps what a transaction replaced, so an unlinked page
// may hold an older version of a record, or one deleted since. The rules
// keep such a version out wherever its newer one, or the tree that
// leaves it out, can still be read. Where neither can, the copy may hold
// an older version (db check of the copy then names what no longer fits),
// or a record that prune had removed, which the next prune removes again.
//
// Entries with no checksum of their own (the branches markers, the blob
// index, the meta bucket's) are not taken from unlinked pages: nothing
// says they are current. The appliance ID that older copies of the meta
// bucket name is the one exception, and only where the copy has no better
// word for it (keepAppliance in salvage.go). Where the blob index could not be read, the copy's
// is made anew from its blob log (rebuildBlobIndex), and the heads of
// the namespaces whose heads entry is lost from its checkpoints
// (rebuildHeads).

// unlinkedBuckets are the buckets whose records can be recognized on
// their own, in the order they are copied: the ledger before the runs,
// whose records it judges (endedRuns). The records never rewritten are
// copied during the scan.
var unlinkedBuckets = []string{bucketBlobLog, bucketOutcomes, bucketRuns, bucketCheckpoints, bucketHeads, bucketWrites,
	bucketToolCalls, bucketUplink}

// rewritten are the buckets whose records a commit may write again under
// the same key, so that a page nothing leads to may hold an older version.
var rewritten = map[string]bool{bucketRuns: true, bucketHeads: true, bucketToolCalls: true, bucketUplink: true}

// foundRecord is a record read from a page that the walk did not reach,
// with the bucket its shape names.
type foundRecord struct {
	bucket string
	k, v   []byte
}

// unlinkedRecords returns the records that the leaf page held in b holds
// (a page with its overflow), each with the one bucket it reads as: its
// own elements, and those of the inline buckets it holds (a root page's
// recent bucket). Anything else (a branch page, a page that is not whole,
// an element that reads as no record or as more than one) is passed over.
func unlinkedRecords(b []byte) []foundRecord {
	entries, ok := leafPageEntries(b, false)
	if !ok {
		return nil
	}
	var recs []foundRecord
	for _, e := range entries {
		if !e.bucket {
			if name, ok := recognize(e.k, e.v); ok {
				recs = append(recs, foundRecord{name, e.k, e.v})
			}
			continue
		}
		inner, ok := inlineEntries(e)
		if !ok {
			continue // a bucket with pages of its own, which the scan reads
		}
		for _, r := range inner {
			if name, ok := recognize(r.k, r.v); ok && !r.bucket && (name == string(e.k) || name == bucketCheckpoints && string(e.k) == bucketRecent) {
				recs = append(recs, foundRecord{name, r.k, r.v})
			}
		}
	}
	return recs
}

// applianceCopies returns the appliance IDs that the copies of the meta
// bucket held in the leaf page b name (metaCopies), those that name one
// the store would accept.
func applianceCopies(b []byte) []string {
	var ids []string
	for _, entries := range metaCopies(b) {
		if id, ok := metaApplianceOf(entries); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// epochCopies returns the stream epochs (NextStreamEpoch) that the copies
// of the meta bucket held in the leaf page b name, those that are 8 bytes.
func epochCopies(b []byte) []uint64 {
	var epochs []uint64
	for _, entries := range metaCopies(b) {
		for _, e := range entries {
			if bytes.Equal(e.k, metaStreamEpoch) && len(e.v) == 8 {
				epochs = append(epochs, binary.BigEndian.Uint64(e.v))
			}
		}
	}
	return epochs
}

// metaCopies returns the entries of the copies of the meta bucket that the
// leaf page b holds: the page's own elements when they are a meta
// bucket's, and the inline meta bucket a root page holds. A meta bucket is
// known by its format record, since its entries carry no checksum; the
// page bbolt freed when a transaction replaced it still holds it.
// Anything else holds none.
func metaCopies(b []byte) [][]salvageEntry {
	entries, ok := leafPageEntries(b, false)
	if !ok {
		return nil
	}
	if isMetaBucket(entries) {
		return [][]salvageEntry{entries}
	}
	var copies [][]salvageEntry
	for _, e := range entries {
		if string(e.k) != bucketMeta {
			continue
		}
		if inner, ok := inlineEntries(e); ok && isMetaBucket(inner) {
			copies = append(copies, inner)
		}
	}
	return copies
}

// leafPageEntries returns the elements of the leaf page held in b (an
// inline bucket's page when inline), or false when b holds no whole leaf
// page.
func leafPageEntries(b []byte, inline bool) ([]salvageEntry, bool) {
	branch, count, err := pageElements(b, "", inline)
	if err != nil || branch {
		return nil, false
	}
	entries, err := leafEntries(b, count, "")
	return entries, err == nil
}

// inlineEntries returns the elements of the bucket that the leaf element e
// holds inline, or false when e is no inline bucket, or a damaged one.
func inlineEntries(e salvageEntry) ([]salvageEntry, bool) {
	if !e.bucket || len(e.v) < inBucketSize || binary.LittleEndian.Uint64(e.v) != 0 {
		return nil, false
	}
	return leafPageEntries(e.v[inBucketSize:], true)
}

// isMetaBucket reports whether entries are a meta bucket's: they hold
// this store's format record and no bucket.
func isMetaBucket(entries []salvageEntry) bool {
	var format bool
	for _, e := range entries {
		switch {
		case e.bucket:
			return false
		case bytes.Equal(e.k, metaFormat):
			format = string(e.v) == formatName
		}
	}
	return format
}

// metaApplianceOf returns the appliance ID that the meta bucket entries
// name, when it is one the store would accept.
func metaApplianceOf(entries []salvageEntry) (string, bool) {
	for _, e := range entries {
		if bytes.Equal(e.k, metaAppliance) {
			return string(e.v), CheckApplianceID(string(e.v)) == nil
		}
	}
	return "", false
}

// recognize returns the one bucket whose record k and v are, or false when
// they read as none or as more than one.
func recognize(k, v []byte) (string, bool) {
	var match string
	for _, name := range unlinkedBuckets {
		if !keyFits(name, k, v) || recordFault(name, k, v) != nil {
			continue
		}
		if match != "" {
			return "", false
		}
		match = name
	}
	return match, match != ""
}

// keyFits reports whether k is the key that bucket name gives the record
// v (see the bucket keys in db.go), as far as the key can be told from the
// record. recordFault judges the record itself.
func keyFits(name string, k, v []byte) bool {
	switch name {
	case bucketBlobLog:
		return len(k) == 20
	case bucketOutcomes:
		o, _, err := decodeOutcome(v)
		return len(k) == 8 && err == nil && o.Seq == beUint64(k)
	case bucketRuns:
		if isOutcomeIndexKey(k) {
			return bytes.HasSuffix(k, []byte(outcomeIndexSuffix)) && bytes.Count(k, []byte{0}) == 1
		}
		r, _, err := decodeRun(v)
		return err == nil && r.ID == string(k)
	case bucketCheckpoints:
		c, err := decodeCheckpoint(v)
		return err == nil && bytes.Equal(k, checkpointKey(c.Thread, c.NS, c.ID))
	case bucketHeads:
		return bytes.Count(k, []byte{0}) == 1
	case bucketWrites:
		// thread \x00 ns \x00 checkpointID \x00 seq (8 bytes)
		return len(k) > 11 && k[len(k)-9] == 0 && bytes.Count(k[:len(k)-9], []byte{0}) == 2
	case bucketToolCalls:
		tc, err := decodeToolCall(v)
		return err == nil && tc.Key == string(k)
	case bucketUplink:
		return bytes.Equal(k, cursorKey)
	}
	return false
}

// copyUnlinked copies into out the records found on the pages the walk did
// not reach, where the walk could not reach them (see above).
func (w *salvageWalk) copyUnlinked(ctx context.Context, out *bbolt.DB) error {
	p := progressOf(ctx)
	// A record that is never rewritten is copied as it is found, a batch
	// at a time, so that the scan of a large store holds little of it; the
	// first version found of one is as good as any. The versions of the
	// others are held until the scan ends, to be ordered.
	found := map[string]map[string][][]byte{}
	batches := map[string][]salvageEntry{}
	for id := uint64(2); id < w.pgid; id++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if w.reached(id) {
			continue
		}
		page := w.unlinkedPage(id)
		for _, a := range applianceCopies(page) {
			w.applianceCopies[a] = true
		}
		for _, e := range epochCopies(page) {
			w.epochCopy = max(w.epochCopy, e)
		}
		for _, r := range unlinkedRecords(page) {
			if !w.unreached(r.bucket, r.k) && (r.bucket != bucketCheckpoints || !w.unreached(bucketRecent, r.k)) {
				continue
			}
			if !rewritten[r.bucket] {
				p.read()
				if batches[r.bucket] = append(batches[r.bucket], salvageEntry{k: r.k, v: r.v}); len(batches[r.bucket]) == salvageBatch {
					if err := w.putUnlinked(out, r.bucket, batches[r.bucket]); err != nil {
						return err
					}
					batches[r.bucket] = batches[r.bucket][:0]
				}
				continue
			}
			if found[r.bucket] == nil {
				found[r.bucket] = map[string][][]byte{}
			}
			vs := found[r.bucket][string(r.k)]
			if !slices.ContainsFunc(vs, func(v []byte) bool { return bytes.Equal(v, r.v) }) {
				found[r.bucket][string(r.k)] = append(vs, r.v)
			}
		}
	}
	for _, name := range unlinkedBuckets {
		if !rewritten[name] {
			if err := w.putUnlinked(out, name, batches[name]); err != nil {
				return err
			}
			continue
		}
		var ended map[string]runEnd
		if name == bucketRuns {
			var err error
			if ended, err = endedRuns(out, found[bucketRuns]); err != nil {
				return err
			}
		}
		var batch []salvageEntry
		for _, k := range slices.Sorted(maps.Keys(found[name])) {
			v, ok := newestVersion(name, found[name][k])
			end, endSaid := ended[k]
			switch {
			case !ok:
				w.lost(name, []byte(k), "found in %d differing versions on pages that nothing leads to any more, and which is the newest cannot be told: left out", len(found[name][k]))
				continue
			case name == bucketRuns && !isOutcomeIndexKey([]byte(k)) && end.outcome != nil && !runEnded(v):
				if v, ok = endFromOutcome(v, end); !ok {
					continue // the salvage copies only records that decode
				}
				if w.rep.Inferred == nil {
					w.rep.Inferred = map[string]string{}
				}
				w.rep.Inferred[k] = fmt.Sprintf("outcome %d", end.outcome.Seq)
				final := "the checkpoint of that version, which may be older than its last (no outcome index entry names its final one)"
				if end.checkpoint != "" {
					final = "the final checkpoint its outcome index entry names, " + end.checkpoint
				}
				w.lost(name, []byte(k), "found only as an older version, from before the run ended; its outcome (seq %d), which the copy "+
					"holds, says it ended %s at %s: it is copied as %s, with the outcome's end time, steps, output and error, and %s. "+
					"Decisions it recorded after that version, if any, are lost", end.outcome.Seq, end.outcome.Status,
					end.outcome.EndedAt.Format(time.RFC3339), end.outcome.Status, final)
			case name == bucketRuns && !isOutcomeIndexKey([]byte(k)) && endSaid && !runEnded(v):
				w.lost(name, []byte(k), "found only as an older version, from before the run ended (its outcome index entry is "+
					"stored, but not its outcome, which would say how it ended): left out")
				continue
			case name == bucketRuns && !isOutcomeIndexKey([]byte(k)) && !runEnded(v):
				var held bool
				if v, held = holdRun(v); held {
					w.held = append(w.held, k)
					w.lost(name, []byte(k), "came back unfinished from a page that nothing leads to any more, where a newer version, "+
						"and the thread's newest checkpoint, may be lost: resumed, it could run a committed step or a tool call again. "+
						"It is copied as failed, so that serve does not resume it; to go on from where it stood, fork its thread at its "+
						"newest checkpoint (outpost runs fork THREAD --checkpoint ID; outpost runs history THREAD lists the checkpoints, "+
						"or, where the thread's head is lost, db check of the copy names them)")
				} else {
					w.lost(name, []byte(k), "came back interrupted from a page that nothing leads to any more; if it had ended since, "+
						"that is lost. It waits for a person's decision as before; check its thread's history before resuming it")
				}
			}
			p.read()
			if batch = append(batch, salvageEntry{k: []byte(k), v: v}); len(batch) == salvageBatch {
				if err := w.putUnlinked(out, name, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if err := w.putUnlinked(out, name, batch); err != nil {
			return err
		}
	}
	return nil
}

// newerRecords handles the records on pages the walk did not reach when
// the tree walked is an older transaction's than the newest: a newer
// transaction wrote them, which is lost (or never committed), or they are
// older versions on free pages. The tree walked is whole, as after a crash
// before that commit, and the rest of that transaction is not mixed in: a
// part of a commit without the rest (an outcome without its run's last
// record) would have serve run a step again. The tool-call records are the
// exception (newerToolCalls).
func (w *salvageWalk) newerRecords(ctx context.Context, out *bbolt.DB) error {
	var last uint64
	var seqs []uint64
	calls := map[string][][]byte{}
	// The scan keeps only what is newer than the copy, so that it holds
	// little of a large store's free pages.
	err := out.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte(bucketOutcomes)); b != nil {
			if k, _ := b.Cursor().Last(); len(k) == 8 {
				last = beUint64(k)
			}
		}
		for id := uint64(2); id < w.pgid; id++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if w.reached(id) {
				continue
			}
			for _, r := range unlinkedRecords(w.unlinkedPage(id)) {
				switch {
				case r.bucket == bucketOutcomes: // an outcome's key is its seq, 8 bytes (keyFits)
					if seq := beUint64(r.k); seq > last && !slices.Contains(seqs, seq) {
						seqs = append(seqs, seq)
					}
				case r.bucket == bucketToolCalls && newerCall(tx, r.k, r.v):
					vs := calls[string(r.k)]
					if !slices.ContainsFunc(vs, func(v []byte) bool { return bytes.Equal(v, r.v) }) {
						calls[string(r.k)] = append(vs, r.v)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	w.newerOutcomes(seqs, last)
	return w.newerToolCalls(out, calls)
}

// newerOutcomes reports the outcomes found past the end of the copy's
// ledger at last, seqs, which the lost transaction appended. They are not
// copied: the rest of that transaction (its runs' last records and
// checkpoints) is lost with its root, and an outcome without it would have
// serve run its run again, to a second outcome. But the uplink may have
// sent them, and then the collector refuses the copy's next outcomes,
// which take their seqs, as a fork.
func (w *salvageWalk) newerOutcomes(seqs []uint64, last uint64) {
	if len(seqs) == 0 {
		return
	}
	slices.Sort(seqs)
	w.lost(bucketOutcomes, nil, "outcomes %d to %d, after the copy's ledger ends at %d, are on pages that a newer transaction wrote, "+
		"which is lost (or never committed); they are not copied, since the rest of that transaction is lost with them. "+
		"If the uplink sent them (the collector's list of appliances gives the last seq it holds), "+
		"the collector refuses the copy's next outcomes, which take their seqs, as a fork: restore a backup that holds them "+
		"rather than use this copy, if there is one", seqs[0], seqs[len(seqs)-1], last)
}

// newerCall reports whether the tool-call record v, found under k, is newer
// than the one the copy holds there, and of a run the copy holds.
func newerCall(tx *bbolt.Tx, k, v []byte) bool {
	tc, err := decodeToolCall(v)
	runs := tx.Bucket([]byte(bucketRuns))
	if err != nil || runs == nil || runs.Get([]byte(tc.RunID)) == nil {
		return false
	}
	calls := tx.Bucket([]byte(bucketToolCalls))
	if calls == nil || calls.Get(k) == nil {
		return true
	}
	return versionOrder(bucketToolCalls, v, calls.Get(k)) > 0
}

// newerToolCalls copies the tool-call records found, calls, that are newer
// than the copy's: an intent the copy lacks, or a result where the copy
// holds only the intent. A tool runs only once its intent is committed, so
// an intent that the lost transaction wrote may stand for a side effect
// that took place. Left out, the intent is unknown to the copy, and serve,
// resuming the run from the tree walked, would call the tool again without
// asking; copied, recovery treats it as after any crash: a recorded result
// is reused, and an intent without one is asked about (or, for a tool
// declared idempotent, run again under the same key). Unlike the rest of
// the transaction, such a record only makes a resumed run more careful.
// A record whose run the copy does not hold is left out (newerCall): it is
// one that prune removed (a free page keeps it), or one of a run the lost
// transaction started, which nothing resumes.
func (w *salvageWalk) newerToolCalls(out *bbolt.DB, calls map[string][][]byte) error {
	if len(calls) == 0 {
		return nil
	}
	var added []string
	err := out.Update(func(tx *bbolt.Tx) error {
		added = added[:0]
		b, err := tx.CreateBucketIfNotExists([]byte(bucketToolCalls))
		if err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(calls)) {
			v, ok := newestVersion(bucketToolCalls, calls[k])
			if !ok {
				w.lost(bucketToolCalls, []byte(k), "found in %d differing versions on pages that nothing leads to any more, and which is the newest cannot be told: left out", len(calls[k]))
				continue
			}
			if err := b.Put([]byte(k), v); err != nil {
				return fmt.Errorf("bucket %s: %w", bucketToolCalls, err)
			}
			added = append(added, k)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range added {
		w.countUnlinked(bucketToolCalls, []byte(k))
	}
	return nil
}

// unlinkedPage reads page id with its overflow when its header says it is
// that page and a leaf; nil otherwise.
func (w *salvageWalk) unlinkedPage(id uint64) []byte {
	b := make([]byte, w.ps)
	if _, err := w.f.ReadAt(b, int64(id*w.ps)); err != nil {
		return nil
	}
	le := binary.LittleEndian
	if le.Uint64(b) != id || le.Uint16(b[8:]) != leafPageFlag {
		return nil
	}
	if overflow := uint64(le.Uint32(b[12:])); overflow > 0 {
		if overflow >= w.pgid-id {
			return nil
		}
		b = make([]byte, (overflow+1)*w.ps)
		if _, err := w.f.ReadAt(b, int64(id*w.ps)); err != nil {
			return nil
		}
	}
	return b
}

// putUnlinked writes found records into bucket name of out, each one whose
// key the copy does not hold yet (a checkpoint: in neither the checkpoints
// nor the recent bucket), and keeps the bucket's sequence past the
// sequence numbers in the keys it writes (the blob log's and the pending
// writes'), which the walk's copy takes from the bucket's header.
func (w *salvageWalk) putUnlinked(out *bbolt.DB, name string, batch []salvageEntry) error {
	if len(batch) == 0 {
		return nil
	}
	var added []salvageEntry
	err := out.Update(func(tx *bbolt.Tx) error {
		added = added[:0]
		b, err := tx.CreateBucketIfNotExists([]byte(name))
		if err != nil {
			return err
		}
		recent := tx.Bucket([]byte(bucketRecent))
		for _, r := range batch {
			if b.Get(r.k) != nil || name == bucketCheckpoints && recent != nil && recent.Get(r.k) != nil {
				continue
			}
			if err := b.Put(r.k, r.v); err != nil {
				return fmt.Errorf("bucket %s: %w", name, err)
			}
			var seq uint64
			switch name {
			case bucketBlobLog:
				seq = beUint64(r.k)
			case bucketWrites:
				seq = beUint64(r.k[len(r.k)-8:])
			}
			if seq > b.Sequence() {
				if err := b.SetSequence(seq); err != nil {
					return err
				}
			}
			added = append(added, r)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range added {
		w.countUnlinked(name, r.k)
	}
	return nil
}

// countUnlinked counts a record copied from a page the walk did not reach.
func (w *salvageWalk) countUnlinked(name string, k []byte) {
	if w.rep.Unlinked == nil {
		w.rep.Unlinked = map[string]int{}
	}
	w.rep.Records[recordKind(name, k)]++
	w.rep.Unlinked[recordKind(name, k)]++
}

// newestVersion returns the newest of a record's differing versions, the
// one newer than every other by its bucket's order (versionOrder), or
// false when there is none.
func newestVersion(name string, vs [][]byte) ([]byte, bool) {
	for i, v := range vs {
		newer := true
		for j, o := range vs {
			if i != j && versionOrder(name, v, o) <= 0 {
				newer = false
			}
		}
		if newer {
			return v, true
		}
	}
	return nil, false
}

// versionOrder compares two versions of one record: positive when a is
// newer, negative when b is, 0 when it cannot be told. The records of the
// buckets not named are never rewritten, so two differing versions of one
// cannot be ordered.
func versionOrder(name string, a, b []byte) int {
	switch name {
	case bucketRuns:
		if ra, err := decodeRunRecord(a); err == nil {
			if rb, err := decodeRunRecord(b); err == nil {
				return runOrder(ra, rb)
			}
		}
		var oa, ob outcomeRun
		if decodeJSONRecord(a, outcomeRunVersion, &oa) == nil && decodeJSONRecord(b, outcomeRunVersion, &ob) == nil {
			return cmpUint(oa.Seq, ob.Seq)
		}
	case bucketHeads:
		ha, _ := decodeHead(a)
		hb, _ := decodeHead(b)
		return strings.Compare(ha, hb) // checkpoint IDs are time-ordered
	case bucketToolCalls:
		ta, _ := decodeToolCall(a)
		tb, _ := decodeToolCall(b)
		if ta != nil && tb != nil {
			return boolOrder(ta.Status == ToolCallDone, tb.Status == ToolCallDone)
		}
	case bucketUplink:
		ca, _ := decodeCursor(a)
		cb, _ := decodeCursor(b)
		return cmpUint(ca, cb)
	}
	return 0
}

// runOrder orders two versions of a run record by how far the run got:
// ended, then steps, decisions and checkpoint.
func runOrder(a, b *runRecord) int {
	if c := boolOrder(a.Status.Terminal(), b.Status.Terminal()); c != 0 {
		return c
	}
	if c := a.Steps - b.Steps; c != 0 {
		return c
	}
	if c := len(a.Decisions) - len(b.Decisions); c != 0 {
		return c
	}
	return strings.Compare(a.Checkpoint, b.Checkpoint)
}

func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func cmpUint(a, b uint64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}

// holdRun returns the run record v, found on a page that nothing leads to
// any more and saying the run is unfinished, as one that serve does not
// resume, and true; an interrupted run is left as it is (it waits for a
// person already), and false. Resuming starts from the thread's head as
// the copy has it, which may be older than the run's last commit, or lost
// (then the run starts over from nothing): steps committed after it would
// run again, and a tool call whose record is lost would repeat its side
// effect. Failed, the run stays readable, with its checkpoints, and its
// thread is free.
func holdRun(v []byte) ([]byte, bool) {
	r, err := decodeRunRecord(v)
	if err != nil || r.Status == engine.StatusInterrupted {
		return v, false
	}
	r.Status, r.EndedAt = engine.StatusFailed, time.Now().UTC()
	r.Error = "salvage: this run came back unfinished from a damaged store, where its newer state may be lost; not resumed " +
		"(fork its thread at its newest checkpoint to go on)"
	return encodeRunRecord(r), true
}

// holdRunsMissingCalls copies as failed (holdRun) each run the walk read
// as running whose tool-call records may lie where the walk could not
// reach, and whose records the search of the other pages may not all have
// found: resumed, the run would find no record under a lost call's key
// and call the tool again, without asking, where the call may have run.
// Its tool calls' keys start with its ID and a colon (internal/wiring's
// keys). The records of its model calls ("model:" and its ID) are left
// out of the count: a model called again has no side effect, and tool
// calls it asks for anew are checked against those recorded.
func (w *salvageWalk) holdRunsMissingCalls(out *bbolt.DB) error {
	gaps := w.gaps[bucketToolCalls]
	if len(gaps) == 0 || w.rootLost {
		return nil // with the root lost, every run was found on such a page
	}
	return out.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketRuns))
		if b == nil {
			return nil
		}
		var held [][2][]byte
		err := b.ForEach(func(k, v []byte) error {
			if isOutcomeIndexKey(k) || w.unreached(bucketRuns, k) {
				return nil // found on such a page: copyUnlinked judged it
			}
			r, err := decodeRunRecord(v)
			if err != nil || r.Status != engine.StatusRunning {
				return nil
			}
			if w.callsMayBeLost(string(k)) {
				failed, _ := holdRun(v)
				held = append(held, [2][]byte{bytes.Clone(k), failed})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, h := range held {
			if err := b.Put(h[0], h[1]); err != nil {
				return err
			}
			w.held = append(w.held, string(h[0]))
			w.lost(bucketRuns, h[0], "was running, and some of its tool-call records may be lost with a page that cannot be read: "+
				"resumed, it would call a tool again whose call may have run, without asking. It is copied as failed, so that "+
				"serve does not resume it; to go on from where it stood, fork its thread at its newest checkpoint (outpost runs "+
				"fork THREAD --checkpoint ID), once you know what its tools did")
		}
		return nil
	})
}

// MetaCallsLostThrough is the key of Run.Meta by which salvage marks a run
// that it copies unfinished and whose tool-call records may be lost
// (callsMayBeLost). Where the copy holds the run's newest state (see
// reachKnown), its value is the newest checkpoint ID the copy holds of the
// run's thread, in any namespace: a task that runs from that checkpoint or
// an older one (the steps up to and including the run's step at salvage)
// may have called a tool before the store was damaged, and the call's
// record may be lost; a task that runs from a newer checkpoint made its
// calls after the salvage, and their records are known. Where the copy
// may not hold it, its value is CallsLostInAnyStep. The tool loop asks a
// person before it runs a call of a tool not declared idempotent that
// such a task makes and that has no record (see agent.LostCalls). Code
// that does not know the key ignores it.
const MetaCallsLostThrough = "store.calls_lost_through"

// CallsLostInAnyStep is the value of MetaCallsLostThrough for a run whose
// reach the copy cannot tell: its newest record, or its thread's newest
// checkpoints, may be lost with the damage. Resumed, it runs again from an
// older checkpoint, under new ones, steps that it may have run before:
// every task of the run may be repeating a call whose record is lost. (The
// value also sorts after every checkpoint ID, so that code which reads it
// as one asks about every step as well.)
const CallsLostInAnyStep = "any"

// markLostCalls marks (MetaCallsLostThrough) each unfinished run of the copy
// whose tool-call records may be lost: resumed, the node it paused in runs
// again, and a call whose record is lost would otherwise run as a new one.
// It marks as well each one whose reach the copy cannot tell (reachKnown),
// even where its calls' records are whole: the steps it runs again under
// new checkpoints call their tools under new keys, which no record
// answers. A run held as failed (holdRun) is resumed by no one, and is not
// marked.
func (w *salvageWalk) markLostCalls(out *bbolt.DB) error {
	return out.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketRuns))
		if b == nil {
			return nil
		}
		marked := map[string]*runRecord{}
		threads := map[string]string{}
		err := b.ForEach(func(k, v []byte) error {
			if isOutcomeIndexKey(k) || !w.callsMayBeLost(string(k)) && w.reachKnown(string(k)) {
				return nil
			}
			r, err := decodeRunRecord(v)
			if err != nil || r.Status.Terminal() {
				return nil
			}
			marked[string(k)], threads[r.Thread] = r, r.Checkpoint
			return nil
		})
		if err != nil || len(marked) == 0 {
			return err
		}
		// Checkpoint keys begin with the ID, so a thread's newest is found
		// only by reading them all.
		for _, name := range []string{bucketCheckpoints, bucketRecent} {
			cb := tx.Bucket([]byte(name))
			if cb == nil {
				continue
			}
			err := cb.ForEach(func(k, _ []byte) error {
				thread, _, id, ok := splitCheckpointKey(k)
				if newest, want := threads[thread]; ok && want && id > newest {
					threads[thread] = id
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		for _, id := range slices.Sorted(maps.Keys(marked)) {
			r := marked[id]
			through := threads[r.Thread]
			switch {
			case !w.reachKnown(id):
				through = CallsLostInAnyStep
				if !w.callsMayBeLost(id) { // else unnamedCalls says it
					w.lost(bucketRuns, []byte(id), "is unfinished, and the copy may not hold its newest record or "+
						"checkpoints, nor tell how far it got: %s", resumedInAnyStep)
				}
			case through == "":
				continue // no checkpoint to resume from: nothing runs again
			}
			if r.Meta == nil {
				r.Meta = map[string]string{}
			}
			r.Meta[MetaCallsLostThrough] = through
			if err := b.Put([]byte(id), encodeRunRecord(r)); err != nil {
				return fmt.Errorf("bucket %s: %w", bucketRuns, err)
			}
		}
		return nil
	})
}

// resumedInAnyStep says what resuming a run marked CallsLostInAnyStep does.
const resumedInAnyStep = "resumed, it goes on from the newest checkpoint of its thread that the copy holds, which may be " +
	"behind it, and runs again steps it may have run, whose calls have new keys that no record answers: each call it makes " +
	"of a tool not declared idempotent that has no record, in any step, waits for a person's decision " +
	"(uncertain_side_effect), as a call that a crash cut short does; a tool declared idempotent is called again. Find out " +
	"from the tools' side what it did before deciding"

// reachKnown reports whether the copy holds how far the run id got: its
// newest record, and every checkpoint of the store. Resumed, it then goes
// on from the checkpoint it stood at, and runs again only the step it
// stood in (a subgraph's inner steps included, from their own newest
// checkpoints). Otherwise a newer record, or the newest checkpoints of its
// thread (which wait in the recent bucket, in the root page), may be lost:
// the run may have gone on past the copy's newest checkpoint by steps
// whose number nothing left tells, and resumed from it, it runs those
// steps again, under checkpoints made after the salvage.
func (w *salvageWalk) reachKnown(id string) bool {
	if w.rootLost || w.unreached(bucketRuns, []byte(id)) || w.checkpointsLeftOut() {
		return false
	}
	return len(w.gaps[bucketCheckpoints]) == 0 && len(w.gaps[bucketRecent]) == 0
}

// checkpointsLeftOut reports whether checkpoints were left out of the copy
// one by one, on pages that were read: records that failed their checks.
func (w *salvageWalk) checkpointsLeftOut() bool {
	return slices.ContainsFunc(w.rep.Lost, func(p Problem) bool {
		return p.Bucket == bucketCheckpoints || p.Bucket == bucketRecent
	})
}

// callsMayBeLost reports whether tool-call records of the run id may lie
// where the walk could not reach: in the root page, which holds the
// tool-call records of a store with few of them, or below a lost page of
// the bucket. Its tool calls' keys start with its ID and a colon
// (internal/wiring's keys).
func (w *salvageWalk) callsMayBeLost(id string) bool {
	lo := []byte(id + ":")
	hi := prefixEnd(lo)
	return w.rootLost || slices.ContainsFunc(w.gaps[bucketToolCalls], func(g keyRange) bool {
		return (g.hi == nil || bytes.Compare(g.hi, lo) > 0) && (g.lo == nil || bytes.Compare(g.lo, hi) < 0)
	})
}

// lostCallsWhere says where the tool-call records that callsMayBeLost
// means were lost.
func (w *salvageWalk) lostCallsWhere() string {
	if w.rootLost {
		return "the root page, which holds them all in a store with few of them, or on a page that cannot be read, which " +
			"nothing tells apart from a free one once the root page is lost"
	}
	return "a page of the tool-call records that cannot be read"
}

// unnamedCalls says plainly, for each run whose tool-call records may be
// lost (callsMayBeLost), that the calls salvage names are not all it made:
// a run copied as failed (holdRun) whose calls salvage cannot name may
// still have called a tool, which a new run on a fork of its thread calls
// again without asking; and a run that waits for a person runs again, once
// resumed, the node it paused in, whose calls may have lost their records:
// marked (markLostCalls), it asks a person before it runs again such a call
// of a tool not declared idempotent (DESIGN: a side effect is never
// silently repeated). Neither is resumed by serve at start.
func (w *salvageWalk) unnamedCalls(out *bbolt.DB) error {
	return out.View(func(tx *bbolt.Tx) error {
		runs, calls := tx.Bucket([]byte(bucketRuns)), tx.Bucket([]byte(bucketToolCalls))
		if runs == nil {
			return nil
		}
		named := func(id string) int {
			n := 0
			if calls != nil {
				prefix := []byte(id + ":")
				c := calls.Cursor()
				for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
					n++
				}
			}
			return n
		}
		for _, id := range w.held {
			if w.callsMayBeLost(id) {
				w.lost(bucketToolCalls, []byte(id+":"), "run %s, copied as failed, may have made tool calls whose records are lost, "+
					"with %s: %d record(s) of its calls came back, and any other call it made cannot be named. A new run on a fork of "+
					"its thread calls such a tool again without asking: find out from the tools' side what it did before going on",
					id, w.lostCallsWhere(), named(id))
			}
		}
		return runs.ForEach(func(k, v []byte) error {
			if isOutcomeIndexKey(k) || !w.callsMayBeLost(string(k)) {
				return nil
			}
			r, err := decodeRunRecord(v)
			if err != nil || r.Status != engine.StatusInterrupted {
				return nil
			}
			if r.Meta[MetaCallsLostThrough] == CallsLostInAnyStep {
				w.lost(bucketToolCalls, append(bytes.Clone(k), ':'), "run %s waits for a person, and records of its tool calls "+
					"may be lost, with %s (%d came back); and the copy may not hold its newest record or checkpoints, nor tell "+
					"how far it got: %s", k, w.lostCallsWhere(), named(string(k)), resumedInAnyStep)
				return nil
			}
			w.lost(bucketToolCalls, append(bytes.Clone(k), ':'), "run %s waits for a person, and records of its tool calls may be "+
				"lost, with %s (%d came back): resumed, the node it paused in runs again, and each call it makes again of a tool "+
				"not declared idempotent whose record is lost waits for a person's decision (uncertain_side_effect), as a call "+
				"that a crash cut short does; a tool declared idempotent is called again with the same key. Find out from the "+
				"tools' side what it did before deciding", k, w.lostCallsWhere(), named(string(k)))
			return nil
		})
	})
}

// heldIntents names the tool calls of the runs copied as failed (holdRun)
// that recorded their intent and no result: the tool may have run. Such a
// run is not resumed, so no recovery asks a person about the call, as it
// would (uncertain_side_effect); and a new run on a fork of its thread
// runs the step again under keys of its own, which calls the tool again
// without asking. The person who goes on from the copy is told instead.
func (w *salvageWalk) heldIntents(out *bbolt.DB) error {
	return out.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketToolCalls))
		if b == nil {
			return nil
		}
		for _, id := range w.held {
			c := b.Cursor()
			prefix := []byte(id + ":")
			for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				tc, err := decodeToolCall(v)
				if err != nil || tc.Status != ToolCallIntent {
					continue
				}
				w.lost(bucketToolCalls, k, "run %s, copied as failed, called tool %s and recorded no result: the tool may have run. "+
					"Nothing resumes the run to ask about it, and a new run on a fork of its thread calls the tool again without "+
					"asking: find out whether it took effect before going on", id, tc.Tool)
			}
		}
		return nil
	})
}

// appendHeldOutcomes appends to the ledger of the copy at path the outcome
// of each run copied as failed (holdRun), with the run's record as it is
// copied, through the commit that ends any run: every run that ends leaves
// an outcome, and the collector learns of these only so. Each is chained
// to the copy's last outcome, so that db check of the copy and the
// collector verify the chain as before. Where the collector acknowledged
// outcomes the copy lacks (cursorPastLedger), none is appended: it would
// take a seq the collector holds under another hash.
func (w *salvageWalk) appendHeldOutcomes(ctx context.Context, path string) error {
	if len(w.held) == 0 {
		return nil
	}
	if w.ackedPast {
		w.lost(bucketOutcomes, nil, "the %d run(s) copied as failed get no outcome: the seqs the copy's ledger would give them are "+
			"ones the collector holds", len(w.held))
		return nil
	}
	d, err := Open(path, Options{})
	if err != nil {
		return err
	}
	// The copy is meant to be moved into a data folder; its lock file,
	// which only this Open made, is not.
	defer os.Remove(LockFile(path))
	for _, id := range w.held {
		r, err := d.Run(ctx, id)
		if err == nil {
			err = d.Commit(ctx, &engine.Commit{Run: r, Sync: true})
		}
		var ce *CorruptError
		switch {
		case err == nil:
			w.rep.OutcomesAppended++
		case ctx.Err() == nil && (errors.As(err, &ce) || errors.Is(err, engine.ErrBlobNotFound)):
			w.lost(bucketRuns, []byte(id), "copied as failed, but its outcome cannot be appended (%v): the collector does not learn "+
				"that it ended", err)
		default:
			return errors.Join(err, d.Close())
		}
	}
	return d.Close()
}

// runEnded reports whether the run record v says the run has ended.
func runEnded(v []byte) bool {
	r, err := decodeRunRecord(v)
	return err == nil && r.Status.Terminal()
}

// runEnd is what the copy says of a run that ended: its newest terminal
// outcome in the copy's ledger, with the reference of an output kept out
// of line (nil where only an outcome index entry says it ended), and the
// final checkpoint that its outcome index entry names ("" where none is
// copied or found).
type runEnd struct {
	outcome    *Outcome
	outputRef  engine.BlobRef
	checkpoint string
}

// endedRuns returns the runs that the copy's ledger and outcome index, or
// the outcome index entries found, say have ended.
func endedRuns(out *bbolt.DB, found map[string][][]byte) (map[string]runEnd, error) {
	ended := map[string]runEnd{}
	index := func(k string, v []byte) {
		var o outcomeRun
		if decodeJSONRecord(v, outcomeRunVersion, &o) == nil && o.Status.Terminal() {
			id := strings.TrimSuffix(k, outcomeIndexSuffix)
			e := ended[id]
			e.checkpoint = o.Checkpoint
			ended[id] = e
		}
	}
	for k, vs := range found {
		if v, ok := newestVersion(bucketRuns, vs); ok && isOutcomeIndexKey([]byte(k)) {
			index(k, v)
		}
	}
	err := out.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte(bucketOutcomes)); b != nil {
			err := b.ForEach(func(_, v []byte) error {
				if o, ref, err := decodeOutcome(v); err == nil && o.Status.Terminal() {
					e := ended[o.Run]
					e.outcome, e.outputRef = o, ref // the ledger's order: the newest last
					ended[o.Run] = e
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if b := tx.Bucket([]byte(bucketRuns)); b != nil {
			return b.ForEach(func(k, v []byte) error {
				if isOutcomeIndexKey(k) {
					index(string(k), v)
				}
				return nil
			})
		}
		return nil
	})
	return ended, err
}

// endFromOutcome returns the run record v, an older version that says the
// run is unfinished, as the run ended by the outcome e holds: its status,
// end time, steps, output and error, which the commit that ended the run
// wrote together with the newest version, and the final checkpoint that
// its outcome index entry names, where one is copied or found. The
// interrupts the older version waited on were answered, or the run would
// not have ended. It returns false where v does not decode.
func endFromOutcome(v []byte, e runEnd) ([]byte, bool) {
	r, err := decodeRunRecord(v)
	if err != nil {
		return v, false
	}
	o := e.outcome
	r.Status, r.EndedAt, r.Steps, r.Error, r.Interrupts = o.Status, o.EndedAt, o.Steps, o.Error, nil
	r.Output, r.OutputRef = nil, ""
	if !e.outputRef.IsZero() {
		r.OutputRef = e.outputRef.String()
	} else if len(o.Output) > 0 && string(o.Output) != "null" {
		r.Output = o.Output
	}
	if e.checkpoint != "" {
		r.Checkpoint = e.checkpoint
	}
	return encodeRunRecord(r), true
}

// rebuildBlobIndex indexes every blob of the copy's log at or below the
// indexed mark that its index lacks, as the lost part of the index did.
// Where the mark is lost, every blob of the log is indexed, and the mark
// set at the log's sequence, as migrateBlobs does.
func rebuildBlobIndex(tx *bbolt.Tx) error {
	log := tx.Bucket([]byte(bucketBlobLog))
	if log == nil || tx.Bucket([]byte(bucketMeta)) == nil {
		return nil // no blob, or no meta bucket to hold a mark
	}
	mark, err := indexedMark(tx)
	if err != nil {
		return nil // db check of the copy names a malformed mark
	}
	if mark == 0 {
		if mark = log.Sequence(); mark == 0 {
			return nil
		}
		if err := bucket(tx, bucketMeta).Put(metaBlobIndexed, binary.BigEndian.AppendUint64(nil, mark)); err != nil {
			return err
		}
	}
	index, err := tx.CreateBucketIfNotExists([]byte(bucketBlobIndex))
	if err != nil {
		return err
	}
	c := log.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		seq, ref, ok := parseBlobLogKey(k)
		if !ok {
			continue // db check of the copy names it
		}
		if seq > mark {
			break
		}
		if index.Get(blobKey(ref)) == nil {
			if err := index.Put(blobKey(ref), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
				return err
			}
		}
	}
	return nil
}
