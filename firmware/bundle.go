package firmware

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/outcomefields"
	"github.com/outpost-edge/outpost/internal/strictjson"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// Bundle is a verified bundle, loaded: its agents compiled to engine graphs
// and its policy data decoded. It is immutable and safe to share.
type Bundle struct {
	Manifest *Manifest
	// Digest is the bundle's content address ("sha256:" + hex of the
	// manifest's bytes), recorded on every run pinned to it.
	Digest string

	Registry  *policy.Registry       // nil when the bundle has no tools file
	Rules     *policy.Rules          // nil when the bundle has no rules file
	Lanes     map[string]policy.Lane // by agent
	Redactor  *policy.Redactor       // nil when the bundle has no redaction file
	Docs      []Doc                  // the knowledge base, in manifest order
	Prompts   map[string]string
	Golden    []Conversation
	Graphs    map[string]*GraphSpec // by agent, as declared
	agents    map[string]*engine.Agent
	indexOnce sync.Once
	idx       *bm25

	// modelLanes are the lanes the model nodes take, for checkNames.
	modelLanes []laneUse
	// fileTools bounds the tool loops of each graph file for a run whose
	// agent is not known (a graph invoked without the run manager's pin,
	// nor a run record): the allowlists of every agent that runs the file,
	// intersected, or nil where none of them has one.
	fileTools map[string][]string
	// openLoops are the agents that run a tool loop and have no
	// allowlist, with the first such node, for Warnings.
	openLoops []openLoop

	runtime     *Runtime // nil: the scripted rules, calls recorded in memory
	runtimeInit sync.Once
	defaultRT   *Runtime
}

// Runtime returns the runtime the bundle was loaded with, or nil.
func (b *Bundle) Runtime() *Runtime { return b.runtime }

// Ref returns the reference a run started on this bundle records.
func (b *Bundle) Ref() engine.BundleRef {
	return engine.BundleRef{Name: b.Manifest.Name, Version: b.Manifest.Version, Digest: b.Digest}
}

// Agent returns one of the bundle's agents, ready for an engine.Manager.
func (b *Bundle) Agent(name string) (*engine.Agent, error) {
	a, ok := b.agents[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q is not in bundle %s (agents: %s)", ErrUnknownAgent, name, b.Manifest, strings.Join(b.AgentNames(), ", "))
	}
	return a, nil
}

// AgentNames lists the bundle's agents, sorted.
func (b *Bundle) AgentNames() []string { return sortedKeys(b.agents) }

// Load verifies the bundle at path (a directory or a .tar) and loads it
// without a Runtime: its model nodes answer from the bundle's scripted
// rules. LoadWithRuntime gives them the appliance's model and call log.
func Load(p string, keys *Keyring) (*Bundle, error) {
	return LoadWithRuntime(p, keys, nil)
}

// LoadWithRuntime verifies the bundle at path and loads it for rt.
func LoadWithRuntime(p string, keys *Keyring, rt *Runtime) (*Bundle, error) {
	files, err := readBundle(p)
	if err != nil {
		return nil, err
	}
	v, err := verifyContents(files, keys)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", p, err)
	}
	b, err := load(v, rt)
	if err == nil {
		err = b.checkNames(v)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", p, err)
	}
	return b, nil
}

// compilations counts load's calls (see Compilations).
var compilations atomic.Int64

// Compilations is how many times this process has loaded a verified
// bundle, compiling its agents' graphs: each Load, each Open of an
// installed version for a runtime it was not loaded for yet, and each load
// of the embedded reference bundle. It shows that a bundle is not compiled
// again where once is enough.
func Compilations() int64 { return compilations.Load() }

