package models

import (
	"context"
	"errors"
	"fmt"
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
// While the answer streams, ChatCapped counts it, chunk by chunk, by the
// estimate (AnswerEstimate), which counts high. Once the count reaches
// the cap the call is stopped, as a model server stops at it: the stream
// callback returns an error, so the provider stops reading the stream,
// and the call's context is canceled. A chunk that takes the count past
// the cap is not handed on to stream. The call then fails as an answer
// that its server cut at the cap does: an *Error of kind Truncated
// (ErrTruncated), whose CompletionTokens is the count (or the provider's
// own, when it reported more), so that a caller with a token budget
// charges what was spent.
//
// A call that does not stream (a provider that returns its whole answer
// without calling stream) cannot be stopped this way: its tokens were
// spent before any of them could be seen. ChatCapped can only refuse
// its answer, in the same way, when it holds more than the cap (the
// provider's count, or else the estimate), and report what it spent.
// The same holds for a chunk that brings many tokens at once: the call
// stops after it, not within it.
//
// Because the estimate counts high, an answer that a provider would have
// ended within its cap can be cut short of it: English prose is counted
// at 1.2 to 1.4 times what Llama 3's tokenizer makes of it, code and
// JSON at up to 1.6, Cyrillic at up to 3 (see EstimateTokens). A
// provider that counted its answer as it streamed would let the count be
// exact; none of Outpost's does (Ollama reports its counts in its final
// chunk only, and ChatCapped takes them from the response).
func ChatCapped(ctx context.Context, p Provider, req Request, stream func(Chunk) error) (*Response, error) {
	limit := req.Options.MaxOutputTokens
	if limit <= 0 {
		return p.Chat(ctx, req, stream)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		count AnswerEstimate
		cut   int // the count at which the answer was cut; 0 while it was not
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
		if n >= limit {
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
		switch {
		case err == nil && resp != nil:
			e.PromptTokens, e.CompletionTokens = resp.PromptTokens, max(cut, resp.CompletionTokens)
		case errors.As(err, &pe):
			e.PromptTokens, e.CompletionTokens = pe.PromptTokens, max(cut, pe.CompletionTokens)
		}
		return nil, e
	case err != nil:
		return nil, err
	}
	n := resp.CompletionTokens
	if n <= 0 {
		n = EstimateAnswerTokens(resp.Message)
	}
	if n >= limit {
		e := overCap(p, req, limit, n)
		e.PromptTokens = resp.PromptTokens
		return nil, e
	}
	return resp, nil
}

// overCap is the error of an answer that ChatCapped refused at its cap.
func overCap(p Provider, req Request, limit, n int) *Error {
	return &Error{Kind: Truncated, Provider: p.Name(), Model: req.Model,
		Err: fmt.Errorf("the answer reached its cap of %d tokens (num_predict) and %s did not stop it: it was cut at %d tokens by the caller's count",
			limit, displayName(p.Name()), n),
		Hint:             "raise the cap (or the run's token budget it follows), or ask for a shorter answer",
		CompletionTokens: n,
	}
}
