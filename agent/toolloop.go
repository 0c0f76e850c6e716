package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// Tool is a tool implementation. key is the call's idempotency key: a tool
// with side effects uses it to make a repeated call harmless (record_note
// writes a note once per key).
type Tool interface {
	Call(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error)
}

// ToolFunc adapts a function to Tool.
type ToolFunc func(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error)

// Call implements Tool.
func (f ToolFunc) Call(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error) {
	return f(ctx, args, key)
}

// Interrupt reasons in ToolInterrupt.Reason.
const (
	ReasonApproval            = "approval_required"
	ReasonUncertainSideEffect = "uncertain_side_effect"
)

// ToolInterrupt is the payload of the interrupts the tool loop raises: a
// write tool that needs approval, or a call that may or may not have run
// before a crash. Approve runs the call; edit runs it with Value as its
// arguments; reject does not run it and tells the model so.
type ToolInterrupt struct {
	Reason string          `json:"reason"`
	Tool   string          `json:"tool"`
	Args   json.RawMessage `json:"args"`
	Key    string          `json:"key"`
	// Node is the path of the node that makes the call through the
	// subgraphs (engine.RunInfo.Path), as events name it: the person who
	// decides must know which of the calls of a loop that several graphs
	// share it is.
	Node string `json:"node,omitempty"`
	// Detail says why the policy asked.
	Detail string `json:"detail,omitempty"`
}