// load decodes a verified bundle: policy data first, then documents and
// prompts, then the graphs, whose nodes refer to all of those.
func load(v *verified, rt *Runtime) (*Bundle, error) {
	compilations.Add(1)
	m := v.manifest
	b := &Bundle{Manifest: m, Digest: v.digest, runtime: rt, Prompts: map[string]string{}, Lanes: map[string]policy.Lane{},
		Graphs: map[string]*GraphSpec{}, agents: map[string]*engine.Agent{}}
	policyErr := func(file string, err error) error { return policyFileError(file, v.files[file], err) }
	var err error
	if m.Tools != "" {
		if b.Registry, err = policy.DecodeRegistry(v.files[m.Tools]); err != nil {
			return nil, policyErr(m.Tools, err)
		}
	}
	if m.Rules != "" {
		if b.Rules, err = policy.DecodeRules(v.files[m.Rules]); err != nil {
			return nil, policyErr(m.Rules, err)
		}
	}
	if m.Redaction != "" {
		if b.Redactor, err = policy.DecodeRedactionPolicy(v.files[m.Redaction]); err != nil {
			return nil, policyErr(m.Redaction, err)
		}
	}
	if m.Lanes != "" {
		if err := b.loadLanes(m.Lanes, v.files[m.Lanes]); err != nil {
			return nil, err
		}
	}
	seen := map[string]string{}
	for _, p := range m.Knowledge {
		d := parseDoc(p, v.files[p])
		if other, dup := seen[d.ID]; dup {
			return nil, &FileError{File: p, Err: fmt.Errorf("%w: document id %q is also the id of %s", ErrMalformed, d.ID, other)}
		}
		seen[d.ID] = p
		b.Docs = append(b.Docs, d)
	}
	for name, p := range m.Prompts {
		b.Prompts[name] = string(v.files[p])
	}
	for _, p := range m.Golden {
		cs, err := DecodeGolden(p, v.files[p])
		if err != nil {
			return nil, err
		}
		b.Golden = append(b.Golden, cs...)
	}
	gc := newGraphCompiler(b, v.files)
	for _, name := range sortedKeys(m.Agents) {
		file := m.Agents[name]
		cg, err := gc.compile(file)
		if err != nil {
			return nil, err
		}
		if err := cg.spec.checkTools(name); err != nil {
			return nil, err
		}
		b.Graphs[name] = cg.spec
		a := newAgent(name, cg, b.Ref())
		a.Pin = b.pinTools
		if rt != nil {
			// The runtime's budget bounds the run too: the narrower of
			// it and the agent's own holds, for each dimension.
			a.StepLimit = engine.Narrower(a.StepLimit, rt.Budget.Steps)
			a.MaxDuration = engine.Narrower(a.MaxDuration, rt.Budget.WallTime)
			a.MaxTokens = engine.Narrower(a.MaxTokens, rt.Budget.Tokens)
		}
		b.agents[name] = a
	}
	b.modelLanes = gc.lanes
	if err := b.boundToolLoops(gc); err != nil {
		return nil, err
	}
	return b, nil
}

// openLoop is an agent that runs a tool loop with no allowlist.
type openLoop struct{ agent, file, graph, node string }

// boundToolLoops refuses an allowlist in a file run only as a subgraph,
// and works out, for each graph file, the allowlists of the agents that
// run it (fileTools) and which agents run a tool loop without one.
func (b *Bundle) boundToolLoops(gc *graphCompiler) error {
	agentFiles := map[string]bool{}
	for _, f := range b.Manifest.Agents {
		agentFiles[f] = true
	}
	for _, f := range sortedKeys(gc.compiled) {
		if !agentFiles[f] {
			if err := gc.compiled[f].spec.checkTools(""); err != nil {
				return err
			}
		}
	}
	b.fileTools = map[string][]string{}
	for _, name := range sortedKeys(b.Manifest.Agents) {
		root := b.Manifest.Agents[name]
		allow := b.Graphs[name].Allowlist()
		for _, f := range gc.reach(root) {
			if allow == nil && len(gc.toolLoops[f]) > 0 && (len(b.openLoops) == 0 || b.openLoops[len(b.openLoops)-1].agent != name) {
				b.openLoops = append(b.openLoops, openLoop{agent: name, file: root, graph: gc.compiled[f].spec.Name, node: gc.toolLoops[f][0]})
			}
			if allow == nil {
				continue
			}
			if have, ok := b.fileTools[f]; ok {
				allow = slices.DeleteFunc(slices.Clone(allow), func(n string) bool { return !slices.Contains(have, n) })
			}
			b.fileTools[f] = allow
		}
	}
	return nil
}

