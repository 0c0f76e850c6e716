package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// Layers that can deny a tool call, as reported in CheckResult.Layer and in
// tool.unauthorized events.
const (
	LayerRegistry  = "registry"  // the tool is not in the bundle at all
	LayerAgent     = "agent"     // the agent's own allowlist leaves it out
	LayerAppliance = "appliance" // the appliance configuration removed it
	LayerRequest   = "request"   // the request narrowed it away
	LayerSchema    = "schema"    // the arguments do not match its schema
)

// ActiveSet is the set of tools one run may call: the registry (ceiling),
// narrowed by the agent's allowlist, narrowed by the appliance's runtime
// restriction, narrowed by the request's override. It is resolved once at
// run start and pinned: it never changes, and its JSON form (MarshalJSON,
// DecodeActiveSet) is stored on the run so that a resumed run checks calls
// exactly as before the restart.
type ActiveSet struct {
	tools    map[string]Tool
	schemas  map[string]*Schema
	names    []string
	excluded map[string]string // ceiling tools left out, and the layer that left them out
	ignored  []string
}

// Resolve computes the active tool set. The layers narrow in order: the
// registry (ceiling) holds every tool the bundle has; agent is the agent's
// allowlist; runtime the appliance's restriction; override the request's.
// For agent, runtime and override, nil means "no restriction at this
// layer" and an empty non-nil slice means "no tools". A tool of the ceiling
// left out is recorded with the first layer that leaves it out
// (ExcludedBy), so that a refused call names it. Names in agent or runtime
// that the ceiling lacks grant nothing and are not errors here (a bundle's
// verification refuses them in an agent's allowlist; one appliance
// configuration may serve several bundles). The override can only narrow:
// a name it gives outside the layers above is not an error (requests are
// written without knowing the appliance's configuration) but it grants
// nothing, and it is listed by Ignored.
func Resolve(ceiling *Registry, agent, runtime, override []string) (*ActiveSet, error) {
	if ceiling == nil {
		return nil, fmt.Errorf("%w: resolve tools: no registry", ErrBadRule)
	}
	inAgent := nameSet(agent)
	inRuntime := nameSet(runtime)
	inOverride := nameSet(override)
	a := &ActiveSet{
		tools:    map[string]Tool{},
		schemas:  map[string]*Schema{},
		excluded: map[string]string{},
	}
	for _, n := range ceiling.names {
		switch {
		case inAgent != nil && !inAgent[n]:
			a.excluded[n] = LayerAgent
		case inRuntime != nil && !inRuntime[n]:
			a.excluded[n] = LayerAppliance
		case inOverride != nil && !inOverride[n]:
			a.excluded[n] = LayerRequest
		default:
			a.tools[n] = ceiling.tools[n]
			a.schemas[n] = ceiling.schemas[n]
			a.names = append(a.names, n)
		}
	}
	for n := range inOverride {
		if _, ok := a.tools[n]; !ok {
			a.ignored = append(a.ignored, n)
		}
	}
	sort.Strings(a.ignored)
	return a, nil
}