// CheckToolDecision returns a tool loop node's check of a person's decision
// (engine.CheckDecisionOn): an edit whose value the tool's schema in reg
// refuses (not an object, a field missing or of the wrong type) is refused
// before the question is spent. The loop would otherwise take the edit as
// the decision, refuse the call it names and go on without it, so that a
// typo in the arguments would stand for a rejection.
func CheckToolDecision(reg *policy.Registry) (func(json.RawMessage, engine.Decision) error, error) {
	tools, err := policy.Resolve(reg, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return func(payload json.RawMessage, d engine.Decision) error {
		var ti ToolInterrupt
		if d.Kind != engine.Edit || json.Unmarshal(payload, &ti) != nil || ti.Tool == "" {
			return nil
		}
		if chk := tools.Check(ti.Tool, normalizeArgs(d.Value)); !chk.Allowed {
			return fmt.Errorf("%s: an edit's value is the call's arguments, a JSON object that the tool's schema accepts", chk.Reason)
		}
		return nil
	}, nil
}

// LoopConfig configures a tool loop node.
type LoopConfig struct {
	Provider models.Provider
	Model    string
	Lane     policy.Lane
	// System is the system prompt; policy.SpotlightInstruction is added to
	// it, so the model knows how tool results are marked.
	System  string
	Options models.Options
	Timeout time.Duration // per model call

	// ActiveTools returns the run's pinned active tool set. The caller
	// decides where it is pinned (the run record, a channel); it must
	// return the same set every time the task runs.
	ActiveTools func(ctx context.Context, s engine.State) (*policy.ActiveSet, error)
	// Impls implements the tools by name.
	Impls map[string]Tool
	Rules []policy.ApprovalRule
	// Budget bounds the loop's iterations (default 5) and the run's
	// tokens, counted with all the run's other model calls (see
	// ModelCall.TokenLimit).
	Budget policy.Budget
	Log    CallLog
	Blobs  engine.BlobStore
	// Now is the clock for approval records; default time.Now.
	Now func() time.Time

	// Messages is the conversation (an append channel). The loop reads it
	// whole and appends what it adds: the model's turns and the tool
	// results, as the model saw them.
	Messages engine.Chan[[]models.Message]
	// Answer, when declared (a replace channel), receives the final answer.
	Answer engine.Chan[string]
	// Untrusted, when declared (a replace channel), says that untrusted
	// text has entered the run; the loop reads it and sets it when a tool
	// result is flagged.
	Untrusted engine.Chan[bool]
	// Tokens, when declared (a sum channel), receives the tokens the
	// loop's model calls used. It is a record, not the budget's count: the
	// token budget counts every model call of the run (ModelCall).
	Tokens engine.Chan[int]
	// Failed, when set, returns the writes that mark the turn as one in
	// which a tool's call failed (the tool returned an error, so what it
	// was asked to do may not be done); the loop adds them to its writes.
	// The tool_loop of a bundle adds a flag to the graph's flags channel.
	Failed func(s engine.State) []engine.Write
}

// loop is one execution of a tool loop node.
type loop struct {
	cfg       *LoopConfig
	info      engine.RunInfo
	active    *policy.ActiveSet
	untrusted bool
	// failed says that a call of this turn failed (see LoopConfig.Failed).
	failed  bool
	tracker *policy.Tracker
}

// ToolLoop returns the node that runs cfg's loop: model → tool calls →
// policy check → execute → neutralize → re-prompt, until the model answers
// without calling a tool or the iteration budget runs out.
//
// The node may run again from its start (after a crash or an interrupt). It
// is deterministic on re-runs: model responses and tool results come back
// from the CallLog by key, and the interrupts it raises come in the same
// order.
func ToolLoop(cfg LoopConfig) (engine.NodeFunc, error) {
	switch {
	case cfg.Provider == nil:
		return nil, fmt.Errorf("%w: tool loop: no provider", ErrBadConfig)
	case cfg.Log == nil || cfg.Blobs == nil:
		return nil, fmt.Errorf("%w: tool loop: no call log or blob store", ErrBadConfig)
	case cfg.ActiveTools == nil:
		return nil, fmt.Errorf("%w: tool loop: no active tool set", ErrBadConfig)
	case cfg.Messages.Name() == "":
		return nil, fmt.Errorf("%w: tool loop: no messages channel", ErrBadConfig)
	}
	if err := cfg.Budget.Validate(); err != nil {
		return nil, fmt.Errorf("tool loop: %w", err)
	}
	for _, r := range cfg.Rules {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("tool loop: %w", err)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &cfg
	return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return c.run(ctx, s)
	}, nil
}

func (cfg *LoopConfig) run(ctx context.Context, s engine.State) ([]engine.Write, error) {
	info, ok := engine.InfoFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: tool loop outside a running node", ErrBadConfig)
	}
	active, err := cfg.ActiveTools(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("tool loop: active tools: %w", err)
	}
	if active == nil {
		return nil, fmt.Errorf("%w: tool loop: no active tool set for run %s", ErrBadConfig, info.Run)
	}
	budget := cfg.Budget
	// The engine's MaxDuration bounds wall time, and the run's token meter
	// its tokens (ModelCall.TokenLimit): the loop's tracker counts its
	// iterations.
	budget.WallTime, budget.Tokens = 0, 0
	l := &loop{cfg: cfg, info: info, active: active, tracker: policy.NewTracker(budget, cfg.Now())}
	if cfg.Untrusted.Name() != "" {
		l.untrusted = cfg.Untrusted.Get(s)
	}
	untrusted0 := l.untrusted
	mc := &ModelCall{Provider: cfg.Provider, Lane: &cfg.Lane, Log: cfg.Log, Blobs: cfg.Blobs, TokenLimit: cfg.Budget.Tokens}

	var defs []models.ToolDef
	for _, t := range active.Tools() {
		defs = append(defs, models.ToolDef{Name: t.Name, Description: t.Description, Parameters: t.Schema})
	}
	system := policy.SpotlightInstruction
	if cfg.System != "" {
		system = cfg.System + "\n\n" + system
	}
	history := append([]models.Message{{Role: models.RoleSystem, Content: system}}, cfg.Messages.Get(s)...)
	var added []models.Message
	answer := ""
	calls := 0
	for model := 0; ; model++ {
		req := models.Request{Model: cfg.Model, Messages: append(history, added...), Tools: defs,
			Options: cfg.Options, Timeout: cfg.Timeout}
		resp, err := mc.Call(ctx, req, model)
		if err != nil {
			return nil, err
		}
		msg := resp.Message
		msg.Role = models.RoleAssistant
		added = append(added, msg)
		if len(msg.ToolCalls) == 0 {
			answer = msg.Content
			break
		}
		if err := l.tracker.AddToolIteration(); err != nil {
			return nil, fmt.Errorf("%w: tool loop %s: %w", engine.ErrBudgetExceeded, info.Node, err)
		}
		for _, tc := range msg.ToolCalls {
			out, err := l.call(ctx, tc, calls)
			if err != nil {
				return nil, err
			}
			calls++
			added = append(added, models.Message{Role: models.RoleTool, Content: out, ToolName: tc.Name})
		}
	}

	ws := []engine.Write{engine.Push(cfg.Messages, added...)}
	if cfg.Answer.Name() != "" {
		ws = append(ws, cfg.Answer.Set(answer))
	}
	if cfg.Untrusted.Name() != "" && l.untrusted != untrusted0 {
		ws = append(ws, cfg.Untrusted.Set(l.untrusted))
	}
	if cfg.Tokens.Name() != "" && mc.Spent() > 0 {
		ws = append(ws, cfg.Tokens.Set(mc.Spent()))
	}
	if cfg.Failed != nil && l.failed {
		ws = append(ws, cfg.Failed(s)...)
	}
	return ws, nil
}

