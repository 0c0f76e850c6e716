package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/models"
)

// Name is the provider's name, in Name() and every Response.
const Name = "scripted"

// resultFences are the lines that fence a tool's result off from
// instructions (policy.Neutralize). A model reads them as delimiters and
// does not repeat them in its answer, so {{context}} leaves them out.
var resultFences = regexp.MustCompile(`(?m)^<<<(?:END_)?TOOL_RESULT [^\n]*>>>\n?`)

// ContextPrefix marks a system message as retrieved context for {{context}}
// when the turn has no tool results: "Context:\n[doc-1] ...". A retrieve
// step that writes its findings this way serves a real model just as well.
const ContextPrefix = "Context:"

// FallbackAnswer answers when no rule matches. It says what happened rather
// than inventing an answer.
const FallbackAnswer = `I have no scripted answer for "{{input}}". (scripted provider: no rule matched)`

// chunksPerAnswer is how many pieces an answer streams in: enough to
// exercise streaming consumers, few enough to keep event logs short.
const chunksPerAnswer = 4

// Provider answers from rules. It is safe for concurrent use.
type Provider struct {
	rules []*compiled // the caller's rules, then the fallback
}

var _ models.Provider = (*Provider)(nil)

// New returns a Provider that tries rules in order, then the fallback.
func New(rules []Rule) (*Provider, error) {
	p := &Provider{}
	for i, r := range append(append([]Rule(nil), rules...), DefaultRules()...) {
		c, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("%w: rule %d%s: %v", ErrBadRules, i, ruleName(r), err)
		}
		p.rules = append(p.rules, c)
	}
	return p, nil
}

// Load parses JSON rules (see ParseRules) and returns their Provider.
func Load(data []byte) (*Provider, error) {
	rules, err := ParseRules(data)
	if err != nil {
		return nil, err
	}
	return New(rules)
}

// DefaultRules is the rule set every Provider ends with: one catch-all rule
// giving FallbackAnswer.
func DefaultRules() []Rule {
	return []Rule{{Name: "fallback", Respond: FallbackAnswer}}
}

// Name returns "scripted".
func (p *Provider) Name() string { return Name }

// Chat answers from the first matching rule. See models.Provider.
func (p *Provider) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	model := req.Model
	if model == "" {
		model = Name
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(ctx, model)
	}

	turn := readTurn(req.Messages)
	rule, groups := p.pick(turn)
	if rule.Fail != "" {
		return nil, &models.Error{Kind: rule.failKind, Provider: Name, Model: model,
			Err: fmt.Errorf("failure scripted by rule %q", rule.Name)}
	}

	fill := templateFiller(turn, groups)
	msg := models.Message{
		Role:     models.RoleAssistant,
		Content:  fill(rule.Respond),
		Thinking: fill(rule.Thinking),
	}
	for i, tc := range rule.ToolCalls {
		args, err := json.Marshal(expandStrings(rule.args[i], fill))
		if err != nil {
			return nil, &models.Error{Kind: models.BadRequest, Provider: Name, Model: model, Err: err}
		}
		msg.ToolCalls = append(msg.ToolCalls, models.ToolCall{
			// IDs are unique within a conversation and the same on every run.
			ID:        fmt.Sprintf("call_%d_%d", turn.assistantTurns+1, i+1),
			Name:      tc.Name,
			Arguments: args,
		})
	}

	// A real model stops at the answer cap; so does this one, by the
	// rule that budgets estimate tokens with.
	capped := req.Options.MaxOutputTokens
	cut := capped > 0 && models.EstimateAnswerTokens(msg) > capped
	if cut {
		msg = truncate(msg, capped)
	}

	if stream != nil {
		for _, chunk := range splitChunks(msg) {
			if err := ctx.Err(); err != nil {
				return nil, contextError(ctx, model)
			}
			if err := stream(chunk); err != nil {
				return nil, err
			}
		}
	}

	completion := countWords(msg.Content) + countWords(msg.Thinking)
	for _, tc := range msg.ToolCalls {
		completion += 1 + countWords(string(tc.Arguments))
	}
	prompt := 0
	for _, m := range req.Messages {
		prompt += countWords(m.Content)
	}
	if cut {
		// Refused as Ollama's done_reason "length" is, with what it spent.
		return nil, &models.Error{Kind: models.Truncated, Provider: Name, Model: model,
			Err:          fmt.Errorf("the answer reached its cap of %d tokens", capped),
			Hint:         "raise the answer cap (or the run's token budget it follows), or ask for a shorter answer",
			PromptTokens: max(prompt, 1), CompletionTokens: models.EstimateAnswerTokens(msg)}
	}
	return &models.Response{
		Provider:         Name,
		Model:            model,
		Message:          msg,
		PromptTokens:     max(prompt, 1),
		CompletionTokens: max(completion, 1),
		DoneReason:       "stop",
		// Duration stays zero: no model ran, and a fixed value keeps
		// recorded responses identical from run to run.
		RequestHash: models.HashRequest(req),
	}, nil
}