func nameSet(names []string) map[string]bool {
	if names == nil {
		return nil
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set
}

// Names returns the active tool names, sorted.
func (a *ActiveSet) Names() []string { return append([]string(nil), a.names...) }

// Tools returns the active tools sorted by name: the definitions to offer
// the model.
func (a *ActiveSet) Tools() []Tool {
	out := make([]Tool, len(a.names))
	for i, n := range a.names {
		out[i] = cloneTool(a.tools[n])
	}
	return out
}

// Ignored returns the override's names that granted nothing because the
// layers above did not allow them, sorted.
func (a *ActiveSet) Ignored() []string { return append([]string(nil), a.ignored...) }

// ExcludedBy returns the layer that left name, a tool of the ceiling, out
// of the set ("agent", "appliance" or "request"), or "" for a tool in the
// set or one the ceiling lacks.
func (a *ActiveSet) ExcludedBy(name string) string { return a.excluded[name] }

// CheckResult is the verdict on one tool call.
type CheckResult struct {
	Allowed bool
	// Layer names what denied the call: "registry", "agent", "appliance",
	// "request" or "schema". It is empty when the call is allowed.
	Layer  string
	Reason string
	// Tool is the tool's definition, when the registry knows it.
	Tool Tool
	// NeedsApproval is set for allowed write tools: see Approval.
	NeedsApproval bool
	// Err wraps ErrToolUnknown, ErrToolDenied or ErrArgsInvalid (an
	// *ArgsError) when the call is denied.
	Err error
}

// Check decides whether a call to name with args may proceed. Empty or
// "null" args stand for an empty object, since models often omit them for
// tools that take none.
func (a *ActiveSet) Check(name string, args json.RawMessage) CheckResult {
	t, ok := a.tools[name]
	if !ok {
		layer, known := a.excluded[name]
		if !known {
			reason := fmt.Sprintf("tool %q is not in the registry", name)
			return CheckResult{Layer: LayerRegistry, Reason: reason, Err: fmt.Errorf("%w: %s", ErrToolUnknown, reason)}
		}
		who := "the appliance configuration"
		switch layer {
		case LayerAgent:
			who = "the agent's allowlist"
		case LayerRequest:
			who = "this request"
		}
		reason := fmt.Sprintf("tool %q is not allowed by %s", name, who)
		return CheckResult{Layer: layer, Reason: reason, Err: fmt.Errorf("%w: %s", ErrToolDenied, reason)}
	}
	trimmed := bytes.TrimSpace(args)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		args = json.RawMessage(`{}`)
	}
	if err := a.schemas[name].Validate(args); err != nil {
		return CheckResult{
			Layer:  LayerSchema,
			Reason: fmt.Sprintf("arguments for %q: %v", name, err),
			Tool:   cloneTool(t),
			Err:    fmt.Errorf("tool %q: %w", name, err),
		}
	}
	return CheckResult{Allowed: true, Tool: cloneTool(t), NeedsApproval: t.Kind == KindWrite}
}

// activeSetVersion versions the pinned form; a reader refuses versions it
// does not know rather than guessing. The "agent" layer came later within
// version 1: a set pinned before it simply has no tool excluded by it, and
// an older reader refuses a set that has one (an unknown layer), which
// fails closed.
const activeSetVersion = 1

type activeSetFile struct {
	Version  int               `json:"version"`
	Tools    []Tool            `json:"tools"`
	Excluded map[string]string `json:"excluded"`
	Ignored  []string          `json:"ignored"`
}

// MarshalJSON writes the pinned form: the full definitions of the active
// tools (so the pin does not depend on a registry that may change), the
// ceiling tools left out with the layer that left them out, and the ignored
// names. The output is stable: the same set always gives the same bytes.
func (a *ActiveSet) MarshalJSON() ([]byte, error) {
	f := activeSetFile{Version: activeSetVersion, Tools: a.Tools(), Excluded: a.excluded, Ignored: a.ignored}
	if f.Ignored == nil {
		f.Ignored = []string{}
	}
	return json.Marshal(f)
}

// DecodeActiveSet reads a pinned active set written by MarshalJSON. The
// tools are validated again, so a corrupted pin fails closed.
func DecodeActiveSet(data []byte) (*ActiveSet, error) {
	var f activeSetFile
	if err := decodeStrict("active tool set", data, &f); err != nil {
		return nil, err
	}
	if f.Version != activeSetVersion {
		return nil, fmt.Errorf("%w: active tool set: version %d, want %d", ErrBadRule, f.Version, activeSetVersion)
	}
	reg, err := NewRegistry(f.Tools)
	if err != nil {
		return nil, fmt.Errorf("active tool set: %w", err)
	}
	a := &ActiveSet{tools: reg.tools, schemas: reg.schemas, names: reg.names, excluded: map[string]string{}}
	for n, layer := range f.Excluded {
		if layer != LayerAgent && layer != LayerAppliance && layer != LayerRequest {
			return nil, fmt.Errorf("%w: active tool set: tool %q excluded by unknown layer %q", ErrBadRule, n, layer)
		}
		if _, active := a.tools[n]; active {
			return nil, fmt.Errorf("%w: active tool set: tool %q is both active and excluded", ErrBadRule, n)
		}
		a.excluded[n] = layer
	}
	a.ignored = append([]string(nil), f.Ignored...)
	sort.Strings(a.ignored)
	return a, nil
}
