package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// A store's root page holds its small buckets inline: the heads bucket,
// the meta bucket. When the root is lost they are lost with it, though
// the checkpoints they describe may be copied. Without a heads entry a
// thread has no history and a new run on it starts from an empty state;
// without the stream epoch the event stream's numbers start over, under
// numbers a client has seen; without the blob index's mark the index is
// not made anew. rebuildLost restores what the copied records say of them.

// salvageEpochFloor is the stream epoch that a copy whose own is lost
// starts from: above any an appliance reaches by counting its starts
// (2^20 starts is one a minute for two years), and far enough below 2^21
// that event numbers stay exact in a JavaScript number (NextStreamEpoch).
const salvageEpochFloor = 1 << 20

// rebuildLost gives the copy what the lost inline buckets held, as far as
// the records copied tell it (see above). It runs after keepFormat, which
// makes the meta bucket.
func (w *salvageWalk) rebuildLost(tx *bbolt.Tx) error {
	var err error
	if w.rep.HeadsRebuilt, w.rep.BranchesRebuilt, err = w.rebuildHeads(tx); err != nil {
		return err
	}
	meta := bucket(tx, bucketMeta)
	metaLost := w.rootLost || len(w.gaps[bucketMeta]) > 0
	if err := w.moveEpoch(meta, metaLost); err != nil {
		return err
	}
	if metaLost && meta.Get(metaBlobIndexed) == nil || len(w.gaps[bucketBlobIndex]) > 0 {
		return rebuildBlobIndex(tx)
	}
	return nil
}

// salvageEpochStep is how far past the greatest stream epoch that older
// copies of the meta bucket name a salvage sets a lost one: the newest
// copy may be older than the lost record by the starts since it was
// written. It also bounds how far past the epoch a file began with
// (stampEpoch) a lost one is set (lostEpoch).
const salvageEpochStep = 1 << 10

// salvageEpochBase is the time from which a lost stream epoch counts
// hours above the floor (lostEpoch).
var salvageEpochBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// salvageClock is the salvage's clock, and a restored backup's
// (restoredEpoch); tests move it.
var salvageClock = time.Now

// epochHours is the number of hours since salvageEpochBase.
func epochHours() uint64 {
	return uint64(max(0, salvageClock().Sub(salvageEpochBase)/time.Hour))
}

// moveEpoch sets the copy's stream epoch past any the store gave out, so
// that a console client is never given new events under numbers it saw
// before. Read with the meta bucket, it is moved on by one: a lost newer
// transaction may have been a start that counted it, and the stream may
// have numbered events under that count already. A backup's copy is moved
// on from the count it goes on from once restored (startCount), where
// that is greater. Lost, it is set by
// lostEpoch. It keeps the epoch set in w.epoch, for stampEpoch.
func (w *salvageWalk) moveEpoch(meta *bbolt.Bucket, metaLost bool) error {
	v := meta.Get(metaStreamEpoch)
	switch {
	case v != nil && len(v) != 8:
		return nil // db check of the copy names it
	case v != nil:
		w.epoch = max(binary.BigEndian.Uint64(v), w.srcStamp) + 1
		return meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, w.epoch))
	case !metaLost:
		return nil // no start counted yet
	}
	epoch, why := w.lostEpoch()
	if err := meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, epoch)); err != nil {
		return err
	}
	w.epoch = epoch
	w.lost(bucketMeta, metaStreamEpoch, "the event stream's start count is lost: it is set to %d, %s, "+
		"so that the stream's numbers stay above those a client saw before", epoch, why)
	return nil
}

