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
//
// Tokens. Every call is counted against the run, whether it answers or
// fails: the count its server reported (prompt and answer), each part
// estimated by models.Spent's rule when it is missing (Ollama leaves the
// prompt's count out when it served the prompt from its cache). A call
// that fails counts the counts its error carries (a truncated answer's),
// or else the estimate of its prompt and of what it streamed before it
// failed; a call refused before the server did any work (unreachable, no
// such model, a request refused as given) counts what it streamed, which
// is nothing. A failed call is recorded under ModelKey + "#spent<n>", so
// that the run's outcome counts it, and so do the budgets of its later
// stretches. A recorded response that is reused costs nothing more.
type ModelCall struct {
	Provider models.Provider
	// Lane is the agent's lane. It is required: a model call without a
	// lane is refused (fail closed).
	Lane *policy.Lane
	Log  CallLog
	// Blobs stores the encoded responses (models.EncodeResponse).
	Blobs engine.BlobStore
	// TokenLimit, when positive, is the run's token budget; the run's own
	// (engine.RunInfo.MaxTokens), when smaller, holds. All the run's model
	// calls count against it together (RunMeter), the concurrent calls of
	// one superstep included. A call sets aside its prompt's estimate and
	// the most its answer may take: what the budget has left after the
	// tokens spent, those set aside by calls in flight and its prompt, or
	// the request's own Options.MaxOutputTokens when that is smaller. That
	// answer cap is sent with the request (Ollama's num_predict), and held
	// at this side of the seam too (models.ChatCapped: a provider that
	// streams on past it is stopped when its answer, counted as it streams,
	// reaches it), so that no answer, nor the answers of calls in flight
	// together, takes the run past its budget. A request without a cap of
	// its own is given DefaultAnswerTokens. A call for which the calls in
	// flight leave no room waits for them to end. A call for which the
	// tokens spent leave no room for a token of answer is refused before it
	// is sent; one whose answer the budget's cap cut short (its server, or
	// models.ChatCapped), or whose server reported more than was set aside,
	// returns an error. These errors wrap engine.ErrBudgetExceeded. A
	// provider that does not stream cannot be stopped at the cap: its
	// answer, past it, is refused and counted once it has been given whole.
	TokenLimit int

	spent int
}

// DefaultAnswerTokens caps the answer of a call under a token budget whose
// request sets no cap of its own (a model node's num_predict). Without it
// such a call would set aside all the budget has left, and the parallel
// calls of a run would wait for one another. It is more than a local
// model writes in one answer on Ollama's default context (4,096 tokens,
// prompt included), and it stops a model that does not stop.
const DefaultAnswerTokens = 8192

// ModelKey is the CallLog key of a node's call-th model call.
func ModelKey(info engine.RunInfo, call int) string {
	return "model:" + callBase(info) + ":" + strconv.Itoa(call)
}

// ModelKeyPrefix starts the CallLog keys of every model call of run.
func ModelKeyPrefix(run string) string { return "model:" + run + ":" }

// callBase is the run, step and task part of every idempotency key; the
// task id already names the checkpoint and the node.
func callBase(info engine.RunInfo) string {
	return info.Run + ":" + strconv.Itoa(info.Step) + ":" + info.Task
}