// ToolKey is the idempotency key of a node's call-th tool call.
func ToolKey(info engine.RunInfo, call int) string {
	return callBase(info) + ":" + strconv.Itoa(call)
}

// Layers of the tool loop's own refusals in tool.unauthorized events, next
// to the active set's (policy.LayerRegistry and the rest): a bundle rule
// denied the call, or the tool has no implementation here.
const (
	layerRule           = "rule"
	layerImplementation = "implementation"
)

// Texts of the refusals and failures the model reads. They are neutral: a
// refusal says that the call did not run, not which rule stopped it or how
// to get around it; a failure says that the call did not succeed, not the
// tool's error, which is recorded (the call log, the tool.result event)
// but may hold what is no one's business in an answer: a file path, a
// host, the text of an internal error.
const (
	refusedPrefix   = "refused: "
	toolErrorPrefix = "tool error: "
	textUnavailable = "refused: tool %q is not available"
	textInvalidArgs = "refused: the arguments for %q are invalid: %s"
	textDenied      = "refused: the call to %q was not run"
	textRejected    = "refused: the call to %q was not run (declined by the operator)"
	textNotRerun    = "refused: the earlier call to %q may not have completed and was not run again (declined by the operator)"
	textNoImpl      = "refused: tool %q is not available"
	textFailed      = failedPrefix + "the call to %q did not succeed; the error was recorded for the operator"
)

// failedPrefix begins what the model reads for a tool call that ran and
// failed, as refusedPrefix begins a refusal: a scripted model's rule tells
// them apart by it (models/scripted, tool_result).
const failedPrefix = "failed: "

