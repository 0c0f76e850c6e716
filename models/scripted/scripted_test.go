package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
)

const medicationRules = `[
  {"name": "search-first", "match": "(?i)(metformin|insulin)", "when_no_tool_result": true,
   "thinking": "The user asks about {{1}}; search first.",
   "tool_calls": [{"name": "kb_search", "arguments": {"query": "{{input}}", "drug": "{{1}}", "limit": 3}}]},
  {"name": "refused", "match": "(?i)(metformin|insulin)", "tool_result": "^refused: ",
   "respond": "I could not look up {{1}} ({{context}})."},
  {"name": "answer", "match": "(?i)(metformin|insulin)", "when_tool_result": true,
   "respond": "About {{1}}: {{context}}"},
  {"name": "chest-pain", "match": "(?i)chest pain", "respond": "This may be an emergency: call 911 now."},
  {"name": "flaky", "match": "^flaky$", "fail": "timeout"}
]`

func newMedication(t testing.TB) *Provider {
	t.Helper()
	p, err := Load([]byte(medicationRules))
	require.NoError(t, err)
	return p
}

func TestProviderSuite(t *testing.T) {
	modelstest.RunProviderSuite(t, func() models.Provider { return newMedication(t) })
	modelstest.RunProviderSuite(t, func() models.Provider {
		p, err := New(nil)
		require.NoError(t, err)
		return p
	})
}

func user(s string) models.Message { return models.Message{Role: models.RoleUser, Content: s} }
func toolResult(name, s string) models.Message {
	return models.Message{Role: models.RoleTool, ToolName: name, Content: s}
}

func TestRules(t *testing.T) {
	type call struct{ name, args string }
	for _, tc := range []struct {
		name     string
		msgs     []models.Message
		content  string
		thinking string
		calls    []call
	}{
		{
			name:     "tool call before any result",
			msgs:     []models.Message{user("I forgot my Metformin dose")},
			thinking: "The user asks about Metformin; search first.",
			calls:    []call{{"kb_search", `{"query":"I forgot my Metformin dose","drug":"Metformin","limit":3}`}},
		},
		{
			name: "answer from this turn's tool results",
			msgs: []models.Message{
				user("I forgot my metformin dose"),
				{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{Name: "kb_search", Arguments: json.RawMessage(`{}`)}}},
				toolResult("kb_search", "[doc-7] Take it with the next meal."),
				toolResult("kb_search", "[doc-9] Do not double up.\n"),
			},
			content: "About metformin: [doc-7] Take it with the next meal.\n\n[doc-9] Do not double up.",
		},
		{
			name: "a refused call is answered by the rule that matches its result",
			msgs: []models.Message{
				user("I forgot my metformin dose"),
				{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{Name: "kb_search", Arguments: json.RawMessage(`{}`)}}},
				toolResult("kb_search", `refused: tool "kb_search" is not available`),
			},
			content: `I could not look up metformin (refused: tool "kb_search" is not available).`,
		},
		{
			name: "tool results of an earlier turn do not count",
			msgs: []models.Message{
				user("metformin?"), toolResult("kb_search", "old"),
				{Role: models.RoleAssistant, Content: "About metformin: old"},
				user("and insulin?"),
			},
			thinking: "The user asks about insulin; search first.",
			calls:    []call{{"kb_search", `{"query":"and insulin?","drug":"insulin","limit":3}`}},
		},
		{
			name:    "first matching rule wins",
			msgs:    []models.Message{user("chest pain after my metformin"), toolResult("kb_search", "x")},
			content: "About metformin: x",
		},
		{
			name:    "no rule matches: the fallback says so",
			msgs:    []models.Message{user("what's the weather")},
			content: `I have no scripted answer for "what's the weather". (scripted provider: no rule matched)`,
		},
		{
			name:    "no user message at all",
			msgs:    nil,
			content: `I have no scripted answer for "". (scripted provider: no rule matched)`,
		},
		{
			name:     "input is JSON-escaped in arguments and never re-expanded",
			msgs:     []models.Message{user(`metformin "quoted" \ {{context}}`)},
			thinking: "The user asks about metformin; search first.",
			calls:    []call{{"kb_search", `{"query":"metformin \"quoted\" \\ {{context}}","drug":"metformin","limit":3}`}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := newMedication(t).Chat(context.Background(), models.Request{Model: "llama3.2", Messages: tc.msgs}, nil)
			require.NoError(t, err)
			require.Equal(t, "scripted", resp.Provider)
			require.Equal(t, tc.content, resp.Message.Content)
			require.Equal(t, tc.thinking, resp.Message.Thinking)
			require.Len(t, resp.Message.ToolCalls, len(tc.calls))
			for i, c := range tc.calls {
				require.Equal(t, c.name, resp.Message.ToolCalls[i].Name)
				require.JSONEq(t, c.args, string(resp.Message.ToolCalls[i].Arguments))
				require.NotEmpty(t, resp.Message.ToolCalls[i].ID)
			}
		})
	}
}

