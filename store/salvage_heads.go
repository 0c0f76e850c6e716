package store

import (
	"context"
	"encoding/binary"
	"maps"
	"slices"

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
	n, err := w.rebuildHeads(tx)
	if err != nil {
		return err
	}
	w.rep.HeadsRebuilt = n
	meta := bucket(tx, bucketMeta)
	metaLost := w.rootLost || len(w.gaps[bucketMeta]) > 0
	if metaLost && meta.Get(metaStreamEpoch) == nil {
		if err := meta.Put(metaStreamEpoch, binary.BigEndian.AppendUint64(nil, salvageEpochFloor)); err != nil {
			return err
		}
		w.lost(bucketMeta, metaStreamEpoch, "the event stream's start count is lost: it is set to %d, above any an appliance "+
			"reaches, so that the stream's numbers stay above those a client saw before", salvageEpochFloor)
	}
	if metaLost && meta.Get(metaBlobIndexed) == nil || len(w.gaps[bucketBlobIndex]) > 0 {
		return rebuildBlobIndex(tx)
	}
	return nil
}

// rebuildHeads records the leaves (leaves.go) of every namespace of the
// copy's checkpoints whose heads entry was not read through the tree: it
// is lost, or it was found on a page that nothing leads to any more, where
// it may be an older version naming an older checkpoint. The namespace's
// newest checkpoint goes in heads, and the others that no newer checkpoint
// of the namespace names as parent in branches, in place of any branches
// entries it had. It returns the number of namespaces so recorded.
func (w *salvageWalk) rebuildHeads(tx *bbolt.Tx) (int, error) {
	hb, err := tx.CreateBucketIfNotExists([]byte(bucketHeads))
	if err != nil {
		return 0, err
	}
	bb, err := tx.CreateBucketIfNotExists([]byte(bucketBranches))
	if err != nil {
		return 0, err
	}
	// parents holds, by heads key, each checkpoint's parent ID.
	parents := map[string]map[string]string{}
	err = eachCheckpoint(context.Background(), tx, func(_ string, k, v []byte) error {
		thread, ns, _, ok := splitCheckpointKey(k)
		if !ok || hb.Get(nsKey(thread, ns)) != nil && !w.unreached(bucketHeads, nsKey(thread, ns)) {
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
		return 0, err
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
			return 0, err
		}
		head := leaves[len(leaves)-1] // the greatest ID has no newer child
		for _, id := range leaves[:len(leaves)-1] {
			if err := bb.Put(branchKey(thread, ns, id), []byte{}); err != nil {
				return 0, err
			}
		}
		if err := hb.Put([]byte(key), encodeHead(head)); err != nil {
			return 0, err
		}
	}
	return len(parents), nil
}