// call handles one tool call and returns the text the model reads.
func (l *loop) call(ctx context.Context, tc models.ToolCall, index int) (string, error) {
	key := ToolKey(l.info, index)
	args := normalizeArgs(tc.Arguments)
	// The record names the node by its path, as events do: the bare name
	// is the same in every instance of a subgraph and in the run's own
	// graph. No reader of the record compares it to a bare name.
	rec := CallRecord{Key: key, Run: l.info.Run, Node: l.info.Path, Tool: tc.Name, ArgsHash: HashArgs(args), Args: args}

	denied := func(layer, reason string) func() { return l.denied(ctx, tc.Name, key, layer, reason) }
	chk := l.active.Check(tc.Name, args)
	if !chk.Allowed {
		text := fmt.Sprintf(textUnavailable, tc.Name)
		if chk.Layer == policy.LayerSchema {
			text = fmt.Sprintf(textInvalidArgs, tc.Name, schemaDetail(chk.Reason))
		}
		rec.Decision, rec.DecidedBy, rec.Reason = string(policy.DecisionDeny), "policy:"+chk.Layer, chk.Reason
		return l.refuse(ctx, rec, text, denied(chk.Layer, chk.Reason))
	}
	tool := chk.Tool
	impl := l.cfg.Impls[tool.Name]

	ar := policy.Decide(l.cfg.Rules, tool, l.untrusted, l.cfg.Now().UTC())
	rec.Decision, rec.DecidedBy, rec.Reason = string(ar.Decision), ar.By, ar.Reason
	switch ar.Decision {
	case policy.DecisionDeny:
		return l.refuse(ctx, rec, fmt.Sprintf(textDenied, tool.Name), denied(layerRule, ar.Reason))
	case policy.DecisionAsk:
		d, err := engine.Interrupt(ctx, ToolInterrupt{Reason: ReasonApproval, Tool: tool.Name, Args: args, Key: key,
			Node: l.info.Path, Detail: ar.Reason})
		if err != nil {
			return "", err
		}
		rec.Decision, rec.DecidedBy, rec.Reason = d.Kind, operator(d), d.Reason
		switch d.Kind {
		case engine.Reject:
			return l.refuse(ctx, rec, fmt.Sprintf(textRejected, tool.Name), nil)
		case engine.Edit:
			args = normalizeArgs(d.Value)
			rec.Args, rec.ArgsHash = args, HashArgs(args)
			if chk := l.active.Check(tool.Name, args); !chk.Allowed {
				rec.Reason = "operator's edit: " + chk.Reason
				return l.refuse(ctx, rec, fmt.Sprintf(textInvalidArgs, tool.Name, schemaDetail(chk.Reason)), denied(chk.Layer, rec.Reason))
			}
		}
	}
	if impl == nil {
		rec.Decision, rec.DecidedBy, rec.Reason = string(policy.DecisionDeny), "policy:"+layerImplementation, ErrNoTool.Error()
		return l.refuse(ctx, rec, fmt.Sprintf(textNoImpl, tool.Name), denied(layerImplementation, ErrNoTool.Error()))
	}

	// The intent may be left without an outcome by a crash. Before it is
	// recorded, the run must be one that recovery finds, and this task one
	// that it runs again under the same id, so with the same key: the
	// intent is then found, and a person asked about it. (In exit
	// durability nothing of the run may be committed yet.)
	if err := engine.EnsureDurable(ctx); err != nil {
		return "", fmt.Errorf("tool call %s: %w", key, err)
	}
	existing, err := intent(ctx, l.cfg.Log, rec)
	if err != nil {
		return "", fmt.Errorf("tool call %s: %w", key, err)
	}
	switch {
	case existing == nil && !tool.Idempotent:
		lost, err := l.recordMayBeLost(ctx)
		if err != nil {
			return "", fmt.Errorf("tool call %s: %w", key, err)
		}
		if lost {
			// The call may have run before the store was damaged, and its
			// record been lost with the page that held it: the intent just
			// recorded stands for it, and a person decides.
			return l.uncertain(ctx, impl, rec, reasonSalvaged)
		}
		return l.execute(ctx, impl, rec, key, "")
	case existing == nil:
		return l.execute(ctx, impl, rec, key, "")
	case existing.Done():
		return l.reply(existing), nil
	case existing.Decision == engine.Reject:
		// A refusal whose outcome a crash kept from being recorded: nothing ran.
		return l.refuse(ctx, *existing, fmt.Sprintf(textRejected, tool.Name), nil)
	case existing.Decision == string(policy.DecisionDeny):
		return l.refuse(ctx, *existing, fmt.Sprintf(textDenied, tool.Name), nil)
	case tool.Idempotent:
		// The tool may or may not have run; running it again with the same
		// key is harmless by its declaration.
		return l.execute(ctx, impl, *existing, key, "")
	}
	return l.uncertain(ctx, impl, *existing, reasonRecovered)
}

