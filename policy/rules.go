package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// DefaultCitationPattern finds citations such as "[kb-03]" in a draft.
const DefaultCitationPattern = `\[(kb-[0-9]+)\]`

// DefaultOutOfScopeFlag is the flag Pre raises for an out-of-scope input when
// the rules do not name one.
const DefaultOutOfScopeFlag = "out_of_scope"

// Rules are an agent's guardrails, loaded from its bundle as data: red flags
// that short-circuit to a fixed answer, the topics the agent may discuss,
// how citations are written, and standing approvals for write tools.
type Rules struct {
	RedFlags []RedFlag `json:"red_flags"`
	Scope    Scope     `json:"scope"`
	// Citation is named in the singular only because Go forbids a field and
	// a method of the same name; its JSON name is "citations".
	Citation  CitationRule   `json:"citations"`
	Approvals []ApprovalRule `json:"approvals,omitempty"`

	c *compiledRules // set by Compile
}

type compiledRules struct {
	redFlags []*regexp.Regexp // one per red flag
	keywords []*regexp.Regexp
	citeRE   *regexp.Regexp
}

// RedFlag is an input that must not reach the model, such as a symptom that
// needs emergency care: Pre answers it with Template.
type RedFlag struct {
	Name string `json:"name"`
	// Pattern is a Go regular expression, matched case-insensitively
	// against the input with invisible characters removed.
	Pattern  string `json:"pattern"`
	Flag     string `json:"flag"`
	Template string `json:"template"`
}

// Scope lists what the agent is for. An input that contains none of the
// keywords gets Refusal. No keywords means every input is in scope.
type Scope struct {
	// Keywords match case-insensitively at the start of a word: "dose"
	// matches "doses" but not "overdose", so list each form that matters.
	Keywords []string `json:"keywords"`
	Refusal  string   `json:"refusal"`
	// Flag is raised for out-of-scope inputs; it defaults to "out_of_scope".
	Flag string `json:"flag,omitempty"`
}

// CitationRule says how a draft cites retrieved documents. Pattern's first
// capture group (or, without one, the whole match) is the cited id.
type CitationRule struct {
	Pattern string `json:"pattern"`
}