// modelRef is what a model call's record holds as its result. Tokens is
// what the call counted against the run (see ModelCall). Attempt, NS and
// Checkpoint name the run's attempt (engine.RunInfo.Attempt) that made the
// call and the checkpoint its task ran from, so that the run's outcome can
// leave out the calls of an attempt that a crash cut short (see
// store.Outcome).
type modelRef struct {
	Blob       string `json:"blob,omitempty"`
	Provider   string `json:"provider"`
	Tokens     int    `json:"tokens"`
	Attempt    int    `json:"attempt,omitempty"`
	NS         string `json:"ns,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
}

// refOf is the record of a call made by the task info names.
func refOf(info engine.RunInfo, blob, provider string, tokens int) modelRef {
	return modelRef{Blob: blob, Provider: provider, Tokens: tokens, Attempt: info.Attempt, NS: info.NS, Checkpoint: info.Checkpoint}
}

// RequestVerifier is implemented by a CallLog that checks a model call's
// request against the one recorded under its key before the recorded
// response is reused: an audit replay's log, for which an answer to
// another question is no answer. A record's ArgsHash is the request's
// models.HashRequest and its Args the request's models.RequestDigest
// (records made before the digest was kept have no Args). An error stops
// the call, and with it the task.
type RequestVerifier interface {
	VerifyRequest(ctx context.Context, rec CallRecord, req models.Request) error
}

// TokenCounter is implemented by a CallLog that can total the tokens a
// run's model calls recorded (the Tokens of their results, failed calls
// included). RunMeter starts a resumed or recovered run's count from it.
// A log that does not implement it cannot say what such a run spent, and
// its model calls under a token budget are refused (ErrTokensUncounted):
// counting from zero would give the run its budget again.
type TokenCounter interface {
	ModelTokens(ctx context.Context, run string) (int, error)
}

// ModelTokens implements TokenCounter.
func (m *MemoryCallLog) ModelTokens(ctx context.Context, run string) (int, error) {
	n := 0
	for _, r := range m.Records(ModelKeyPrefix(run)) {
		n += RecordedTokens(r.Status, r.Result)
	}
	return n, nil
}

// RecordedTokens is what a model call's record counted against its run:
// the tokens in the result of a record that is done.
func RecordedTokens(status string, result []byte) int {
	var ref modelRef
	if status != StatusDone || json.Unmarshal(result, &ref) != nil {
		return 0
	}
	return max(ref.Tokens, 0)
}

type runMeterKey struct{}

// RunMeter returns the token meter of the run that the calling node
// serves: one for all its model calls while it runs (engine.RunValue).
// A resumed or recovered run's starts from the tokens log recorded for it
// before (see TokenCounter), so that neither a resume nor a recovery gives
// a run its budget again; with a log that cannot count them, it fails
// with an error wrapping ErrTokensUncounted (fail closed: an estimate
// could only guess low, for a log read by key cannot list a run's calls).
func RunMeter(ctx context.Context, log CallLog) (*policy.TokenMeter, error) {
	info, ok := engine.InfoFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: token meter outside a running node", ErrBadConfig)
	}
	v, err := engine.RunValue(ctx, runMeterKey{}, func() (any, error) {
		tc, ok := log.(TokenCounter)
		switch {
		case !ok && !info.Resumed:
			return policy.NewTokenMeter(0), nil // the run began in this call
		case !ok:
			return nil, engine.MarkPermanent(fmt.Errorf("%w: run %s was resumed, and its call log (%T) cannot say what it spent before: "+
				"give the log a ModelTokens method (agent.TokenCounter), or run without a token budget", ErrTokensUncounted, info.Run, log))
		}
		used, err := tc.ModelTokens(ctx, info.Run)
		if err != nil {
			return nil, fmt.Errorf("count the tokens run %s spent: %w", info.Run, err)
		}
		return policy.NewTokenMeter(used), nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*policy.TokenMeter), nil
}

// Spent returns the tokens of the calls made through m so far, recorded
// responses reused included: what the node adds to a tokens channel.
func (m *ModelCall) Spent() int { return m.spent }

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
	limit := engine.Narrower(m.TokenLimit, info.MaxTokens)
	var meter *policy.TokenMeter
	if limit > 0 {
		var err error
		if meter, err = RunMeter(ctx, m.Log); err != nil {
			return nil, err
		}
	}
	key := ModelKey(info, call)
	rec, err := m.Log.Get(ctx, key)
	switch {
	case err == nil && rec.Done():
		if v, ok := m.Log.(RequestVerifier); ok {
			if err := v.VerifyRequest(ctx, *rec, req); err != nil {
				return nil, engine.MarkPermanent(fmt.Errorf("model call %s: %w", key, err))
			}
		}
		resp, err := m.load(ctx, key, rec)
		if err != nil {
			return nil, err
		}
		m.spent += RecordedTokens(rec.Status, rec.Result)
		if meter != nil {
			// Counted when it was recorded; a run recovered past its
			// budget stops here.
			if err := meter.Settle(0, 0, limit); err != nil {
				return nil, overBudget(key, err)
			}
		}
		return resp, nil
	case err != nil && !errors.Is(err, ErrCallNotFound):
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}

	var res *reservation
	budgetCap := false  // the budget, not the request, set the answer's cap
	defaultCap := false // the request set none: DefaultAnswerTokens did
	if meter != nil {
		prompt, own := models.EstimatePromptTokens(req), req.Options.MaxOutputTokens
		if own <= 0 {
			own, defaultCap = DefaultAnswerTokens, true
		}
		answer, err := meter.Reserve(ctx, prompt, own, limit)
		var be *policy.BudgetError
		switch {
		case errors.As(err, &be):
			return nil, overBudget(key, err)
		case err != nil: // the run stopped while the call waited for room
			return nil, fmt.Errorf("model call %s: %w", key, err)
		}
		res = &reservation{meter: meter, tokens: prompt + answer, limit: limit}
		defer res.release()
		budgetCap = answer < own
		req.Options.MaxOutputTokens = answer
	}
	var streamed models.AnswerEstimate // for a call that fails
	stream := func(c models.Chunk) error {
		streamed.Add(c)
		if c.Content != "" || c.Thinking != "" {
			engine.Emit(ctx, engine.EventModelToken, map[string]any{
				"call": key, "content": c.Content, "thinking": c.Thinking})
		}
		return nil
	}
	// The cap is held here too, not only asked of the provider: a
	// provider that ignores it is cut at it (models.ChatCapped).
	resp, err := models.ChatCapped(ctx, m.Provider, req, stream)
	if err != nil {
		err = fmt.Errorf("model call %s: %w", key, err)
		spent := failedCallTokens(req, streamed.Tokens(), err)
		budgetErr := res.settle(spent)
		if spent > 0 {
			m.spent += spent
			if rerr := m.recordSpent(ctx, info, key, req, models.HashRequest(req), spent, err.Error()); rerr != nil {
				return nil, errors.Join(err, rerr)
			}
		}
		if budgetErr == nil && budgetCap && errors.Is(err, models.ErrTruncated) {
			// Cut at what the budget had left: the run could not afford
			// the whole answer.
			budgetErr = &policy.BudgetError{Which: policy.BudgetTokens, Limit: int64(limit), Used: int64(meter.Used())}
		}
		if budgetErr != nil {
			return nil, errors.Join(overBudget(key, budgetErr), err)
		}
		if defaultCap && errors.Is(err, models.ErrTruncated) {
			err = fmt.Errorf("%w (cut at %d tokens, the answer cap of a call under a token budget whose node sets no num_predict)", err, DefaultAnswerTokens)
		}
		if models.IsTransient(err) {
			return nil, engine.MarkTransient(err)
		}
		return nil, engine.MarkPermanent(err)
	}
	spent := models.Spent(req, resp.PromptTokens, resp.CompletionTokens, resp.Message)
	budgetErr := res.settle(spent)
	m.spent += spent
	hash := resp.RequestHash
	if hash == "" {
		hash = models.HashRequest(req)
	}
	resp, err = m.record(ctx, info, key, req, hash, resp, spent)
	if err != nil {
		return nil, err
	}
	if budgetErr != nil {
		return nil, overBudget(key, budgetErr)
	}
	return resp, nil
}

// reservation is what a model call has set aside on its run's meter. It
// is settled once: with what the call spent (settle), or, when the call
// never got that far (a provider that panicked), with nothing (release),
// so that the calls waiting for room do not wait for it until the run
// ends. A nil reservation (no token budget) settles to nothing.
type reservation struct {
	meter         *policy.TokenMeter
	tokens, limit int
	done          bool
}

func (r *reservation) settle(spent int) error {
	if r == nil {
		return nil
	}
	r.done = true
	return r.meter.Settle(r.tokens, spent, r.limit)
}

func (r *reservation) release() {
	if r != nil && !r.done {
		_ = r.settle(0)
	}
}

// record stores a response and records it under key. A response recorded
// meanwhile by an attempt that raced this one wins; this one's tokens are
// then recorded as spent beside it.
func (m *ModelCall) record(ctx context.Context, info engine.RunInfo, key string, req models.Request, hash string, resp *models.Response, spent int) (*models.Response, error) {
	enc, err := models.EncodeResponse(resp)
	if err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	ref, err := m.Blobs.PutBlob(ctx, enc)
	if err != nil {
		return nil, fmt.Errorf("model call %s: store response: %w", key, err)
	}
	result, _ := json.Marshal(refOf(info, ref.String(), resp.Provider, spent))
	// The record names the node by its path through the subgraphs, as a
	// tool call's record does: the bare name is the same in every instance
	// of a subgraph. No reader of it compares it to a bare name (the
	// conflict checks compare tool, request digest and run; tokens and
	// replays read the key, tool and result).
	existing, err := intent(ctx, m.Log, CallRecord{Key: key, Run: info.Run, Node: info.Path,
		Tool: "model:" + req.Model, ArgsHash: hash, Args: requestDigest(req), Decision: string(policy.DecisionAllow), DecidedBy: "lane:" + m.Lane.Agent})
	if err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	if existing.Done() {
		if err := m.recordSpent(ctx, info, key, req, hash, spent, "an answer raced this one to the record"); err != nil {
			return nil, err
		}
		return m.load(ctx, key, existing)
	}
	if err := m.Log.Done(ctx, key, result, ""); err != nil {
		return nil, fmt.Errorf("model call %s: %w", key, err)
	}
	return resp, nil
}

// requestDigest is what a model call's record keeps in its Args: the
// request's models.RequestDigest, for an audit replay to say which part of
// a request that differs does (RequestVerifier).
func requestDigest(req models.Request) json.RawMessage {
	digest, _ := json.Marshal(models.DigestRequest(req)) // strings and numbers only
	return digest
}

// recordSpent records tokens spent by a call whose answer is not the
// recorded one, under the first free key + "#spent<n>", with the request's
// hash and digest as a call's record has them. They are recorded even when
// the run is being stopped (its wall time ran out, say): they were spent
// all the same.
func (m *ModelCall) recordSpent(ctx context.Context, info engine.RunInfo, key string, req models.Request, hash string, spent int, why string) error {
	ctx = context.WithoutCancel(ctx)
	result, _ := json.Marshal(refOf(info, "", m.Provider.Name(), spent))
	for n := 1; n <= maxSpentRecords; n++ {
		k := key + "#spent" + strconv.Itoa(n)
		existing, err := m.Log.Intent(ctx, CallRecord{Key: k, Run: info.Run, Node: info.Path,
			Tool: "model:" + req.Model, ArgsHash: hash, Args: requestDigest(req), Decision: string(policy.DecisionAllow), DecidedBy: "lane:" + m.Lane.Agent})
		switch {
		case errors.Is(err, ErrCallConflict) || (err == nil && existing != nil):
			continue
		case err != nil:
			return fmt.Errorf("model call %s: record the tokens it spent: %w", k, err)
		}
		if err := m.Log.Done(ctx, k, result, why); err != nil {
			return fmt.Errorf("model call %s: record the tokens it spent: %w", k, err)
		}
		return nil
	}
	return fmt.Errorf("model call %s: more than %d failed attempts recorded", key, maxSpentRecords)
}

// maxSpentRecords bounds the failed attempts recorded for one call; a
// node's retries are bounded far below it.
const maxSpentRecords = 1000

// failedCallTokens is what a failed call counts (see ModelCall): the
// counts the error carries, else the estimate of the prompt and of what
// was streamed; a call that the server refused before it did any work
// counts only what was streamed.
func failedCallTokens(req models.Request, streamed int, err error) int {
	prompt, completion := 0, 0
	var me *models.Error
	if errors.As(err, &me) {
		switch me.Kind {
		case models.Unreachable, models.NotFound, models.BadRequest:
			return streamed
		}
		prompt, completion = me.PromptTokens, me.CompletionTokens
	}
	if prompt <= 0 {
		prompt = models.EstimatePromptTokens(req)
	}
	if completion <= 0 {
		completion = streamed
	}
	return prompt + completion
}

func overBudget(key string, err error) error {
	return engine.MarkPermanent(fmt.Errorf("%w: model call %s: %w", engine.ErrBudgetExceeded, key, err))
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
