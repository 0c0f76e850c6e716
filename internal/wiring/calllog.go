package wiring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// CallLog adapts the store's tool-call records to agent.CallLog. Arguments
// and results above engine.BlobThreshold are stored as blobs in blobs
// (normally db itself: the store refuses a record whose blob it lacks).
// When blobs is db, such a blob is stored in the record's own commit.
//
// store.ToolCall has no fields for the approval, so the record's Args value
// holds an envelope: {"args", "decision", "decided_by", "reason"}.
//
// It implements agent.LostCalls, from the mark salvage leaves on a run.
func CallLog(db *store.DB, blobs engine.BlobStore) agent.CallLog {
	return &callLog{db: db, blobs: blobs}
}

type callLog struct {
	db    *store.DB
	blobs engine.BlobStore
}

type envelope struct {
	Args      json.RawMessage `json:"args,omitempty"`
	Decision  string          `json:"decision,omitempty"`
	DecidedBy string          `json:"decided_by,omitempty"`
	Reason    string          `json:"reason,omitempty"`
}

// value is how a record stores b: inline when small, else as a blob. A
// blob that db stores is returned in carried, for the record's own
// commit to store (store.DB.PutToolIntent): PutBlob first would cost the
// call one more commit. One that another blob store keeps is put there
// now.
func (c *callLog) value(ctx context.Context, b []byte) (v engine.Value, carried [][]byte, _ error) {
	if len(b) == 0 {
		return engine.Value{}, nil, nil
	}
	if len(b) <= engine.BlobThreshold {
		return engine.Value{Inline: append([]byte(nil), b...)}, nil, nil
	}
	if c.blobs == engine.BlobStore(c.db) {
		return engine.Value{Blob: engine.RefOf(b)}, [][]byte{b}, nil
	}
	ref, err := c.blobs.PutBlob(ctx, b)
	if err != nil {
		return engine.Value{}, nil, err
	}
	return engine.Value{Blob: ref}, nil, nil
}

func (c *callLog) bytes(ctx context.Context, v engine.Value) ([]byte, error) {
	if v.Blob.IsZero() {
		return v.Inline, nil
	}
	return c.blobs.Blob(ctx, v.Blob)
}

func (c *callLog) Intent(ctx context.Context, rec agent.CallRecord) (*agent.CallRecord, error) {
	if old, err := c.Get(ctx, rec.Key); err == nil {
		if old.Tool != rec.Tool || old.ArgsHash != rec.ArgsHash || old.Run != rec.Run {
			return nil, fmt.Errorf("record intent %s: %w: recorded %s(%s), offered %s(%s)",
				rec.Key, agent.ErrCallConflict, old.Tool, old.ArgsHash, rec.Tool, rec.ArgsHash)
		}
		return old, nil
	} else if !errors.Is(err, agent.ErrCallNotFound) {
		return nil, err
	}
	env, err := json.Marshal(envelope{Args: rec.Args, Decision: rec.Decision, DecidedBy: rec.DecidedBy, Reason: rec.Reason})
	if err != nil {
		return nil, fmt.Errorf("record intent %s: %w", rec.Key, err)
	}
	args, carried, err := c.value(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("record intent %s: %w", rec.Key, err)
	}
	err = c.db.PutToolIntent(ctx, rec.Key, store.ToolCall{RunID: rec.Run, Node: rec.Node, Tool: rec.Tool,
		ArgsHash: rec.ArgsHash, Args: args}, carried...)
	switch {
	case errors.Is(err, store.ErrToolCallConflict):
		return nil, fmt.Errorf("%w: %w", agent.ErrCallConflict, err)
	case errors.Is(err, store.ErrToolCallDone):
		return c.Get(ctx, rec.Key)
	case err != nil:
		return nil, err
	}
	return nil, nil
}

