package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Start and End are the graph's virtual entry and exit.
const (
	Start = "__start__"
	End   = "__end__"
)

// NodeFunc is a step: it reads a read-only view of the state and returns
// writes. It may run again after a crash, an error or an interrupt, so work
// before its return (and before an Interrupt call) must be idempotent.
type NodeFunc func(ctx context.Context, s State) ([]Write, error)

// Router picks the next nodes from the state after a step.
type Router func(s State) []string

// Send is one fan-out task: Node runs once per Send, with Input as its own
// argument (read with InputOf).
type Send struct {
	Node  string
	Input any
}

// FanoutRouter returns one Send per task to run next.
type FanoutRouter func(s State) []Send

// RetryPolicy says how often and how patiently a failing node is retried.
// Only transient and timeout errors are retried (see KindOf).
type RetryPolicy struct {
	MaxAttempts int           // including the first; 0 or 1 means no retry
	Initial     time.Duration // first backoff; default 100ms
	Factor      float64       // growth per attempt; default 2
	Max         time.Duration // backoff cap; default 10s
	Jitter      bool          // full jitter: sleep a random time up to the backoff
	// Classify overrides KindOf for this node.
	Classify func(error) ErrorKind
}

// NodeOption configures a node.
type NodeOption func(*node)

// WithRetry sets the node's retry policy.
func WithRetry(p RetryPolicy) NodeOption { return func(n *node) { n.retry = p } }

// WithTimeout bounds one attempt of the node.
func WithTimeout(d time.Duration) NodeOption { return func(n *node) { n.timeout = d } }

// CheckDecision gives the node's check of a person's decision on its
// interrupts. Resume runs it before it accepts the decision: one it refuses
// is an ErrBadDecision and the run stays interrupted, where the node would
// otherwise fail on it once the review had been spent (an edit whose value
// the node cannot use, say).
func CheckDecision(fn func(Decision) error) NodeOption {
	return CheckDecisionOn(func(_ json.RawMessage, d Decision) error { return fn(d) })
}

// CheckDecisionOn is CheckDecision for a node whose check depends on the
// question it asked: fn is also given the payload of the interrupt the
// decision answers, so that an edit is checked against that question (the
// arguments of the tool call it is about, say).
func CheckDecisionOn(fn func(payload json.RawMessage, d Decision) error) NodeOption {
	return func(n *node) { n.check = fn }
}

// checkDecision runs the check of the node that raised in, if it has one.
// ns is the namespace g runs in; an interrupt raised deeper, inside a
// subgraph, is followed down its namespace ("node:task/node:task") to the
// graph that holds the node, so that its edit is checked before it is spent
// too.
func (g *Graph) checkDecision(ns string, in PendingInterrupt, d Decision) error {
	owner := g
	if rel := strings.TrimPrefix(strings.TrimPrefix(in.NS, ns), "/"); rel != "" {
		for _, seg := range strings.Split(rel, "/") {
			i := strings.LastIndexByte(seg, ':')
			if i < 0 {
				return nil
			}
			sub := owner.nodes[seg[:i]]
			if sub == nil || sub.subgraph == nil {
				return nil
			}
			owner = sub.subgraph
		}
	}
	n := owner.nodes[in.Node]
	if n == nil || n.check == nil {
		return nil
	}
	if err := n.check(in.Payload, d); err != nil {
		return &refusalError{node: in.Node, kind: d.Kind, err: err}
	}
	return nil
}

// Writes declares the channels the node writes; Compile checks they exist.
func Writes(channels ...string) NodeOption {
	return func(n *node) { n.writes = append(n.writes, channels...) }
}

// Reads declares the channels the node reads; Compile checks they exist.
func Reads(channels ...string) NodeOption {
	return func(n *node) { n.reads = append(n.reads, channels...) }
}

type node struct {
	name     string
	fn       NodeFunc
	retry    RetryPolicy
	timeout  time.Duration
	writes   []string
	reads    []string
	subgraph *Graph
	check    func(payload json.RawMessage, d Decision) error
}

