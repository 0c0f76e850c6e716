package firmware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/bounded"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/policy"
)

// MetaTools is the key of engine.RunRequest.Meta (and engine.Run.Meta) that
// holds a request's instance override of the active tool set: tool names
// separated by commas ("" for no tools at all). Absent means the request
// does not narrow the set.
const MetaTools = "tools"

// ScriptedModel is the model name the scripted provider answers as, and the
// name a lane lists to allow it.
const ScriptedModel = scripted.Name

// Runtime is what the model and tool_loop node kinds need from the
// appliance: the model to call, where calls are recorded, and the limits.
// Bundles loaded without one (Load, Reference) still compile, and their
// model nodes answer with the bundle's scripted rules, recording calls in
// memory only.
type Runtime struct {
	// Provider serves model calls; nil means the scripted provider built
	// from the node's scripted_rules file in the bundle.
	Provider models.Provider
	// Model is the model asked for (and checked against the agent's
	// lane). Empty means the node's own model, or "scripted" when the
	// scripted provider serves.
	Model string
	// Models, when set, is asked at each model call (a model node's, or
	// a tool loop's start) which provider and model serve it, in place
	// of Provider and Model; a nil provider means the scripted rules. It
	// lets an appliance move new calls to a model server that came up
	// after it started, while a call under way keeps what it began on.
	// The provider it returns must be comparable (a pointer).
	Models func() (models.Provider, string)
	// Log records each model call and tool call (intent, then result), so
	// that a re-executed task reuses them. Nil keeps them in memory.
	Log agent.CallLog
	// Blobs stores model responses. Nil keeps them in memory.
	Blobs engine.BlobStore
	// Budget bounds tool-loop iterations (default 5) and tokens per run,
	// and the runs' supersteps (the narrower of it and the agent's
	// step_limit) and wall time.
	Budget policy.Budget
	// Runs reads a run's record for its Meta[MetaTools] override. Nil
	// means no request narrows the tool set.
	Runs engine.RunStore
	// Tools is the appliance's runtime restriction of the tool set; nil
	// means no restriction at this layer.
	Tools []string
	// Notes and Followups back the record_note and schedule_followup
	// tools; a tool whose backing is nil is refused as unavailable.
	Notes     agent.Notes
	Followups agent.Followups
	// Impls adds or replaces tool implementations by name.
	Impls map[string]agent.Tool

	initOnce sync.Once
	pinned   pins
}

// maxPins is how many runs' tool sets the runtime keeps at once (see
// pins).
const maxPins = 1024

// pins keeps the active tool sets ActiveTools found, by run id, the last
// maxPins of them: an appliance runs for months, and one entry per run it
// ever ran would grow without end. A set no longer kept is found again as
// it was: read from the run's record, or resolved again from the same
// registry, the runtime's Tools (fixed for its life) and no override.
type pins struct {
	mu   sync.Mutex
	sets *bounded.Map[string, *policy.ActiveSet] // made on first use
}

func (p *pins) get(run string) (*policy.ActiveSet, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sets == nil {
		return nil, false
	}
	return p.sets.Get(run)
}

// put keeps set for run, unless another caller kept one first; it returns
// the one kept.
func (p *pins) put(run string, set *policy.ActiveSet) *policy.ActiveSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sets == nil {
		p.sets = bounded.New[string, *policy.ActiveSet](maxPins)
	}
	if kept, ok := p.sets.Get(run); ok {
		return kept
	}
	p.sets.Put(run, set)
	return set
}

// size is how many sets are kept.
func (p *pins) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sets == nil {
		return 0
	}
	return p.sets.Len()
}

func (rt *Runtime) init() {
	rt.initOnce.Do(func() {
		if rt.Log == nil {
			rt.Log = agent.NewMemoryCallLog()
		}
		if rt.Blobs == nil {
			rt.Blobs = engine.NewMemoryStore()
		}
	})
}

// provider picks who answers a node: the runtime's provider, or the
// bundle's scripted rules for the node.
func (rt *Runtime) provider(script *scripted.Provider, nodeModel string) (models.Provider, string, error) {
	p, model := rt.Provider, rt.Model
	if rt.Models != nil {
		p, model = rt.Models()
	}
	if p != nil {
		if model == "" {
			model = nodeModel
		}
		if model == "" {
			return nil, "", fmt.Errorf("%w: no model named by the appliance or the node", agent.ErrBadConfig)
		}
		return p, model, nil
	}
	if script == nil {
		return nil, "", fmt.Errorf("%w: the appliance has no model provider and the node has no scripted_rules", agent.ErrBadConfig)
	}
	if model == "" {
		model = ScriptedModel
	}
	return script, model, nil
}

