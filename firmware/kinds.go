package firmware

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// Built-in node kinds.
const (
	KindModel     = "model"
	KindToolLoop  = "tool_loop"
	KindGuardrail = "guardrail"
	KindRetrieve  = "retrieve"
	KindRouter    = "router"
	KindReview    = "review"
	KindTemplate  = "template"
	KindFanout    = "fanout"
	KindSubgraph  = "subgraph"
)

// KindBuilder builds a node of a registered kind from its config (the
// node's "config" object, verbatim; from a YAML graph file, as JSON).
// Decode it with env.Decode so that unknown fields are refused with a line
// and column, and report problems with env.Errorf.
type KindBuilder func(cfg json.RawMessage, env *Env) (engine.NodeFunc, error)

var (
	kindsMu sync.RWMutex
	kinds   = map[string]KindBuilder{}
)

var builtinKinds = map[string]KindBuilder{
	KindModel:     buildModel,
	KindToolLoop:  buildToolLoop,
	KindGuardrail: buildGuardrail,
	KindRetrieve:  buildRetrieve,
	KindRouter:    buildRouter,
	KindReview:    buildReview,
	KindTemplate:  buildTemplate,
	KindFanout:    buildFanout,
	KindSubgraph:  nil, // wired by the compiler
}

// RegisterKind makes a node kind of a Go program's own available to the
// graph files it loads. It panics if name is empty, built in, or already
// registered, as registration happens at init time.
func RegisterKind(name string, build KindBuilder) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, builtin := builtinKinds[name]; builtin || name == "" || build == nil {
		panic(fmt.Sprintf("firmware: RegisterKind(%q): %v", name, ErrDuplicateKind))
	}
	if _, dup := kinds[name]; dup {
		panic(fmt.Sprintf("firmware: RegisterKind(%q): %v", name, ErrDuplicateKind))
	}
	kinds[name] = build
}

// Kinds lists every node kind a graph file may use, sorted.
func Kinds() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	out := make([]string, 0, len(builtinKinds)+len(kinds))
	for k := range builtinKinds {
		out = append(out, k)
	}
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func buildNode(kind string, cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	build, ok := builtinKinds[kind]
	if !ok {
		kindsMu.RLock()
		build, ok = kinds[kind]
		kindsMu.RUnlock()
	}
	if !ok || build == nil {
		return nil, env.wrap(fmt.Errorf("%w %q (known: %s)", ErrUnknownNodeKind, kind, strings.Join(Kinds(), ", ")))
	}
	fn, err := build(cfg, env)
	if err != nil {
		if _, ok := err.(*FileError); ok {
			return nil, err
		}
		return nil, env.wrap(err)
	}
	return fn, nil
}

// Env is what a node kind's builder may use: the bundle being loaded (its
// rules, registry, documents, prompts and the Runtime it was loaded with),
// the graph's channels, and where the node is declared, for errors.
type Env struct {
	Bundle *Bundle
	File   string // the graph file
	Graph  string // the graph's name
	Node   string // the node's name
	Flags  string // the graph's flags channel

	channels map[string]Channel
	handles  map[string]any // typed engine.Chan handles by channel name
	data     []byte         // the graph file's bytes
	cfgOff   int            // where the node's config starts in data, or -1
	nodeOff  int
	gc       *graphCompiler
	raised   *raised // what the graph's nodes can raise
}

// raise records that the node can add flags to the graph's flags channel.
func (e *Env) raise(flags ...string) {
	if e.raised != nil {
		e.raised.add(e.Flags, flags...)
	}
}

// Channel returns a channel the graph declares.
func (e *Env) Channel(name string) (Channel, bool) {
	c, ok := e.channels[name]
	return c, ok
}

// Decode decodes the node's config strictly into v. An absent config
// decodes as {}.
func (e *Env) Decode(cfg json.RawMessage, v any) error {
	if len(cfg) == 0 {
		cfg = json.RawMessage(`{}`)
	}
	off := e.cfgOff
	whole := e.data
	if off < 0 || off+len(cfg) > len(whole) || string(whole[off:off+len(cfg)]) != string(cfg) {
		whole, off = cfg, 0
	}
	if _, err := decodeStrictAt(e.File, whole, off, cfg, v); err != nil {
		if fe, ok := err.(*FileError); ok {
			fe.Node = e.Node
		}
		return err
	}
	return nil
}

