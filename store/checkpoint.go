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
		b := bucket(tx, bucketCheckpoints)
		var k, v []byte
		if id == "" {
			k, v = lastWithPrefix(b.Cursor(), nsPrefix(thread, ns))
		} else {
			k = checkpointKey(thread, ns, id)
			v = b.Get(k)
		}
		if v == nil {
			return engine.ErrCheckpointNotFound
		}
		c, err := decodeCheckpoint(v)
		if err != nil {
			return corrupt(bucketCheckpoints, k, err)
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
// before ("" for the newest), at most limit (0 for all).
func (d *DB) History(ctx context.Context, thread, ns, before string, limit int) ([]*engine.Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var out []*engine.Checkpoint
	err := d.view(func(tx *bbolt.Tx) error {
		prefix := nsPrefix(thread, ns)
		c := bucket(tx, bucketCheckpoints).Cursor()
		var k, v []byte
		if before == "" {
			k, v = lastWithPrefix(c, prefix)
		} else {
			// The first key at or above before, then one step back.
			if k, _ = c.Seek(append(bytes.Clone(prefix), before...)); k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
			if err := ctx.Err(); err != nil {
				return err
			}
			cp, err := decodeCheckpoint(v)
			if err != nil {
				return corrupt(bucketCheckpoints, k, err)
			}
			out = append(out, cp)
			if limit > 0 && len(out) == limit {
				break
			}
		}
		return nil
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
