package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
)

// Kind says whether a tool only reads or changes something outside the run.
// Write tools need approval before they run.
type Kind string

// Tool kinds.
const (
	KindRead  Kind = "read"
	KindWrite Kind = "write"
)

// Tool is one entry of a bundle's tool registry.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Kind        Kind   `json:"kind"`
	// Idempotent tools may be re-run with the same idempotency key when a
	// crash left an intent without a result; any other tool then waits for
	// a person.
	Idempotent bool `json:"idempotent"`
	// Schema is the JSON Schema of the arguments, an object schema. An
	// absent schema means the tool takes no arguments (not "any arguments").
	Schema json.RawMessage `json:"schema,omitempty"`
}

// Registry is a validated set of tools: the ceiling of every active tool
// set. It is immutable once built.
type Registry struct {
	tools   map[string]Tool
	schemas map[string]*Schema
	names   []string
}

// toolNameRE is the name syntax that OpenAI- and Ollama-style function
// calling accepts, with a leading letter so names never look like numbers
// or flags.
var toolNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// noArgsSchema is what a tool without a schema accepts: an empty object.
var noArgsSchema = json.RawMessage(`{"type":"object","additionalProperties":false}`)

// NewRegistry validates tools and builds a registry. Every problem is
// reported (joined), each wrapping ErrBadRule and naming the tool.
func NewRegistry(tools []Tool) (*Registry, error) {
	r := &Registry{tools: map[string]Tool{}, schemas: map[string]*Schema{}}
	var errs []error
	for i, t := range tools {
		what := fmt.Sprintf("tool %d (%q)", i, t.Name)
		at := fmt.Sprintf("tools.%d", i)
		if !toolNameRE.MatchString(t.Name) {
			errs = append(errs, itemError(at, fmt.Errorf("%w: %s: name must match %s", ErrBadRule, what, toolNameRE)))
			continue
		}
		if _, dup := r.tools[t.Name]; dup {
			errs = append(errs, itemError(at, fmt.Errorf("%w: %s: declared twice", ErrBadRule, what)))
			continue
		}
		if t.Kind != KindRead && t.Kind != KindWrite {
			// No default: a tool whose kind was forgotten must not slip in as
			// a read tool and skip approval.
			errs = append(errs, itemError(at, fmt.Errorf("%w: %s: kind must be %q or %q, got %q", ErrBadRule, what, KindRead, KindWrite, t.Kind)))
			continue
		}
		raw := t.Schema
		if len(bytes.TrimSpace(raw)) == 0 {
			raw = noArgsSchema
		}
		s, err := CompileSchema(raw)
		if err != nil {
			errs = append(errs, itemError(at, fmt.Errorf("%s: %w", what, err)))
			continue
		}
		if len(s.types) != 1 || s.types[0] != "object" {
			errs = append(errs, itemError(at, fmt.Errorf("%w: %s: schema must have \"type\": \"object\" (tool arguments are an object)", ErrBadRule, what)))
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			errs = append(errs, itemError(at, fmt.Errorf("%w: %s: schema: %v", ErrBadRule, what, err)))
			continue
		}
		t.Schema = buf.Bytes()
		r.tools[t.Name] = t
		r.schemas[t.Name] = s
		r.names = append(r.names, t.Name)
	}
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	sort.Strings(r.names)
	return r, nil
}

// registryFile is the on-disk shape of a registry: an object, so that it
// can grow fields without breaking old readers.
type registryFile struct {
	Tools []Tool `json:"tools"`
}

// DecodeRegistry reads a registry file, {"tools": [...]}, strictly: unknown
// fields, duplicate keys and trailing data are errors that give a line and
// column.
func DecodeRegistry(data []byte) (*Registry, error) {
	var f registryFile
	if err := decodeStrict("tool registry", data, &f); err != nil {
		return nil, err
	}
	if f.Tools == nil {
		return nil, fmt.Errorf("%w: tool registry: missing \"tools\"", ErrBadRule)
	}
	return NewRegistry(f.Tools)
}

// Lookup returns the named tool.
func (r *Registry) Lookup(name string) (Tool, bool) {
	t, ok := r.tools[name]
	return cloneTool(t), ok
}

// Names returns the tool names, sorted.
func (r *Registry) Names() []string {
	return append([]string(nil), r.names...)
}

// Tools returns the tools sorted by name, for handing to a model.
func (r *Registry) Tools() []Tool {
	out := make([]Tool, len(r.names))
	for i, n := range r.names {
		out[i] = cloneTool(r.tools[n])
	}
	return out
}

// MarshalJSON writes the registry in the form DecodeRegistry reads.
func (r *Registry) MarshalJSON() ([]byte, error) {
	return json.Marshal(registryFile{Tools: r.Tools()})
}

// cloneTool copies the schema bytes so that callers cannot change a pinned
// tool through a shared slice.
func cloneTool(t Tool) Tool {
	t.Schema = append(json.RawMessage(nil), t.Schema...)
	return t
}

// joinErrors is errors.Join with one error per line; kept separate so the
// message format is decided in one place.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return &multiError{errs}
}

type multiError struct{ errs []error }

func (m *multiError) Error() string {
	var b bytes.Buffer
	for i, e := range m.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

func (m *multiError) Unwrap() []error { return m.errs }