func TestContextFromSystemMessage(t *testing.T) {
	p, err := Load([]byte(`[{"respond": "Context says: {{context}}"}]`))
	require.NoError(t, err)
	resp, err := p.Chat(context.Background(), models.Request{Messages: []models.Message{
		{Role: models.RoleSystem, Content: "You are helpful."},
		{Role: models.RoleSystem, Content: "Context:\n[doc-1] Metformin is taken with meals."},
		user("when do I take it?"),
	}}, nil)
	require.NoError(t, err)
	require.Equal(t, "Context says: [doc-1] Metformin is taken with meals.", resp.Message.Content)
	require.Equal(t, "scripted", resp.Model, "with no model asked for, the response names the provider")
}

func TestStreamsInFewChunks(t *testing.T) {
	p, err := Load([]byte(`[{"thinking": "a b", "respond": "one two three four five six seven",
		"tool_calls": [{"name": "record_note", "arguments": {"text": "{{input}}"}}]}]`))
	require.NoError(t, err)
	var chunks []models.Chunk
	resp, err := p.Chat(context.Background(), models.Request{Messages: []models.Message{user("hi")}}, func(c models.Chunk) error {
		chunks = append(chunks, c)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []models.Chunk{
		{Thinking: "a "}, {Thinking: "b"},
		{Content: "one two "}, {Content: "three four "}, {Content: "five six "},
		{Content: "seven", ToolCalls: resp.Message.ToolCalls},
	}, chunks)
	require.Equal(t, 1, resp.PromptTokens)
	require.Equal(t, 2+7+2, resp.CompletionTokens, "words of thinking, content, and 1+words per tool call")
	require.Equal(t, "stop", resp.DoneReason)
	require.Zero(t, resp.Duration)
}

func TestScriptedFailure(t *testing.T) {
	resp, err := newMedication(t).Chat(context.Background(), models.Request{Model: "llama3.2", Messages: []models.Message{user("flaky")}}, nil)
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrTimeout)
	require.True(t, models.IsTransient(err))
	require.Contains(t, err.Error(), `rule "flaky"`)
}

func TestDeterministic(t *testing.T) {
	req := models.Request{Model: "llama3.2", Messages: []models.Message{user("I forgot my metformin dose")}}
	a, err := newMedication(t).Chat(context.Background(), req, nil)
	require.NoError(t, err)
	b, err := newMedication(t).Chat(context.Background(), req, nil)
	require.NoError(t, err)
	ea, _ := models.EncodeResponse(a)
	eb, _ := models.EncodeResponse(b)
	require.Equal(t, string(ea), string(eb), "the same request is answered byte for byte the same")
}

func TestParseRulesRejects(t *testing.T) {
	for name, in := range map[string]string{
		"not an array":        `{"match": "x", "respond": "y"}`,
		"null":                `null`,
		"unknown field":       `[{"match": "x", "reply": "y"}]`,
		"bad pattern":         `[{"match": "(", "respond": "y"}]`,
		"both conditions":     `[{"respond": "y", "when_tool_result": true, "when_no_tool_result": true}]`,
		"result without one":  `[{"respond": "y", "tool_result": "x", "when_no_tool_result": true}]`,
		"bad result pattern":  `[{"respond": "y", "tool_result": "("}]`,
		"answers nothing":     `[{"match": "x"}]`,
		"unknown placeholder": `[{"respond": "{{contxt}}"}]`,
		"placeholder in args": `[{"tool_calls": [{"name": "t", "arguments": {"q": ["{{query}}"]}}]}]`,
		"args not object":     `[{"tool_calls": [{"name": "t", "arguments": [1]}]}]`,
		"tool without name":   `[{"tool_calls": [{"arguments": {}}]}]`,
		"unknown fail kind":   `[{"fail": "explode"}]`,
		"trailing data":       `[{"respond": "y"}] []`,
		"too long pattern":    `[{"respond": "y", "match": "` + strings.Repeat("a", maxPattern+1) + `"}]`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseRules([]byte(in))
			require.ErrorIs(t, err, ErrBadRules)
			_, err = New([]Rule{{Match: "(", Respond: "x"}})
			require.ErrorIs(t, err, ErrBadRules)
		})
	}
}