// LostCalls is implemented by a CallLog that may have lost records of a
// run's calls: the store-backed log of a store salvaged after damage.
// CallsLostThrough returns the newest checkpoint ID from which a task of
// the run may have made calls whose records are lost ("" when none may
// be): a task that runs from that checkpoint or an older one, and calls a
// tool whose key has no record, may be repeating a call that ran. It
// returns CallsLostInAnyStep where the run may have gone on past the
// checkpoints that are left: then every task of the run may be.
type LostCalls interface {
	CallsLostThrough(ctx context.Context, run string) (string, error)
}

// CallsLostInAnyStep is what LostCalls returns for a run whose every task
// may be repeating a call whose record is lost.
const CallsLostInAnyStep = "any"

// recordMayBeLost reports whether a call of this task that has no record
// may have run before, its record lost (LostCalls). Checkpoint IDs grow
// with time, so a task that runs from a checkpoint made after the records
// were lost is not one, unless the run may have gone on past the
// checkpoints that were left, and runs again under new ones steps that it
// had run.
func (l *loop) recordMayBeLost(ctx context.Context) (bool, error) {
	lc, ok := l.cfg.Log.(LostCalls)
	if !ok {
		return false, nil
	}
	through, err := lc.CallsLostThrough(ctx, l.info.Run)
	if err != nil {
		return false, err
	}
	return through == CallsLostInAnyStep || through != "" && l.info.Checkpoint <= through, nil
}

// Why uncertain asks, in the Reason of its "#ask<n>" markers, and what the
// question says to the person.
const (
	reasonRecovered = "an intent without a result was found on recovery"
	reasonSalvaged  = "no record of the call was found in a salvaged store whose records of the run may be lost"
	detailRecovered = "the call may or may not have run before a crash; approve runs it again, reject reports it as not done"
	detailSalvaged  = "the call's record may have been lost when the store was salvaged, so it may or may not have run " +
		"before; approve runs it again, reject reports it as not done"
)

// askedMarker is the result of an "#ask<n>" marker that records decisions
// set aside: the task's Interrupt calls before the question returned
// answers given to other questions (see uncertain). A marker of none holds
// "asked".
type askedMarker struct {
	SetAside int `json:"set_aside"`
}

func setAsideBy(m *CallRecord) int {
	var a askedMarker
	if json.Unmarshal(m.Result, &a) != nil || a.SetAside < 0 {
		return 0
	}
	return a.SetAside
}

