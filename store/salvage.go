package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// SalvageReport says what Salvage copied out of a damaged store and what
// it could not.
type SalvageReport struct {
	// TxID is the transaction whose meta page the walk started from.
	TxID uint64 `json:"txid"`
	// Records counts the records copied, by bucket.
	Records map[string]int `json:"records"`
	// Unlinked counts, of Records, those found on pages that nothing led
	// to any more (below a root or branch page that could not be read), by
	// bucket; see unlinked.go for how such a record is judged current.
	Unlinked map[string]int `json:"unlinked,omitempty"`
	// Lost lists what could not be read: a meta page, a page and the part
	// of a bucket below it, a bucket the file no longer names, a record
	// that fails its own checksum or decoding.
	Lost []Problem `json:"lost"`
	// Check is db check of the new store: the references that the lost
	// records leave dangling, a broken outcome chain.
	Check *CheckReport `json:"check"`
	// ApplianceID is the appliance ID the copy holds, the one its
	// outcomes go upstream as; ApplianceFrom says where it was found
	// (ApplianceFromStore and the others below).
	ApplianceID   string `json:"appliance_id"`
	ApplianceFrom string `json:"appliance_from"`
	// HeadsRebuilt counts the namespaces whose heads entry was lost, or
	// found only on a page that nothing leads to any more, and whose
	// leaves are recorded anew from the checkpoints copied (rebuildHeads),
	// so that their history lists them and a new run goes on from the
	// newest.
	HeadsRebuilt int `json:"heads_rebuilt"`
	// OutcomesAppended counts the outcomes appended to the copy's ledger
	// for the runs it copies as failed (appendHeldOutcomes).
	OutcomesAppended int `json:"outcomes_appended"`
	// Inferred names, by run ID, the runs found only as an older version
	// from before they ended, whose ended state is taken from the outcome
	// the copy holds, and that outcome ("outcome SEQ"): the commit that
	// ends a run writes its outcome with its last record.
	Inferred map[string]string `json:"inferred,omitempty"`
	// BranchesRebuilt counts the namespaces whose heads entry was read
	// but whose branches entries (their older leaves) may be lost: their
	// leaves are recorded anew in the same way, so that their history
	// lists every checkpoint copied.
	BranchesRebuilt int `json:"branches_rebuilt"`
	// WritesLeftOut counts the pending writes read but left out of the
	// copy, each also in Lost: their checkpoint is not in the copy
	// (dropOrphanWrites).
	WritesLeftOut int `json:"writes_left_out"`
}

// Where a salvaged copy's appliance ID comes from: the store's own meta
// bucket; where that is lost, the outcomes copied, which each carry the
// ID they were chained under; the ID the operator gave
// (SalvageOptions.ApplianceID); an older copy of the meta bucket on a page
// that nothing leads to any more; or, where none of them names one, a new
// ID, which a collector takes for another appliance.
const (
	ApplianceFromStore    = "store"
	ApplianceFromOutcomes = "outcomes"
	ApplianceFromOption   = "option"
	ApplianceFromOldCopy  = "old-copy"
	ApplianceFromNew      = "new"
)

// SalvageOptions tune SalvageWith.
type SalvageOptions struct {
	// ApplianceID is the appliance ID to give the copy when the store's
	// own is lost and no outcome copied names it. One that differs from
	// the ID the store or its outcomes name is refused (ErrApplianceID):
	// the outcomes chained under that ID cannot move to another.
	ApplianceID string
}

// MarshalJSON writes an empty Lost as [], not null, as CheckReport does
// its problems, so that a script reads a list either way.
func (r SalvageReport) MarshalJSON() ([]byte, error) {
	type plain SalvageReport
	if r.Lost == nil {
		r.Lost = []Problem{}
	}
	return json.Marshal(plain(r))
}

// OK reports whether everything was copied and the new store checks
// clean.
func (r *SalvageReport) OK() bool { return len(r.Lost) == 0 && r.Check != nil && r.Check.OK() }

