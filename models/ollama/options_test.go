package ollama

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
)

// stallAfter streams lines, flushing each, then sends nothing more until
// the client goes away: a runner that hung mid-answer.
func stallAfter(lines [][]byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, line := range lines {
			_, _ = w.Write(append(line, '\n'))
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	}
}

// A stream that stops sending after some tokens fails once no chunk came
// for the stall timeout, not at the end of the call's (or the node's)
// whole timeout, and as a transient error, worth the node's retry.
func TestChatStallMidStreamIsATransientTimeout(t *testing.T) {
	partial := fixtureLines(t, "plain.ndjson")[:2]
	srv := newFakeOllama(t, stallAfter(partial))
	c := NewWithOptions(srv.URL, srv.Client(), Options{StallTimeout: 100 * time.Millisecond})
	req := chatRequestFor("llama3.2")
	req.Timeout = 5 * time.Second // the node's, much longer

	chunks := 0
	start := time.Now()
	resp, err := c.Chat(context.Background(), req, func(models.Chunk) error { chunks++; return nil })
	elapsed := time.Since(start)
	require.Nil(t, resp)
	require.Less(t, elapsed, 2*time.Second, "the stall ends the call, not the call's timeout: %v", err)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Timeout, me.Kind, "error: %v", err)
	require.True(t, models.IsTransient(err), "error: %v", err)
	require.ErrorIs(t, err, models.ErrTimeout)
	require.Contains(t, err.Error(), "no chunk of the answer for 100ms")
	require.Equal(t, 2, chunks)
}

// The stall timeout runs between chunks only: the wait for the first one
// (a model loading, a long prompt read) is the call's timeout's, and the
// time the caller's stream callback takes is not a stall.
func TestChatStallTimeoutSparesSlowStartsAndSlowCallers(t *testing.T) {
	lines := fixtureLines(t, "plain.ndjson")
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(1200 * time.Millisecond) // loading the model
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, line := range lines {
			_, _ = w.Write(append(line, '\n'))
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	})
	// The chunks come 50 ms apart, well within the stall timeout even on a
	// loaded machine; the model's loading and the caller's first event
	// each take several times as long.
	c := NewWithOptions(srv.URL, srv.Client(), Options{StallTimeout: 400 * time.Millisecond})
	first := true
	resp, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error {
		if first {
			first = false
			time.Sleep(1000 * time.Millisecond) // the caller stores its first event
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, expectFixture(t, "plain.ndjson").content, resp.Message.Content)
}

// The appliance asks Ollama to keep the model loaded between turns: a
// KeepAlive given to the client goes with every call that sets none of
// its own.
func TestChatSendsTheClientsKeepAlive(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	day := 24 * time.Hour
	c := NewWithOptions(srv.URL, srv.Client(), Options{KeepAlive: &day})
	_, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.NoError(t, err)
	require.Equal(t, "24h0m0s", srv.lastBody(t)["keep_alive"])

	own := 5 * time.Minute
	req := chatRequestFor("llama3.2")
	req.KeepAlive = &own
	_, err = c.Chat(context.Background(), req, nil)
	require.NoError(t, err)
	require.Equal(t, "5m0s", srv.lastBody(t)["keep_alive"], "a request's own keep-alive wins")

	forever := time.Duration(-1)
	c = NewWithOptions(srv.URL, srv.Client(), Options{KeepAlive: &forever})
	_, err = c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.NoError(t, err)
	require.EqualValues(t, -1, srv.lastBody(t)["keep_alive"], "a negative keep-alive keeps the model loaded")
}

// An answer cap goes to Ollama as num_predict, in the options map the
// real client sends, and an answer stopped by it is refused as truncated,
// with the tokens it spent and a hint that names the cap, not num_ctx.
func TestChatSendsTheAnswerCapAsNumPredict(t *testing.T) {
	var sent map[string]any
	length := replayStream(t, "length.ndjson")
	var srv *fakeOllama
	srv = newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		srv.mu.Lock()
		raw := srv.bodies[len(srv.bodies)-1] // the body, read by the fake
		srv.mu.Unlock()
		var body struct {
			Options map[string]any `json:"options"`
		}
		if err := json.Unmarshal(raw, &body); err != nil || body.Options["num_predict"] == nil {
			http.Error(w, `{"error":"no num_predict in the request's options"}`, http.StatusBadRequest)
			return
		}
		sent = body.Options
		length(w, r)
	})
	c := New(srv.URL, srv.Client())
	req := chatRequestFor("llama3.2")
	req.Options.MaxOutputTokens = 8
	resp, err := c.Chat(context.Background(), req, nil)
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrTruncated)
	require.Equal(t, map[string]any{"num_predict": float64(8)}, sent)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, 8, me.CompletionTokens, "what the cut answer spent is still counted")
	require.Contains(t, err.Error(), "cap of 8 tokens (num_predict)")

	_, err = c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.ErrorContains(t, err, "no num_predict", "no cap, no num_predict: the model's default holds")
}
