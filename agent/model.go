package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// EventModelRefused is announced when a model call is refused because the
// model is outside the agent's lane. (The run then fails with an error
// wrapping ErrLaneViolation and policy.ErrModelNotInLane.)
const EventModelRefused = "model.refused"

// ModelCall calls a model on behalf of a node, so that any past run can be
// re-executed: every response is stored as a blob and recorded in the
// CallLog under ModelKey before the node's writes are returned, and a task
// that runs again (after a crash, a retry or an interrupt) gets the recorded
// response back instead of calling the model again.
type ModelCall struct {
	Provider models.Provider
	// Lane is the agent's lane. It is required: a model call without a
	// lane is refused (fail closed).
	Lane *policy.Lane
	Log  CallLog
	// Blobs stores the encoded responses (models.EncodeResponse).
	Blobs engine.BlobStore
	// Tracker, when set, is fed each response's tokens; going over the
	// token budget returns an error wrapping engine.ErrBudgetExceeded.
	Tracker *policy.Tracker
}

// ModelKey is the CallLog key of a node's call-th model call.
func ModelKey(info engine.RunInfo, call int) string {
	return "model:" + callBase(info) + ":" + strconv.Itoa(call)
}

// callBase is the run, step and task part of every idempotency key; the
// task id already names the checkpoint and the node.
func callBase(info engine.RunInfo) string {
	return info.Run + ":" + strconv.Itoa(info.Step) + ":" + info.Task
}

// modelRef is what a model call's record holds as its result.
type modelRef struct {
	Blob     string `json:"blob"`
	Provider string `json:"provider"`
	Tokens   int    `json:"tokens"`
}

// Call makes the node's call-th model call (call numbers must be the same
// every time the task runs). It must run inside a node.
func (m *ModelCall) Call(ctx context.Context, req models.Request, call int) (*models.Response, error) {
	if m.Provider == nil || m.Log == nil || m.Blobs == nil {
		return nil, fmt.Errorf("%w: model call needs a provider, a call log and a blob store", ErrBadConfig)
	}
	info, ok := engine.InfoFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: model call outside a running node", ErrBadConfig)
	}
	if err := m.allow(ctx, info, req.Model); err != nil {
		return nil, err
	}
	key := ModelKey(info, call)
	rec, err := m.Log.Get(ctx, key)
	switch {
	case err == nil && rec.Done():
		resp, err := m.load(ctx, key, rec)
		if err != nil {
			return nil, err
		}
		return resp, m.count(resp)
	case err != nil && !errors.Is(err, ErrCallNotFound):
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}

	stream := func(c models.Chunk) error {
		if c.Content != "" || c.Thinking != "" {
			engine.Emit(ctx, engine.EventModelToken, map[string]any{
				"call": key, "content": c.Content, "thinking": c.Thinking})
		}
		return nil
	}
	resp, err := m.Provider.Chat(ctx, req, stream)
	if err != nil {
		err = fmt.Errorf("model call %s: %w", key, err)
		if models.IsTransient(err) {
			return nil, engine.MarkTransient(err)
		}
		return nil, engine.MarkPermanent(err)
	}
	enc, err := models.EncodeResponse(resp)
	if err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	ref, err := m.Blobs.PutBlob(ctx, enc)
	if err != nil {
		return nil, fmt.Errorf("model call %s: store response: %w", key, err)
	}
	result, _ := json.Marshal(modelRef{Blob: ref.String(), Provider: resp.Provider,
		Tokens: resp.PromptTokens + resp.CompletionTokens})
	hash := resp.RequestHash
	if hash == "" {
		hash = models.HashRequest(req)
	}
	existing, err := intent(ctx, m.Log, CallRecord{Key: key, Run: info.Run, Node: info.Node,
		Tool: "model:" + req.Model, ArgsHash: hash, Decision: string(policy.DecisionAllow), DecidedBy: "lane:" + m.Lane.Agent})
	if err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	if existing.Done() {
		// Recorded by an attempt that raced this one; the record wins.
		resp, err := m.load(ctx, key, existing)
		if err != nil {
			return nil, err
		}
		return resp, m.count(resp)
	}
	if err := m.Log.Done(ctx, key, result, ""); err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	return resp, m.count(resp)
}

func (m *ModelCall) allow(ctx context.Context, info engine.RunInfo, model string) error {
	var err error
	if m.Lane == nil {
		err = fmt.Errorf("%w: no lane is configured for this agent", policy.ErrModelNotInLane)
	} else {
		err = m.Lane.Allow(model)
	}
	if err == nil {
		return nil
	}
	engine.Announce(ctx, EventModelRefused, map[string]any{
		"run": info.Run, "node": info.Node, "model": model, "error": err.Error()})
	return engine.MarkPermanent(fmt.Errorf("%w: %w", ErrLaneViolation, err))
}

func (m *ModelCall) load(ctx context.Context, key string, rec *CallRecord) (*models.Response, error) {
	var ref modelRef
	if err := json.Unmarshal(rec.Result, &ref); err != nil {
		return nil, fmt.Errorf("model call %s: recorded result: %w", key, err)
	}
	br, err := engine.ParseBlobRef(ref.Blob)
	if err != nil {
		return nil, fmt.Errorf("model call %s: recorded result: %w", key, err)
	}
	data, err := m.Blobs.Blob(ctx, br)
	if err != nil {
		return nil, fmt.Errorf("model call %s: load response: %w", key, err)
	}
	resp, err := models.DecodeResponse(data)
	if err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	return resp, nil
}

func (m *ModelCall) count(resp *models.Response) error {
	if m.Tracker == nil {
		return nil
	}
	if err := m.Tracker.AddTokens(resp.PromptTokens + resp.CompletionTokens); err != nil {
		return fmt.Errorf("%w: %w", engine.ErrBudgetExceeded, err)
	}
	return nil
}

// intent records rec's intent; when the key already holds a record (even
// one that conflicts, say with arguments an operator edited differently
// when asked again), the recorded one wins and is returned.
func intent(ctx context.Context, log CallLog, rec CallRecord) (*CallRecord, error) {
	existing, err := log.Intent(ctx, rec)
	if errors.Is(err, ErrCallConflict) {
		return log.Get(ctx, rec.Key)
	}
	return existing, err
}
