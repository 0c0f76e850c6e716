package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// A tool call is recorded twice: its intent before the tool runs and its
// result after. On recovery, a result is reused; an intent without one means
// the side effect may or may not have happened.
const toolCallVersion = 1

// ToolCallStatus is how far a tool call got.
type ToolCallStatus string

// Tool call statuses.
const (
	ToolCallIntent ToolCallStatus = "intent" // recorded before the tool ran
	ToolCallDone   ToolCallStatus = "done"   // its result is recorded
)

// ToolCall is the record of one tool call, stored under its idempotency key
// (made by the caller from run, step, task and call index).
type ToolCall struct {
	Key   string `json:"key"`
	RunID string `json:"run_id"`
	Node  string `json:"node"`
	Tool  string `json:"tool"`
	// ArgsHash identifies the arguments, so a second intent under the same
	// key with other arguments is refused rather than silently merged.
	ArgsHash string `json:"args_hash"`
	// Args and Result are inline when small, blob references when not;
	// referenced blobs must already be stored.
	Args     engine.Value   `json:"args"`
	Result   engine.Value   `json:"result"`
	Error    string         `json:"error"`
	Status   ToolCallStatus `json:"status"`
	IntentAt time.Time      `json:"intent_at"`
	DoneAt   time.Time      `json:"done_at"`
}

func encodeToolCall(tc *ToolCall) ([]byte, error) { return encodeJSONRecord(toolCallVersion, tc) }

func decodeToolCall(b []byte) (*ToolCall, error) {
	var tc ToolCall
	if err := decodeJSONRecord(b, toolCallVersion, &tc); err != nil {
		return nil, err
	}
	return &tc, nil
}

// PutToolIntent durably records that a tool is about to run. Recording the
// same intent again (same tool and arguments) is a no-op, so a retried step
// may call it freely. It fails with ErrToolCallConflict when the key holds
// another call, and with ErrToolCallDone when the call already has a result,
// which the caller must reuse.
//
// blobs are the bytes of blobs that rec.Args names and that may not be
// stored yet: they are stored in the record's own transaction, one commit
// where PutBlob before it would take two (a model call's request digest
// past engine.BlobThreshold cost its call a fourth commit). They are
// stored only when the record is written.
func (d *DB) PutToolIntent(ctx context.Context, key string, rec ToolCall, blobs ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record tool intent %s: %w", key, err)
	}
	if key == "" {
		return fmt.Errorf("record tool intent: %w: empty idempotency key", ErrInvalidKey)
	}
	rec.Key, rec.Status = key, ToolCallIntent
	rec.Result, rec.Error, rec.DoneAt = engine.Value{}, "", time.Time{}
	if rec.IntentAt.IsZero() {
		rec.IntentAt = time.Now().UTC()
	}
	enc, err := encodeToolCall(&rec)
	if err != nil {
		return fmt.Errorf("record tool intent %s: %w", key, err)
	}
	k := []byte(key)
	write := false
	carried := carryBlobs(blobs)
	err = d.q.do(&request{
		validate: func(tx *bbolt.Tx) error {
			old, err := loadToolCall(tx, k)
			switch {
			case err != nil:
				return err
			case old == nil:
				write = true
				return carried.check(tx, rec.Args)
			case old.Tool != rec.Tool || old.ArgsHash != rec.ArgsHash || old.RunID != rec.RunID:
				return fmt.Errorf("%w: recorded %s(%s) of run %s, offered %s(%s) of run %s",
					ErrToolCallConflict, old.Tool, old.ArgsHash, old.RunID, rec.Tool, rec.ArgsHash, rec.RunID)
			case old.Status == ToolCallDone:
				return ErrToolCallDone
			}
			write = false
			return nil
		},
		apply: func(tx *bbolt.Tx) error {
			if !write {
				return nil
			}
			if err := carried.store(tx); err != nil {
				return err
			}
			return bucket(tx, bucketToolCalls).Put(k, enc)
		},
	})
	if err != nil {
		return fmt.Errorf("record tool intent %s: %w", key, err)
	}
	return nil
}

