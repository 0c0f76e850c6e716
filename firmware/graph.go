package firmware

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/strictjson"
)

// Names of the graph's entry and exit in edge lists.
const (
	StartNode = "START"
	EndNode   = "END"
)

// DefaultFlagsChannel is the channel conditions and guardrails read flags
// from when a graph does not name one.
const DefaultFlagsChannel = "flags"

// GraphSpec is a declarative graph, as a bundle's graph file holds it.
type GraphSpec struct {
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Channels    []Channel `json:"channels"`
	// Input is the channel a run's JSON input is written to; Output the
	// channel whose value becomes the run's output.
	Input  string `json:"input,omitempty"`
	Output string `json:"output,omitempty"`
	// Flags is the strings channel that conditions and guardrails use;
	// "flags" by default.
	Flags string `json:"flags,omitempty"`
	// Reset names replace channels emptied at the start of every run, so
	// that per-turn state (flags, retrieved documents, the draft) does not
	// carry over from the thread's previous turn.
	Reset []string `json:"reset,omitempty"`
	// History, when set, is a messages channel that receives each run's
	// input as a user message (the conversation across turns).
	History   string `json:"history,omitempty"`
	StepLimit int    `json:"step_limit,omitempty"`
	// MaxTokens and MaxRunTime (a Go duration) are the agent's token and
	// wall-time budgets per run. They narrow the appliance's (the
	// runtime's Budget); they never widen them. They bound all of a run,
	// its subgraphs included, and are read from an agent's own file only.
	MaxTokens  int    `json:"max_tokens,omitempty"`
	MaxRunTime string `json:"max_run_time,omitempty"`
	// Tools is the agent's allowlist: the tools of the bundle's registry
	// its runs may call (policy.LayerAgent), which the appliance and the
	// request narrow further. Nil (the field left out) allows the whole
	// registry, as before agents named their tools; an empty list allows
	// none. Each name must be a tool of the registry, named once. It is
	// read from an agent's own file only: it bounds the tool loops of the
	// agent's subgraphs too, and a file used only as a subgraph may not
	// have one.
	Tools *[]string  `json:"tools,omitempty"`
	Nodes []NodeSpec `json:"nodes"`
	Edges []EdgeSpec `json:"edges"`
	// maxRunTime is MaxRunTime parsed.
	maxRunTime time.Duration
	// raised is what the graph's nodes can write to its channels as
	// flags, set when it is compiled.
	raised *raised
	// checkTools checks Tools for the agent whose file this is, or, with
	// "", refuses them in a file run only as a subgraph (see load).
	checkTools func(agent string) error
}

// Allowlist returns the agent's allowlist: nil when its file names no
// tools (it may use the whole registry), the names otherwise (empty: none).
func (g *GraphSpec) Allowlist() []string {
	if g == nil || g.Tools == nil {
		return nil
	}
	return append([]string{}, (*g.Tools)...)
}

// NodeSpec is one node of a graph file: its name, its kind and the kind's
// own configuration.
type NodeSpec struct {
	Name    string          `json:"name"`
	Kind    string          `json:"kind"`
	Config  json.RawMessage `json:"config,omitempty"`
	Timeout string          `json:"timeout,omitempty"` // a Go duration bounding one attempt
	Retries int             `json:"retries,omitempty"` // extra attempts on transient errors
}

// EdgeSpec is a static edge, or, with When, one case of a conditional edge.
// The cases leaving a node are tried in file order; the first that holds
// picks the next node, and the last case must be {"default": true}.
type EdgeSpec struct {
	From string     `json:"from"`
	To   string     `json:"to"`
	When *Condition `json:"when,omitempty"`
}

// Condition is one test from the fixed vocabulary of conditional edges.
// Exactly one field is set. There is deliberately no expression language:
// every branch of a bundle's graph can be read off its file.
type Condition struct {
	FlagSet         string   `json:"flag_set,omitempty"`
	FlagNotSet      string   `json:"flag_not_set,omitempty"`
	ChannelEmpty    string   `json:"channel_empty,omitempty"`
	ChannelNotEmpty string   `json:"channel_not_empty,omitempty"`
	CounterAtLeast  *Counter `json:"counter_at_least,omitempty"`
	Default         bool     `json:"default,omitempty"`
}

