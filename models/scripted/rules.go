package scripted

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/outpost-edge/outpost/models"
)

// Rule maps a pattern on the last user message to a scripted answer.
type Rule struct {
	// Name identifies the rule in errors; optional.
	Name string `json:"name,omitempty"`
	// Match is an RE2 pattern searched in the last user message; empty
	// matches any message.
	Match string `json:"match,omitempty"`
	// WhenToolResult limits the rule to calls where this turn already has
	// tool results; WhenNoToolResult to calls where it has none. Together
	// they script the tool loop: call a tool first, then answer from it.
	WhenToolResult   bool `json:"when_tool_result,omitempty"`
	WhenNoToolResult bool `json:"when_no_tool_result,omitempty"`
	// ToolResult is an RE2 pattern searched in the turn's tool results;
	// a rule with one applies only when they match it (it implies
	// when_tool_result). It lets an answer tell a refused call from one
	// that ran.
	ToolResult string `json:"tool_result,omitempty"`
	// Respond is the answer's template.
	Respond string `json:"respond,omitempty"`
	// Thinking is a template streamed as thinking before the answer.
	Thinking string `json:"thinking,omitempty"`
	// ToolCalls are emitted with the answer; string values in their
	// arguments are templates too.
	ToolCalls []ToolCallTemplate `json:"tool_calls,omitempty"`
	// Fail makes the call fail with this models.ErrorKind name
	// ("timeout", "unreachable", "server", ...), to script a failure.
	Fail string `json:"fail,omitempty"`
}

// ToolCallTemplate is a scripted tool call. Arguments is a JSON object.
type ToolCallTemplate struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// MaxRulesSize bounds what ParseRules reads: rules are hand-written data
// from a bundle, and a runaway file should fail, not exhaust memory.
const MaxRulesSize = 1 << 20

// maxPattern bounds one pattern; RE2 is linear-time, but its compiled size
// grows with the pattern.
const maxPattern = 4096

// ErrBadRules is wrapped by every rule validation failure.
var ErrBadRules = errors.New("invalid scripted rules")

// placeholder finds {{...}} in templates, to reject ones we do not fill in:
// a typo would otherwise reach the user verbatim.
var placeholder = regexp.MustCompile(`\{\{[^{}]*\}\}`)

var knownPlaceholders = map[string]bool{"{{input}}": true, "{{context}}": true, "{{match}}": true}

func init() {
	for i := 1; i <= 9; i++ {
		knownPlaceholders["{{"+strconv.Itoa(i)+"}}"] = true
	}
}

// ParseRules decodes a JSON array of rules strictly: unknown fields,
// trailing data, bad patterns, unknown placeholders and rules that would
// answer nothing are errors wrapping ErrBadRules.
func ParseRules(data []byte) ([]Rule, error) {
	if len(data) > MaxRulesSize {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrBadRules, len(data), MaxRulesSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var rules []Rule
	if err := dec.Decode(&rules); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRules, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the rules", ErrBadRules)
	}
	if rules == nil {
		return nil, fmt.Errorf("%w: expected a JSON array of rules", ErrBadRules)
	}
	for i := range rules {
		if _, err := compileRule(rules[i]); err != nil {
			return nil, fmt.Errorf("%w: rule %d%s: %v", ErrBadRules, i, ruleName(rules[i]), err)
		}
	}
	return rules, nil
}

func ruleName(r Rule) string {
	if r.Name == "" {
		return ""
	}
	return fmt.Sprintf(" (%q)", r.Name)
}

// compiled is a validated rule with its pattern compiled and its tool-call
// arguments decoded, so a call does no parsing that could fail.
type compiled struct {
	Rule
	re       *regexp.Regexp
	toolRe   *regexp.Regexp
	failKind models.ErrorKind
	args     []any // decoded arguments of each tool call
}

func compileRule(r Rule) (*compiled, error) {
	c := &compiled{Rule: r}
	if len(r.Match) > maxPattern {
		return nil, fmt.Errorf("pattern longer than %d bytes", maxPattern)
	}
	if r.Match != "" {
		re, err := regexp.Compile(r.Match)
		if err != nil {
			return nil, fmt.Errorf("pattern: %v", err)
		}
		c.re = re
	}
	if r.WhenToolResult && r.WhenNoToolResult {
		return nil, errors.New("when_tool_result and when_no_tool_result exclude each other")
	}
	if r.ToolResult != "" {
		if r.WhenNoToolResult {
			return nil, errors.New("tool_result and when_no_tool_result exclude each other")
		}
		if len(r.ToolResult) > maxPattern {
			return nil, fmt.Errorf("tool_result pattern longer than %d bytes", maxPattern)
		}
		re, err := regexp.Compile(r.ToolResult)
		if err != nil {
			return nil, fmt.Errorf("tool_result pattern: %v", err)
		}
		c.toolRe = re
	}
	if r.Fail != "" {
		kind, ok := models.ParseErrorKind(r.Fail)
		if !ok {
			return nil, fmt.Errorf("fail: unknown error kind %q", r.Fail)
		}
		c.failKind = kind
	} else if r.Respond == "" && len(r.ToolCalls) == 0 {
		return nil, errors.New("a rule needs respond, tool_calls or fail")
	}
	for _, tmpl := range []string{r.Respond, r.Thinking} {
		if err := checkPlaceholders(tmpl); err != nil {
			return nil, err
		}
	}
	for i, tc := range r.ToolCalls {
		if tc.Name == "" {
			return nil, fmt.Errorf("tool call %d: no name", i)
		}
		var args any = map[string]any{}
		if len(bytes.TrimSpace(tc.Arguments)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(tc.Arguments))
			dec.UseNumber() // keep numbers exactly as written
			args = nil
			if err := dec.Decode(&args); err != nil {
				return nil, fmt.Errorf("tool call %d (%s): arguments: %v", i, tc.Name, err)
			}
			if _, ok := args.(map[string]any); !ok {
				return nil, fmt.Errorf("tool call %d (%s): arguments must be a JSON object", i, tc.Name)
			}
		}
		if err := walkStrings(args, checkPlaceholders); err != nil {
			return nil, fmt.Errorf("tool call %d (%s): %v", i, tc.Name, err)
		}
		c.args = append(c.args, args)
	}
	return c, nil
}

func checkPlaceholders(tmpl string) error {
	for _, p := range placeholder.FindAllString(tmpl, -1) {
		if !knownPlaceholders[p] {
			return fmt.Errorf("unknown placeholder %s (known: {{input}}, {{context}}, {{match}}, {{1}}..{{9}})", p)
		}
	}
	return nil
}

func walkStrings(v any, check func(string) error) error {
	switch v := v.(type) {
	case string:
		return check(v)
	case map[string]any:
		for _, x := range v {
			if err := walkStrings(x, check); err != nil {
				return err
			}
		}
	case []any:
		for _, x := range v {
			if err := walkStrings(x, check); err != nil {
				return err
			}
		}
	}
	return nil
}

// expandStrings returns a copy of v with every string passed through fill.
// Expanding the decoded value, not the JSON text, keeps a substituted quote
// or backslash from breaking (or injecting into) the arguments.
func expandStrings(v any, fill func(string) string) any {
	switch v := v.(type) {
	case string:
		return fill(v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = expandStrings(x, fill)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = expandStrings(x, fill)
		}
		return out
	}
	return v
}