// Salvage copies every record it can still read from the store file src,
// which may be damaged beyond what Open accepts (ErrDamaged), into a new
// store file dst. It reads the file page by page without bbolt, from the
// newest meta page that is whole (the older one when that walk cannot
// reach the root), and passes over a page that is not whole together with
// what lies below it, so one bad page loses the records it holds rather
// than the store. The records below a lost page that names others (the
// root page, a branch page) are then looked for page by page, among the
// pages the walk did not reach, and copied where they can be told current
// (unlinked.go); the report counts them apart. A record that fails its own checksum or decoding is
// left out too, and reported lost by bucket and key: copied, it would fail
// in the new store as it did in the old one, and stop whatever reads it
// (listing runs, starting serve). db check of the new store, part of the
// report, names the references that the lost records leave dangling.
//
// Under WithProgress it reports the records copied so far. src is locked
// as Open locks it, so a process writing to it makes Salvage fail with
// ErrInUse; it is never written. dst must not exist; it appears whole or
// not at all.
func Salvage(ctx context.Context, src, dst string) (*SalvageReport, error) {
	return SalvageWith(ctx, src, dst, SalvageOptions{})
}

// SalvageWith is Salvage with options.
func SalvageWith(ctx context.Context, src, dst string, opts SalvageOptions) (*SalvageReport, error) {
	if opts.ApplianceID != "" {
		if err := CheckApplianceID(opts.ApplianceID); err != nil {
			return nil, fmt.Errorf("salvage %s: %w", src, err)
		}
	}
	if _, err := os.Stat(dst); err == nil {
		return nil, fmt.Errorf("salvage into %s: %w", dst, os.ErrExist)
	}
	lock, err := lockStore(src, false, DefaultTimeout)
	if err != nil && !errors.Is(err, errLocked) {
		// The lock file cannot be made, as on a damaged disk mounted
		// read-only: a shared lock on the one there is, which a writer's
		// lock still excludes, will do.
		lock, err = lockStore(src, true, DefaultTimeout)
	}
	if errors.Is(err, errLocked) {
		// Plain: the caller knows which process that is and says how to
		// stop it (outpost db salvage names serve).
		return nil, fmt.Errorf("salvage %s: %w", src, ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}
	if lock != nil {
		defer lock.Close()
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}

	rep := &SalvageReport{Records: map[string]int{}}
	metas := salvageMetas(f, rep)
	if len(metas) == 0 {
		if err := hollow(f, fi.Size()); err != nil {
			return rep, fmt.Errorf("salvage %s: %w", src, err)
		}
		return rep, fmt.Errorf("salvage %s: %w: neither meta page is whole, so nothing in the file can be found", src, ErrDamaged)
	}
	var w *salvageWalk
	var entries []salvageEntry
	var stamp, txid uint64
	for _, m := range metas {
		stamp, txid = max(stamp, m.startCount()), max(txid, m.txid)
	}
	newWalk := func(m boltMeta) *salvageWalk {
		return &salvageWalk{pageWalk: newPageWalk(f, m.pageSize, min(m.pgid, uint64(fi.Size())/m.pageSize)), rep: rep,
			gaps: map[string][]keyRange{}, applianceWant: opts.ApplianceID, applianceCopies: map[string]bool{},
			srcStamp: stamp, srcTxID: txid}
	}
	for i, m := range metas {
		w = newWalk(m)
		entries = nil
		err := w.tree(ctx, m.root, "the meta page", nil, nil, func(e salvageEntry) error { entries = append(entries, e); return nil })
		if ctx.Err() != nil {
			return rep, fmt.Errorf("salvage %s: %w", src, ctx.Err())
		}
		if err == nil {
			rep.TxID = m.txid
			// A newer transaction than the tree used may have been
			// committed: its root page is lost, or its meta page is not
			// whole.
			w.newerLost = i > 0 || len(metas) < 2
			break
		}
		if i == len(metas)-1 {
			// Nothing names the buckets any more, but their pages may
			// still be whole: they are looked for one by one (unlinked.go).
			rep.Lost = append(rep.Lost, Problem{Message: fmt.Sprintf(
				"the root page cannot be read from either meta page (%v): the buckets' records are looked for page by page, and the inline buckets (the meta bucket's format records and appliance ID among them) are lost", err)})
			w, entries = newWalk(metas[0]), nil
			w.rootLost, rep.TxID = true, metas[0].txid
			break
		}
		rep.Lost = append(rep.Lost, Problem{Message: fmt.Sprintf(
			"the root page of transaction %d cannot be read (%v); the older meta page (transaction %d) is used instead", m.txid, err, metas[i+1].txid)})
	}
	if m := metas[0]; uint64(fi.Size()) < m.pgid*m.pageSize {
		rep.Lost = append(rep.Lost, Problem{Message: fmt.Sprintf(
			"the file holds %d bytes, but its pages reach %d: it was cut short, and what its last pages held is lost", fi.Size(), m.pgid*m.pageSize)})
	}

	tmp := dst + ".salvage"
	_ = os.Remove(tmp) // a leftover of a salvage that did not finish
	if err := w.copyInto(ctx, tmp, entries); err != nil {
		if !errors.Is(err, ErrApplianceID) { // a refusal, not a failed write
			err = fmt.Errorf("write %s: %w", tmp, err)
		}
		return rep, errors.Join(fmt.Errorf("salvage %s: %w", src, err), removeIfExists(tmp))
	}
	if err := w.appendHeldOutcomes(ctx, tmp); err != nil {
		return rep, errors.Join(fmt.Errorf("salvage %s: %w", src, err), removeIfExists(tmp), removeIfExists(LockFile(tmp)))
	}
	if err := stampEpoch(tmp, w.epoch); err != nil {
		return rep, errors.Join(fmt.Errorf("salvage %s: %w", src, err), removeIfExists(tmp), removeIfExists(LockFile(tmp)))
	}
	if err := os.Rename(tmp, dst); err != nil {
		return rep, errors.Join(fmt.Errorf("salvage %s: %w", src, err), removeIfExists(tmp))
	}
	if err := fsync.Dir(filepath.Dir(dst)); err != nil {
		return rep, fmt.Errorf("salvage %s: %w", src, err)
	}
	// Open adds what the copy lacks (a lost bucket, the appliance ID) and
	// upgrades an older format, as it would for the original.
	d, err := Open(dst, Options{})
	if err != nil {
		return rep, fmt.Errorf("salvage %s: the copy %s does not open: %w", src, dst, err)
	}
	rep.ApplianceID = d.ApplianceID()
	// The check's reads are not the salvage's progress.
	rep.Check, err = d.Check(context.WithValue(ctx, progressKey{}, (*progress)(nil)))
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	// The copy is meant to be moved into a data folder; its lock file,
	// which only this Open made, is not.
	_ = os.Remove(LockFile(dst))
	if err != nil {
		return rep, fmt.Errorf("salvage %s: check the copy %s: %w", src, dst, err)
	}
	return rep, nil
}

// salvageMetas returns the whole meta pages, newest first.
func salvageMetas(f *os.File, rep *SalvageReport) []boltMeta {
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	m0, m1, off1 := readMetas(f, size)
	var metas []boltMeta
	if m0.valid {
		metas = append(metas, m0)
	} else {
		rep.Lost = append(rep.Lost, Problem{Message: "the meta page at byte 0 is not whole"})
	}
	switch {
	case m1.valid:
		metas = append(metas, m1)
	case m0.valid:
		rep.Lost = append(rep.Lost, Problem{Message: fmt.Sprintf("the meta page at byte %d is not whole", off1)})
	default:
		rep.Lost = append(rep.Lost, Problem{Message: "no second meta page is whole"})
	}
	slices.SortFunc(metas, func(a, b boltMeta) int {
		switch {
		case a.txid > b.txid:
			return -1
		case a.txid < b.txid:
			return 1
		}
		return 0
	})
	return metas
}

// salvageWalk reads pages as the open-time check does (pageWalk), but
// passes over a page that is not whole, and what lies below it, instead of
// stopping.
type salvageWalk struct {
	*pageWalk
	rep *SalvageReport
	// bucket names the bucket being read, "" for the root bucket.
	bucket string
	// gaps are the key ranges of each bucket that lie below a page the
	// walk could not read; rootLost, that no meta page leads to any
	// bucket. The pages the walk did not reach are searched for records
	// in them (unlinked.go).
	gaps     map[string][]keyRange
	rootLost bool
	// applianceWant is SalvageOptions.ApplianceID; applianceCopies, the
	// appliance IDs that older copies of the meta bucket found on those
	// pages name (applianceCopies in unlinked.go).
	applianceWant   string
	applianceCopies map[string]bool
	// epochCopy is the greatest stream epoch that those copies name;
	// srcStamp and srcTxID, the greatest epoch stamp (stampEpoch) and
	// transaction ID that the source's whole meta pages hold; epoch, the
	// stream epoch the copy is given (moveEpoch).
	epochCopy, srcStamp, srcTxID uint64
	epoch                        uint64
	// newerLost says the tree walked is not the newest transaction's.
	newerLost bool
	// held are the runs copied as failed (holdRun); ackedPast, that the
	// collector acknowledged outcomes the copy's ledger lacks
	// (cursorPastLedger).
	held      []string
	ackedPast bool
}

// keyRange is the keys from lo up to hi, hi left out; a nil bound is
// open.
type keyRange struct{ lo, hi []byte }

func (r keyRange) holds(k []byte) bool {
	return (r.lo == nil || bytes.Compare(k, r.lo) >= 0) && (r.hi == nil || bytes.Compare(k, r.hi) < 0)
}

// lostRange records that the records of bucket from lo up to hi could not
// be reached.
func (w *salvageWalk) lostRange(bucket string, lo, hi []byte) {
	w.gaps[bucket] = append(w.gaps[bucket], keyRange{bytes.Clone(lo), bytes.Clone(hi)})
}

// unreached reports whether the record under k in bucket lies where the
// walk could not reach.
func (w *salvageWalk) unreached(bucket string, k []byte) bool {
	return w.rootLost || slices.ContainsFunc(w.gaps[bucket], func(r keyRange) bool { return r.holds(k) })
}

// emitError is a failure to write what the walk read: it ends the walk,
// where a page that cannot be read does not.
type emitError struct{ err error }

func (e *emitError) Error() string { return e.err.Error() }
func (e *emitError) Unwrap() error { return e.err }

type salvageEntry struct {
	k, v   []byte
	bucket bool
}

func (w *salvageWalk) lost(bucket string, key []byte, format string, a ...any) {
	p := Problem{Bucket: bucket, Message: fmt.Sprintf(format, a...)}
	if key != nil {
		p.Key = renderKey(bucket, key)
	}
	w.rep.Lost = append(w.rep.Lost, p)
}

// copyInto writes a new bbolt file at path holding the known buckets that
// the root bucket's entries name, each read from the source as it is
// written, a few thousand records to a transaction.
func (w *salvageWalk) copyInto(ctx context.Context, path string, entries []salvageEntry) error {
	out, err := openBolt(path, Options{Timeout: DefaultTimeout})
	if err != nil {
		return err
	}
	err = func() error {
		copied := map[string]bool{}
		for _, e := range entries {
			name := string(e.k)
			switch {
			case !e.bucket || !slices.Contains(knownBuckets, name):
				w.lost("", nil, "the root bucket holds %q, which the store does not know; it is left out", e.k)
				continue
			case name == bucketUnfinished:
				// An index of the run records, which may have lost some:
				// Open builds it anew from those the copy holds.
				continue
			case len(e.v) < inBucketSize:
				w.lost(name, nil, "its header in the root page is cut short: its records are lost")
				w.lostRange(name, nil, nil)
				continue
			}
			copied[name] = true
			if err := w.copyBucket(ctx, out, name, e.v); err != nil {
				return err
			}
		}
		for _, name := range append([]string{bucketMeta}, dataBuckets...) {
			if !copied[name] && name != bucketUnfinished && !w.rootLost {
				w.lost(name, nil, "the root bucket does not name this bucket: its records are lost")
				w.lostRange(name, nil, nil)
			}
		}
		switch {
		case w.rootLost || len(w.gaps) > 0:
			if err := w.copyUnlinked(ctx, out); err != nil {
				return err
			}
			if err := w.holdRunsMissingCalls(out); err != nil {
				return err
			}
			if err := w.holdRunsOfEmptyThreads(out); err != nil {
				return err
			}
			if err := w.markLostCalls(out); err != nil {
				return err
			}
			if err := w.heldIntents(out); err != nil {
				return err
			}
			if err := w.unnamedCalls(out); err != nil {
				return err
			}
		case w.newerLost:
			if err := w.newerRecords(ctx, out); err != nil {
				return err
			}
			fallthrough
		default:
			// Checkpoints that failed their checks were left out, on pages
			// that were read: a run may have gone on past the copy's
			// newest checkpoint of its thread (see reachKnown).
			if w.checkpointsLeftOut() {
				if err := w.holdRunsOfEmptyThreads(out); err != nil {
					return err
				}
				if err := w.markLostCalls(out); err != nil {
					return err
				}
			}
		}
		if err := w.dropOrphanWrites(ctx, out); err != nil {
			return err
		}
		if err := out.Update(w.keepFormat); err != nil {
			return err
		}
		return out.Update(w.rebuildLost)
	}()
	return errors.Join(err, out.Close())
}

// salvageBatch is the number of records copied in one transaction: the
// memory a salvage takes, whatever the size of the store.
var salvageBatch = 4096

// copyBucket copies one bucket, whose header in the root page is hdr.
func (w *salvageWalk) copyBucket(ctx context.Context, out *bbolt.DB, name string, hdr []byte) error {
	var batch []salvageEntry
	flush := func() error {
		err := out.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			b.FillPercent = 1 // keys arrive in order
			if err := b.SetSequence(binary.LittleEndian.Uint64(hdr[8:])); err != nil {
				return err
			}
			for _, r := range batch {
				if err := b.Put(r.k, r.v); err != nil {
					return fmt.Errorf("bucket %s: %w", name, err)
				}
			}
			return nil
		})
		if err == nil {
			for _, r := range batch {
				w.rep.Records[recordKind(name, r.k)]++
			}
		}
		batch = batch[:0]
		return err
	}
	var werr error // a failed write ends the walk (see nodes)
	p := progressOf(ctx)
	emit := func(r salvageEntry) error {
		p.read()
		if r.bucket {
			w.lost(name, r.k, "a nested bucket, which the store never makes; left out")
			return nil
		}
		if err := recordFault(name, r.k, r.v); err != nil {
			w.lost(name, r.k, "%v: the record cannot be read, and is left out", err)
			return nil
		}
		if batch = append(batch, r); len(batch) == salvageBatch {
			if err := flush(); err != nil {
				werr = &emitError{err}
			}
		}
		return werr
	}
	w.bucket = name
	var err error
	if root := binary.LittleEndian.Uint64(hdr); root == 0 {
		err = w.nodes(ctx, hdr[inBucketSize:], "an inline bucket", true, nil, nil, emit)
	} else {
		err = w.tree(ctx, root, "the root page", nil, nil, emit)
	}
	switch {
	case werr != nil:
		return werr
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		w.lost(name, nil, "%v: its records are lost", err)
		w.lostRange(name, nil, nil)
	}
	return flush() // makes the bucket too when nothing of it could be read
}