// Allowlist returns an agent's allowlist: nil when its file names no
// tools, so that it may call every tool of the registry, and the names
// (none for an empty list) otherwise.
func (b *Bundle) Allowlist(agent string) []string { return b.Graphs[agent].Allowlist() }

// Warnings lists what a bundle may mean otherwise than it says, though it
// loads: each agent that runs a tool loop and names no tools, so that it
// may call every tool of the registry.
func (b *Bundle) Warnings() []string {
	var out []string
	for _, o := range b.openLoops {
		var tools []string
		if b.Registry != nil {
			tools = b.Registry.Names()
		}
		where := fmt.Sprintf("its tool_loop node %q", o.node)
		if o.graph != b.Graphs[o.agent].Name {
			where += fmt.Sprintf(" (in subgraph %q)", o.graph)
		}
		out = append(out, fmt.Sprintf("%s: agent %q names no tools, so %s may call every tool of the registry (%s): "+
			"list the ones it needs in \"tools\"", o.file, o.agent, where, strings.Join(tools, ", ")))
	}
	return out
}

// checkNames refuses a bundle whose names do not meet: an approval for a
// tool outside its registry, a model node whose lane the lanes file lacks,
// a redaction field that no outcome has (checkRedactionFields), a golden
// conversation that no replay could pass (checkGolden).
// A misspelt name there passes every other check and shows only at run
// time, if ever, so verify and install refuse it. Open does not: a bundle
// installed before this check still serves the runs pinned to it.
func (b *Bundle) checkNames(v *verified) error {
	m := v.manifest
	if m.Rules != "" {
		if err := checkApprovals(m.Rules, v.files[m.Rules], b.Rules.Approvals, b.Registry); err != nil {
			return err
		}
	}
	if m.Lanes != "" {
		if err := b.checkLanes(m.Lanes); err != nil {
			return err
		}
	}
	if m.Redaction != "" {
		if err := checkRedactionFields(m.Redaction, v.files[m.Redaction]); err != nil {
			return err
		}
	}
	return b.checkGolden()
}

// policyFileError locates err, a policy decoder's error about the file's
// data, in the file. The decoders name the item at fault by its JSON path
// (*policy.ItemError); the file's positions give its line and column, and
// those of the list it is in give a string's ("fields.2").
func policyFileError(file string, data []byte, err error) error {
	fe := &FileError{File: file, Err: fmt.Errorf("%w: %w", ErrMalformed, err)}
	var ie *policy.ItemError
	if errors.As(err, &ie) {
		var doc any
		if pos, perr := decodeStrict(file, data, &doc); perr == nil {
			off := pos.At(ie.Path)
			if _, recorded := pos[ie.Path]; !recorded {
				dot := strings.LastIndexByte(ie.Path, '.')
				list, recorded := pos[ie.Path[:max(dot, 0)]]
				if i, err := strconv.Atoi(ie.Path[dot+1:]); dot > 0 && recorded && err == nil {
					if at := strictjson.ElementAt(data, list, i); at >= 0 {
						off = at
					}
				}
			}
			if off >= 0 {
				fe.Line, fe.Column = lineCol(data, off)
			}
		}
	}
	return fe
}

// checkRedactionFields refuses a redaction policy field whose first
// segment names no field of an outcome record (policy.CheckFields): it
// keeps nothing, so what it meant to send upstream would stay on the
// appliance, unseen by anyone.
func checkRedactionFields(file string, data []byte) error {
	var p policy.RedactionPolicy
	// The policy decoded strictly once already; this pass reads its fields.
	if _, err := decodeStrict(file, data, &p); err != nil {
		return err
	}
	if err := p.CheckFields("an outcome record", outcomefields.Names); err != nil {
		return policyFileError(file, data, err)
	}
	return nil
}