// MetaActiveTools is the key of engine.Run.Meta that holds the run's active
// tool set, resolved and pinned when the run opened (policy.ActiveSet's
// JSON form).
const MetaActiveTools = "active_tools"

// pinTools is the agents' engine.Agent.Pin: it resolves the run's active
// tool set (the bundle's registry, narrowed by the agent's allowlist, by
// the appliance's restriction and by the request's override in
// Meta[MetaTools]) as the run opens, refuses an override naming a tool
// outside that set (*UnknownToolsError), and stores the set on the run, so
// the run keeps it across restarts even if the appliance's restriction
// changes meanwhile.
func (b *Bundle) pinTools(run *engine.Run) error {
	reg := b.Registry
	if reg == nil {
		reg, _ = policy.NewRegistry(nil)
	}
	var restrict []string
	if b.runtime != nil {
		restrict = b.runtime.Tools
	}
	var override []string
	if v, ok := run.Meta[MetaTools]; ok {
		override = ParseToolList(v)
	}
	set, err := policy.Resolve(reg, b.Allowlist(run.Agent), restrict, override)
	if err != nil {
		return fmt.Errorf("resolve the active tool set: %w", err)
	}
	if ignored := set.Ignored(); len(ignored) > 0 {
		// Fail closed: a name the run could never use (a typo, a tool
		// this appliance leaves out) is refused, not dropped from a run
		// that then goes ahead without it.
		return unknownTools(run.Agent, set)
	}
	raw, err := set.MarshalJSON()
	if err != nil {
		return err
	}
	run.Meta[MetaActiveTools] = string(raw)
	return nil
}

// unknownTools is the error for the override's names that set ignored,
// saying which of them the agent's allowlist and the appliance's
// restriction left out.
func unknownTools(agent string, set *policy.ActiveSet) *UnknownToolsError {
	e := &UnknownToolsError{Agent: agent, Names: set.Ignored()}
	for _, n := range e.Names {
		switch set.ExcludedBy(n) {
		case policy.LayerAgent:
			e.Unlisted = append(e.Unlisted, n)
		case policy.LayerAppliance:
			e.Appliance = append(e.Appliance, n)
		}
	}
	return e
}

// UnknownTools refuses the names of a request's tool override that the
// agent's active tool set cannot hold: not in the bundle's registry, or
// left out by the agent's allowlist or the appliance's restriction. It
// resolves the set as the run would open (the agent's Pin, on a run that
// is never stored, so that a request can be refused before anything
// starts), which refuses the names the override gives in vain; it returns
// nil when there are none. An agent
// without a Pin has no tool registry, so every name is unknown to it.
func UnknownTools(ag *engine.Agent, names []string) (*UnknownToolsError, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if ag.Pin == nil {
		return &UnknownToolsError{Agent: ag.Name, Names: names}, nil
	}
	probe := &engine.Run{Agent: ag.Name, Bundle: ag.Bundle, Meta: map[string]string{MetaTools: strings.Join(names, ",")}}
	if err := ag.Pin(probe); err != nil {
		var unknown *UnknownToolsError
		if errors.As(err, &unknown) {
			return unknown, nil
		}
		return nil, err
	}
	if _, ok := probe.Meta[MetaActiveTools]; !ok {
		return nil, fmt.Errorf("agent %q pins no active tool set", ag.Name)
	}
	return nil, nil
}