// recordFault returns why the record under k in bucket name cannot be
// read, as the store's reads would find it: its checksum fails, its version
// is unknown, or its payload does not decode; or, for a blob, its bytes do
// not hash to the reference in its key. nil when it reads. Only records in
// the sealed envelope (encoding.go) are judged; the meta bucket's entries,
// the branches markers and the blob index are copied as they are, for the
// check of the copy to judge.
func recordFault(name string, k, v []byte) error {
	var err error
	switch name {
	case bucketCheckpoints, bucketRecent:
		_, err = decodeCheckpoint(v)
	case bucketHeads:
		_, err = decodeHead(v)
	case bucketWrites:
		_, err = decodePendingWrite(v)
	case bucketBlobLog:
		var data []byte
		if data, _, err = decodeBlob(v); err == nil {
			if _, ref, ok := parseBlobLogKey(k); ok && engine.RefOf(data) != ref {
				err = fmt.Errorf("content hashes to %s", engine.RefOf(data))
			}
		}
	case bucketRuns:
		if isOutcomeIndexKey(k) {
			err = decodeJSONRecord(v, outcomeRunVersion, &outcomeRun{})
		} else {
			_, _, err = decodeRun(v)
		}
	case bucketOutcomeRuns:
		err = decodeJSONRecord(v, outcomeRunVersion, &outcomeRun{})
	case bucketToolCalls:
		_, err = decodeToolCall(v)
	case bucketOutcomes:
		_, _, err = decodeOutcome(v)
	case bucketUplink:
		if bytes.Equal(k, cursorKey) {
			_, err = decodeCursor(v)
		}
	}
	return err
}