// lostEpoch is the stream epoch of a copy whose own is lost, and why: the
// greatest of
//
//   - the floor, above any a store that no salvage made reaches by
//     counting its starts;
//   - the epoch the file began with (its stamp, stampEpoch) plus the
//     transactions it committed since, at most salvageEpochStep, plus one.
//     Each start of the stream is a transaction of its own, so the count
//     the file reached is at most its stamp plus its transaction ID: where
//     that ID is within the step the epoch is past it for certain, and
//     beyond, as long as the file was started no more than that many
//     times. The meta pages, which hold both, are what a salvage needs
//     whole anyway, so a lost root page does not take them, and a
//     salvage of a salvaged copy moves on from the first salvage's count
//     whatever the clock says;
//   - the floor plus the hours since salvageEpochBase, which keeps apart
//     two copies salvaged from the same file at different times;
//   - past the greatest that older copies of the meta bucket name, where
//     the file still holds some.
//
// With 2^20 hours (119 years), or 2^10 salvages of a file in turn, the
// epoch stays below 2^21, so event numbers stay exact in a JavaScript
// number (NextStreamEpoch).
func (w *salvageWalk) lostEpoch() (uint64, string) {
	hours := epochHours()
	epoch, why := uint64(salvageEpochFloor), fmt.Sprintf("the floor %d, above any an appliance reaches", salvageEpochFloor)
	if e := salvageEpochFloor + hours; e > epoch {
		epoch, why = e, fmt.Sprintf("the floor %d, above any an appliance reaches, plus the %d hours since %s",
			salvageEpochFloor, hours, salvageEpochBase.Format(time.DateOnly))
	}
	if e := w.srcStamp + min(w.srcTxID, salvageEpochStep) + 1; e > epoch {
		epoch, why = e, fmt.Sprintf("past %d, the count the file began with, plus its %d transactions since, "+
			"each of which counted at most one start", w.srcStamp, w.srcTxID)
		if w.srcTxID > salvageEpochStep {
			why = fmt.Sprintf("past %d, the count the file began with, by %d: past any it reached unless it started "+
				"more than %d times in its %d transactions since", w.srcStamp, e-w.srcStamp, salvageEpochStep, w.srcTxID)
		}
	}
	if e := w.epochCopy + salvageEpochStep; w.epochCopy > 0 && e > epoch {
		epoch, why = e, fmt.Sprintf("past %d, the greatest an older copy of the store's meta records names", w.epochCopy)
	}
	return epoch, why
}

// epochStampOffset is where a meta page holds the root bucket's sequence,
// which bbolt carries from each meta page to the next and never sets or
// reads itself.
const epochStampOffset = metaOffset + 24

// stampEpoch records, in both meta pages of the closed store file at
// path, the stream epoch the file begins with: a salvage's copy, whose
// epoch the salvage set, and a compacted copy, whose transaction IDs start
// again from the first. A later salvage that finds the meta bucket lost
// with the root page reads it there (lostEpoch): the count of a file is at
// most its stamp plus its transaction ID. A store made new has none (0),
// and counts from 0.
func stampEpoch(path string, epoch uint64) error {
	if epoch == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = func() error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		m0, m1, off1 := readMetas(f, fi.Size())
		if !m0.valid || !m1.valid {
			return fmt.Errorf("stamp the stream epoch: %w: a meta page is not whole", ErrDamaged)
		}
		le := binary.LittleEndian
		b := make([]byte, metaOffset+metaSize)
		for _, off := range []int64{0, off1} {
			if _, err := f.ReadAt(b, off); err != nil {
				return err
			}
			le.PutUint64(b[epochStampOffset:], epoch)
			h := fnv.New64a()
			_, _ = h.Write(b[metaOffset:metaChecksumOffset])
			le.PutUint64(b[metaChecksumOffset:], h.Sum64())
			if _, err := f.WriteAt(b, off); err != nil {
				return err
			}
		}
		return f.Sync()
	}()
	return errors.Join(err, f.Close())
}

