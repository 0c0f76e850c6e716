package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testRules = `{
  "red_flags": [
    {"name": "chest_pain", "pattern": "chest (pain|tightness)", "flag": "acute", "template": "Call emergency services now."},
    {"name": "overdose", "pattern": "\\b(overdose|took too many)\\b", "flag": "acute", "template": "Call poison control now."},
    {"name": "self_harm", "pattern": "hurt myself", "flag": "self_harm", "template": "Please call a crisis line."}
  ],
  "scope": {"keywords": ["dose", "medication", "metformin", "pill", "tablet", "side effect"], "refusal": "I can only help with your medications."},
  "citations": {},
  "approvals": [{"tool": "record_note", "decision": "allow", "reason": "reviewed daily"}]
}`

func mustRules(t testing.TB) *Rules {
	t.Helper()
	r, err := DecodeRules([]byte(testRules))
	require.NoError(t, err)
	return r
}

func TestRulesPre(t *testing.T) {
	r := mustRules(t)
	tests := []struct {
		name, input string
		flags       []string
		short       string
	}{
		{"in scope", "I forgot my metformin dose", []string{}, ""},
		{"keyword at word start", "how many doses today?", []string{}, ""},
		{"keyword case-insensitive", "MEDICATION question", []string{}, ""},
		{"keyword inside a word does not count", "a tablespoon of sugar, overdoses of sun", []string{"out_of_scope"}, "I can only help with your medications."},
		{"red flag short-circuits", "now I have chest pain", []string{"acute"}, "Call emergency services now."},
		{"red flag case-insensitive", "CHEST TIGHTNESS after my pill", []string{"acute"}, "Call emergency services now."},
		{"red flag through zero-width chars", "chest\u200b pain", []string{"acute"}, "Call emergency services now."},
		{"red flag through extra spacing", "chest \n\t pain", []string{"acute"}, "Call emergency services now."},
		{"first red flag supplies the template; flags deduplicated", "I took too many pills and have chest pain", []string{"acute"}, "Call emergency services now."},
		{"several flags", "I want to hurt myself, I took too many", []string{"acute", "self_harm"}, "Call poison control now."},
		{"out of scope", "what's the weather in Lisbon?", []string{"out_of_scope"}, "I can only help with your medications."},
		{"empty input is out of scope", "", []string{"out_of_scope"}, "I can only help with your medications."},
		{"multi-word keyword", "is dizziness a side effect?", []string{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, short := r.Pre(tt.input)
			assert.Equal(t, tt.flags, flags)
			assert.Equal(t, tt.short, short)
		})
	}
}

func TestRulesPreWithoutScopeOrCompile(t *testing.T) {
	// Rules built in Go work without an explicit Compile.
	r := &Rules{RedFlags: []RedFlag{{Name: "x", Pattern: "bleeding", Flag: "acute", Template: "T"}}}
	flags, short := r.Pre("anything at all")
	assert.Equal(t, []string{}, flags)
	assert.Equal(t, "", short)
	flags, short = r.Pre("Bleeding gums")
	assert.Equal(t, []string{"acute"}, flags)
	assert.Equal(t, "T", short)

	// Rules that cannot compile refuse everything.
	bad := &Rules{RedFlags: []RedFlag{{Name: "x", Pattern: "(", Flag: "acute", Template: "T"}}}
	flags, short = bad.Pre("hello")
	assert.Equal(t, []string{"rules_invalid"}, flags)
	assert.NotEmpty(t, short)
	_, uncited, _ := bad.Citations("[kb-1]", []string{"kb-1"})
	assert.True(t, uncited)
}

func TestRulesCitations(t *testing.T) {
	r := mustRules(t)
	retrieved := []string{"kb-03", "kb-07"}
	tests := []struct {
		name, draft      string
		cited, foreign   []string
		uncited, highRis bool
	}{
		{"cites retrieved", "Take it with food [kb-03].", []string{"kb-03"}, []string{}, false, false},
		{"cites two, deduplicated in order", "A [kb-07]. B [kb-03]. C [kb-07].", []string{"kb-07", "kb-03"}, []string{}, false, false},
		{"cites nothing", "Take it with food.", []string{}, []string{}, true, true},
		{"cites something not retrieved", "As [kb-03] and [kb-99] say.", []string{"kb-03", "kb-99"}, []string{"kb-99"}, false, true},
		{"id without brackets is not a citation", "see kb-03", []string{}, []string{}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cited, uncited, foreign := r.Citations(tt.draft, retrieved)
			assert.Equal(t, tt.cited, cited)
			assert.Equal(t, tt.uncited, uncited)
			assert.Equal(t, tt.foreign, foreign)
			assert.Equal(t, tt.highRis, r.HighRisk(tt.draft, retrieved))
		})
	}

	custom, err := DecodeRules([]byte(`{"red_flags":[],"scope":{"keywords":[],"refusal":""},"citations":{"pattern":"\\(source: ([a-z0-9-]+)\\)"}}`))
	require.NoError(t, err)
	cited, uncited, foreign := custom.Citations("Yes (source: doc-1).", []string{"doc-1"})
	assert.Equal(t, []string{"doc-1"}, cited)
	assert.False(t, uncited)
	assert.Empty(t, foreign)
}

func TestDecodeRulesErrors(t *testing.T) {
	tests := []struct{ name, data, want string }{
		{"unknown field", `{"red_flags":[],"scope":{"keywords":[],"refusal":"","extra":1}}`, `unknown field "scope.extra"`},
		{"bad pattern", `{"red_flags":[{"name":"a","pattern":"(","flag":"f","template":"t"}]}`, `red flag 0 ("a"): pattern`},
		{"no flag", `{"red_flags":[{"name":"a","pattern":"x","template":"t"}]}`, "no flag"},
		{"no template", `{"red_flags":[{"name":"a","pattern":"x","flag":"f","template":" "}]}`, "no template"},
		{"no name", `{"red_flags":[{"pattern":"x","flag":"f","template":"t"}]}`, "no name"},
		{"no pattern", `{"red_flags":[{"name":"a","flag":"f","template":"t"}]}`, "no pattern"},
		{"duplicate name", `{"red_flags":[{"name":"a","pattern":"x","flag":"f","template":"t"},{"name":"a","pattern":"y","flag":"f","template":"t"}]}`, "declared twice"},
		{"keywords without refusal", `{"scope":{"keywords":["dose"]}}`, "keywords without a refusal"},
		{"empty keyword", `{"scope":{"keywords":[" "],"refusal":"no"}}`, "empty keyword"},
		{"bad citation pattern", `{"citations":{"pattern":"["}}`, "citations: pattern"},
		{"citation pattern with two groups", `{"citations":{"pattern":"(a)(b)"}}`, "want at most one"},
		{"bad approval", `{"approvals":[{"tool":"x","decision":"sure"}]}`, "decision must be"},
		{"trailing data", `{} {}`, "unexpected data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRules([]byte(tt.data))
			assert.ErrorIs(t, err, ErrBadRule)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}
