package store

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"
)

// A thread's newest checkpoints wait in a small bucket, recent, before
// they join the checkpoints bucket. The checkpoints bucket is a tree of
// many pages: a commit that adds one checkpoint to it rewrites the leaf at
// its right edge and the branch page above, two pages besides the root
// and the meta page that every commit writes. The recent bucket is kept
// small enough for bbolt to store it inline, inside the root page, so a
// checkpoint that goes there costs no page of its own. When the next
// checkpoint would make it too large to stay inline, everything it held
// moves to the checkpoints bucket in that commit: one leaf and one branch
// page for several checkpoints. The newest checkpoint stays in recent,
// unless it is too large to be inline on its own. A lone thread's step
// commit then writes about four pages instead of five and a half (bench
// S1, measured with 4 KB pages), and what a commit costs on disk is mostly
// the pages it writes.
//
// A checkpoint is in exactly one of the two buckets, under the same key;
// checkpoints reads both. A version 3 or 4 file opened read-only has no
// recent bucket, and reads as if it were empty.

// checkpoints is the checkpoints bucket and the recent bucket, read and
// written as one.
type checkpoints struct {
	main, recent *bbolt.Bucket
	// inline is the most recent may hold and stay inline, in bbolt's
	// measure: a page header, then an element header, key and value per
	// record.
	inline int
	// direct is set in the transaction of a large group commit (see Put).
	direct bool
}

// directBatch is the number of requests from which a group commit puts
// its checkpoints straight into the checkpoints bucket. With more than a
// few, recent would overflow within the transaction anyway; with 64
// threads (bench S2), passing them all through it lowered throughput by
// about a tenth.
const directBatch = 4

func openCheckpoints(tx *bbolt.Tx) checkpoints {
	c := checkpoints{
		main: bucket(tx, bucketCheckpoints), recent: bucket(tx, bucketRecent),
		inline: tx.DB().Info().PageSize / 4, // bbolt's limit for an inline bucket
	}
	if tx.Writable() {
		if st := stateOf(tx); st != nil {
			c.direct = st.batch >= directBatch
		}
	}
	return c
}

// bucketOf names the bucket that holds key, for error reports; "" when
// neither does.
func (c checkpoints) bucketOf(key []byte) string {
	switch {
	case c.recent != nil && c.recent.Get(key) != nil:
		return bucketRecent
	case c.main.Get(key) != nil:
		return bucketCheckpoints
	}
	return ""
}

// corrupt reports the record under key as corrupt, naming the bucket that
// holds it.
func (c checkpoints) corrupt(key []byte, err error) error {
	name := c.bucketOf(key)
	if name == "" {
		name = bucketCheckpoints
	}
	return corrupt(name, key, err)
}

// Get returns the record under key, or nil.
func (c checkpoints) Get(key []byte) []byte {
	if c.recent != nil {
		if v := c.recent.Get(key); v != nil {
			return v
		}
	}
	return c.main.Get(key)
}

// Put stores rec under key: in place when the checkpoints bucket holds the
// key already, else in recent. When recent would then be too large to
// stay inline, what it held moves to the checkpoints bucket first (and rec
// goes there too if it is too large on its own).
//
// A transaction of a large group commit (direct) puts its checkpoints
// straight into the checkpoints bucket: they land together at its right
// edge, whose pages the transaction writes once for all of them, and
// passing them through recent would only cost the leader time.
func (c checkpoints) Put(key, rec []byte) error {
	if c.recent == nil || c.main.Get(key) != nil {
		return c.main.Put(key, rec)
	}
	return c.putRecent(key, rec)
}

// putNew is Put for a key that neither bucket holds, which saves a large
// group commit two lookups per checkpoint.
func (c checkpoints) putNew(key, rec []byte) error {
	if c.recent == nil || c.direct {
		return c.main.Put(key, rec)
	}
	return c.putRecent(key, rec)
}

// putRecent is Put for a key that only recent may hold.
func (c checkpoints) putRecent(key, rec []byte) error {
	if c.direct {
		if err := c.recent.Delete(key); err != nil {
			return err
		}
		return c.main.Put(key, rec)
	}
	const elem, header = 16, 16 // bbolt's leaf element and page header sizes
	own := header + elem + len(key) + len(rec)
	size := own
	cur := c.recent.Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if !bytes.Equal(k, key) { // else rewritten
			size += elem + len(k) + len(v)
		}
	}
	if size <= c.inline {
		return c.recent.Put(key, rec)
	}
	// Copied before the moves change the bucket under the cursor.
	var held [][2][]byte
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if !bytes.Equal(k, key) {
			held = append(held, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		}
	}
	for _, kv := range held {
		if err := c.main.Put(kv[0], kv[1]); err != nil {
			return fmt.Errorf("move checkpoint out of %s: %w", bucketRecent, err)
		}
		if err := c.recent.Delete(kv[0]); err != nil {
			return fmt.Errorf("move checkpoint out of %s: %w", bucketRecent, err)
		}
	}
	if own <= c.inline {
		return c.recent.Put(key, rec)
	}
	if err := c.recent.Delete(key); err != nil {
		return err
	}
	return c.main.Put(key, rec)
}

// Delete removes key from whichever bucket holds it.
func (c checkpoints) Delete(key []byte) error {
	if c.recent != nil {
		if err := c.recent.Delete(key); err != nil {
			return err
		}
	}
	return c.main.Delete(key)
}

// lastKey returns the greatest key of either bucket, or nil.
func (c checkpoints) lastKey() []byte {
	k, _ := c.main.Cursor().Last()
	if c.recent != nil {
		if r, _ := c.recent.Cursor().Last(); bytes.Compare(r, k) > 0 {
			k = r
		}
	}
	return k
}

// eachCheckpoint calls fn for every checkpoint record, naming the bucket that holds
// it, until fn fails or ctx ends. Records come in key order within each
// bucket, the checkpoints bucket first.
func eachCheckpoint(ctx context.Context, tx *bbolt.Tx, fn func(bucketName string, k, v []byte) error) error {
	for _, name := range []string{bucketCheckpoints, bucketRecent} {
		if bucket(tx, name) == nil {
			continue // a version 4 file opened read-only
		}
		if err := eachRecord(ctx, tx, name, func(k, v []byte) error { return fn(name, k, v) }); err != nil {
			return err
		}
	}
	return nil
}