type condEdge struct {
	from    string
	router  Router
	targets []string
}

type fanoutEdge struct {
	from    string
	router  FanoutRouter
	targets []string
}

// Builder assembles a graph. Its methods record problems instead of failing
// one at a time; Compile reports them all.
type Builder struct {
	name         string
	channels     map[string]*channelSpec
	channelOrder []string
	nodes        map[string]*node
	nodeOrder    []string
	edges        map[string][]string
	conds        []condEdge
	fanouts      []fanoutEdge
	problems     []string
}

// NewGraph starts a graph builder.
func NewGraph(name string) *Builder {
	return &Builder{
		name:     name,
		channels: map[string]*channelSpec{},
		nodes:    map[string]*node{},
		edges:    map[string][]string{},
	}
}

// AddNode adds a named step.
func (b *Builder) AddNode(name string, fn NodeFunc, opts ...NodeOption) *Builder {
	switch {
	case name == "" || name == Start || name == End:
		b.problems = append(b.problems, fmt.Sprintf("node name %q is reserved or empty", name))
		return b
	case strings.ContainsAny(name, "/:|"):
		b.problems = append(b.problems, fmt.Sprintf("node name %q may not contain '/', ':' or '|'", name))
		return b
	case b.nodes[name] != nil:
		b.problems = append(b.problems, fmt.Sprintf("duplicate node %q", name))
		return b
	case fn == nil:
		b.problems = append(b.problems, fmt.Sprintf("node %q has no function", name))
		return b
	}
	n := &node{name: name, fn: fn}
	for _, o := range opts {
		o(n)
	}
	b.nodes[name] = n
	b.nodeOrder = append(b.nodeOrder, name)
	return b
}

// AddEdge adds a static edge: to runs after from.
func (b *Builder) AddEdge(from, to string) *Builder {
	b.edges[from] = append(b.edges[from], to)
	return b
}

// AddConditionalEdge adds a router after from. targets declares every node it
// may return (End included if it may end the run); returning anything else
// fails the run.
func (b *Builder) AddConditionalEdge(from string, r Router, targets ...string) *Builder {
	if r == nil {
		b.problems = append(b.problems, fmt.Sprintf("conditional edge from %q has no router", from))
		return b
	}
	if len(targets) == 0 {
		b.problems = append(b.problems, fmt.Sprintf("conditional edge from %q declares no targets", from))
	}
	b.conds = append(b.conds, condEdge{from: from, router: r, targets: targets})
	return b
}

// AddFanout adds a fan-out edge after from: one task per Send returned.
func (b *Builder) AddFanout(from string, r FanoutRouter, targets ...string) *Builder {
	if r == nil {
		b.problems = append(b.problems, fmt.Sprintf("fan-out edge from %q has no router", from))
		return b
	}
	if len(targets) == 0 {
		b.problems = append(b.problems, fmt.Sprintf("fan-out edge from %q declares no targets", from))
	}
	b.fanouts = append(b.fanouts, fanoutEdge{from: from, router: r, targets: targets})
	return b
}

// CompileOption configures Compile.
type CompileOption func(*Graph)

// InterruptBefore pauses a run before any of the named nodes runs.
func InterruptBefore(nodes ...string) CompileOption {
	return func(g *Graph) { g.before = append(g.before, nodes...) }
}

// InterruptAfter pauses a run after any of the named nodes has run.
func InterruptAfter(nodes ...string) CompileOption {
	return func(g *Graph) { g.after = append(g.after, nodes...) }
}

// Graph is a compiled, validated graph. It is immutable and safe to share.
type Graph struct {
	name         string
	channels     map[string]*channelSpec
	channelOrder []string
	nodes        map[string]*node
	nodeOrder    []string
	edges        map[string][]string
	conds        map[string][]condEdge
	fanouts      map[string][]fanoutEdge
	before       []string
	after        []string
	order        map[string]int // node -> declaration index
}

