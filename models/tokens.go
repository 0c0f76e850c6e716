package models

import "unicode/utf8"

// Token estimates. A model server reports what each call spent (Ollama's
// prompt_eval_count and eval_count), but not always: Ollama leaves the
// prompt's count out (or zero) for a prompt it served from its cache, a
// call that fails mid-answer never gets to its final counts, and a
// prompt must be counted before it is sent. Budgets must not treat such
// a call as free, nor set aside too little for it, so Outpost then
// counts by this rule, made to count high rather than low:
//
//   - an ASCII word (a run of letters) is one token per 4 letters,
//     rounded up, so a short word is a whole token; a space before it is
//     free (BPE tokenizers fold it into the word);
//   - every digit, and every other ASCII character (punctuation, symbols,
//     line breaks, tabs), is a token (tokenizers split numbers into
//     digits or groups of up to 3, and merge few symbols);
//   - other text is one token per 2 bytes of its UTF-8, rounded up: a
//     token a character for the 2-byte scripts (accented Latin, Greek,
//     Cyrillic, Hebrew, Arabic), 1.5 for the 3-byte ones (CJK, kana,
//     Hangul, Devanagari, Thai), 2 for the 4-byte ones (emoji);
//   - a prompt is its messages' text (content, thinking, tool calls'
//     names and arguments), the tools' definitions, and 4 tokens per
//     message for the chat template's markers.
//
// Counting 4 bytes a token, as Outpost once did, counted Chinese text
// below Llama 3's tokenizer and Chinese, Korean and Arabic at about half
// of Llama 2's, and digits, code and JSON low as well. Measured against
// the tokenizers of Llama 3, OpenAI's cl100k and o200k (tiktoken), Llama 2
// and Mistral 7B (SentencePiece), this rule counts English prose, code,
// JSON, digits and Chinese, Japanese, Korean, Hindi, Thai, Arabic and
// Russian text at or above the first three: English prose at 1.2 to 1.4
// times Llama 3's count, code and JSON at 1.4 to 1.6, CJK at 1.7 to 2,
// Cyrillic at up to 3. It is an upper bound in practice, not a proof:
// random letters (base64), Hebrew, Polish and Amharic text count below
// Llama 3's, and SentencePiece tokenizers that fall back to bytes take
// more than it counts for Korean, Arabic and Persian. A server's own
// counts, when it reports them, replace the estimate (Spent).
const TokensPerMessage = 4

// EstimateTokens is the token count of text by the rule above.
func EstimateTokens(text string) int {
	var e TextEstimate
	e.Add(text)
	return e.Tokens()
}

// TextEstimate counts a text that arrives in pieces by the rule above: its
// Tokens after the last piece is the EstimateTokens of the whole text,
// wherever the pieces were cut. The zero value is an empty text.
type TextEstimate struct {
	tokens   int // of the words ended, the digits and the symbols
	word     int // letters of the word not yet ended
	nonASCII int // bytes of text that is not ASCII
}

// Add counts the next piece of the text.
func (e *TextEstimate) Add(s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			e.word++
			continue
		case c >= utf8.RuneSelf:
			e.nonASCII++
		case c != ' ':
			e.tokens++
		}
		e.tokens += wordTokens(e.word)
		e.word = 0
	}
}

// Tokens is the count of the text so far.
func (e *TextEstimate) Tokens() int {
	return e.tokens + wordTokens(e.word) + (e.nonASCII+1)/2
}

func wordTokens(letters int) int { return (letters + 3) / 4 }

// AnswerEstimate counts a streamed answer by the rule above, chunk by
// chunk: its Tokens after the last chunk is the EstimateAnswerTokens of
// the answer the chunks make. The zero value is an empty answer.
type AnswerEstimate struct {
	content, thinking TextEstimate
	toolCalls         int
}

// Add counts the next chunk.
func (a *AnswerEstimate) Add(c Chunk) {
	a.content.Add(c.Content)
	a.thinking.Add(c.Thinking)
	for _, tc := range c.ToolCalls {
		a.toolCalls += EstimateTokens(tc.Name) + EstimateTokens(string(tc.Arguments))
	}
}

// Tokens is the count of the answer so far.
func (a *AnswerEstimate) Tokens() int {
	return a.content.Tokens() + a.thinking.Tokens() + a.toolCalls
}

// EstimatePromptTokens is the token count of req's prompt by the rule
// above.
func EstimatePromptTokens(req Request) int {
	n := 0
	for _, m := range req.Messages {
		n += TokensPerMessage + EstimateAnswerTokens(m) + EstimateTokens(m.ToolName)
	}
	for _, t := range req.Tools {
		n += EstimateTokens(t.Name) + EstimateTokens(t.Description) + EstimateTokens(string(t.Parameters))
	}
	return n
}

// EstimateAnswerTokens is the token count of an answer by the rule above.
func EstimateAnswerTokens(m Message) int {
	var a AnswerEstimate
	a.Add(Chunk{Content: m.Content, Thinking: m.Thinking, ToolCalls: m.ToolCalls})
	return a.Tokens()
}

// CutTokens returns the longest prefix of s, ending at a character's
// boundary, that the rule above counts at most n tokens: where a model
// whose answer is capped at n tokens would have stopped, as far as the
// rule can tell.
func CutTokens(s string, n int) string {
	var e TextEstimate
	end := 0
	for end < len(s) {
		_, size := utf8.DecodeRuneInString(s[end:])
		e.Add(s[end : end+size])
		if e.Tokens() > n {
			break
		}
		end += size
	}
	return s[:end]
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
