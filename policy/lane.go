package policy

import (
	"fmt"
	"strings"
)

// Lane is the set of models an agent may use. Each entry is an exact model
// name ("llama3.2:3b") or a family pattern ("llama3.2:*") matching every tag
// of that model. Names compare as Ollama compares them: case-insensitively,
// with a missing tag meaning ":latest". There is no catch-all "*": a lane
// names what it trusts.
type Lane struct {
	Agent  string   `json:"agent"`
	Models []string `json:"models"`
}

// Validate reports a lane that could never allow anything or that uses an
// unsupported pattern.
func (l Lane) Validate() error {
	if l.Agent == "" {
		return fmt.Errorf("%w: lane: no agent", ErrBadRule)
	}
	if len(l.Models) == 0 {
		return fmt.Errorf("%w: lane for %q: no models", ErrBadRule, l.Agent)
	}
	for _, m := range l.Models {
		name, tag := splitModel(m)
		if name == "" || strings.Contains(name, "*") || (strings.Contains(tag, "*") && tag != "*") {
			return fmt.Errorf("%w: lane for %q: %q is neither a model name nor a \"family:*\" pattern", ErrBadRule, l.Agent, m)
		}
	}
	return nil
}

// Allow returns nil if model is in the lane, and otherwise an error wrapping
// ErrModelNotInLane that names the agent, the model and the lane.
func (l Lane) Allow(model string) error {
	name, tag := splitModel(model)
	if name != "" && !strings.Contains(model, "*") {
		for _, m := range l.Models {
			mn, mt := splitModel(m)
			if mn == name && (mt == "*" || mt == tag) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: agent %q may not use model %q (lane: %s)", ErrModelNotInLane, l.Agent, model, strings.Join(l.Models, ", "))
}

// splitModel splits "name:tag", lowercased, with "latest" for a missing
// tag. The tag follows the last colon after the last slash, since a
// registry host may carry a port ("host:5000/library/llama3.2:3b").
func splitModel(s string) (name, tag string) {
	s = strings.ToLower(strings.TrimSpace(s))
	slash := strings.LastIndexByte(s, '/')
	if i := strings.LastIndexByte(s, ':'); i > slash {
		name, tag = s[:i], s[i+1:]
	} else {
		name, tag = s, ""
	}
	if tag == "" {
		tag = "latest"
	}
	return name, tag
}