// newAgent wraps a compiled graph as an engine agent: the request's input
// goes to the graph's input channel, the output channel becomes the output.
func newAgent(name string, cg *compiledGraph, ref engine.BundleRef) *engine.Agent {
	a := &engine.Agent{Name: name, Graph: cg.graph, Bundle: ref, StepLimit: cg.spec.StepLimit,
		MaxDuration: cg.spec.maxRunTime, MaxTokens: cg.spec.MaxTokens}
	var turn []engine.Write
	for _, r := range cg.spec.Reset {
		w, _ := cg.channels[r].zeroWrite() // checked at compile time
		turn = append(turn, w)
	}
	in, hasIn := cg.channels[cg.spec.Input]
	hist, hasHist := cg.channels[cg.spec.History]
	if hasIn || hasHist {
		a.Input = func(raw json.RawMessage) ([]engine.Write, error) {
			ws := append([]engine.Write(nil), turn...)
			if hasIn {
				w, err := in.inputWrite(raw)
				if err != nil {
					return nil, err
				}
				ws = append(ws, w)
			}
			if hasHist && hist.Name != in.Name {
				var text string
				if err := json.Unmarshal(raw, &text); err == nil {
					ws = append(ws, engine.Write{Channel: hist.Name, Value: []models.Message{{Role: models.RoleUser, Content: text}}})
				}
			}
			return ws, nil
		}
	}
	if out, ok := cg.channels[cg.spec.Output]; ok {
		a.Output = func(s engine.State) json.RawMessage {
			v, _ := s.Value(out.Name)
			raw, err := json.Marshal(v)
			if err != nil {
				return nil
			}
			return raw
		}
	}
	return a
}

func (b *Bundle) loadLanes(file string, data []byte) error {
	var f struct {
		Lanes []policy.Lane `json:"lanes"`
	}
	pos, err := decodeStrict(file, data, &f)
	if err != nil {
		return err
	}
	for i, l := range f.Lanes {
		at := fmt.Sprintf("lanes.%d", i)
		if err := l.Validate(); err != nil {
			return malformed(file, data, pos.At(at), "", "%v", err)
		}
		if _, dup := b.Lanes[l.Agent]; dup {
			return malformed(file, data, pos.At(at), "", "a second lane for agent %q", l.Agent)
		}
		b.Lanes[l.Agent] = l
	}
	return nil
}

// checkLanes refuses a model node whose lane the lanes file lacks: every
// model call of it would be refused at run time (fail closed), on a bundle
// that verified. A lane under a misspelt agent leaves that agent so.
func (b *Bundle) checkLanes(file string) error {
	for _, u := range b.modelLanes {
		if _, ok := b.Lanes[u.lane]; ok {
			continue
		}
		which := fmt.Sprintf("its lane, %q (the graph's name, as its config names no \"lane\"),", u.lane)
		if u.named {
			which = fmt.Sprintf("config.lane: %q", u.lane)
		}
		return u.env.Errorf("%s is not in %s, so every model call of the node would be refused (lanes: %s)",
			which, file, strings.Join(sortedKeys(b.Lanes), ", "))
	}
	return nil
}

// checkApprovals refuses a standing approval for a tool that the bundle's
// registry does not hold: a misspelt name would leave the tool it meant at
// the default decision, so that a read tool meant to be denied would run.
func checkApprovals(file string, data []byte, approvals []policy.ApprovalRule, reg *policy.Registry) error {
	var tools []string
	if reg != nil {
		tools = reg.Names()
	}
	for i, a := range approvals {
		if a.Tool == "*" || slices.Contains(tools, a.Tool) {
			continue
		}
		// The rules decoded strictly once already; this pass finds where.
		pos, _ := decodeStrict(file, data, &policy.Rules{})
		at := fmt.Sprintf("approvals.%d", i)
		known := "the bundle has no tool registry"
		if len(tools) > 0 {
			known = "tools: " + strings.Join(tools, ", ")
		}
		return malformed(file, data, pos.At(at), "", "%s.tool: %q is not a tool of the bundle's registry (%s)", at, a.Tool, known)
	}
	return nil
}

// parseDoc reads a knowledge-base document. Its id is the file name
// without extension; a first line "# Title" is its title.
func parseDoc(p string, data []byte) Doc {
	base := path.Base(p)
	d := Doc{ID: strings.TrimSuffix(base, path.Ext(base)), Text: string(data)}
	first, rest, _ := strings.Cut(d.Text, "\n")
	if t, ok := strings.CutPrefix(strings.TrimSpace(first), "# "); ok {
		d.Title = strings.TrimSpace(t)
		d.Text = strings.TrimSpace(rest)
	}
	return d
}