// uncertain handles a call of a non-idempotent tool whose intent has no
// result: it may have run before a crash, or before the store was salvaged
// (why, reasonSalvaged: the call had no record, and rec was recorded just
// now). A person decides whether it runs again. Each question is marked in
// the log ("#ask<n>") before it is asked, so that every later execution of
// the task raises its interrupts in the same order, and each decision is
// recorded ("#retry<n>") before it is acted on; a re-run that itself leaves
// no result is asked about again.
//
// Decisions are matched to a task's interrupts by their order. A question
// whose marker was not closed before has never been asked, so a decision
// its Interrupt returns answers another question, one the task asked
// before at that place in its order (after a salvage lost a call's record,
// the node asks this one first): the decision is set aside, the question
// asked after it, and the marker records how many were set aside, for the
// task's later executions to pass over them as well. The question set
// aside is asked again where the task comes to it.
func (l *loop) uncertain(ctx context.Context, impl Tool, rec CallRecord, why string) (string, error) {
	key := rec.Key
	for n := 1; ; n++ {
		askKey := key + "#ask" + strconv.Itoa(n)
		retryKey := key + "#retry" + strconv.Itoa(n)
		marker := rec
		marker.Key, marker.Decision, marker.DecidedBy = askKey, "ask", "policy:"+ReasonUncertainSideEffect
		if marker.Reason = reasonRecovered; n == 1 {
			marker.Reason = why
		}
		m, err := intent(ctx, l.cfg.Log, marker)
		if err != nil {
			return "", fmt.Errorf("tool call %s: %w", key, err)
		}
		asked, setAside := m.Done(), 0
		if m != nil {
			marker.Reason = m.Reason
		}
		if asked {
			setAside = setAsideBy(m)
		}
		// The node is this task's, not rec's: a record an older release
		// wrote names the bare node.
		ti := ToolInterrupt{Reason: ReasonUncertainSideEffect, Tool: rec.Tool, Args: rec.Args, Key: key,
			Node: l.info.Path, Detail: detailRecovered}
		if marker.Reason == reasonSalvaged {
			ti.Detail = detailSalvaged
		}
		for range setAside {
			if _, err := engine.Interrupt(ctx, ti); err != nil {
				return "", err
			}
		}
		d, err := engine.Interrupt(ctx, ti)
		for !asked && err == nil {
			setAside++
			d, err = engine.Interrupt(ctx, ti)
		}
		if !asked {
			// The marker holds no side effect: it is closed before the
			// question is put, so that it never reads as an open intent.
			result := json.RawMessage(`"asked"`)
			if setAside > 0 {
				result, _ = json.Marshal(askedMarker{SetAside: setAside})
			}
			if err := l.cfg.Log.Done(ctx, askKey, result, ""); err != nil {
				return "", fmt.Errorf("tool call %s: %w", askKey, err)
			}
		}
		if err != nil {
			return "", err
		}
		retry := rec
		retry.Key, retry.Decision, retry.DecidedBy, retry.Reason = retryKey, d.Kind, operator(d), d.Reason
		var editRefused func()
		if d.Kind == engine.Edit {
			retry.Args = normalizeArgs(d.Value)
			retry.ArgsHash = HashArgs(retry.Args)
			if chk := l.active.Check(rec.Tool, retry.Args); !chk.Allowed {
				retry.Decision, retry.Reason = engine.Reject, "operator's edit: "+chk.Reason
				editRefused = l.denied(ctx, rec.Tool, retryKey, chk.Layer, retry.Reason)
			}
		}
		existing, err := intent(ctx, l.cfg.Log, retry)
		if err != nil {
			return "", fmt.Errorf("tool call %s: %w", retryKey, err)
		}
		if existing != nil {
			retry = *existing
		}
		switch {
		case existing.Done():
			return l.reply(existing), nil
		case retry.Decision == engine.Reject:
			text, err := l.refuse(ctx, retry, fmt.Sprintf(textNotRerun, rec.Tool), nil)
			if err == nil && existing == nil && editRefused != nil {
				editRefused() // the refusal was recorded just now
			}
			return text, err
		case existing == nil:
			return l.execute(ctx, impl, retry, key, key)
		}
		// The re-run itself left no result: ask again.
	}
}

// denied returns the announcement of a refused call, a tool.unauthorized
// event, for refuse to make when it records the refusal.
func (l *loop) denied(ctx context.Context, tool, key, layer, reason string) func() {
	return func() {
		// "node" is the bare name, as it always was; "path" names the node
		// through the subgraphs, as the event's own node does.
		engine.Announce(ctx, engine.EventToolDenied, map[string]any{"run": l.info.Run, "node": l.info.Node,
			"path": l.info.Path, "tool": tool, "layer": layer, "reason": reason, "key": key})
	}
}

// refuse records a call that does not run (once) and returns the refusal.
// announce runs only when the record is new.
func (l *loop) refuse(ctx context.Context, rec CallRecord, text string, announce func()) (string, error) {
	existing, err := intent(ctx, l.cfg.Log, rec)
	if err != nil {
		return "", fmt.Errorf("tool call %s: %w", rec.Key, err)
	}
	if existing.Done() {
		return l.reply(existing), nil
	}
	if err := l.cfg.Log.Done(ctx, rec.Key, nil, text); err != nil {
		return "", fmt.Errorf("tool call %s: %w", rec.Key, err)
	}
	if announce != nil && existing == nil {
		announce()
	}
	return text, nil
}

