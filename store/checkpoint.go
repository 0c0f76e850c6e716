package store

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// Checkpoint returns one checkpoint of a thread's namespace; id "" means
// the newest. It fails with engine.ErrCheckpointNotFound when absent.
func (d *DB) Checkpoint(ctx context.Context, thread, ns, id string) (*engine.Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load checkpoint: %w", err)
	}
	var out *engine.Checkpoint
	err := d.view(func(tx *bbolt.Tx) error {
		key := checkpointKey(thread, ns, id)
		if id == "" {
			t, err := openNSTree(tx, thread, ns)
			if err != nil {
				return err
			}
			if t.head == "" {
				return engine.ErrCheckpointNotFound
			}
			key = t.key(t.head)
		}
		cb := openCheckpoints(tx)
		v := cb.Get(key)
		switch {
		case v == nil && id == "":
			return corrupt(bucketHeads, nsKey(thread, ns), errMissingLeaf)
		case v == nil:
			return engine.ErrCheckpointNotFound
		}
		c, err := decodeCheckpoint(v)
		if err != nil {
			return cb.corrupt(key, err)
		}
		out = c
		return nil
	})
	if err != nil {
		if id == "" {
			return nil, fmt.Errorf("load newest checkpoint of thread %q ns %q: %w", thread, ns, err)
		}
		return nil, fmt.Errorf("load checkpoint %s of thread %q: %w", id, thread, err)
	}
	return out, nil
}

// History lists a namespace's checkpoints newest first, starting below
// before ("" for the newest), at most limit (0 for all). It lists every
// branch of the namespace, merged by ID, and reads no further down the
// parent chains than the listing needs.
func (d *DB) History(ctx context.Context, thread, ns, before string, limit int) ([]*engine.Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var out []*engine.Checkpoint
	err := d.view(func(tx *bbolt.Tx) error {
		t, err := openNSTree(tx, thread, ns)
		if err != nil {
			return err
		}
		w, err := t.walk()
		if err != nil {
			return err
		}
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			id, rec, ok, err := w.next()
			if err != nil || !ok {
				return err
			}
			if before != "" && id >= before {
				continue
			}
			cp, err := decodeCheckpoint(rec)
			if err != nil {
				return t.cb.corrupt(t.key(id), err)
			}
			out = append(out, cp)
			if limit > 0 && len(out) == limit {
				return nil
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of thread %q ns %q: %w", thread, ns, err)
	}
	return out, nil
}

// Writes returns the pending writes saved against a checkpoint, in the order
// they were saved.
func (d *DB) Writes(ctx context.Context, thread, ns, checkpointID string) ([]engine.PendingWrite, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load pending writes: %w", err)
	}
	var out []engine.PendingWrite
	err := d.view(func(tx *bbolt.Tx) error {
		prefix := writesPrefix(thread, ns, checkpointID)
		c := bucket(tx, bucketWrites).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(k) != len(prefix)+8 {
				continue // not a write key: those are the prefix and an 8-byte sequence
			}
			w, err := decodePendingWrite(v)
			if err != nil {
				return corrupt(bucketWrites, k, err)
			}
			out = append(out, *w)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load pending writes of checkpoint %s: %w", checkpointID, err)
	}
	return out, nil
}
