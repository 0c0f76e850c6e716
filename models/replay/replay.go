package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/outpost-edge/outpost/models"
)

// Name is the provider's name, in Name() and every Response it returns.
const Name = "replay"

// Key names one model call of a run: the superstep, the task within it and
// the call's index within the task (a tool loop calls the model repeatedly).
type Key struct {
	Run  string
	Step int
	Task string
	Call int
}

func (k Key) String() string {
	return fmt.Sprintf("run %s step %d task %q call %d", k.Run, k.Step, k.Task, k.Call)
}

type keyCtx struct{}

// WithKey returns ctx carrying the key of the model call about to be made.
func WithKey(ctx context.Context, key Key) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFrom returns the key WithKey put in ctx.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyCtx{}).(Key)
	return k, ok
}

// Lookup loads the response recorded under key. It returns an error
// wrapping ErrNotRecorded, or a nil response, when there is none.
type Lookup func(ctx context.Context, key Key) (*models.Response, error)

var (
	// ErrNotRecorded: the original run made no model call under this key,
	// so the replay has already parted from it.
	ErrNotRecorded = errors.New("no recorded model response")
	// ErrNoKey: the caller did not say which recorded call this is.
	ErrNoKey = errors.New("no replay key in the context (set one with replay.WithKey)")
)

// Diverged reports that a replayed call asks something other than what the
// original call asked, so its recorded answer no longer applies.
type Diverged struct {
	Key      Key
	Recorded string // models.HashRequest of the original request
	Got      string // models.HashRequest of the replayed request
}

func (e *Diverged) Error() string {
	return fmt.Sprintf("replay diverged at %s: the request differs from the recorded one (recorded %s, now %s)",
		e.Key, e.Recorded, e.Got)
}

// Provider answers from recorded responses. It is safe for concurrent use
// if the lookup is.
type Provider struct {
	lookup Lookup
}

var _ models.Provider = (*Provider)(nil)

// New returns a Provider reading records through lookup.
func New(lookup Lookup) *Provider { return &Provider{lookup: lookup} }

// Name returns "replay".
func (p *Provider) Name() string { return Name }

// Chat returns the response recorded under the context's key. The response
// is the recorded one except that Provider says "replay": an audit's events
// must not claim a model ran. The whole answer streams as one chunk.
func (p *Provider) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	if err := ctx.Err(); err != nil {
		kind := models.Canceled
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			kind = models.Timeout
		}
		return nil, &models.Error{Kind: kind, Provider: Name, Model: req.Model, Err: context.Cause(ctx)}
	}
	key, ok := KeyFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("replay model %s: %w", req.Model, ErrNoKey)
	}
	rec, err := p.lookup(ctx, key)
	if err != nil {
		if errors.Is(err, ErrNotRecorded) {
			return nil, fmt.Errorf("replay: %s: %w", key, err)
		}
		return nil, fmt.Errorf("replay: load the response recorded for %s: %w", key, err)
	}
	if rec == nil {
		return nil, fmt.Errorf("replay: %s: %w", key, ErrNotRecorded)
	}
	hash := models.HashRequest(req)
	if rec.RequestHash != "" && rec.RequestHash != hash {
		return nil, &Diverged{Key: key, Recorded: rec.RequestHash, Got: hash}
	}

	resp := *rec
	resp.Provider = Name
	// Copy what the caller could mutate, so it cannot alter a record the
	// lookup may hand out again.
	resp.Message.ToolCalls = append([]models.ToolCall(nil), rec.Message.ToolCalls...)
	for i, tc := range resp.Message.ToolCalls {
		resp.Message.ToolCalls[i].Arguments = append([]byte(nil), tc.Arguments...)
	}
	if len(resp.Message.ToolCalls) == 0 {
		resp.Message.ToolCalls = nil
	}
	if stream != nil {
		if err := stream(models.Chunk{
			Content:   resp.Message.Content,
			Thinking:  resp.Message.Thinking,
			ToolCalls: resp.Message.ToolCalls,
		}); err != nil {
			return nil, err
		}
	}
	return &resp, nil
}