// PutToolResult durably records a tool call's outcome: rec's Result, Error
// and DoneAt (now when zero). The intent must have been recorded. Recording
// the same result again is a no-op; another result fails with
// ErrToolCallConflict. blobs are as PutToolIntent's, for rec.Result.
func (d *DB) PutToolResult(ctx context.Context, key string, rec ToolCall, blobs ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("record tool result %s: %w", key, err)
	}
	if rec.DoneAt.IsZero() {
		rec.DoneAt = time.Now().UTC()
	}
	k := []byte(key)
	var enc []byte
	carried := carryBlobs(blobs)
	err := d.q.do(&request{
		validate: func(tx *bbolt.Tx) error {
			enc = nil
			old, err := loadToolCall(tx, k)
			switch {
			case err != nil:
				return err
			case old == nil:
				return ErrToolCallNotFound
			case old.Status == ToolCallDone:
				if !sameValue(old.Result, rec.Result) || old.Error != rec.Error {
					return fmt.Errorf("%w: a different result is recorded", ErrToolCallConflict)
				}
				return nil
			}
			if err := carried.check(tx, rec.Result); err != nil {
				return err
			}
			old.Result, old.Error, old.DoneAt, old.Status = rec.Result, rec.Error, rec.DoneAt, ToolCallDone
			enc, err = encodeToolCall(old)
			return err
		},
		apply: func(tx *bbolt.Tx) error {
			if enc == nil {
				return nil
			}
			if err := carried.store(tx); err != nil {
				return err
			}
			return bucket(tx, bucketToolCalls).Put(k, enc)
		},
	})
	if err != nil {
		return fmt.Errorf("record tool result %s: %w", key, err)
	}
	return nil
}

// ToolCall returns the record under an idempotency key, or
// ErrToolCallNotFound.
func (d *DB) ToolCall(ctx context.Context, key string) (*ToolCall, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load tool call %s: %w", key, err)
	}
	var out *ToolCall
	err := d.view(func(tx *bbolt.Tx) error {
		tc, err := loadToolCall(tx, []byte(key))
		if err == nil && tc == nil {
			err = ErrToolCallNotFound
		}
		out = tc
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load tool call %s: %w", key, err)
	}
	return out, nil
}

// ToolCalls lists the records whose keys start with prefix, in key order.
// Idempotency keys begin with the run ID, so a run's calls share a prefix.
func (d *DB) ToolCalls(ctx context.Context, prefix string) ([]*ToolCall, error) {
	var out []*ToolCall
	err := d.view(func(tx *bbolt.Tx) error {
		c := bucket(tx, bucketToolCalls).Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			tc, err := decodeToolCall(v)
			if err != nil {
				return corrupt(bucketToolCalls, k, err)
			}
			out = append(out, tc)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tool calls %q: %w", prefix, err)
	}
	return out, nil
}

// loadToolCall returns nil, nil when the key is free.
func loadToolCall(tx *bbolt.Tx, k []byte) (*ToolCall, error) {
	v := bucket(tx, bucketToolCalls).Get(k)
	if v == nil {
		return nil, nil
	}
	tc, err := decodeToolCall(v)
	if err != nil {
		return nil, corrupt(bucketToolCalls, k, err)
	}
	return tc, nil
}

// carriedBlobs are the blobs a tool-call record is stored with, in its
// transaction.
type carriedBlobs struct{ blobBatch }

func carryBlobs(data [][]byte) carriedBlobs {
	now := time.Now()
	var out carriedBlobs
	for _, b := range data {
		if ref := engine.RefOf(b); !out.carries(ref) {
			out.blobBatch = append(out.blobBatch, encodedBlob{ref: ref, data: b, rec: encodeBlob(b, now)})
		}
	}
	return out
}

func (cb carriedBlobs) carries(ref engine.BlobRef) bool {
	return slices.ContainsFunc(cb.blobBatch, func(c encodedBlob) bool { return c.ref == ref })
}

// check refuses a carried blob whose reference the store holds with other
// bytes, and a record whose values refer to a blob neither stored nor
// carried: a dangling reference would only show up when the record is
// needed.
func (cb carriedBlobs) check(tx *bbolt.Tx, vs ...engine.Value) error {
	bb := writeBlobs(tx)
	if err := cb.collide(bb); err != nil {
		return err
	}
	for _, v := range vs {
		if !v.Blob.IsZero() && !cb.carries(v.Blob) && bb.locate(v.Blob) == nil {
			return fmt.Errorf("blob %s: %w", v.Blob, engine.ErrBlobNotFound)
		}
	}
	return nil
}

// store adds the carried blobs that check found missing. Those stored
// already are left as they are, as Commit leaves them: the record written
// beside them names them, so Prune keeps them.
func (cb carriedBlobs) store(tx *bbolt.Tx) error { return cb.add(writeBlobs(tx)) }

func sameValue(a, b engine.Value) bool {
	return a.Blob == b.Blob && bytes.Equal(a.Inline, b.Inline)
}