// keepFormat makes sure the copy names its format, which Open needs: when
// the format records are lost, the copy is stamped with this binary's
// version (the records of versions 3 and 4 are all read by it). It then
// gives the copy its appliance ID (keepAppliance).
func (w *salvageWalk) keepFormat(tx *bbolt.Tx) error {
	meta, err := tx.CreateBucketIfNotExists([]byte(bucketMeta))
	if err != nil {
		return err
	}
	if meta.Get(metaFormat) == nil || meta.Get(metaVersion) == nil {
		if err := meta.Put(metaFormat, []byte(formatName)); err != nil {
			return err
		}
		if err := meta.Put(metaVersion, []byte(strconv.Itoa(formatVersion))); err != nil {
			return err
		}
		w.lost(bucketMeta, nil, "the format records are lost; the copy is stamped format version %d", formatVersion)
	}
	if err := w.keepAppliance(tx, meta); err != nil {
		return err
	}
	w.cursorPastLedger(tx)
	return nil
}

// cursorPastLedger reports an uplink cursor that the copy's ledger does
// not reach: the collector acknowledged outcomes that the copy lost. Their
// seqs are free in the copy, so the next outcomes would take them under
// other hashes, and the collector refuses those as a fork of the
// appliance's chain; until the ledger passes the cursor, they are not even
// sent.
func (w *salvageWalk) cursorPastLedger(tx *bbolt.Tx) {
	b := tx.Bucket([]byte(bucketUplink))
	if b == nil || b.Get(cursorKey) == nil {
		return
	}
	acked, err := decodeCursor(b.Get(cursorKey))
	if err != nil {
		return // left out as it is, or reported by the check of the copy
	}
	var last uint64
	if o := tx.Bucket([]byte(bucketOutcomes)); o != nil {
		if k, _ := o.Cursor().Last(); len(k) == 8 {
			last = beUint64(k)
		}
	}
	if acked > last {
		w.ackedPast = true
		w.lost(bucketOutcomes, nil, "the collector acknowledged outcomes up to seq %d, but the copy's ledger ends at %d: "+
			"outcomes %d to %d are lost here though the collector holds them, and the outcomes the copy appends next would take "+
			"their seqs, which the collector refuses as a fork of this appliance's chain. Restore a backup that holds them "+
			"rather than use this copy, if there is one", acked, last, last+1, acked)
	}
}