// turn is what rules look at: the last user message and what followed it.
type turn struct {
	input          string
	context        string
	hasToolResults bool
	assistantTurns int
}

func readTurn(msgs []models.Message) turn {
	var t turn
	lastUser := -1
	for i, m := range msgs {
		switch m.Role {
		case models.RoleUser:
			lastUser = i
			t.input = m.Content
		case models.RoleAssistant:
			t.assistantTurns++
		}
	}
	var results []string
	for _, m := range msgs[lastUser+1:] {
		if m.Role == models.RoleTool {
			t.hasToolResults = true
			results = append(results, strings.TrimSpace(resultFences.ReplaceAllString(m.Content, "")))
		}
	}
	if len(results) > 0 {
		t.context = strings.Join(results, "\n\n")
		return t
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		if m := msgs[i]; m.Role == models.RoleSystem && strings.HasPrefix(m.Content, ContextPrefix) {
			t.context = strings.TrimSpace(strings.TrimPrefix(m.Content, ContextPrefix))
			break
		}
	}
	return t
}

func (p *Provider) pick(t turn) (*compiled, []string) {
	for _, r := range p.rules {
		if r.WhenToolResult && !t.hasToolResults || r.WhenNoToolResult && t.hasToolResults {
			continue
		}
		if r.toolRe != nil && (!t.hasToolResults || !r.toolRe.MatchString(t.context)) {
			continue
		}
		if r.re == nil {
			return r, nil
		}
		if groups := r.re.FindStringSubmatch(t.input); groups != nil {
			return r, groups
		}
	}
	// Unreachable: the fallback rule matches everything.
	return p.rules[len(p.rules)-1], nil
}

// templateFiller fills placeholders in one pass, so text that was filled in
// (a user's input, a tool result) is never itself expanded.
func templateFiller(t turn, groups []string) func(string) string {
	pairs := []string{"{{input}}", t.input, "{{context}}", t.context}
	match := ""
	if len(groups) > 0 {
		match = groups[0]
	}
	pairs = append(pairs, "{{match}}", match)
	for i := 1; i <= 9; i++ {
		g := ""
		if i < len(groups) {
			g = groups[i]
		}
		pairs = append(pairs, "{{"+strconv.Itoa(i)+"}}", g)
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}

// splitChunks cuts an answer into a few chunks at word boundaries: thinking
// first, then the content, with tool calls riding on the last chunk.
func splitChunks(msg models.Message) []models.Chunk {
	var chunks []models.Chunk
	for _, part := range splitWords(msg.Thinking, chunksPerAnswer) {
		chunks = append(chunks, models.Chunk{Thinking: part})
	}
	for _, part := range splitWords(msg.Content, chunksPerAnswer) {
		chunks = append(chunks, models.Chunk{Content: part})
	}
	if len(msg.ToolCalls) > 0 {
		if len(chunks) == 0 || chunks[len(chunks)-1].Content == "" {
			chunks = append(chunks, models.Chunk{})
		}
		chunks[len(chunks)-1].ToolCalls = msg.ToolCalls
	}
	if len(chunks) == 0 {
		// An empty answer still streams once, so listeners see the turn.
		chunks = append(chunks, models.Chunk{})
	}
	return chunks
}

// splitWords cuts s into at most n pieces that concatenate back to s.
func splitWords(s string, n int) []string {
	if s == "" {
		return nil
	}
	words := strings.SplitAfter(s, " ")
	per := (len(words) + n - 1) / n
	var parts []string
	for i := 0; i < len(words); i += per {
		parts = append(parts, strings.Join(words[i:min(i+per, len(words))], ""))
	}
	return parts
}

// truncate cuts an answer to its first n tokens (models.CutTokens):
// thinking first, then the content. The tool calls, which come at the
// end of an answer, are not reached.
func truncate(msg models.Message, n int) models.Message {
	msg.Thinking = models.CutTokens(msg.Thinking, n)
	msg.Content = models.CutTokens(msg.Content, n-models.EstimateTokens(msg.Thinking))
	msg.ToolCalls = nil
	return msg
}

func countWords(s string) int { return len(strings.Fields(s)) }

func contextError(ctx context.Context, model string) *models.Error {
	cause := context.Cause(ctx)
	kind := models.Canceled
	if errors.Is(cause, context.DeadlineExceeded) {
		kind = models.Timeout
	}
	return &models.Error{Kind: kind, Provider: Name, Model: model, Err: cause}
}