// ActiveTools returns the run's active tool set: the one pinned on the run
// when it opened (Meta[MetaActiveTools]). A run opened without the pin (a
// graph invoked directly, not through the run manager) gets it resolved
// here: the bundle's registry, narrowed by the allowlist that allowlist
// returns for the run's agent (the one its record names, "" when it has
// none; a nil allowlist, or a nil func, narrows nothing), by the
// appliance's restriction (Tools) and by the request's override
// (Meta[MetaTools]), which may name no tool outside the layers above
// (*UnknownToolsError). Either way it is kept for the run's next calls
// (see pins).
func (rt *Runtime) ActiveTools(ctx context.Context, reg *policy.Registry, allowlist func(agent string) []string, run string) (*policy.ActiveSet, error) {
	if set, ok := rt.pinned.get(run); ok {
		return set, nil
	}
	if reg == nil {
		reg, _ = policy.NewRegistry(nil)
	}
	var override []string
	var set *policy.ActiveSet
	agent := ""
	if rt.Runs != nil && run != "" {
		r, err := rt.Runs.Run(ctx, run)
		if err != nil && !errors.Is(err, engine.ErrRunNotFound) {
			return nil, fmt.Errorf("read run %s for its tool set: %w", run, err)
		}
		if r != nil {
			agent = r.Agent
			if v, ok := r.Meta[MetaActiveTools]; ok {
				if set, err = policy.DecodeActiveSet([]byte(v)); err != nil {
					return nil, fmt.Errorf("run %s: its pinned tool set: %w", run, err)
				}
			} else if v, ok := r.Meta[MetaTools]; ok {
				override = ParseToolList(v)
			}
		}
	}
	if set == nil {
		var allow []string
		if allowlist != nil {
			allow = allowlist(agent)
		}
		var err error
		if set, err = policy.Resolve(reg, allow, rt.Tools, override); err != nil {
			return nil, err
		}
		if ignored := set.Ignored(); len(ignored) > 0 {
			return nil, unknownTools(agent, set)
		}
	}
	return rt.pinned.put(run, set), nil
}