// Counter is the argument of counter_at_least: an int or float channel and
// the value it must reach.
type Counter struct {
	Channel string  `json:"channel"`
	N       float64 `json:"n"`
}

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// graphCompiler compiles the graph files of one bundle. Subgraph files are
// compiled once each and shared.
type graphCompiler struct {
	bundle   *Bundle
	files    contents
	compiled map[string]*compiledGraph
	stack    []string  // files being compiled, for cycle detection
	lanes    []laneUse // the lanes model nodes take, in the order compiled
	// subgraphs lists the graph files each file runs as subgraphs, and
	// toolLoops its tool_loop nodes: what an agent's file reaches tells
	// which tool loops its allowlist bounds.
	subgraphs map[string][]string
	toolLoops map[string][]string
}

// newGraphCompiler returns a compiler for the graph files of b.
func newGraphCompiler(b *Bundle, files contents) *graphCompiler {
	return &graphCompiler{bundle: b, files: files, compiled: map[string]*compiledGraph{},
		subgraphs: map[string][]string{}, toolLoops: map[string][]string{}}
}

// reach returns the files an agent whose graph file is root runs, root
// first, each once.
func (gc *graphCompiler) reach(root string) []string {
	seen := map[string]bool{root: true}
	out := []string{root}
	for i := 0; i < len(out); i++ {
		for _, sub := range gc.subgraphs[out[i]] {
			if !seen[sub] {
				seen[sub] = true
				out = append(out, sub)
			}
		}
	}
	return out
}

// laneUse is a model node's lane, with the node's Env for where it is.
type laneUse struct {
	lane  string
	named bool // by the node's "lane", not by default
	env   *Env
}

type compiledGraph struct {
	spec     *GraphSpec
	graph    *engine.Graph
	channels map[string]Channel
	handles  map[string]any // typed engine.Chan handles by channel name
}

// compile compiles the graph file at path.
func (gc *graphCompiler) compile(path string) (*compiledGraph, error) {
	if cg := gc.compiled[path]; cg != nil {
		return cg, nil
	}
	if slices.Contains(gc.stack, path) {
		return nil, &FileError{File: path, Err: fmt.Errorf("%w: subgraph cycle: %v", ErrMalformed, append(gc.stack, path))}
	}
	data, ok := gc.files[path]
	if !ok {
		return nil, fmt.Errorf("%w: graph file %s", ErrMissingFile, path)
	}
	gc.stack = append(gc.stack, path)
	defer func() { gc.stack = gc.stack[:len(gc.stack)-1] }()
	var cg *compiledGraph
	var err error
	if isYAML(path) {
		// YAML is converted to JSON and compiled as such; positions are
		// mapped back to the YAML.
		js, m, yerr := yamlToJSON(path, data)
		if yerr != nil {
			return nil, yerr
		}
		if cg, err = gc.build(path, js); err != nil {
			return nil, m.relocate(path, err)
		}
		check := cg.spec.checkTools
		cg.spec.checkTools = func(agent string) error { return m.relocate(path, check(agent)) }
	} else if cg, err = gc.build(path, data); err != nil {
		return nil, err
	}
	gc.compiled[path] = cg
	return cg, nil
}

