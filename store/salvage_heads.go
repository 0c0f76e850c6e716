package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/bbolt"
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
// written.
const salvageEpochStep = 1 << 10

// salvageEpochBase is the time from which a lost stream epoch counts
// hours above the floor (lostEpoch).
var salvageEpochBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// salvageClock is the salvage's clock; tests move it.
var salvageClock = time.Now

// moveEpoch sets the copy's stream epoch past any the store gave out, so
// that a console client is never given new events under numbers it saw
// before. Read with the meta bucket, it is moved on by one: a lost newer
// transaction may have been a start that counted it, and the stream may
// have numbered events under that count already. Lost, it is set by
// lostEpoch.
func (w *salvageWalk) moveEpoch(meta *bbolt.Bucket, metaLost bool) error {
	v := meta.Get(metaStreamEpoch)
	switch {
	case v != nil && len(v) != 8:
		return nil // db check of the copy names it
	case v != nil:
		return meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, binary.BigEndian.Uint64(v)+1))
	case !metaLost:
		return nil // no start counted yet
	}
	epoch, why := w.lostEpoch()
	if err := meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, epoch)); err != nil {
		return err
	}
	w.lost(bucketMeta, metaStreamEpoch, "the event stream's start count is lost: it is set to %d, %s, "+
		"so that the stream's numbers stay above those a client saw before", epoch, why)
	return nil
}

// lostEpoch is the stream epoch of a copy whose own is lost, and why. The
// floor is above any an appliance reaches by counting its starts; but the
// store may be a salvaged copy itself, whose count started at the floor
// (a salvage whose root page is lost, with both meta pages' roots, finds
// no older record of it as a rule: bbolt reuses the pages it frees). So
// the epoch is the floor plus the hours since salvageEpochBase, which
// passes the count of an earlier salvage's copy as long as it started no
// more than once an hour on average since; and past the greatest that
// older copies of the meta bucket name, where the file still holds some.
// 2^20 hours is 119 years, so event numbers stay exact in a JavaScript
// number (NextStreamEpoch).
func (w *salvageWalk) lostEpoch() (uint64, string) {
	hours := uint64(max(0, salvageClock().Sub(salvageEpochBase)/time.Hour))
	epoch, why := salvageEpochFloor+hours, fmt.Sprintf("the floor %d, above any an appliance reaches, plus the %d hours since %s, "+
		"above any a copy salvaged before reaches unless it started more than once an hour since",
		salvageEpochFloor, hours, salvageEpochBase.Format(time.DateOnly))
	if w.epochCopy+salvageEpochStep > epoch {
		epoch, why = w.epochCopy+salvageEpochStep, fmt.Sprintf("past %d, the greatest an older copy of the store's meta records names", w.epochCopy)
	}
	return epoch, why
}

// rebuildHeads records the leaves (leaves.go) of every namespace of the
// copy's checkpoints whose heads entry was not read through the tree (it
// is lost, or it was found on a page that nothing leads to any more, where
// it may be an older version naming an older checkpoint), or whose
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
	err = eachCheckpoint(context.Background(), tx, func(_ string, k, _ []byte) error {
		thread, ns, id, ok := splitCheckpointKey(k)
		if !ok {
			return nil
		}
		key := nsKey(thread, ns)
		if hb.Get(key) == nil || w.unreached(bucketHeads, key) {
			headLost[string(key)] = true
		} else if _, seen := headLost[string(key)]; !seen && w.unreached(bucketBranches, branchKey(thread, ns, id)) {
			headLost[string(key)] = false
		}
		return nil
	})
	if err != nil {
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
		if w.rootLost || len(w.gaps[bucketRecent]) > 0 {
			w.lost(bucketHeads, []byte(key), "recorded anew at checkpoint %s, the newest of the %d copied; the thread's newest "+
				"checkpoints waited in the recent bucket, which the lost root page held, and those that no other page still "+
				"holds are lost: the head may be behind the thread's last step, by a number of steps that cannot be told. "+
				"Check the thread's history (outpost runs history THREAD) before a new turn goes on from it", head, len(ids))
		}
	}
	return heads, branches, nil
}