// ParseToolList reads a comma-separated list of tool names; "" is the
// empty (non-nil) list, meaning "no tools".
func ParseToolList(s string) []string {
	out := []string{}
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// impls returns the tool implementations a bundle's tool loop can call.
func (rt *Runtime) impls(b *Bundle) map[string]agent.Tool {
	docs := make([]agent.Document, len(b.Docs))
	for i, d := range b.Docs {
		docs[i] = agent.Document{ID: d.ID, Title: d.Title, Text: d.Text}
	}
	m := map[string]agent.Tool{
		agent.ToolKBSearch:    agent.NewKBSearch(docs),
		agent.ToolCurrentTime: agent.CurrentTime{},
	}
	if rt.Notes != nil {
		m[agent.ToolRecordNote] = agent.RecordNote{Notes: rt.Notes}
	}
	if rt.Followups != nil {
		m[agent.ToolScheduleFollowup] = agent.ScheduleFollowup{Followups: rt.Followups}
	}
	for k, v := range rt.Impls {
		m[k] = v
	}
	return m
}

// runtimeOf returns the bundle's runtime, or a default one: the scripted
// rules, with calls recorded in memory.
func (b *Bundle) runtimeOf() *Runtime {
	if b.runtime == nil {
		b.runtimeInit.Do(func() { b.defaultRT = &Runtime{} })
		b.defaultRT.init()
		return b.defaultRT
	}
	b.runtime.init()
	return b.runtime
}

// modelCommon is the configuration model and tool_loop nodes share.
type modelCommon struct {
	// Model is the model the node asks for when the appliance names none.
	Model string `json:"model,omitempty"`
	// Lane is the agent whose lane applies; default the graph's name.
	Lane string `json:"lane,omitempty"`
	// System names a prompt of the bundle used as the system prompt.
	System string `json:"system,omitempty"`
	// ScriptedRules is a bundle file of models/scripted rules, used when
	// the appliance has no model provider (demos, tests, offline eval).
	ScriptedRules string   `json:"scripted_rules,omitempty"`
	Temperature   *float64 `json:"temperature,omitempty"`
	Seed          *int     `json:"seed,omitempty"`
	NumCtx        int      `json:"num_ctx,omitempty"`
	// NumPredict caps each answer's tokens (0: no cap of the node's own);
	// the run's token budget caps it further (see agent.ModelCall).
	NumPredict int `json:"num_predict,omitempty"`
}

func (c *modelCommon) prepare(env *Env) (system string, script *scripted.Provider, err error) {
	if c.NumPredict < 0 {
		return "", nil, env.Errorf("num_predict must not be negative (0 is no cap)")
	}
	named := c.Lane != ""
	if !named {
		c.Lane = env.Graph
	}
	if env.gc != nil {
		env.gc.lanes = append(env.gc.lanes, laneUse{lane: c.Lane, named: named, env: env})
	}
	if c.System != "" {
		p, ok := env.Bundle.Prompts[c.System]
		if !ok {
			return "", nil, env.Errorf("system: unknown prompt %q", c.System)
		}
		system = p
	}
	if c.ScriptedRules != "" {
		data, ok := env.gc.files[c.ScriptedRules]
		if !ok || checkPath(c.ScriptedRules) != nil {
			return "", nil, env.Errorf("scripted_rules: %q is not a file of the bundle", c.ScriptedRules)
		}
		script, err = scripted.Load(data)
		if err != nil {
			return "", nil, env.Errorf("scripted_rules: %s: %v", c.ScriptedRules, err)
		}
	}
	return system, script, nil
}

func (c *modelCommon) options() models.Options {
	return models.Options{Temperature: c.Temperature, Seed: c.Seed, NumCtx: c.NumCtx, MaxOutputTokens: c.NumPredict}
}

// lane returns the lane of the node's agent, or nil (which refuses every
// model: fail closed).
func (c *modelCommon) lane(b *Bundle) *policy.Lane {
	if l, ok := b.Lanes[c.Lane]; ok {
		return &l
	}
	return nil
}

// model: one model call. It sends the system prompt, the retrieved
// documents (and a "Context:" line listing their ids and titles, which the
// scripted provider's {{context}} fills in), and the conversation, and
// writes the answer to out and the names of the tools it proposes to
// tool_calls. It does not run tools; tool_loop does.
type modelConfig struct {
	modelCommon
	// Messages is the conversation (a messages channel), of which the
	// last History messages (default 8) are sent.
	Messages string `json:"messages,omitempty"`
	History  int    `json:"history,omitempty"`
	// Input is sent as the user's message when there is no Messages.
	Input string `json:"input,omitempty"`
	// Context is a docs channel of retrieved documents.
	Context   string `json:"context,omitempty"`
	Out       string `json:"out"`
	ToolCalls string `json:"tool_calls,omitempty"`
	// Tokens, an int sum channel, receives the tokens the node's model
	// call used. The runtime's token budget counts every model call of the
	// run, whether or not its node declares this channel.
	Tokens string `json:"tokens,omitempty"`
	// FlagRisks raises, on the graph's flags channel, what makes the
	// answer high-risk, so that conditional edges can send it to review:
	// "uncited" (it cites nothing), "foreign_citation" (it cites an id
	// not in context) and "write_tool" (it proposes a write tool, or a
	// tool the registry does not know).
	FlagRisks bool `json:"flag_risks,omitempty"`
}

// FlagWriteTool is raised by a model node with flag_risks when its answer
// proposes a write tool.
const FlagWriteTool = "write_tool"

func buildModel(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c modelConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	system, script, err := c.prepare(env)
	if err != nil {
		return nil, err
	}
	if c.History <= 0 {
		c.History = 8
	}
	var msgs, input, ctxCh, tools, tokens Channel
	if c.Messages != "" {
		if msgs, err = env.need("messages", c.Messages, TypeMessages); err != nil {
			return nil, err
		}
	}
	if c.Input != "" {
		if input, err = env.need("input", c.Input); err != nil {
			return nil, err
		}
	}
	if msgs.Name == "" && input.Name == "" {
		return nil, env.Errorf("model: needs messages or input")
	}
	if c.Context != "" {
		if ctxCh, err = env.need("context", c.Context, TypeDocs); err != nil {
			return nil, err
		}
	}
	out, err := env.need("out", c.Out)
	if err != nil {
		return nil, err
	}
	if err := out.canHoldText(); err != nil {
		return nil, env.Errorf("out: %v", err)
	}
	if c.ToolCalls != "" {
		if tools, err = env.need("tool_calls", c.ToolCalls, TypeStrings); err != nil {
			return nil, err
		}
	}
	if c.Tokens != "" {
		if tokens, err = env.need("tokens", c.Tokens, TypeInt); err != nil {
			return nil, err
		}
		if tokens.Reducer != engine.KindSum {
			return nil, env.Errorf("tokens: channel %q must have reducer sum", c.Tokens)
		}
	}
	var flags Channel
	if c.FlagRisks {
		if env.Bundle.Rules == nil {
			return nil, env.Errorf("flag_risks: the bundle has no rules file")
		}
		if flags, err = env.need("flags", env.Flags, TypeStrings); err != nil {
			return nil, err
		}
		env.raise(FlagUncited, FlagForeignCitation, FlagWriteTool)
	}
	b := env.Bundle
	return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		rt := b.runtimeOf()
		p, model, err := rt.provider(script, c.Model)
		if err != nil {
			return nil, engine.MarkPermanent(err)
		}
		var conv []models.Message
		if system != "" {
			conv = append(conv, models.Message{Role: models.RoleSystem, Content: system})
		}
		if ctxCh.Name != "" {
			v, _ := s.Value(ctxCh.Name)
			if docs, _ := v.([]Doc); len(docs) > 0 {
				conv = append(conv, contextMessages(docs)...)
			}
		}
		if msgs.Name != "" {
			v, _ := s.Value(msgs.Name)
			h, _ := v.([]models.Message)
			conv = append(conv, h[max(0, len(h)-c.History):]...)
		} else {
			v, _ := s.Value(input.Name)
			conv = append(conv, models.Message{Role: models.RoleUser, Content: render(v)})
		}
		mc := &agent.ModelCall{Provider: p, Lane: c.lane(b), Log: rt.Log, Blobs: rt.Blobs, TokenLimit: rt.Budget.Tokens}
		resp, err := mc.Call(ctx, models.Request{Model: model, Messages: conv, Options: c.options()}, 0)
		if err != nil {
			return nil, err
		}
		w, err := out.textWrite(resp.Message.Content)
		if err != nil {
			return nil, err
		}
		ws := []engine.Write{w}
		names := []string{}
		for _, tc := range resp.Message.ToolCalls {
			names = append(names, tc.Name)
		}
		if tools.Name != "" {
			ws = append(ws, engine.Write{Channel: tools.Name, Value: names})
		}
		if flags.Name != "" {
			ws = append(ws, flagWrites(s, flags, b.risks(s, ctxCh, resp.Message.Content, names))...)
		}
		if tokens.Name != "" && mc.Spent() > 0 {
			ws = append(ws, engine.Write{Channel: tokens.Name, Value: mc.Spent()})
		}
		return ws, nil
	}, nil
}