// DecodeRules reads and compiles guardrail rules strictly: unknown fields,
// bad patterns, red flags without a flag or template, and a scope without a
// refusal are all errors wrapping ErrBadRule.
func DecodeRules(data []byte) (*Rules, error) {
	var r Rules
	if err := decodeStrict("rules", data, &r); err != nil {
		return nil, err
	}
	if err := r.Compile(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Compile checks the rules and prepares their patterns. DecodeRules calls
// it; call it yourself on Rules built in Go.
func (r *Rules) Compile() error {
	c, err := r.compile()
	if err != nil {
		return err
	}
	r.c = c
	return nil
}

func (r *Rules) compile() (*compiledRules, error) {
	c := &compiledRules{}
	seen := map[string]bool{}
	for i, f := range r.RedFlags {
		what := fmt.Sprintf("red flag %d (%q)", i, f.Name)
		at := fmt.Sprintf("red_flags.%d", i)
		switch {
		case f.Name == "":
			return nil, itemError(at, fmt.Errorf("%w: %s: no name", ErrBadRule, what))
		case seen[f.Name]:
			return nil, itemError(at, fmt.Errorf("%w: %s: declared twice", ErrBadRule, what))
		case f.Flag == "":
			return nil, itemError(at, fmt.Errorf("%w: %s: no flag", ErrBadRule, what))
		case strings.TrimSpace(f.Template) == "":
			return nil, itemError(at, fmt.Errorf("%w: %s: no template", ErrBadRule, what))
		case f.Pattern == "":
			return nil, itemError(at, fmt.Errorf("%w: %s: no pattern", ErrBadRule, what))
		}
		seen[f.Name] = true
		re, err := regexp.Compile("(?i)" + f.Pattern)
		if err != nil {
			return nil, itemError(at, fmt.Errorf("%w: %s: pattern: %v", ErrBadRule, what, err))
		}
		c.redFlags = append(c.redFlags, re)
	}
	for _, k := range r.Scope.Keywords {
		k = strings.TrimSpace(k)
		if k == "" {
			return nil, itemError("scope", fmt.Errorf("%w: scope: empty keyword", ErrBadRule))
		}
		c.keywords = append(c.keywords, regexp.MustCompile(`(?i)(^|[^\pL\pN])`+regexp.QuoteMeta(k)))
	}
	if len(c.keywords) > 0 && strings.TrimSpace(r.Scope.Refusal) == "" {
		return nil, itemError("scope", fmt.Errorf("%w: scope: keywords without a refusal", ErrBadRule))
	}
	pattern := r.Citation.Pattern
	if pattern == "" {
		pattern = DefaultCitationPattern
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, itemError("citations", fmt.Errorf("%w: citations: pattern: %v", ErrBadRule, err))
	}
	if re.NumSubexp() > 1 {
		return nil, itemError("citations", fmt.Errorf("%w: citations: pattern has %d groups, want at most one (the id)", ErrBadRule, re.NumSubexp()))
	}
	c.citeRE = re
	for i, a := range r.Approvals {
		if err := a.Validate(); err != nil {
			return nil, itemError(fmt.Sprintf("approvals.%d", i), err)
		}
	}
	return c, nil
}

// ready returns the compiled rules. Rules written as Go literals without a
// Compile call are compiled per call rather than cached, so that concurrent
// readers never race on the cache; errors fail closed in the callers.
func (r *Rules) ready() (*compiledRules, error) {
	if r.c != nil {
		return r.c, nil
	}
	return r.compile()
}

// FlagRulesInvalid is the flag Pre raises when the rules do not compile.
const FlagRulesInvalid = "rules_invalid"

// PreFlags lists every flag Pre can raise, sorted: each red flag's, and the
// scope's where the scope has keywords (FlagRulesInvalid alone where the
// rules do not compile).
func (r *Rules) PreFlags() []string {
	c, err := r.ready()
	if err != nil {
		return []string{FlagRulesInvalid}
	}
	var flags []string
	for _, f := range r.RedFlags {
		flags = append(flags, f.Flag)
	}
	if len(c.keywords) > 0 {
		flag := r.Scope.Flag
		if flag == "" {
			flag = DefaultOutOfScopeFlag
		}
		flags = append(flags, flag)
	}
	slices.Sort(flags)
	return slices.Compact(flags)
}

// Pre screens an input before the model sees it. Every matching red flag
// adds its flag; the first one (in rule order) supplies shortCircuit, the
// answer to give instead of running the model. An input that matches no red
// flag and no scope keyword gets the scope's flag and refusal. Rules that do
// not compile refuse everything: a guardrail that cannot run must not wave
// inputs through.
func (r *Rules) Pre(input string) (flags []string, shortCircuit string) {
	c, err := r.ready()
	if err != nil {
		return []string{FlagRulesInvalid}, "This assistant is not available right now."
	}
	text := normalizeInput(input)
	flags = []string{}
	seen := map[string]bool{}
	for i, re := range c.redFlags {
		if !re.MatchString(text) {
			continue
		}
		f := r.RedFlags[i]
		if !seen[f.Flag] {
			seen[f.Flag] = true
			flags = append(flags, f.Flag)
		}
		if shortCircuit == "" {
			shortCircuit = f.Template
		}
	}
	if shortCircuit != "" || len(c.keywords) == 0 {
		return flags, shortCircuit
	}
	for _, k := range c.keywords {
		if k.MatchString(text) {
			return flags, ""
		}
	}
	flag := r.Scope.Flag
	if flag == "" {
		flag = DefaultOutOfScopeFlag
	}
	return append(flags, flag), r.Scope.Refusal
}

// normalizeInput removes what would let an input dodge a pattern while
// reading the same to a person: invisible characters, and runs of spacing.
func normalizeInput(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	space := false
	for _, r := range s {
		switch {
		case isInvisible(r) || isControl(r) && r != '\n' && r != '\t':
		case r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == 0xA0:
			space = true
		default:
			if space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = false
			b.WriteRune(foldRune(r))
		}
	}
	return b.String()
}

// Citations checks the ids a draft cites against the ids retrieved for it.
// cited lists each cited id once, in order of first appearance; uncited is
// set when the draft cites nothing; foreign lists cited ids that were not
// retrieved. A draft is high-risk when uncited or foreign is non-empty (see
// HighRisk).
func (r *Rules) Citations(draft string, retrieved []string) (cited []string, uncited bool, foreign []string) {
	c, err := r.ready()
	if err != nil {
		return []string{}, true, []string{}
	}
	have := map[string]bool{}
	for _, id := range retrieved {
		have[id] = true
	}
	seen := map[string]bool{}
	cited, foreign = []string{}, []string{}
	for _, m := range c.citeRE.FindAllStringSubmatch(draft, -1) {
		id := m[0]
		if len(m) > 1 {
			id = m[1]
		}
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		cited = append(cited, id)
		if !have[id] {
			foreign = append(foreign, id)
		}
	}
	return cited, len(cited) == 0, foreign
}

// HighRisk reports whether a draft needs a person's review: it cites
// nothing, or cites something that was not retrieved.
func (r *Rules) HighRisk(draft string, retrieved []string) bool {
	_, uncited, foreign := r.Citations(draft, retrieved)
	return uncited || len(foreign) > 0
}