// execute runs the tool under an intent already recorded as rec, records
// its outcome and announces both. toolKey is the key the tool is given
// (rec.Key unless this is an approved re-run).
func (l *loop) execute(ctx context.Context, impl Tool, rec CallRecord, toolKey, origKey string) (string, error) {
	if toolKey == "" {
		toolKey = rec.Key
	}
	called := map[string]any{"key": toolKey, "tool": rec.Tool, "args": rec.Args,
		"decision": rec.Decision, "decided_by": rec.DecidedBy}
	if origKey != "" {
		called["record"] = rec.Key
	}
	engine.Announce(ctx, engine.EventToolCalled, called)
	result, callErr := impl.Call(ctx, rec.Args, toolKey)
	if ctx.Err() != nil && callErr != nil {
		// Stopped mid-call (cancel, shutdown): leave the intent open; the
		// outcome is unknown.
		return "", fmt.Errorf("tool call %s: %w", rec.Key, callErr)
	}
	errText := ""
	if callErr != nil {
		result, errText = nil, toolErrorPrefix+callErr.Error()
	} else if !json.Valid(result) {
		result, _ = json.Marshal(string(result))
	}
	// The call has returned: its outcome is known and is recorded even if
	// the run is being stopped meanwhile, or recovery would find an open
	// intent and ask a person about a call whose result was in hand.
	if err := l.cfg.Log.Done(context.WithoutCancel(ctx), rec.Key, result, errText); err != nil {
		return "", fmt.Errorf("tool call %s: %w", rec.Key, err)
	}
	done := rec
	done.Status, done.Result, done.Error = StatusDone, result, errText
	text, flags := l.neutralize(&done)
	data := map[string]any{"key": toolKey, "tool": rec.Tool, "bytes": len(result)}
	if errText != "" {
		data["error"] = errText
	}
	if len(flags) > 0 {
		data["flags"] = flags
	}
	engine.Announce(ctx, engine.EventToolResult, data)
	return text, nil
}

// reply turns a recorded outcome into what the model reads.
func (l *loop) reply(rec *CallRecord) string {
	text, _ := l.neutralize(rec)
	return text
}

// neutralize returns the model's view of a recorded outcome: the loop's own
// refusals as they are, a failure as the loop's own text (the tool's error
// stays in the record), anything that came from a tool through
// policy.Neutralize, which marks the run untrusted when it raises flags.
func (l *loop) neutralize(rec *CallRecord) (string, []string) {
	if rec.Error != "" {
		if strings.HasPrefix(rec.Error, refusedPrefix) {
			return rec.Error, nil
		}
		l.failed = true
		return fmt.Sprintf(textFailed, rec.Tool), nil
	}
	raw := string(rec.Result)
	sum := sha256.Sum256([]byte(rec.Key + "\x00" + raw))
	// The nonce is derived from the text it wraps, so a re-run shows the
	// model the same bytes, and the text cannot contain its own nonce.
	n := policy.Neutralize(rec.Tool, raw, policy.NeutralizeOptions{
		Nonce: hex.EncodeToString(sum[:12]), ToolNames: l.active.Names()})
	if len(n.Flags) > 0 {
		l.untrusted = true
	}
	return n.Text, n.Flags
}

func normalizeArgs(args json.RawMessage) json.RawMessage {
	t := strings.TrimSpace(string(args))
	if t == "" || t == "null" {
		return json.RawMessage(`{}`)
	}
	return args
}

func operator(d engine.Decision) string {
	if d.By == "" {
		return "operator"
	}
	return "operator:" + d.By
}

// schemaDetail keeps the part of a schema refusal the model can act on.
func schemaDetail(reason string) string {
	if i := strings.Index(reason, ": "); i >= 0 {
		return reason[i+2:]
	}
	return reason
}
