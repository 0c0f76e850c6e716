package firmware

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/strictjson"
)

// Conversation is one golden conversation: turns on one thread, each with
// what it must produce (see DESIGN.md, "Golden conversations").
type Conversation struct {
	Name  string `json:"name"`
	Agent string `json:"agent"`
	Turns []Turn `json:"turns"`
	File  string `json:"-"`
	Line  int    `json:"-"`
	// raw is the conversation's line of the file, read again to place a
	// fault that CheckGolden finds at its column.
	raw []byte
}

// Turn is one input of a conversation.
type Turn struct {
	// Input is left out of an encoding when absent, as the decoder found
	// it; "input": null stays null, and CheckGolden refuses both.
	Input       json.RawMessage `json:"input,omitempty"`
	Expect      *Expect         `json:"expect,omitempty"`
	Resume      *Resume         `json:"resume,omitempty"`
	AfterResume *Expect         `json:"after_resume,omitempty"`
}

// Expect is what a turn must produce. Every field is optional; a nil slice
// is not checked, an empty one must match exactly, so an encoding leaves
// out the one and keeps the other.
type Expect struct {
	Path          []string `json:"path,omitzero"`
	Flags         []string `json:"flags,omitzero"`
	FinalContains []string `json:"final_contains,omitempty"`
	FinalRegex    string   `json:"final_regex,omitempty"`
	Tools         []string `json:"tools,omitzero"`
	Status        string   `json:"status,omitempty"`
	Interrupt     string   `json:"interrupt,omitempty"`
}

// Resume is the decision a paused turn is resumed with.
type Resume struct {
	Decision string          `json:"decision"`
	Value    json.RawMessage `json:"value,omitempty"`
	Reason   string          `json:"reason,omitempty"`
}

// DecodeGolden reads a golden-conversation file: one JSON object a line,
// blank lines and lines starting with '#' skipped, decoded strictly. Its
// errors wrap ErrMalformed and call the file a malformed golden file, since
// outpost eval reads ones that no bundle holds. It checks the shape alone:
// CheckGolden checks what the fields say. A bundle is opened with the shape
// checked alone, so that one installed before a check was added still
// serves the runs pinned to it; verify and install check the rest.
func DecodeGolden(file string, data []byte) ([]Conversation, error) {
	var out []Conversation
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), maxFileSize)
	off := 0
	for line := 1; sc.Scan(); line++ {
		raw := sc.Bytes()
		start := off
		// The scanner drops a line's \r before its \n: the next line
		// starts past both.
		if off += len(raw); off < len(data) && data[off] == '\r' {
			off++
		}
		off++
		t := bytes.TrimSpace(raw)
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		var c Conversation
		if _, err := decodeStrictAs(errMalformedGolden, file, data, start, raw, &c); err != nil {
			return nil, err
		}
		if c.Name == "" || c.Agent == "" || len(c.Turns) == 0 {
			return nil, malformedAs(errMalformedGolden, file, data, start, "", "a conversation needs a name, an agent and turns")
		}
		c.File, c.Line, c.raw = file, line, data[start:start+len(raw)]
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		return nil, &FileError{File: file, Err: fmt.Errorf("%w: %v", errMalformedGolden, err)}
	}
	return out, nil
}

// statuses a turn may expect: a turn ends at one of them.
var statuses = []string{
	string(engine.StatusCompleted), string(engine.StatusInterrupted), string(engine.StatusFailed),
	string(engine.StatusCancelled), string(engine.StatusBudgetExceeded),
}