// keepAppliance gives the copy the appliance ID that its outcomes go
// upstream as. The collector knows an appliance by that ID, and takes a
// batch only when each of its records carries it: a copy under a new ID
// could send nothing the ledger holds, and its new outcomes would start a
// second appliance whose chain does not begin at the genesis hash. Where
// the store's own record of the ID is lost, the ID is taken from the
// outcomes copied (they were chained under it, and an ID cannot change
// once there are outcomes), else from the operator, else from older copies
// of the meta bucket when they all name one. Where nothing names it, Open
// makes a new one, and the report says how to give the right one.
func (w *salvageWalk) keepAppliance(tx *bbolt.Tx, meta *bbolt.Bucket) error {
	stored, chained := string(meta.Get(metaAppliance)), ledgerAppliance(tx)
	for _, named := range []struct{ id, by string }{{stored, "the store names"}, {chained, "the outcomes copied carry"}} {
		if w.applianceWant != "" && named.id != "" && named.id != w.applianceWant {
			return fmt.Errorf("%w: %s appliance ID %q, not %q: salvage without --appliance-id to keep %q",
				ErrApplianceID, named.by, named.id, w.applianceWant, named.id)
		}
	}
	copies := slices.Sorted(maps.Keys(w.applianceCopies))
	id, from := stored, ApplianceFromStore
	switch {
	case stored != "":
	case chained != "":
		id, from = chained, ApplianceFromOutcomes
	case w.applianceWant != "":
		id, from = w.applianceWant, ApplianceFromOption
	case len(copies) == 1:
		id, from = copies[0], ApplianceFromOldCopy
	case len(copies) > 1:
		w.lost(bucketMeta, nil, "the appliance ID is lost, no outcome copied names it, and older copies of the meta bucket name %d (%s): "+
			"the copy gets a new one, which a collector takes for another appliance. Salvage again with --appliance-id ID, "+
			"the ID this appliance sends its outcomes as (serve's --appliance-id, or the collector's list of appliances)",
			len(copies), strings.Join(copies, ", "))
		from = ApplianceFromNew
	default:
		w.lost(bucketMeta, nil, "the appliance ID is lost, and nothing left in the file names it: the copy gets a new one, "+
			"which a collector takes for another appliance. If this appliance has sent outcomes upstream, salvage again with "+
			"--appliance-id ID, the ID it sends them as (serve's --appliance-id, or the collector's list of appliances)")
		from = ApplianceFromNew
	}
	w.rep.ApplianceFrom = from
	if id == "" || id == stored {
		return nil
	}
	return meta.Put(metaAppliance, []byte(id))
}