// Name returns the graph's name.
func (g *Graph) Name() string { return g.name }

// Nodes returns the node names in the order they were added.
func (g *Graph) Nodes() []string { return slices.Clone(g.nodeOrder) }

// Compile validates the graph and returns every problem it finds at once.
func (b *Builder) Compile(opts ...CompileOption) (*Graph, error) {
	g := &Graph{
		name:         b.name,
		channels:     b.channels,
		channelOrder: b.channelOrder,
		nodes:        b.nodes,
		nodeOrder:    b.nodeOrder,
		edges:        b.edges,
		conds:        map[string][]condEdge{},
		fanouts:      map[string][]fanoutEdge{},
	}
	for _, o := range opts {
		o(g)
	}
	g.order = make(map[string]int, len(b.nodeOrder))
	for i, n := range b.nodeOrder {
		g.order[n] = i
	}
	problems := slices.Clone(b.problems)
	known := func(n string) bool { return n == Start || n == End || b.nodes[n] != nil }

	froms := make([]string, 0, len(b.edges))
	for from := range b.edges {
		froms = append(froms, from)
	}
	sort.Strings(froms)
	for _, from := range froms {
		if from == End {
			problems = append(problems, "edge from End")
		} else if !known(from) {
			problems = append(problems, fmt.Sprintf("edge from unknown node %q", from))
		}
		for _, to := range b.edges[from] {
			if to == Start {
				problems = append(problems, fmt.Sprintf("edge from %q to Start", from))
			} else if !known(to) {
				problems = append(problems, fmt.Sprintf("edge from %q to unknown node %q", from, to))
			}
		}
	}
	for _, c := range b.conds {
		if !known(c.from) || c.from == End {
			problems = append(problems, fmt.Sprintf("conditional edge from unknown node %q", c.from))
		}
		for _, t := range c.targets {
			if !known(t) || t == Start {
				problems = append(problems, fmt.Sprintf("conditional edge from %q declares unknown target %q", c.from, t))
			}
		}
		g.conds[c.from] = append(g.conds[c.from], c)
	}
	for _, f := range b.fanouts {
		if !known(f.from) || f.from == End {
			problems = append(problems, fmt.Sprintf("fan-out edge from unknown node %q", f.from))
		}
		for _, t := range f.targets {
			if b.nodes[t] == nil {
				problems = append(problems, fmt.Sprintf("fan-out edge from %q declares unknown target %q", f.from, t))
			}
		}
		g.fanouts[f.from] = append(g.fanouts[f.from], f)
	}
	for _, name := range b.nodeOrder {
		n := b.nodes[name]
		for _, c := range append(slices.Clone(n.writes), n.reads...) {
			if b.channels[c] == nil {
				problems = append(problems, fmt.Sprintf("node %q uses undeclared channel %q", name, c))
			}
		}
		if n.subgraph != nil {
			for _, c := range n.subgraph.channelOrder {
				if p := b.channels[c]; p != nil && p.kind != n.subgraph.channels[c].kind {
					problems = append(problems, fmt.Sprintf("subgraph node %q: channel %q is %s here and %s in the subgraph", name, c, p.kind, n.subgraph.channels[c].kind))
				}
			}
		}
	}
	for _, list := range [][]string{g.before, g.after} {
		for _, n := range list {
			if b.nodes[n] == nil {
				problems = append(problems, fmt.Sprintf("static interrupt on unknown node %q", n))
			}
		}
	}
	if len(g.successors(Start)) == 0 {
		problems = append(problems, "no edge from Start")
	}

	// Reachability, both ways.
	fwd := g.reach(Start, g.successors)
	pred := map[string][]string{}
	for _, n := range append([]string{Start}, b.nodeOrder...) {
		for _, s := range g.successors(n) {
			pred[s] = append(pred[s], n)
		}
	}
	back := g.reach(End, func(n string) []string { return pred[n] })
	for _, n := range b.nodeOrder {
		if !fwd[n] {
			problems = append(problems, fmt.Sprintf("node %q is unreachable from Start", n))
		}
		if !back[n] {
			problems = append(problems, fmt.Sprintf("node %q has no path to End", n))
		}
	}
	if len(problems) > 0 {
		return nil, &CompileError{Graph: b.name, Problems: problems}
	}
	return g, nil
}