func (c *callLog) Done(ctx context.Context, key string, result json.RawMessage, errText string) error {
	v, carried, err := c.value(ctx, result)
	if err != nil {
		return fmt.Errorf("record tool result %s: %w", key, err)
	}
	err = c.db.PutToolResult(ctx, key, store.ToolCall{Result: v, Error: errText}, carried...)
	switch {
	case errors.Is(err, store.ErrToolCallNotFound):
		return fmt.Errorf("%w: %w", agent.ErrCallNotFound, err)
	case errors.Is(err, store.ErrToolCallConflict):
		return fmt.Errorf("%w: %w", agent.ErrCallConflict, err)
	}
	return err
}

func (c *callLog) Get(ctx context.Context, key string) (*agent.CallRecord, error) {
	tc, err := c.db.ToolCall(ctx, key)
	if errors.Is(err, store.ErrToolCallNotFound) {
		return nil, fmt.Errorf("%w: %w", agent.ErrCallNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	return c.record(ctx, tc)
}

func (c *callLog) record(ctx context.Context, tc *store.ToolCall) (*agent.CallRecord, error) {
	rec := &agent.CallRecord{Key: tc.Key, Run: tc.RunID, Node: tc.Node, Tool: tc.Tool, ArgsHash: tc.ArgsHash,
		Status: string(tc.Status), Error: tc.Error}
	raw, err := c.bytes(ctx, tc.Args)
	if err != nil {
		return nil, fmt.Errorf("load call %s: args: %w", tc.Key, err)
	}
	if len(raw) > 0 {
		var env envelope
		if err := json.Unmarshal(raw, &env); err != nil {
			return nil, fmt.Errorf("load call %s: args: %w", tc.Key, err)
		}
		rec.Args, rec.Decision, rec.DecidedBy, rec.Reason = env.Args, env.Decision, env.DecidedBy, env.Reason
	}
	res, err := c.bytes(ctx, tc.Result)
	if err != nil {
		return nil, fmt.Errorf("load call %s: result: %w", tc.Key, err)
	}
	if len(res) > 0 {
		rec.Result = append(json.RawMessage(nil), res...)
	}
	return rec, nil
}

// Records lists the call records whose keys start with prefix (a run id
// lists the run's tool calls), in key order.
func Records(ctx context.Context, log agent.CallLog, prefix string) ([]agent.CallRecord, error) {
	c, ok := log.(*callLog)
	if !ok {
		return nil, fmt.Errorf("wiring.Records: not a store call log")
	}
	tcs, err := c.db.ToolCalls(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]agent.CallRecord, 0, len(tcs))
	for _, tc := range tcs {
		r, err := c.record(ctx, tc)
		if err != nil {
			return nil, err
		}
		out = append(out, *r)
	}
	return out, nil
}

// CallsLostThrough implements agent.LostCalls: the mark that salvage left
// on the run's record where its tool-call records may be lost
// (store.DB.CallsLostThrough; agent.CallsLostInAnyStep for
// store.CallsLostInAnyStep), "" where it left none. A run record that
// cannot be read is an error: the tool loop then runs no call.
func (c *callLog) CallsLostThrough(ctx context.Context, run string) (string, error) {
	through, err := c.db.CallsLostThrough(ctx, run)
	if through == store.CallsLostInAnyStep {
		return agent.CallsLostInAnyStep, nil
	}
	return through, err
}

// ModelTokens implements agent.TokenCounter: the tokens that run's model
// calls recorded, so that a resumed or recovered run's token budget goes
// on from what it spent before.
func (c *callLog) ModelTokens(ctx context.Context, run string) (int, error) {
	tcs, err := c.db.ToolCalls(ctx, agent.ModelKeyPrefix(run))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, tc := range tcs {
		res, err := c.bytes(ctx, tc.Result)
		if err != nil {
			return 0, fmt.Errorf("load call %s: result: %w", tc.Key, err)
		}
		n += agent.RecordedTokens(string(tc.Status), res)
	}
	return n, nil
}