func FuzzParseRules(f *testing.F) {
	f.Add([]byte(medicationRules))
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"respond": "{{1}}{{match}}", "match": "(a)(b)?"}]`))
	f.Add([]byte(`[{"tool_calls": [{"name": "t", "arguments": {"n": 1e400}}]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := ParseRules(data)
		if err != nil {
			if !errors.Is(err, ErrBadRules) {
				t.Fatalf("error does not wrap ErrBadRules: %v", err)
			}
			return
		}
		p, err := New(rules)
		if err != nil {
			t.Fatalf("parsed rules do not build a provider: %v", err)
		}
		again, err := json.Marshal(rules)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseRules(again); err != nil {
			t.Fatalf("re-encoded rules do not parse: %v\n%s", err, again)
		}
		// Whatever the rules, a call answers or fails with a typed error.
		resp, err := p.Chat(context.Background(), models.Request{Messages: []models.Message{user("metformin")}}, nil)
		var me *models.Error
		if err != nil && !errors.As(err, &me) {
			t.Fatalf("untyped error: %v", err)
		}
		if err == nil && resp.Provider != Name {
			t.Fatalf("provider %q", resp.Provider)
		}
	})
}

// A tool result reaches {{context}} without the fences that mark it as
// data, as a model reads them and does not repeat them; the rules match
// the result inside.
func TestContextLeavesOutResultFences(t *testing.T) {
	p := newMedication(t)
	fenced := func(body string) models.Message {
		return toolResult("kb_search", "<<<TOOL_RESULT id=0123456789abcdef tool=kb_search>>>\n"+body+"\n<<<END_TOOL_RESULT id=0123456789abcdef>>>")
	}
	for _, tc := range []struct{ body, want string }{
		{"[doc-1] Take it with food.", "About metformin: [doc-1] Take it with food."},
		{"refused: tool \"kb_search\" is not available", "I could not look up metformin (refused: tool \"kb_search\" is not available)."},
	} {
		resp, err := p.Chat(context.Background(), models.Request{Messages: []models.Message{user("metformin?"), fenced(tc.body)}}, nil)
		require.NoError(t, err)
		require.Equal(t, tc.want, resp.Message.Content)
	}
}

// An answer cap cuts the answer to about that many tokens, by the rule
// budgets estimate with, and the call is refused as truncated, as a
// real model's answer stopped by num_predict is; an answer within its cap
// is whole.
func TestAnswerCapTruncates(t *testing.T) {
	p := newMedication(t)
	req := models.Request{Model: "m", Messages: []models.Message{user("chest pain")}} // "This may be an emergency: call 911 now."
	req.Options.MaxOutputTokens = 3
	var streamed strings.Builder
	resp, err := p.Chat(context.Background(), req, func(c models.Chunk) error { streamed.WriteString(c.Content); return nil })
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrTruncated)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Truncated, me.Kind)
	require.Equal(t, "This may be ", streamed.String(), "what was streamed is the cut answer: 3 words, 3 tokens")
	require.Equal(t, 3, me.CompletionTokens)
	require.Positive(t, me.PromptTokens)
	require.False(t, models.IsTransient(err))

	req.Options.MaxOutputTokens = 14 // This may be an emerg ency : call 9 1 1 now .
	resp, err = p.Chat(context.Background(), req, nil)
	require.NoError(t, err)
	require.Equal(t, "This may be an emergency: call 911 now.", resp.Message.Content)

	// Thinking counts first, and the tool calls at the end are not reached.
	req = models.Request{Model: "m", Messages: []models.Message{user("I forgot my metformin")}}
	req.Options.MaxOutputTokens = 2
	var got models.Message
	_, err = p.Chat(context.Background(), req, func(c models.Chunk) error {
		got.Thinking += c.Thinking
		got.Content += c.Content
		got.ToolCalls = append(got.ToolCalls, c.ToolCalls...)
		return nil
	})
	require.ErrorIs(t, err, models.ErrTruncated)
	require.Equal(t, models.Message{Thinking: "The user "}, got)
}