// CheckGolden checks decoded conversations beyond their shape, for what
// would otherwise only fail when they are replayed: no field is null,
// every turn has an input, a status is one a turn can end in, an interrupt comes with no
// other status, a regular expression compiles, a resume decision is
// approve, reject or edit (with a value), and comes only after a turn that
// may pause, after_resume comes with a resume, and names are unique within
// a file. Its error is a *FileError wrapping ErrMalformed, at the line and
// column of the item at fault, that names the conversation and the field.
func CheckGolden(cs []Conversation) error {
	type named struct{ file, name string }
	seen := map[named]int{}
	for _, c := range cs {
		if prev, dup := seen[named{c.File, c.Name}]; dup {
			return c.fault("", "name already used on line %d", prev)
		}
		seen[named{c.File, c.Name}] = c.Line
		if err := c.check(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conversation) check() error {
	if at := c.nullAt(); at != "" {
		hint := ""
		if optionalField(at) {
			hint = " (leave out a field that is not given)"
		}
		return c.fault(at, "%s: null where %s is wanted%s", at, wantedAt(at), hint)
	}
	for i, t := range c.Turns {
		at := fmt.Sprintf("turns.%d", i)
		switch strings.TrimSpace(string(t.Input)) {
		case "":
			return c.fault(at, "%s.input: every turn needs an input", at)
		case "null": // a conversation built in Go, with no line to read
			return c.fault(at, "%s.input: null where %s is wanted", at, wantedAt(at+".input"))
		}
		if err := c.checkExpect(at+".expect", t.Expect); err != nil {
			return err
		}
		if t.AfterResume != nil && t.Resume == nil {
			return c.fault(at+".after_resume", "%s.after_resume: given without a resume", at)
		}
		if t.Resume != nil {
			d := engine.Decision{Kind: t.Resume.Decision, Value: t.Resume.Value, Reason: t.Resume.Reason}
			if err := d.Validate(); err != nil {
				return c.fault(at+".resume", "%s.resume.decision: %v", at, err)
			}
			if t.Expect != nil && t.Expect.Status != "" && t.Expect.Status != string(engine.StatusInterrupted) {
				return c.fault(at+".resume", "%s.resume: the turn expects status %s, so there is nothing to resume", at, t.Expect.Status)
			}
		}
		if err := c.checkExpect(at+".after_resume", t.AfterResume); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conversation) checkExpect(at string, e *Expect) error {
	if e == nil {
		return nil
	}
	if e.Status != "" && !slices.Contains(statuses, e.Status) {
		return c.fault(at, "%s.status: %q is not a status a turn ends in (%s)", at, e.Status, strings.Join(statuses, ", "))
	}
	if e.Interrupt != "" && e.Status != "" && e.Status != string(engine.StatusInterrupted) {
		return c.fault(at, "%s.interrupt: given with status %s", at, e.Status)
	}
	if e.FinalRegex != "" {
		if _, err := regexp.Compile(e.FinalRegex); err != nil {
			return c.fault(at, "%s.final_regex: %v", at, err)
		}
	}
	return nil
}

// userData matches the paths whose values are the turn's own data, where
// a null inside is a value like any other: a turn's input and a resume's
// value (a null as the whole of either is still refused).
var userData = regexp.MustCompile(`^turns\.\d+\.(input|resume\.value)$`)

// nullAt returns the JSON path of the first null in the conversation's
// line ("turns.0.expect.flags"), or "" for none. encoding/json reads a null
// as a field left out, or an item of a list as "", so that the replay
// would not check what the file seems to ask (a null flags is no check of
// the flags, not a check that none is raised) or would run a turn with no
// input. A conversation built by hand, not decoded, has no line to read.
func (c *Conversation) nullAt() string {
	if c.raw == nil {
		return ""
	}
	at, _ := firstNull(json.NewDecoder(bytes.NewReader(c.raw)), "")
	return at
}

// firstNull reads one value from dec and returns the path of its first
// null, at being the value's own path.
func firstNull(dec *json.Decoder, at string) (string, error) {
	if userData.MatchString(at) {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil || string(v) != "null" {
			return "", err
		}
		return at, nil
	}
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	if tok == nil {
		return at, nil
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return "", nil
	}
	prefix := at
	if prefix != "" {
		prefix += "."
	}
	for i := 0; dec.More(); i++ {
		key := strconv.Itoa(i)
		if d == '{' {
			k, err := dec.Token()
			if err != nil {
				return "", err
			}
			key, _ = k.(string)
		}
		if found, err := firstNull(dec, prefix+key); found != "" || err != nil {
			return found, err
		}
	}
	_, err = dec.Token()
	return "", err
}

// optionalField reports whether path at names a field that a golden
// conversation may leave out: not an item of a list, nor a turn's input
// or the conversation's name, agent or turns.
func optionalField(at string) bool {
	field := at[strings.LastIndexByte(at, '.')+1:]
	if _, err := strconv.Atoi(field); err == nil {
		return false
	}
	return strings.Contains(at, ".") && field != "input"
}

// wantedAt says what a golden conversation wants at path at.
func wantedAt(at string) string {
	field := at[strings.LastIndexByte(at, '.')+1:]
	if _, err := strconv.Atoi(field); err == nil && strings.Count(at, ".") == 1 {
		field = "turn" // an item of turns
	}
	switch field {
	case "input":
		return "an input (every turn needs one)"
	case "value":
		return "a value"
	case "turns", "path", "flags", "final_contains", "tools":
		return "a list"
	case "turn", "expect", "resume", "after_resume":
		return "an object"
	}
	return "a string"
}

// fault reports a mistake in conversation c at the item whose JSON path
// is at (its nearest object or array; "" for the conversation), as an
// error of a malformed golden file that names the conversation.
func (c *Conversation) fault(at, format string, args ...any) *FileError {
	e := &FileError{File: c.File, Line: c.Line,
		Err: fmt.Errorf("%w: conversation %q: %s", errMalformedGolden, c.Name, fmt.Sprintf(format, args...))}
	if c.raw == nil {
		return e // built by hand, not decoded: no column to give
	}
	e.Column = 1
	var shape Conversation
	if pos, err := strictjson.Decode(c.raw, &shape); err == nil && at != "" {
		if off := pos.At(at); off >= 0 {
			_, e.Column = lineCol(c.raw, off)
		}
	}
	return e
}

// checkGolden refuses a golden conversation of the bundle that no replay of
// it could pass: one CheckGolden refuses, or one that names an agent the
// bundle lacks, or expects a node its agent's graph lacks (in its path or
// as its interrupt), a tool its registry or its agent's allowlist lacks,
// or a flag its agent can never raise. Like checkNames, whose part it is, it is for verify and
// install, not Open.
//
// The flags a replay reads are those of the agent's "flags" channel. What
// its graph's nodes can write there is known where only guardrails,
// reviews and model nodes' flag_risks do, which raise flags of the rules'
// and their own vocabulary; where the run's input, a node whose config
// names the channel, or a node of a Go program's own kind may write to it,
// the expected flags are not checked.
func (b *Bundle) checkGolden() error {
	if err := CheckGolden(b.Golden); err != nil {
		return err
	}
	for _, c := range b.Golden {
		if _, ok := b.Graphs[c.Agent]; !ok {
			return c.fault("", "agent: %q is not an agent of the bundle (agents: %s)", c.Agent, strings.Join(b.AgentNames(), ", "))
		}
	}
	if err := b.CheckGoldenNames(b.Golden); err != nil {
		return err
	}
	return b.CheckGoldenFlags(b.Golden, DefaultFlagsChannel)
}

// CheckGoldenNames refuses a conversation of convs that expects a node its
// agent's graph lacks (in a path or an interrupt), or a tool b's registry
// or its agent's allowlist lacks, as verify refuses one of the bundle's own
// golden files (see checkGolden), so that golden files of one's own are
// checked before anything is replayed. A conversation whose agent is not
// one of b's is not checked.
//
// A turn's expected tools are the tools it called (its tool.called
// events); a call the active set refuses is a tool.unauthorized event and
// is not listed. The active set is never wider than the agent's
// allowlist, so a tool outside it can never be listed, in the agent's
// subgraphs either, and the turn could never pass.
func (b *Bundle) CheckGoldenNames(convs []Conversation) error {
	var tools []string
	if b.Registry != nil {
		tools = b.Registry.Names()
	}
	for i := range convs {
		c := &convs[i]
		spec, ok := b.Graphs[c.Agent]
		if !ok {
			continue
		}
		var nodes []string
		for _, n := range spec.Nodes {
			nodes = append(nodes, n.Name)
		}
		for _, e := range c.expectations() {
			if err := c.checkExpectNames(e.at, e.expect, nodes, tools, spec.Allowlist()); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckGoldenFlags refuses a conversation of convs that expects a flag its
// agent can never raise on channel, the channel a replay reads the flags
// from, as verify refuses one of the bundle's own golden files for the
// "flags" channel (see checkGolden), so that golden files of one's own are
// checked before anything is replayed. A conversation whose agent is not
// one of b's, or whose channel's flags are not known, is not checked.
func (b *Bundle) CheckGoldenFlags(convs []Conversation, channel string) error {
	for i := range convs {
		c := &convs[i]
		spec, ok := b.Graphs[c.Agent]
		if !ok {
			continue
		}
		flags, unknown := spec.raised.can(channel)
		if unknown != "" {
			continue
		}
		for _, e := range c.expectations() {
			if err := c.checkExpectFlags(e.at, e.expect, flags); err != nil {
				return err
			}
		}
	}
	return nil
}

// expectation is what a turn of a conversation expects (its expect or its
// after_resume; nil when it has none), with its JSON path.
type expectation struct {
	at     string
	expect *Expect
}

// expectations lists c's expectations, turn by turn.
func (c *Conversation) expectations() []expectation {
	var out []expectation
	for i, t := range c.Turns {
		out = append(out, expectation{fmt.Sprintf("turns.%d.expect", i), t.Expect},
			expectation{fmt.Sprintf("turns.%d.after_resume", i), t.AfterResume})
	}
	return out
}

// checkExpectFlags refuses an expectation of a flag outside flags, the
// ones the conversation's agent can raise.
func (c *Conversation) checkExpectFlags(at string, e *Expect, flags []string) error {
	if e == nil {
		return nil
	}
	for i, f := range e.Flags {
		if !slices.Contains(flags, f) {
			known := "it raises none"
			if len(flags) > 0 {
				known = "its flags: " + strings.Join(flags, ", ")
			}
			return c.fault(at+".flags", "%s.flags.%d: %q is not a flag agent %q can raise (%s)", at, i, f, c.Agent, known)
		}
	}
	return nil
}

// checkExpectNames refuses an expectation that names a node outside nodes
// (the agent's graph; a subgraph's node is reported as "parent/child") or
// a tool outside tools (the registry) or allowed (the agent's allowlist,
// nil when it names none and may call every tool of the registry).
func (c *Conversation) checkExpectNames(at string, e *Expect, nodes, tools, allowed []string) error {
	if e == nil {
		return nil
	}
	for i, n := range e.Path {
		if !slices.Contains(nodes, n) {
			return c.fault(at+".path", "%s.path.%d: %q is not a node of agent %q's graph (nodes: %s)", at, i, n, c.Agent, strings.Join(nodes, ", "))
		}
	}
	if e.Interrupt != "" {
		for _, n := range strings.Split(e.Interrupt, ",") {
			if root, _, _ := strings.Cut(n, "/"); !slices.Contains(nodes, root) {
				return c.fault(at, "%s.interrupt: %q is not a node of agent %q's graph (nodes: %s)", at, n, c.Agent, strings.Join(nodes, ", "))
			}
		}
	}
	for i, name := range e.Tools {
		if !slices.Contains(tools, name) {
			known := "the bundle has no tool registry"
			if len(tools) > 0 {
				known = "tools: " + strings.Join(tools, ", ")
			}
			return c.fault(at+".tools", "%s.tools.%d: %q is not a tool of the bundle's registry (%s)", at, i, name, known)
		}
		if allowed != nil && !slices.Contains(allowed, name) {
			known := "it names none"
			if len(allowed) > 0 {
				known = "tools: " + strings.Join(allowed, ", ")
			}
			return c.fault(at+".tools", "%s.tools.%d: %q is not in agent %q's allowlist (%s): the agent can never call it, "+
				"and a refused call is not listed", at, i, name, c.Agent, known)
		}
	}
	return nil
}
