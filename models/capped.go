package models

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// errAnswerCut is what ChatCapped's stream callback returns, and the
// cause it cancels the call's context with, once the answer has reached
// its cap.
var errAnswerCut = errors.New("the answer reached its cap")

// ChatCapped calls p with req, and holds the answer to its cap
// (req.Options.MaxOutputTokens) on this side of the seam as well: the
// cap is sent with the request (Ollama's num_predict), but a provider
// that does not honour it (one of one's own, an Ollama that ignores
// num_predict, a proxy that drops it) would be found out only when the
// call ended, having spent what it liked. Without a cap it is p.Chat.
//
// While the answer streams, ChatCapped counts it low (see AnswerFloor):
// no more tokens than a model spends on it, so that an answer its
// provider ends within the cap is never cut short of it. An answer whose
// count reaches the cap exactly is left to its provider, which ends it
// there if it honours the cap, whole or cut with counts of its own
// (Ollama's done_reason "length", its eval counts), which are what a
// budget is charged. Once the count passes the cap the call is stopped:
// the stream callback returns an error, so the provider stops reading
// the stream, and the call's context is canceled. A chunk that takes the
// count past the cap is not handed on to stream, nor charged when the
// count before it was the cap. The call then fails as
// an answer that its server cut at the cap does: an *Error of kind
// Truncated (ErrTruncated), whose CompletionTokens is the count (or the
// provider's own, when it reported more), so that a caller with a token
// budget charges what was spent: the provider's count, or else the
// estimate, which counts high (see Spent).
//
// A provider that streams a token a chunk, as Ollama does, is stopped at
// the chunk after its cap. One that streams many tokens a chunk stops after the chunk
// that passes it, not within it, and by the low count, which may be a
// third of what it spent. A call that does not stream (a provider that
// returns its whole answer without calling stream) cannot be stopped at
// all: its tokens were spent before any of them could be seen. ChatCapped
// can only refuse its answer, in the same way, when it holds more than
// the cap (the provider's count, or else the low count), and report what
// it spent. A provider can hold a line it reads past the cap of its own
// (models/ollama does not read a line of the stream longer than an answer
// of the cap takes): it then fails as one cut at the cap, and ChatCapped
// returns its error. An answer whose count is the cap exactly is within it: Ollama
// counts the end of text a model ends on among the num_predict tokens,
// so a whole answer may report the cap.
func ChatCapped(ctx context.Context, p Provider, req Request, stream func(Chunk) error) (*Response, error) {
	limit := req.Options.MaxOutputTokens
	if limit <= 0 {
		return p.Chat(ctx, req, stream)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		count AnswerFloor
		cut   int // the count at which the answer was cut; 0 while it was not
		// atCap is the estimate of the answer when its count was the cap
		// exactly (0 before): an honest provider ends it there, with its
		// own counts, and one that goes on is charged no more than that
		// for the chunk that passes the cap, as one that stopped would be.
		atCap int
	)
	resp, err := p.Chat(ctx, req, func(c Chunk) error {
		if cut > 0 {
			return errAnswerCut // a provider that went on after it was told to stop
		}
		count.Add(c)
		n := count.Tokens()
		if n <= limit && stream != nil {
			if err := stream(c); err != nil {
				return err
			}
		}
		if n == limit && atCap == 0 {
			atCap = count.Estimate()
		}
		if n > limit {
			cut = n
			cancel(errAnswerCut)
			return errAnswerCut
		}
		return nil
	})
	var pe *Error
	switch {
	case cut > 0:
		e := overCap(p, req, limit, cut)
		// It is charged as an answer is (see Spent): the provider's count,
		// or else the estimate, which counts high.
		e.CompletionTokens = count.Estimate()
		if atCap > 0 {
			e.CompletionTokens = atCap
		}
		switch {
		case err == nil && resp != nil:
			e.PromptTokens = resp.PromptTokens
			if resp.CompletionTokens > 0 {
				e.CompletionTokens = resp.CompletionTokens
			}
		case errors.As(err, &pe):
			e.PromptTokens = pe.PromptTokens
			if pe.CompletionTokens > 0 {
				e.CompletionTokens = pe.CompletionTokens
			}
		}
		return nil, e
	case err != nil:
		return nil, err
	}
	n, charged := resp.CompletionTokens, resp.CompletionTokens
	if n <= 0 {
		var whole AnswerFloor
		whole.Add(Chunk{Content: resp.Message.Content, Thinking: resp.Message.Thinking, ToolCalls: resp.Message.ToolCalls})
		n, charged = max(count.Tokens(), whole.Tokens()), EstimateAnswerTokens(resp.Message)
	}
	if n > limit {
		e := overCap(p, req, limit, n)
		e.PromptTokens, e.CompletionTokens = resp.PromptTokens, charged
		return nil, e
	}
	return resp, nil
}