// successors lists every node that may follow n, deduplicated. A node with no
// outgoing edge ends the run, so it leads to End.
func (g *Graph) successors(n string) []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, s := range g.edges[n] {
		add(s)
	}
	for _, c := range g.conds[n] {
		for _, s := range c.targets {
			add(s)
		}
	}
	for _, f := range g.fanouts[n] {
		for _, s := range f.targets {
			add(s)
		}
	}
	if len(out) == 0 && n != End && n != Start {
		add(End)
	}
	return out
}

func (g *Graph) reach(from string, next func(string) []string) map[string]bool {
	seen := map[string]bool{from: true}
	stack := []string{from}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, s := range next(n) {
			if !seen[s] {
				seen[s] = true
				stack = append(stack, s)
			}
		}
	}
	return seen
}

// Mermaid renders the compiled graph as a Mermaid flowchart. It is derived
// from the graph itself, so a diagram cannot drift from the code.
func (g *Graph) Mermaid() string {
	var sb strings.Builder
	sb.WriteString("flowchart TD\n")
	ids := make(map[string]string, len(g.nodeOrder))
	for i, n := range g.nodeOrder {
		ids[n] = mermaidID(n, i)
	}
	id := func(n string) string {
		switch n {
		case Start:
			return "__start__"
		case End:
			return "__end__"
		}
		return ids[n]
	}
	sb.WriteString("  __start__([start])\n")
	for _, n := range g.nodeOrder {
		label := mermaidLabel(n)
		if g.nodes[n].subgraph != nil {
			fmt.Fprintf(&sb, "  %s[[%s]]\n", id(n), label)
		} else {
			fmt.Fprintf(&sb, "  %s[%s]\n", id(n), label)
		}
	}
	sb.WriteString("  __end__([end])\n")
	for _, from := range append([]string{Start}, g.nodeOrder...) {
		for _, to := range g.edges[from] {
			fmt.Fprintf(&sb, "  %s --> %s\n", id(from), id(to))
		}
		for _, c := range g.conds[from] {
			for _, to := range c.targets {
				fmt.Fprintf(&sb, "  %s -.-> %s\n", id(from), id(to))
			}
		}
		for _, f := range g.fanouts[from] {
			for _, to := range f.targets {
				fmt.Fprintf(&sb, "  %s ==>|fan-out| %s\n", id(from), id(to))
			}
		}
		if from != Start && len(g.edges[from]) == 0 && len(g.conds[from]) == 0 && len(g.fanouts[from]) == 0 {
			fmt.Fprintf(&sb, "  %s --> __end__\n", id(from))
		}
	}
	return sb.String()
}

// mermaidID returns n when Mermaid accepts it as a node id, and a positional
// id otherwise: node names may hold spaces, punctuation or Mermaid keywords
// ("end" closes a subgraph), which would break the diagram.
func mermaidID(n string, i int) string {
	switch strings.ToLower(n) {
	case "end", "graph", "flowchart", "subgraph", "direction", "style", "class", "classdef", "click", "linkstyle", "default":
		return fmt.Sprintf("__n%d", i)
	}
	for _, r := range n {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return fmt.Sprintf("__n%d", i)
		}
	}
	return n
}

// mermaidLabel quotes a node name as a label, escaping the quote character.
func mermaidLabel(n string) string {
	if mermaidID(n, 0) == n {
		return n
	}
	return `"` + strings.ReplaceAll(n, `"`, "#quot;") + `"`
}