// rebuildHeads records the leaves (leaves.go) of every namespace of the
// copy's checkpoints whose heads entry was not read through the tree (it
// is lost, or it was found on a page that nothing leads to any more, where
// it may be an older version naming an older checkpoint), or names a
// checkpoint that the copy lacks, or whose
// branches entries may lie where the walk could not reach. The
// namespace's newest checkpoint goes in heads, and the others that no
// newer checkpoint of the namespace names as parent in branches, in place
// of any branches entries it had. It returns the number of namespaces so
// recorded whose heads entry was lost, and of those whose heads entry was
// read but whose branches entries may be lost. Where the recent bucket,
// which holds each thread's newest checkpoints, is lost with the root
// page, the older copies of it found on other pages have been copied
// (copyUnlinked), but the newest as a rule are not among them (bbolt
// reuses the pages it frees): each namespace whose head is rebuilt is
// reported, as its head may be behind.
func (w *salvageWalk) rebuildHeads(tx *bbolt.Tx) (heads, branches int, err error) {
	hb, err := tx.CreateBucketIfNotExists([]byte(bucketHeads))
	if err != nil {
		return 0, 0, err
	}
	bb, err := tx.CreateBucketIfNotExists([]byte(bucketBranches))
	if err != nil {
		return 0, 0, err
	}
	// headLost holds, by heads key, the namespaces to record anew, and
	// whether their heads entry is what was lost.
	headLost := map[string]bool{}
	// dangling holds, by heads key, the checkpoint that a heads entry read
	// through the tree names, where the copy lacks it: it was on a page
	// that could not be read, or failed its checks. Such an entry is
	// recorded anew as well.
	dangling, cps := map[string]string{}, openCheckpoints(tx)
	// kept holds, by heads key, the namespaces of which the copy holds a
	// checkpoint.
	kept := map[string]bool{}
	danglingHead := func(key []byte, thread, ns string) bool {
		if _, seen := dangling[string(key)]; !seen {
			id, err := decodeHead(hb.Get(key))
			if err != nil || cps.Get(checkpointKey(thread, ns, id)) != nil {
				id = ""
			}
			dangling[string(key)] = id
		}
		return dangling[string(key)] != ""
	}
	err = eachCheckpoint(context.Background(), tx, func(_ string, k, _ []byte) error {
		thread, ns, id, ok := splitCheckpointKey(k)
		if !ok {
			return nil
		}
		key := nsKey(thread, ns)
		kept[string(key)] = true
		if hb.Get(key) == nil || w.unreached(bucketHeads, key) || danglingHead(key, thread, ns) {
			headLost[string(key)] = true
		} else if _, seen := headLost[string(key)]; !seen && w.unreached(bucketBranches, branchKey(thread, ns, id)) {
			headLost[string(key)] = false
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if err := w.dropEmptyHeads(hb, bb, kept); err != nil {
		return 0, 0, err
	}
	// parents holds, by heads key, each checkpoint's parent ID.
	parents := map[string]map[string]string{}
	err = eachCheckpoint(context.Background(), tx, func(_ string, k, v []byte) error {
		thread, ns, _, ok := splitCheckpointKey(k)
		if _, rebuild := headLost[string(nsKey(thread, ns))]; !ok || !rebuild {
			return nil
		}
		id, parent, err := decodeCheckpointLink(v)
		if err != nil {
			return nil // the salvage copies only records that decode
		}
		key := string(nsKey(thread, ns))
		if parents[key] == nil {
			parents[key] = map[string]string{}
		}
		parents[key][id] = parent
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	for _, key := range slices.Sorted(maps.Keys(parents)) {
		ids := parents[key]
		inner := map[string]bool{}
		for id, parent := range ids {
			if _, ok := ids[parent]; ok && parent < id {
				inner[parent] = true
			}
		}
		var leaves []string
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			if !inner[id] {
				leaves = append(leaves, id)
			}
		}
		thread, ns, _ := splitNSKey([]byte(key))
		if err := dropBranches(bb, thread, ns); err != nil {
			return 0, 0, err
		}
		head := leaves[len(leaves)-1] // the greatest ID has no newer child
		for _, id := range leaves[:len(leaves)-1] {
			if err := bb.Put(branchKey(thread, ns, id), []byte{}); err != nil {
				return 0, 0, err
			}
		}
		if err := hb.Put([]byte(key), encodeHead(head)); err != nil {
			return 0, 0, err
		}
		if !headLost[key] {
			branches++
			continue
		}
		heads++
		switch {
		case w.rootLost || len(w.gaps[bucketRecent]) > 0:
			w.lost(bucketHeads, []byte(key), "recorded anew at checkpoint %s, the newest of the %d copied; the thread's newest "+
				"checkpoints waited in the recent bucket, which the lost root page held, and those that no other page still "+
				"holds are lost: the head may be behind the thread's last step, by a number of steps that cannot be told. "+
				"Check the thread's history (outpost runs history THREAD) before a new turn goes on from it", head, len(ids))
		case dangling[key] != "":
			w.lost(bucketHeads, []byte(key), "named checkpoint %s, which was lost (on a page that cannot be read, or failing "+
				"its checks); recorded anew at checkpoint %s, the newest of the %d copied: the head may be behind the thread's "+
				"last step, by a number of steps that cannot be told. Check the thread's history (outpost runs history THREAD) "+
				"before a new turn goes on from it", dangling[key], head, len(ids))
		}
	}
	return heads, branches, nil
}

// dropEmptyHeads deletes the heads entry and the branches entries of each
// namespace of which the copy holds no checkpoint (kept): every one of
// them was lost, so what the entries name is lost too, and no checkpoint
// is left to record anew in their place. Kept, they would leave the
// thread's history and a new turn on it failing on a checkpoint that is
// not there; dropped, the namespace is as one that has not begun, and a
// new run on the thread starts from an empty state. A heads entry that
// does not decode is left for db check of the copy to name.
func (w *salvageWalk) dropEmptyHeads(hb, bb *bbolt.Bucket, kept map[string]bool) error {
	heads := map[string]string{}
	err := hb.ForEach(func(k, v []byte) error {
		if _, _, ok := splitNSKey(k); ok && !kept[string(k)] {
			if id, err := decodeHead(v); err == nil {
				heads[string(k)] = id
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var branchOnly []string
	err = bb.ForEach(func(k, _ []byte) error {
		thread, ns, _, ok := splitBranchKey(k)
		if key := string(nsKey(thread, ns)); ok && !kept[key] && hb.Get([]byte(key)) == nil {
			branchOnly = append(branchOnly, key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, key := range slices.Compact(slices.Concat(slices.Sorted(maps.Keys(heads)), branchOnly)) {
		thread, ns, _ := splitNSKey([]byte(key))
		if err := dropBranches(bb, thread, ns); err != nil {
			return err
		}
		id, ok := heads[key]
		if !ok {
			w.lost(bucketBranches, []byte(key), "named checkpoints that were lost with every other checkpoint of their "+
				"namespace, which has no heads entry: they are dropped")
			continue
		}
		if err := hb.Delete([]byte(key)); err != nil {
			return fmt.Errorf("drop head %s: %w", renderKey(bucketHeads, []byte(key)), err)
		}
		w.lost(bucketHeads, []byte(key), "named checkpoint %s, which was lost with every other checkpoint of its namespace "+
			"(on a page that cannot be read, or failing its checks): the heads entry and its branches entries are dropped, "+
			"and the thread's history is empty from here. A new run on the thread starts from an empty state", id)
	}
	return nil
}

// holdRunsOfEmptyThreads copies as failed each unfinished run that has
// committed a step (its record names a checkpoint) on a thread of which
// the copy holds no checkpoint, in any namespace: its state went with
// them, and its thread's head is dropped (dropEmptyHeads). serve would
// resume it from nothing, and it would end at once as completed, with no
// output, an outcome it never reached. Failed, it stays readable, its
// thread is free for a new run, and its outcome is appended
// (appendHeldOutcomes). An interrupted run is left as it is, as holdRun
// leaves it: it waits for a person already, and the engine refuses a
// decision on a run whose thread lost the checkpoint it paused at
// (engine.Manager.Resume), so that person cancels it.
func (w *salvageWalk) holdRunsOfEmptyThreads(out *bbolt.DB) error {
	return out.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketRuns))
		if b == nil {
			return nil
		}
		stopped := map[string]*runRecord{}
		err := b.ForEach(func(k, v []byte) error {
			if isOutcomeIndexKey(k) {
				return nil
			}
			r, err := decodeRunRecord(v)
			if err == nil && !r.Status.Terminal() && r.Status != engine.StatusInterrupted && r.Checkpoint != "" {
				stopped[string(k)] = r
			}
			return nil
		})
		if err != nil || len(stopped) == 0 {
			return err
		}
		kept := map[string]bool{}
		err = eachCheckpoint(context.Background(), tx, func(_ string, k, _ []byte) error {
			if thread, _, _, ok := splitCheckpointKey(k); ok {
				kept[thread] = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, id := range slices.Sorted(maps.Keys(stopped)) {
			r := stopped[id]
			if kept[r.Thread] {
				continue
			}
			was := r.Status
			r.Status, r.EndedAt = engine.StatusFailed, time.Now().UTC()
			r.Error = "salvage: every checkpoint of this run's thread was lost with the damaged store, and its state with them; " +
				"not resumed (start a new run on the thread)"
			if err := b.Put([]byte(id), encodeRunRecord(r)); err != nil {
				return fmt.Errorf("bucket %s: %w", bucketRuns, err)
			}
			w.held = append(w.held, id)
			w.lost(bucketRuns, []byte(id), "was %s, and every checkpoint of its thread %q is lost (its last was %s): resumed, it "+
				"would go on from nothing and end as completed without having finished. It is copied as failed; its thread is "+
				"free for a new run", was, r.Thread, r.Checkpoint)
		}
		return nil
	})
}