// estimateExcess bounds how many times the estimate (EstimateTokens)
// counts what a tokenizer makes of text: Cyrillic's 3 is the most of the
// scripts it was measured on.
const estimateExcess = 3

// AnswerFloor counts a streamed answer low: the chunks that carry
// something (a model server streams a token or more a chunk), or a third
// of the estimate (AnswerEstimate), whichever is more. In practice that is
// no more than the tokens a model spent on the answer, so a cap held by
// this count never cuts an answer short of the cap its provider honours.
// But for runs of one symbol: a tokenizer makes one token of many dashes,
// equals signs, line breaks or tabs in a row (markdown's rules and table
// lines, indentation), where the estimate counts each, so here a run
// counts a token for each symbolRun of its characters.
// The zero value is an empty answer.
type AnswerFloor struct {
	est               AnswerEstimate
	content, thinking symbolRuns
	chunks            int
}

// Add counts the next chunk.
func (f *AnswerFloor) Add(c Chunk) {
	f.est.Add(c)
	f.content.add(c.Content)
	f.thinking.add(c.Thinking)
	if c.Content != "" || c.Thinking != "" || len(c.ToolCalls) > 0 {
		f.chunks++
	}
}

// Tokens is the count of the answer so far.
func (f *AnswerFloor) Tokens() int {
	low := f.est.Tokens() - f.content.chars - f.thinking.chars + f.content.tokens() + f.thinking.tokens()
	return max(f.chunks, (low+estimateExcess-1)/estimateExcess)
}

// Estimate is the answer's estimate so far (AnswerEstimate), which counts
// high.
func (f *AnswerFloor) Estimate() int { return f.est.Tokens() }

// symbolRun is how many characters of a run of one symbol AnswerFloor
// counts a token: Llama 3's and cl100k's vocabularies hold runs of 16.
const symbolRun = 16

// symbolRuns counts the ASCII symbols of a text that arrives in pieces
// (what the estimate counts a token each, digits and spaces aside):
// chars of them, in runs of one symbol that make tokens() tokens at
// symbolRun characters a token.
type symbolRuns struct {
	chars, ended int  // symbols seen; tokens of the runs that ended
	sym          byte // the symbol of the run going on, and its length
	run          int
}

func (r *symbolRuns) add(s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf || c == ' ' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' {
			r.ended += r.runTokens()
			r.run = 0
			continue
		}
		r.chars++
		if r.run > 0 && c != r.sym {
			r.ended += r.runTokens()
			r.run = 0
		}
		r.sym = c
		r.run++
	}
}

func (r *symbolRuns) runTokens() int { return (r.run + symbolRun - 1) / symbolRun }

func (r *symbolRuns) tokens() int { return r.ended + r.runTokens() }

// overCap is the error of an answer that ChatCapped refused at its cap.
func overCap(p Provider, req Request, limit, n int) *Error {
	e := CapError(p.Name(), req.Model, limit, fmt.Sprintf("it was cut at %d tokens by the caller's count", n))
	e.CompletionTokens = n
	return e
}

// CapError is the error of an answer refused at its cap of limit tokens
// (Request.Options.MaxOutputTokens), which its provider did not stop it
// at: an error of kind Truncated. why says how the caller found it out.
// The caller sets what the call spent (PromptTokens, CompletionTokens).
func CapError(provider, model string, limit int, why string) *Error {
	return &Error{Kind: Truncated, Provider: provider, Model: model,
		Err: fmt.Errorf("the answer reached its cap of %d tokens (num_predict) and %s did not stop it: %s",
			limit, displayName(provider), why),
		Hint: "raise the cap (or the run's token budget it follows), or ask for a shorter answer",
	}
}