// risks lists the flags that make an answer high-risk (see FlagRisks).
func (b *Bundle) risks(s engine.State, ctxCh Channel, answer string, tools []string) []string {
	var retrieved []string
	if ctxCh.Name != "" {
		v, _ := s.Value(ctxCh.Name)
		retrieved = docIDs(v)
	}
	var out []string
	_, uncited, foreign := b.Rules.Citations(answer, retrieved)
	if uncited {
		out = append(out, FlagUncited)
	}
	if len(foreign) > 0 {
		out = append(out, FlagForeignCitation)
	}
	for _, name := range tools {
		t, known := policy.Tool{}, false
		if b.Registry != nil {
			t, known = b.Registry.Lookup(name)
		}
		if !known || t.Kind != policy.KindRead {
			out = append(out, FlagWriteTool)
			break
		}
	}
	return out
}

// contextMessages renders retrieved documents for a model: their text, for
// a real model to read, then one "Context:" line of ids and titles, the
// ones the answer may cite.
func contextMessages(docs []Doc) []models.Message {
	var full, index strings.Builder
	full.WriteString("Documents (cite them by their [id]):\n")
	for i, d := range docs {
		fmt.Fprintf(&full, "\n[%s] %s\n%s\n", d.ID, d.Title, strings.TrimSpace(d.Text))
		if i > 0 {
			index.WriteString("; ")
		}
		index.WriteString("[" + d.ID + "]")
		if d.Title != "" {
			index.WriteString(" " + d.Title)
		}
	}
	return []models.Message{
		{Role: models.RoleSystem, Content: full.String()},
		{Role: models.RoleSystem, Content: scripted.ContextPrefix + " " + index.String()},
	}
}

// FlagToolFailed is raised by a tool_loop, in a graph with a flags channel,
// when a tool's call failed this turn: what the tool was asked to do (a
// follow-up scheduled, a note left) may not be done, whatever the answer.
const FlagToolFailed = "tool_failed"