func (gc *graphCompiler) build(file string, data []byte) (*compiledGraph, error) {
	var spec GraphSpec
	pos, err := decodeStrict(file, data, &spec)
	if err != nil {
		return nil, err
	}
	fail := func(path, node, format string, args ...any) error {
		return malformed(file, data, pos.At(path), node, format, args...)
	}
	if !nodeNameRE.MatchString(spec.Name) {
		return nil, fail("", "", "name: %q is not a graph name", spec.Name)
	}
	if spec.Flags == "" {
		spec.Flags = DefaultFlagsChannel
	}
	b := engine.NewGraph(spec.Name)
	channels := map[string]Channel{}
	handles := map[string]any{}
	for i, c := range spec.Channels {
		at := fmt.Sprintf("channels.%d", i)
		if !nodeNameRE.MatchString(c.Name) {
			return nil, fail(at, "", "channel name %q is not allowed", c.Name)
		}
		if _, dup := channels[c.Name]; dup {
			return nil, fail(at, "", "channel %q declared twice", c.Name)
		}
		h, err := declare(b, c)
		if err != nil {
			return nil, fail(at, "", "%v", err)
		}
		channels[c.Name] = c
		handles[c.Name] = h
	}
	if fc, ok := channels[spec.Flags]; ok && fc.Type != TypeStrings {
		return nil, fail("", "", "flags channel %q must have type strings, not %s", spec.Flags, fc.Type)
	}
	for _, io := range []struct{ field, ch string }{{"input", spec.Input}, {"output", spec.Output}} {
		if io.ch != "" {
			if _, ok := channels[io.ch]; !ok {
				return nil, fail(io.field, "", "%s: undeclared channel %q", io.field, io.ch)
			}
		}
	}

	for i, name := range spec.Reset {
		c, ok := channels[name]
		if !ok {
			return nil, fail(fmt.Sprintf("reset.%d", i), "", "reset: undeclared channel %q", name)
		}
		if _, err := c.zeroWrite(); err != nil {
			return nil, fail(fmt.Sprintf("reset.%d", i), "", "reset: %v", err)
		}
	}
	if spec.History != "" {
		if c, ok := channels[spec.History]; !ok || c.Type != TypeMessages {
			return nil, fail("history", "", "history: %q is not a declared messages channel", spec.History)
		}
	}
	if spec.MaxTokens < 0 {
		return nil, fail("max_tokens", "", "max_tokens must not be negative")
	}
	if spec.MaxRunTime != "" {
		d, err := time.ParseDuration(spec.MaxRunTime)
		if err != nil || d <= 0 {
			return nil, fail("max_run_time", "", "max_run_time %q is not a positive duration", spec.MaxRunTime)
		}
		spec.maxRunTime = d
	}
	if off, null := nullMember(data, "tools"); null {
		return nil, malformed(file, data, off, "", `tools: null: leave the field out for the whole registry, or write [] for no tools`)
	}
	spec.checkTools = func(agent string) error { return gc.checkAllowlist(file, data, pos, &spec, agent) }

	// What the nodes can raise, and where other writes make it unknown.
	raised := &raised{}
	for _, ch := range []struct{ name, why string }{
		{spec.Input, "the run's input is written to it"}, {spec.History, "the run's input is written to it"},
	} {
		if ch.name != "" {
			raised.opaque(ch.name, fmt.Sprintf("channel %q of graph %q: %s", ch.name, spec.Name, ch.why))
		}
	}

	// Nodes.
	names := map[string]NodeSpec{}
	fanouts := map[string]*fanoutConfig{}
	for i, n := range spec.Nodes {
		at := fmt.Sprintf("nodes.%d", i)
		switch {
		case !nodeNameRE.MatchString(n.Name) || n.Name == StartNode || n.Name == EndNode:
			return nil, fail(at, n.Name, "node name %q is not allowed", n.Name)
		case names[n.Name].Name != "":
			return nil, fail(at, n.Name, "node declared twice")
		}
		names[n.Name] = n
		env := &Env{Bundle: gc.bundle, File: file, Graph: spec.Name, Node: n.Name, Flags: spec.Flags,
			channels: channels, handles: handles, data: data, cfgOff: pos.At(at + ".config"), nodeOff: pos.At(at), gc: gc,
			raised: raised}
		for _, ch := range namedChannels(n.Config, channels) {
			raised.opaque(ch, fmt.Sprintf("node %q of graph %q names channel %q in its config", n.Name, spec.Name, ch))
		}
		if _, builtin := builtinKinds[n.Kind]; !builtin {
			raised.opaque(anyChannel, fmt.Sprintf("node %q of graph %q is of kind %q, which may write anything", n.Name, spec.Name, n.Kind))
		}
		var opts []engine.NodeOption
		if n.Timeout != "" {
			d, err := time.ParseDuration(n.Timeout)
			if err != nil || d <= 0 {
				return nil, fail(at+".timeout", n.Name, "timeout %q is not a positive duration", n.Timeout)
			}
			opts = append(opts, engine.WithTimeout(d))
		}
		if n.Retries < 0 || n.Retries > 10 {
			return nil, fail(at, n.Name, "retries must be between 0 and 10")
		} else if n.Retries > 0 {
			opts = append(opts, engine.WithRetry(engine.RetryPolicy{MaxAttempts: n.Retries + 1}))
		}
		switch n.Kind {
		case KindSubgraph:
			var cfg struct {
				Graph string `json:"graph"`
			}
			if err := env.Decode(n.Config, &cfg); err != nil {
				return nil, err
			}
			if _, ok := gc.files[cfg.Graph]; !ok || checkPath(cfg.Graph) != nil {
				return nil, env.Errorf("subgraph file %q is not in the bundle's files", cfg.Graph)
			}
			sub, err := gc.compile(cfg.Graph)
			if err != nil {
				return nil, err
			}
			raised.include(n.Name, sub.spec.raised, channels)
			gc.subgraphs[file] = append(gc.subgraphs[file], cfg.Graph)
			b.AddSubgraph(n.Name, sub.graph, opts...)
			continue
		case KindFanout:
			var cfg fanoutConfig
			if err := env.Decode(n.Config, &cfg); err != nil {
				return nil, err
			}
			c, ok := channels[cfg.Over]
			if !ok || !c.isList() {
				return nil, env.Errorf("fanout: over: %q is not a declared list channel", cfg.Over)
			}
			if cfg.To == "" || cfg.Join == "" {
				return nil, env.Errorf("fanout: needs to (the node run per item) and join")
			}
			fanouts[n.Name] = &cfg
		}
		fn, err := buildNode(n.Kind, n.Config, env)
		if err != nil {
			return nil, err
		}
		if n.Kind == KindReview {
			opts = append(opts, engine.CheckDecision(checkReview))
		}
		if n.Kind == KindToolLoop {
			gc.toolLoops[file] = append(gc.toolLoops[file], n.Name)
		}
		if n.Kind == KindToolLoop && env.Bundle.Registry != nil {
			check, err := agent.CheckToolDecision(env.Bundle.Registry)
			if err != nil {
				return nil, env.Errorf("tool_loop: %v", err)
			}
			opts = append(opts, engine.CheckDecisionOn(check))
		}
		b.AddNode(n.Name, fn, opts...)
	}
	nodeKnown := func(n string) bool { return names[n].Name != "" }
	endpoint := func(n string) string {
		switch n {
		case StartNode:
			return engine.Start
		case EndNode:
			return engine.End
		}
		return n
	}

	// Fan-outs: one task per item of the list, each followed by the join.
	for name, cfg := range fanouts {
		at := "nodes"
		for i, n := range spec.Nodes {
			if n.Name == name {
				at = fmt.Sprintf("nodes.%d", i)
			}
		}
		for _, t := range []string{cfg.To, cfg.Join} {
			if !nodeKnown(t) {
				return nil, fail(at, name, "fanout: unknown node %q", t)
			}
		}
		over, to, join := cfg.Over, cfg.To, cfg.Join
		b.AddFanout(name, func(s engine.State) []engine.Send {
			v, _ := s.Value(over)
			list := items(v)
			if len(list) == 0 {
				return []engine.Send{{Node: join}}
			}
			sends := make([]engine.Send, len(list))
			for i, it := range list {
				sends[i] = engine.Send{Node: to, Input: it}
			}
			return sends
		}, to, join)
		b.AddEdge(to, join)
	}

	// Edges: static ones as they are, conditional ones grouped by source.
	type cases struct {
		conds   []Condition
		targets []string
		at      string
	}
	conditional := map[string]*cases{}
	var condOrder []string
	static := map[string]bool{}
	for i, e := range spec.Edges {
		at := fmt.Sprintf("edges.%d", i)
		if e.From == EndNode || (e.From != StartNode && !nodeKnown(e.From)) {
			return nil, fail(at, "", "edge from unknown node %q", e.From)
		}
		if e.To == StartNode || (e.To != EndNode && !nodeKnown(e.To)) {
			return nil, fail(at, "", "edge from %q to unknown node %q", e.From, e.To)
		}
		if fanouts[e.From] != nil {
			return nil, fail(at, e.From, "a fanout node's edges come from its config (to, join); remove this edge")
		}
		if e.When == nil {
			if conditional[e.From] != nil {
				return nil, fail(at, e.From, "node has both static and conditional edges")
			}
			static[e.From] = true
			b.AddEdge(endpoint(e.From), endpoint(e.To))
			continue
		}
		if static[e.From] {
			return nil, fail(at, e.From, "node has both static and conditional edges")
		}
		if err := checkCondition(*e.When, channels, spec.Flags); err != nil {
			return nil, fail(at+".when", e.From, "when: %v", err)
		}
		c := conditional[e.From]
		if c == nil {
			c = &cases{}
			conditional[e.From] = c
			condOrder = append(condOrder, e.From)
		}
		if n := len(c.conds); n > 0 && c.conds[n-1].Default {
			return nil, fail(at, e.From, "case after the default case is never taken")
		}
		c.conds = append(c.conds, *e.When)
		c.targets = append(c.targets, endpoint(e.To))
		c.at = at
	}
	for _, from := range condOrder {
		c := conditional[from]
		if !c.conds[len(c.conds)-1].Default {
			return nil, fail(c.at, from, "conditional edges from %q end without a {\"default\": true} case", from)
		}
		conds, targets, flags := c.conds, c.targets, spec.Flags
		var declared []string
		for _, t := range targets {
			if !slices.Contains(declared, t) {
				declared = append(declared, t)
			}
		}
		b.AddConditionalEdge(endpoint(from), func(s engine.State) []string {
			for i, cond := range conds {
				if cond.holds(s, flags) {
					return []string{targets[i]}
				}
			}
			return []string{engine.End} // unreachable: the last case is the default
		}, append(declared, engine.End)...)
	}

	g, err := b.Compile()
	if err != nil {
		var ce *engine.CompileError
		if errors.As(err, &ce) {
			return nil, &FileError{File: file, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
		}
		return nil, &FileError{File: file, Err: err}
	}
	spec.raised = raised
	return &compiledGraph{spec: &spec, graph: g, channels: channels, handles: handles}, nil
}

// checkAllowlist refuses, for agent, a "tools" list that names a tool
// twice, or one the bundle's registry lacks, which could never be
// granted: a misspelt name would keep the tool meant out of the agent's
// reach unseen until a run is refused it. With agent "" it refuses any
// list: the file is run only as a subgraph, where the allowlist of the
// agent that runs it holds. Each at the name's line and column.
func (gc *graphCompiler) checkAllowlist(file string, data []byte, pos positions, spec *GraphSpec, agent string) error {
	if spec.Tools == nil {
		return nil
	}
	if agent == "" {
		return malformed(file, data, pos.At("tools"), "", "tools: graph %q is run only as a subgraph, and an allowlist is "+
			"read from an agent's own file (it bounds the agent's subgraphs too): move it there", spec.Name)
	}
	var known []string
	if gc.bundle.Registry != nil {
		known = gc.bundle.Registry.Names()
	}
	at := func(i int) int {
		if off := strictjson.ElementAt(data, pos["tools"], i); off >= 0 {
			return off
		}
		return pos.At("tools")
	}
	seen := map[string]bool{}
	for i, n := range *spec.Tools {
		if seen[n] {
			return malformed(file, data, at(i), "", "tools.%d: agent %q names tool %q twice", i, agent, n)
		}
		seen[n] = true
		if !slices.Contains(known, n) {
			have := "the bundle has no tool registry"
			if len(known) > 0 {
				have = "tools: " + strings.Join(known, ", ")
			}
			return malformed(file, data, at(i), "", "tools.%d: agent %q names tool %q, which is not in the bundle's registry (%s)", i, agent, n, have)
		}
	}
	return nil
}

// nullMember reports whether the top-level object of data has member key
// with the value null, and where that value is.
func nullMember(data []byte, key string) (int, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return -1, false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return -1, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return -1, false
		}
		if k == key && string(v) == "null" {
			return int(dec.InputOffset()) - len(v), true
		}
	}
	return -1, false
}