// Errorf returns an error wrapping ErrMalformed, located at the node.
func (e *Env) Errorf(format string, args ...any) error {
	return malformed(e.File, e.data, e.nodeOff, e.Node, format, args...)
}

func (e *Env) wrap(err error) error {
	fe := &FileError{File: e.File, Node: e.Node, Err: err}
	if e.nodeOff >= 0 && e.data != nil {
		fe.Line, fe.Column = lineCol(e.data, e.nodeOff)
	}
	return fe
}

// need returns a declared channel, or an error naming the field that
// refers to it. Types, when given, are the ones the channel may have.
func (e *Env) need(field, name string, types ...string) (Channel, error) {
	c, ok := e.channels[name]
	if !ok {
		return c, e.Errorf("%s: undeclared channel %q", field, name)
	}
	if len(types) > 0 && !contains(types, c.Type) {
		return c, e.Errorf("%s: channel %q is %s, want %s", field, name, c.Type, strings.Join(types, " or "))
	}
	return c, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// flagWrites returns the write that adds flags to the flags channel, or
// nothing when they are all set already.
func flagWrites(s engine.State, c Channel, add []string) []engine.Write {
	v, _ := s.Value(c.Name)
	have, _ := v.([]string)
	var fresh []string
	for _, f := range add {
		if !contains(have, f) && !contains(fresh, f) {
			fresh = append(fresh, f)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if c.Reducer == engine.KindReplace {
		return []engine.Write{{Channel: c.Name, Value: append(append([]string{}, have...), fresh...)}}
	}
	return []engine.Write{{Channel: c.Name, Value: fresh}}
}

// router: a node that changes nothing; the conditional edges leaving it
// pick what runs next.
func buildRouter(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c struct{}
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	return func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil }, nil
}

// fanout: passes through; the fan-out edge the compiler adds after it
// sends one task per item of over to the node to, then runs join.
func buildFanout(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c fanoutConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	return func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil }, nil
}

// template: fills {{name}} placeholders from channels (and {{item}} from a
// fan-out task's input) and writes the text to out.
type templateConfig struct {
	Template string `json:"template,omitempty"`
	Prompt   string `json:"prompt,omitempty"` // a prompt of the bundle, instead of template
	Out      string `json:"out"`
}

var placeholderRE = regexp.MustCompile(`\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}`)

func buildTemplate(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c templateConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	text := c.Template
	switch {
	case c.Prompt != "" && c.Template != "":
		return nil, env.Errorf("template: give template or prompt, not both")
	case c.Prompt != "":
		p, ok := env.Bundle.Prompts[c.Prompt]
		if !ok {
			return nil, env.Errorf("template: unknown prompt %q", c.Prompt)
		}
		text = p
	case c.Template == "":
		return nil, env.Errorf("template: needs template or prompt")
	}
	out, err := env.need("out", c.Out)
	if err != nil {
		return nil, err
	}
	if err := out.canHoldText(); err != nil {
		return nil, env.Errorf("out: %v", err)
	}
	return compileTemplate(env, text, out)
}

func compileTemplate(env *Env, text string, out Channel) (engine.NodeFunc, error) {
	for _, m := range placeholderRE.FindAllStringSubmatch(text, -1) {
		if name := m[1]; name != "item" {
			if _, ok := env.channels[name]; !ok {
				return nil, env.Errorf("template: {{%s}} names no channel", name)
			}
		}
	}
	return func(_ context.Context, s engine.State) ([]engine.Write, error) {
		filled := fill(text, s)
		w, err := out.textWrite(filled)
		if err != nil {
			return nil, err
		}
		return []engine.Write{w}, nil
	}, nil
}

func fill(text string, s engine.State) string {
	return placeholderRE.ReplaceAllStringFunc(text, func(m string) string {
		name := placeholderRE.FindStringSubmatch(m)[1]
		if name == "item" {
			return render(s.Input())
		}
		v, _ := s.Value(name)
		return render(v)
	})
}

// guardrail: the bundle's rules. Mode pre screens the input: red flags and
// out-of-scope inputs raise flags and write the fixed answer to out. Mode
// post checks the draft's citations against the retrieved documents and
// raises "uncited" or "foreign_citation".
type guardrailConfig struct {
	Mode    string `json:"mode"`
	Input   string `json:"input,omitempty"`   // pre: the text to screen
	Out     string `json:"out,omitempty"`     // pre: where the short-circuit answer goes
	Draft   string `json:"draft,omitempty"`   // post: the draft to check
	Context string `json:"context,omitempty"` // post: the docs retrieved for it
	Cited   string `json:"cited,omitempty"`   // post: optional strings channel for the cited ids
}

// Flags the post guardrail raises.
const (
	FlagUncited         = "uncited"
	FlagForeignCitation = "foreign_citation"
)

func buildGuardrail(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c guardrailConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	rules := env.Bundle.Rules
	if rules == nil {
		return nil, env.Errorf("guardrail: the bundle has no rules file")
	}
	flags, err := env.need("flags", env.Flags, TypeStrings)
	if err != nil {
		return nil, err
	}
	switch c.Mode {
	case "pre":
		in, err := env.need("input", c.Input)
		if err != nil {
			return nil, err
		}
		out, err := env.need("out", c.Out)
		if err != nil {
			return nil, err
		}
		if err := out.canHoldText(); err != nil {
			return nil, env.Errorf("out: %v", err)
		}
		env.raise(rules.PreFlags()...)
		return func(_ context.Context, s engine.State) ([]engine.Write, error) {
			v, _ := s.Value(in.Name)
			raised, short := rules.Pre(render(v))
			ws := flagWrites(s, flags, raised)
			if short != "" {
				w, err := out.textWrite(short)
				if err != nil {
					return nil, err
				}
				ws = append(ws, w)
			}
			return ws, nil
		}, nil
	case "post":
		draft, err := env.need("draft", c.Draft)
		if err != nil {
			return nil, err
		}
		var ctxCh, citedCh Channel
		if c.Context != "" {
			if ctxCh, err = env.need("context", c.Context, TypeDocs); err != nil {
				return nil, err
			}
		}
		if c.Cited != "" {
			if citedCh, err = env.need("cited", c.Cited, TypeStrings); err != nil {
				return nil, err
			}
		}
		env.raise(FlagUncited, FlagForeignCitation)
		return func(_ context.Context, s engine.State) ([]engine.Write, error) {
			v, _ := s.Value(draft.Name)
			var retrieved []string
			if ctxCh.Name != "" {
				d, _ := s.Value(ctxCh.Name)
				retrieved = docIDs(d)
			}
			cited, uncited, foreign := rules.Citations(render(v), retrieved)
			var raised []string
			if uncited {
				raised = append(raised, FlagUncited)
			}
			if len(foreign) > 0 {
				raised = append(raised, FlagForeignCitation)
			}
			ws := flagWrites(s, flags, raised)
			if citedCh.Name != "" {
				ws = append(ws, engine.Write{Channel: citedCh.Name, Value: cited})
			}
			return ws, nil
		}, nil
	}
	return nil, env.Errorf("guardrail: mode must be pre or post, got %q", c.Mode)
}

// retrieve: BM25 over the bundle's knowledge base; the k best documents
// go to out. Skipped (no writes) when one of skip_if_flags is set.
type retrieveConfig struct {
	Query       string   `json:"query"`
	Out         string   `json:"out"`
	K           int      `json:"k,omitempty"`
	SkipIfFlags []string `json:"skip_if_flags,omitempty"`
}

func buildRetrieve(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c retrieveConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	q, err := env.need("query", c.Query)
	if err != nil {
		return nil, err
	}
	out, err := env.need("out", c.Out, TypeDocs)
	if err != nil {
		return nil, err
	}
	if len(c.SkipIfFlags) > 0 {
		if _, err := env.need("flags", env.Flags, TypeStrings); err != nil {
			return nil, err
		}
	}
	if c.K <= 0 {
		c.K = 3
	}
	index := env.Bundle.index()
	flags := env.Flags
	return func(_ context.Context, s engine.State) ([]engine.Write, error) {
		for _, f := range c.SkipIfFlags {
			if hasFlag(s, flags, f) {
				return nil, nil
			}
		}
		v, _ := s.Value(q.Name)
		docs := index.search(render(v), c.K)
		if out.Reducer == engine.KindReplace && docs == nil {
			docs = []Doc{}
		}
		return []engine.Write{{Channel: out.Name, Value: docs}}, nil
	}, nil
}

// review: pauses for a person when the draft is high-risk (per the rules'
// HighRisk: it cites nothing, or cites what was not retrieved) or proposes
// a write tool. Approve keeps the draft, edit replaces it with the
// decision's value (a JSON string), reject replaces it with reject_text.
// It runs no tool, and its question says so for a proposed write tool;
// a tool loop is what runs one, after its own approval.
type reviewConfig struct {
	Draft      string `json:"draft"`
	Context    string `json:"context,omitempty"`
	ToolCalls  string `json:"tool_calls,omitempty"` // strings (tool names) or messages (their tool calls)
	RejectText string `json:"reject_text,omitempty"`
	Always     bool   `json:"always,omitempty"` // review every draft
}

// Flags the review node raises with a person's decision.
const (
	FlagReviewApproved = "review_approved"
	FlagReviewEdited   = "review_edited"
	FlagReviewRejected = "review_rejected"
)

// ReviewRequest is the payload of a review interrupt.
type ReviewRequest struct {
	Draft   string   `json:"draft"`
	Reasons []string `json:"reasons"`
	Cited   []string `json:"cited,omitempty"`
	Tools   []string `json:"write_tools,omitempty"`
}

// reviewEdit is the text an edit decision on a review gives: its value is
// a JSON string or {"text": ...}. A value it cannot use is refused with
// the field at fault ("value", "value.text") and why, since the person who
// sent it sees only this message.
func reviewEdit(v json.RawMessage) (string, error) {
	const want = `an edit's value is the answer to send, as a JSON string or as {"text": "..."}`
	var edited string
	field := "value"
	if kind := jsonKind(v); kind == "a string" {
		if err := json.Unmarshal(v, &edited); err != nil {
			return "", fmt.Errorf("%q is not valid JSON: %v", field, err)
		}
	} else if kind != "an object" {
		return "", fmt.Errorf("%q is %s: %s", field, kind, want)
	} else {
		var obj struct {
			Text json.RawMessage `json:"text"`
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || json.Unmarshal(v, &fields) != nil {
			return "", fmt.Errorf("%q is not valid JSON: %s", field, want)
		}
		field = "value.text"
		switch kind := jsonKind(obj.Text); {
		case obj.Text == nil && len(fields) == 0:
			return "", fmt.Errorf(`"value" is an empty object: %s`, want)
		case obj.Text == nil:
			names := make([]string, 0, len(fields))
			for k := range fields {
				names = append(names, strconv.Quote(k))
			}
			sort.Strings(names)
			return "", fmt.Errorf(`"value" has no "text" field (its fields: %s): %s`, strings.Join(names, ", "), want)
		case kind != "a string":
			return "", fmt.Errorf("%q is %s, not a string: %s", field, kind, want)
		}
		if err := json.Unmarshal(obj.Text, &edited); err != nil {
			return "", fmt.Errorf("%q is not valid JSON: %v", field, err)
		}
	}
	// An edit is the answer the person sends: an empty one would reach
	// the patient as no answer at all.
	if strings.TrimSpace(edited) == "" {
		return "", fmt.Errorf("%q is empty: write the answer, or approve or reject the draft", field)
	}
	return edited, nil
}

// jsonKind names the kind of JSON value v holds, as a message says it: "a
// string", "an object", "a number", and so on.
func jsonKind(v json.RawMessage) string {
	t := strings.TrimSpace(string(v))
	if t == "" {
		return "empty"
	}
	switch t[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// checkReview is a review node's check of a decision (engine.CheckDecision):
// an edit it could not use is refused before the review is spent.
func checkReview(d engine.Decision) error {
	if d.Kind != engine.Edit {
		return nil
	}
	_, err := reviewEdit(d.Value)
	return err
}

func buildReview(cfg json.RawMessage, env *Env) (engine.NodeFunc, error) {
	var c reviewConfig
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	draft, err := env.need("draft", c.Draft, TypeString)
	if err != nil {
		return nil, err
	}
	var ctxCh, toolsCh Channel
	if c.Context != "" {
		if ctxCh, err = env.need("context", c.Context, TypeDocs); err != nil {
			return nil, err
		}
	}
	if c.ToolCalls != "" {
		if toolsCh, err = env.need("tool_calls", c.ToolCalls, TypeStrings, TypeMessages); err != nil {
			return nil, err
		}
	}
	rules, registry := env.Bundle.Rules, env.Bundle.Registry
	if rules == nil && !c.Always {
		return nil, env.Errorf("review: the bundle has no rules file to judge risk by (or set always)")
	}
	flags, hasFlags := env.channels[env.Flags]
	if c.RejectText == "" {
		c.RejectText = "A reviewer withheld this answer. Please contact the clinic directly."
	}
	if hasFlags && flags.Type == TypeStrings {
		env.raise(FlagReviewApproved, FlagReviewEdited, FlagReviewRejected)
	}
	return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		v, _ := s.Value(draft.Name)
		text, _ := v.(string)
		req := ReviewRequest{Draft: text, Reasons: []string{}}
		if c.Always {
			req.Reasons = append(req.Reasons, "always")
		}
		if rules != nil {
			var retrieved []string
			if ctxCh.Name != "" {
				d, _ := s.Value(ctxCh.Name)
				retrieved = docIDs(d)
			}
			cited, uncited, foreign := rules.Citations(text, retrieved)
			req.Cited = cited
			if uncited {
				req.Reasons = append(req.Reasons, "cites nothing")
			}
			for _, id := range foreign {
				req.Reasons = append(req.Reasons, "cites "+id+", which was not retrieved")
			}
		}
		if toolsCh.Name != "" {
			tv, _ := s.Value(toolsCh.Name)
			for _, name := range proposedTools(tv) {
				t, known := policy.Tool{}, false
				if registry != nil {
					t, known = registry.Lookup(name)
				}
				if !known || t.Kind == policy.KindWrite {
					// An unknown tool is judged as a write: fail closed.
					// The review runs no tool: say so, so that an approval
					// is not taken for the call being made.
					req.Tools = append(req.Tools, name)
					req.Reasons = append(req.Reasons, "proposes write tool "+name+", which this review does not run: approving sends the draft alone")
				}
			}
		}
		if len(req.Reasons) == 0 {
			return nil, nil
		}
		d, err := engine.Interrupt(ctx, req)
		if err != nil {
			return nil, err
		}
		var ws []engine.Write
		var flag string
		switch d.Kind {
		case engine.Approve:
			flag = FlagReviewApproved
		case engine.Edit:
			edited, err := reviewEdit(d.Value)
			if err != nil {
				return nil, fmt.Errorf("review: %w", err)
			}
			ws = append(ws, engine.Write{Channel: draft.Name, Value: edited})
			flag = FlagReviewEdited
		case engine.Reject:
			ws = append(ws, engine.Write{Channel: draft.Name, Value: c.RejectText})
			flag = FlagReviewRejected
		default:
			return nil, fmt.Errorf("review: %w (got %q)", engine.ErrBadDecision, d.Kind)
		}
		if hasFlags && flags.Type == TypeStrings {
			ws = append(ws, flagWrites(s, flags, []string{flag})...)
		}
		return ws, nil
	}, nil
}

// proposedTools lists tool names from a strings channel, or the tool calls
// of the last message of a messages channel.
func proposedTools(v any) []string {
	switch x := v.(type) {
	case []string:
		return x
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	if msgs, ok := v.([]models.Message); ok && len(msgs) > 0 {
		var out []string
		for _, tc := range msgs[len(msgs)-1].ToolCalls {
			out = append(out, tc.Name)
		}
		return out
	}
	return nil
}