// tool_loop: agent.ToolLoop over the bundle's registry and the run's pinned
// active tool set: model → tool calls → policy check → execute →
// neutralize → re-prompt, until the model answers without a tool call or
// the iteration budget runs out. Write tools ask an operator (an
// interrupt) unless the bundle's rules hold a standing approval.
type toolLoopConfig struct {
	modelCommon
	Messages string `json:"messages"`
	Answer   string `json:"answer,omitempty"`
	Tokens   string `json:"tokens,omitempty"`
	// MaxIterations narrows the runtime's tool-iteration budget (when the
	// runtime sets none, it replaces the default of 5).
	MaxIterations int `json:"max_iterations,omitempty"`
}

func buildToolLoop(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c toolLoopConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	system, script, err := c.prepare(env)
	if err != nil {
		return nil, err
	}
	msgs, err := env.need("messages", c.Messages, TypeMessages)
	if err != nil {
		return nil, err
	}
	if msgs.Reducer != engine.KindAppend {
		return nil, env.Errorf("messages: channel %q must have reducer append", c.Messages)
	}
	var answer engine.Chan[string]
	if c.Answer != "" {
		if _, err := env.need("answer", c.Answer, TypeString); err != nil {
			return nil, err
		}
		answer = env.handles[c.Answer].(engine.Chan[string])
	}
	var tokens engine.Chan[int]
	if c.Tokens != "" {
		tc, err := env.need("tokens", c.Tokens, TypeInt)
		if err != nil {
			return nil, err
		}
		if tc.Reducer != engine.KindSum {
			return nil, env.Errorf("tokens: channel %q must have reducer sum", c.Tokens)
		}
		tokens = env.handles[c.Tokens].(engine.Chan[int])
	}
	if c.MaxIterations < 0 {
		return nil, env.Errorf("max_iterations must not be negative")
	}
	if env.Bundle.Registry == nil {
		return nil, env.Errorf("tool_loop: the bundle has no tools file")
	}
	messages := env.handles[c.Messages].(engine.Chan[[]models.Message])
	file := env.File
	var failed func(engine.State) []engine.Write
	if flags, ok := env.Channel(env.Flags); ok {
		env.raise(FlagToolFailed)
		failed = func(s engine.State) []engine.Write { return flagWrites(s, flags, []string{FlagToolFailed}) }
	}
	b := env.Bundle
	var rules []policy.ApprovalRule
	if b.Rules != nil {
		rules = b.Rules.Approvals
	}
	type loopKey struct {
		rt    *Runtime
		p     models.Provider
		model string
	}
	var (
		mu    sync.Mutex
		built = map[loopKey]engine.NodeFunc{}
	)
	// The loop is built on first use for each runtime and provider, since
	// the provider and the call log are the appliance's, not the
	// bundle's, and the provider may change (Runtime.Models) between runs
	// of the node.
	loopFor := func(rt *Runtime) (engine.NodeFunc, error) {
		p, model, err := rt.provider(script, c.Model)
		if err != nil {
			return nil, err
		}
		key := loopKey{rt, p, model}
		mu.Lock()
		defer mu.Unlock()
		if fn := built[key]; fn != nil {
			return fn, nil
		}
		lane := policy.Lane{Agent: c.Lane}
		if l := c.lane(b); l != nil {
			lane = *l
		}
		budget := rt.Budget
		// A bundle narrows the appliance's limit; it never raises it.
		budget.ToolIterations = engine.Narrower(budget.ToolIterations, c.MaxIterations)
		fn, err := agent.ToolLoop(agent.LoopConfig{
			Provider: p, Model: model, Lane: lane, System: system, Options: c.options(),
			ActiveTools: func(ctx context.Context, _ engine.State) (*policy.ActiveSet, error) {
				info, _ := engine.InfoFrom(ctx)
				return rt.ActiveTools(ctx, b.Registry, func(agent string) []string {
					if _, ok := b.Graphs[agent]; ok {
						return b.Allowlist(agent)
					}
					return b.fileTools[file]
				}, info.Run)
			},
			Impls: rt.impls(b), Rules: rules, Budget: budget.WithDefaults(), Log: rt.Log, Blobs: rt.Blobs,
			Messages: messages, Answer: answer, Tokens: tokens, Failed: failed,
		})
		if err != nil {
			return nil, err
		}
		built[key] = fn
		return fn, nil
	}
	return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		fn, err := loopFor(b.runtimeOf())
		if err != nil {
			return nil, engine.MarkPermanent(err)
		}
		return fn(ctx, s)
	}, nil
}