type fanoutConfig struct {
	Over string `json:"over"`
	To   string `json:"to"`
	Join string `json:"join"`
}

func checkCondition(c Condition, channels map[string]Channel, flags string) error {
	n := 0
	var channel string
	if c.FlagSet != "" {
		n++
	}
	if c.FlagNotSet != "" {
		n++
	}
	if c.ChannelEmpty != "" {
		n++
		channel = c.ChannelEmpty
	}
	if c.ChannelNotEmpty != "" {
		n++
		channel = c.ChannelNotEmpty
	}
	if c.CounterAtLeast != nil {
		n++
		ch, ok := channels[c.CounterAtLeast.Channel]
		if !ok || (ch.Type != TypeInt && ch.Type != TypeFloat) {
			return fmt.Errorf("counter_at_least: %q is not a declared int or float channel", c.CounterAtLeast.Channel)
		}
	}
	if c.Default {
		n++
	}
	if n != 1 {
		return fmt.Errorf("want exactly one of flag_set, flag_not_set, channel_empty, channel_not_empty, counter_at_least, default; got %d", n)
	}
	if (c.FlagSet != "" || c.FlagNotSet != "") && channels[flags].Name == "" {
		return fmt.Errorf("flag conditions need the flags channel %q to be declared", flags)
	}
	if channel != "" && channels[channel].Name == "" {
		return fmt.Errorf("undeclared channel %q", channel)
	}
	return nil
}

func (c Condition) holds(s engine.State, flags string) bool {
	switch {
	case c.Default:
		return true
	case c.FlagSet != "":
		return hasFlag(s, flags, c.FlagSet)
	case c.FlagNotSet != "":
		return !hasFlag(s, flags, c.FlagNotSet)
	case c.ChannelEmpty != "":
		v, _ := s.Value(c.ChannelEmpty)
		return isEmpty(v)
	case c.ChannelNotEmpty != "":
		v, _ := s.Value(c.ChannelNotEmpty)
		return !isEmpty(v)
	case c.CounterAtLeast != nil:
		v, _ := s.Value(c.CounterAtLeast.Channel)
		return number(v) >= c.CounterAtLeast.N
	}
	return false
}