// ledgerAppliance returns the appliance ID that the newest outcome of the
// copy that decodes carries, "" when none does.
func ledgerAppliance(tx *bbolt.Tx) string {
	b := tx.Bucket([]byte(bucketOutcomes))
	if b == nil {
		return ""
	}
	c := b.Cursor()
	for k, v := c.Last(); k != nil; k, v = c.Prev() {
		if o, _, err := decodeOutcome(v); err == nil && CheckApplianceID(o.ApplianceID) == nil {
			return o.ApplianceID
		}
	}
	return ""
}

// tree reads the page tree at id, whose keys lie from lo up to hi,
// handing each leaf element to emit in key order. A page below the top
// that cannot be read is reported, with what lies below it, and passed
// over; the top page is the error.
func (w *salvageWalk) tree(ctx context.Context, id uint64, from string, lo, hi []byte, emit func(salvageEntry) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := w.page(id, from)
	if err != nil {
		return err
	}
	return w.nodes(ctx, b, fmt.Sprintf("page %d", id), false, lo, hi, emit)
}

// nodes reads the elements of a branch or leaf page held in b, whose keys
// lie from lo up to hi. A child of a branch page that cannot be read is
// reported, with its key range, and passed over. An error from emit ends
// the walk.
func (w *salvageWalk) nodes(ctx context.Context, b []byte, what string, inline bool, lo, hi []byte, emit func(salvageEntry) error) error {
	branch, count, err := pageElements(b, what, inline)
	if err != nil {
		return err
	}
	if !branch {
		// The whole page is checked before any of it is handed on, so a
		// page is copied whole or not at all.
		entries, err := leafEntries(b, count, what)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := emit(e); err != nil {
				return err
			}
		}
		return nil
	}
	le := binary.LittleEndian
	keys := make([][]byte, count)
	for i := range count {
		e := pageHeaderSize + i*branchElementSize
		pos, ksize := int(le.Uint32(b[e:])), int(le.Uint32(b[e+4:]))
		if e+pos+ksize > len(b) {
			return fmt.Errorf("%s: element %d's key lies outside the page", what, i)
		}
		keys[i] = b[e+pos : e+pos+ksize]
	}
	for i := range count {
		// A child's keys lie between its own key and the next one's; the
		// first child's reach down to this page's own bound.
		clo, chi := keys[i], hi
		if i == 0 {
			clo = lo
		}
		if i+1 < count {
			chi = keys[i+1]
		}
		err := w.tree(ctx, le.Uint64(b[pageHeaderSize+i*branchElementSize+8:]), what, clo, chi, emit)
		var werr *emitError
		switch {
		case err == nil:
		case ctx.Err() != nil, errors.As(err, &werr):
			return err
		default:
			w.lost(w.bucket, keys[i], "%v: the records from this key to the next branch are lost", err)
			w.lostRange(w.bucket, clo, chi)
		}
	}
	return nil
}

