package models

// Token estimates. A model server reports what each call spent (Ollama's
// prompt_eval_count and eval_count), but not always: Ollama leaves the
// prompt's count out (or zero) for a prompt it served from its cache, and
// a call that fails mid-answer never gets to its final counts. Budgets
// must not treat such a call as free, so Outpost then counts by this rule:
//
//   - a text is one token per 4 bytes, rounded up (BPE tokenizers give
//     about 4 bytes of English per token, and fewer for other scripts,
//     whose characters take 2 to 4 bytes each: the rule counts those
//     high, not low);
//   - a prompt is its messages' text (content, thinking, and tool calls'
//     names and arguments), the tools' definitions, and 4 tokens per
//     message for the chat template's markers.
const (
	BytesPerToken      = 4
	TokensPerMessage   = 4
	estimateRoundingUp = BytesPerToken - 1
)

// EstimateTokens is the token count of text by the rule above.
func EstimateTokens(text string) int { return EstimateBytes(len(text)) }

// EstimateBytes is the token count of n bytes of text by the rule above.
func EstimateBytes(n int) int { return (max(n, 0) + estimateRoundingUp) / BytesPerToken }

// EstimatePromptTokens is the token count of req's prompt by the rule
// above.
func EstimatePromptTokens(req Request) int {
	n := 0
	for _, m := range req.Messages {
		n += TokensPerMessage + estimateMessageBytes(m)
	}
	for _, t := range req.Tools {
		n += (len(t.Name) + len(t.Description) + len(t.Parameters) + estimateRoundingUp) / BytesPerToken
	}
	return n
}

// EstimateAnswerTokens is the token count of an answer by the rule above.
func EstimateAnswerTokens(m Message) int { return estimateMessageBytes(m) }

func estimateMessageBytes(m Message) int {
	b := len(m.Content) + len(m.Thinking)
	for _, tc := range m.ToolCalls {
		b += len(tc.Name) + len(tc.Arguments)
	}
	return (b + estimateRoundingUp) / BytesPerToken
}

// Spent returns the tokens a call spent, from the counts its server
// reported, each one estimated (see above) when it is missing: prompt
// from req, completion from answer.
func Spent(req Request, prompt, completion int, answer Message) int {
	if prompt <= 0 {
		prompt = EstimatePromptTokens(req)
	}
	if completion <= 0 {
		completion = EstimateAnswerTokens(answer)
	}
	return prompt + completion
}
