package models_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
)

// runaway is a provider that ignores the answer cap: it streams words
// (a token each) until it has streamed words of them, and then answers
// with all it streamed. It keeps to the rest of the Provider contract:
// it stops at the stream callback's error and at its context's end,
// unless rude, when it goes on streaming whatever it is told.
type runaway struct {
	words  int
	rude   bool
	silent bool // it returns its answer without streaming it

	sent     int  // chunks handed to the stream callback
	canceled bool // its context had ended when it returned
}

func (p *runaway) Name() string { return "runaway" }

func (p *runaway) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	defer func() { p.canceled = ctx.Err() != nil }()
	var text strings.Builder
	for range p.words {
		text.WriteString(" dose")
		if p.silent {
			continue
		}
		p.sent++
		if err := stream(models.Chunk{Content: " dose"}); err != nil && !p.rude {
			return nil, err
		}
		if ctx.Err() != nil && !p.rude {
			return nil, &models.Error{Kind: models.Canceled, Provider: p.Name(), Model: req.Model, Err: context.Cause(ctx)}
		}
	}
	return &models.Response{Provider: p.Name(), Model: req.Model, PromptTokens: 7, DoneReason: "stop",
		Message: models.Message{Role: models.RoleAssistant, Content: text.String()}}, nil
}

func cappedRequest(limit int) models.Request {
	req := models.Request{Model: "m", Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}
	req.Options.MaxOutputTokens = limit
	return req
}

// A provider that streams on past the answer's cap is stopped once the
// answer passes it: what it streams past the cap goes no further, and
// the call fails as an answer cut at its cap does, with what it spent.
func TestChatCappedStopsAProviderThatIgnoresTheCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *runaway
	}{
		{"stops at the callback's error", &runaway{words: 1000}},
		{"goes on regardless", &runaway{words: 1000, rude: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := modelstest.RequireCutAtCap(t, tc.p, cappedRequest(20))
			require.Equal(t, strings.Repeat(" dose", 20), got, "what was streamed on is the answer up to its cap")
			require.True(t, tc.p.canceled, "the call's context is canceled")
			if !tc.p.rude {
				require.Equal(t, 21, tc.p.sent, "the provider stopped streaming at the chunk after the cap, which an honest one would not have sent")
			}
		})
	}
}

// An answer that comes whole, not streamed, cannot be stopped at its
// cap: it is refused when it holds more, by the low count (a third of the
// estimate here: one chunk), and charged what it spent, by the estimate.
func TestChatCappedRefusesAWholeAnswerPastTheCap(t *testing.T) {
	p := &runaway{words: 63, silent: true}
	resp, err := models.ChatCapped(context.Background(), p, cappedRequest(20), nil)
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrTruncated)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, 63, me.CompletionTokens, "its estimate, as it reported no count")
	require.Equal(t, 7, me.PromptTokens, "the prompt count it reported")

	p = &runaway{words: 60, silent: true}
	resp, err = models.ChatCapped(context.Background(), p, cappedRequest(20), nil)
	require.NoError(t, err, "60 words may be as few as 20 tokens, the cap: the answer is not refused on a guess")
	require.NotNil(t, resp)
}

// An honest answer just under its cap is never cut short, however high the
// estimate counts its text: here Cyrillic, counted a token a letter, and
// streamed a token a chunk, as Ollama streams.
func TestChatCappedDoesNotCutAnHonestAnswerShort(t *testing.T) {
	word := " дом" // a token to a tokenizer, three to the estimate
	p := &honest{chunks: 19, piece: word}
	resp, err := models.ChatCapped(context.Background(), p, cappedRequest(20), nil)
	require.NoError(t, err)
	require.Equal(t, strings.Repeat(word, 19), resp.Message.Content)
	require.Greater(t, models.EstimateTokens(resp.Message.Content), 20, "the estimate alone would have cut it")
}

// honest streams chunks pieces and stops, reporting no count.
type honest struct {
	chunks int
	piece  string
}

func (p *honest) Name() string { return "honest" }

func (p *honest) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	for range p.chunks {
		if err := stream(models.Chunk{Content: p.piece}); err != nil {
			return nil, err
		}
	}
	return &models.Response{Provider: p.Name(), Model: req.Model, DoneReason: "stop",
		Message: models.Message{Role: models.RoleAssistant, Content: strings.Repeat(p.piece, p.chunks)}}, nil
}

// reporting answers briefly, streamed, but reports a count of its own.
type reporting struct{ completion int }

func (p reporting) Name() string { return "reporting" }

func (p reporting) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	if err := stream(models.Chunk{Content: "ok"}); err != nil {
		return nil, err
	}
	return &models.Response{Provider: p.Name(), Model: req.Model, PromptTokens: 3, CompletionTokens: p.completion,
		DoneReason: "stop", Message: models.Message{Role: models.RoleAssistant, Content: "ok"}}, nil
}

// The provider's own count, when it reports one, is the answer's: an
// answer whose text is counted within the cap, but whose provider
// counted more, is refused.
func TestChatCappedTakesTheProvidersCount(t *testing.T) {
	resp, err := models.ChatCapped(context.Background(), reporting{completion: 30}, cappedRequest(20), nil)
	require.Nil(t, resp)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Truncated, me.Kind)
	require.Equal(t, 30, me.CompletionTokens)

	resp, err = models.ChatCapped(context.Background(), reporting{completion: 1}, cappedRequest(20), nil)
	require.NoError(t, err)
	require.Equal(t, "ok", resp.Message.Content)

	resp, err = models.ChatCapped(context.Background(), reporting{completion: 20}, cappedRequest(20), nil)
	require.NoError(t, err, "the cap is the most an answer may take, not more than it may")
	require.Equal(t, "ok", resp.Message.Content)
}

// An answer within its cap, and any answer of a call without one, comes
// back as the provider gave it; the caller's stream error comes back
// unchanged.
func TestChatCappedPassesAnswersWithinTheCap(t *testing.T) {
	chunks := 0
	resp, err := models.ChatCapped(context.Background(), &runaway{words: 19}, cappedRequest(20), func(models.Chunk) error {
		chunks++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, strings.Repeat(" dose", 19), resp.Message.Content)
	require.Equal(t, 19, chunks)

	resp, err = models.ChatCapped(context.Background(), &runaway{words: 1000}, cappedRequest(0), func(models.Chunk) error { return nil })
	require.NoError(t, err, "no cap, nothing to hold")
	require.Len(t, resp.Message.Content, 5000)

	stop := errors.New("listener went away")
	_, err = models.ChatCapped(context.Background(), &runaway{words: 100}, cappedRequest(20), func(models.Chunk) error { return stop })
	require.Equal(t, stop, err)
}

// A run of one symbol is one token to a tokenizer for many of its
// characters (Llama 3's and cl100k's vocabularies hold runs of 16 dashes,
// equals signs and the like, which markdown tables and rules are made
// of), where the estimate counts a token each: an honest answer of such
// tokens, streamed a token a chunk, within its cap, is not cut short by
// the estimate's third either.
func TestChatCappedDoesNotCutAnHonestAnswerOfSymbolRunsShort(t *testing.T) {
	for _, piece := range []string{"----------------", "================", "\n\n\n\n", "\t\t\t\t"} {
		p := &honest{chunks: 19, piece: piece}
		resp, err := models.ChatCapped(context.Background(), p, cappedRequest(20), nil)
		require.NoError(t, err, "%q", piece)
		require.Equal(t, strings.Repeat(piece, 19), resp.Message.Content)
	}
}