// pageElements reads the header of a branch or leaf page held in b: what
// kind it is and how many elements it has, which it checks the page can
// hold. An inline page is a leaf whatever its flags say.
func pageElements(b []byte, what string, inline bool) (branch bool, count int, err error) {
	if len(b) < pageHeaderSize {
		return false, 0, fmt.Errorf("%s is cut short", what)
	}
	le := binary.LittleEndian
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	branch = flags == branchPageFlag && !inline
	if !branch && flags != leafPageFlag {
		return false, 0, fmt.Errorf("%s: page type %#x where a branch or leaf page belongs", what, flags)
	}
	if pageHeaderSize+count*leafElementSize > len(b) { // branch and leaf elements are the same size
		return false, 0, fmt.Errorf("%s has %d elements, more than it holds", what, count)
	}
	return branch, count, nil
}

// leafEntries returns the count elements of the leaf page held in b,
// copied out of it, once it has checked that every element lies in the
// page and the keys are in order.
func leafEntries(b []byte, count int, what string) ([]salvageEntry, error) {
	le := binary.LittleEndian
	entries := make([]salvageEntry, 0, count)
	var prev []byte
	for i := range count {
		e := pageHeaderSize + i*leafElementSize
		pos, ksize, vsize := int(le.Uint32(b[e+4:])), int(le.Uint32(b[e+8:])), int(le.Uint32(b[e+12:]))
		if e+pos+ksize+vsize > len(b) {
			return nil, fmt.Errorf("%s: element %d's key or value lies outside the page", what, i)
		}
		k := b[e+pos : e+pos+ksize]
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return nil, fmt.Errorf("%s: element %d's key is out of order", what, i)
		}
		prev = k
		entries = append(entries, salvageEntry{k: k, v: b[e+pos+ksize : e+pos+ksize+vsize],
			bucket: le.Uint32(b[e:])&bucketLeafFlag != 0})
	}
	for i := range entries {
		entries[i].k, entries[i].v = bytes.Clone(entries[i].k), bytes.Clone(entries[i].v)
	}
	return entries, nil
}
