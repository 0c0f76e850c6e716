package ollama

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
)

// pastNumPredict is an Ollama that ignores num_predict: it streams words
// answer chunks of " dose" (a token each), one a millisecond as a model
// generates them, then its final chunk with eval_count (evalCount, or
// words when 0). It stops when the client goes away, and says how far it
// got.
type pastNumPredict struct {
	words, evalCount int

	mu       sync.Mutex
	streamed int  // answer chunks written
	finished bool // the final chunk was written
	gone     bool // the client went away first
}

func (s *pastNumPredict) chat(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	created := time.Date(2025, 6, 12, 9, 14, 2, 0, time.UTC)
	for i := range s.words {
		line := fmt.Sprintf(`{"model":"llama3.2","created_at":%q,"message":{"role":"assistant","content":" dose"},"done":false}`+"\n",
			created.Add(time.Duration(i)*20*time.Millisecond).Format(time.RFC3339Nano))
		if _, err := w.Write([]byte(line)); err != nil {
			break
		}
		w.(http.Flusher).Flush()
		s.mu.Lock()
		s.streamed++
		s.mu.Unlock()
		select {
		case <-r.Context().Done():
			s.mu.Lock()
			s.gone = true
			s.mu.Unlock()
			return
		case <-time.After(time.Millisecond):
		}
	}
	eval := s.evalCount
	if eval == 0 {
		eval = s.words
	}
	_, _ = fmt.Fprintf(w, `{"model":"llama3.2","created_at":%q,"message":{"role":"assistant","content":""},"done_reason":"stop","done":true,`+
		`"total_duration":1873512083,"load_duration":1482031541,"prompt_eval_count":31,"prompt_eval_duration":70264000,"eval_count":%d,"eval_duration":318724000}`+"\n",
		created.Add(time.Minute).Format(time.RFC3339Nano), eval)
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
}

// An Ollama that streams on past num_predict is cut at the answer's cap:
// the client stops reading its stream, the server sees the client go
// away long before it would have finished, and the call fails as an
// answer cut at its cap, charged what it streamed.
func TestChatCappedCutsAnOllamaThatIgnoresNumPredict(t *testing.T) {
	s := &pastNumPredict{words: 5000}
	srv := newFakeOllama(t, s.chat)
	req := chatRequestFor("llama3.2")
	req.Options.MaxOutputTokens = 20
	got := modelstest.RequireCutAtCap(t, New(srv.URL, srv.Client()), req)
	require.Equal(t, strings.Repeat(" dose", 20), got)

	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.gone
	}, 5*time.Second, 5*time.Millisecond, "the server never saw the client go away")
	require.Equal(t, map[string]any{"num_predict": float64(20)}, srv.lastBody(t)["options"], "the cap was asked of the server")
	s.mu.Lock()
	defer s.mu.Unlock()
	require.False(t, s.finished)
	require.Less(t, s.streamed, 1000, "the server streamed %d of its %d chunks", s.streamed, s.words)
}

// An Ollama whose answer streams within the cap by the client's count,
// but whose final chunk reports more than the cap (it ignored
// num_predict), has its answer refused, charged its own counts.
func TestChatCappedTakesOllamasFinalCounts(t *testing.T) {
	s := &pastNumPredict{words: 10, evalCount: 45}
	srv := newFakeOllama(t, s.chat)
	req := chatRequestFor("llama3.2")
	req.Options.MaxOutputTokens = 20
	resp, err := models.ChatCapped(context.Background(), New(srv.URL, srv.Client()), req, nil)
	require.Nil(t, resp)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Truncated, me.Kind)
	require.Equal(t, 31, me.PromptTokens)
	require.Equal(t, 45, me.CompletionTokens)
}

// atNumPredict is an Ollama that honours num_predict: it streams the
// answer a token a chunk up to the cap, then its final chunk with
// done_reason (stop when the model ended the answer with the cap's last
// token, its end of text streaming nothing; length when the cap cut it)
// and its counts.
func atNumPredict(t *testing.T, limit int, reason string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		chunks := limit
		if reason == "stop" {
			chunks-- // the last token is the end of text
		}
		for range chunks {
			_, _ = fmt.Fprintln(w, `{"model":"llama3.2","created_at":"2025-06-12T09:14:02Z","message":{"role":"assistant","content":" дом"},"done":false}`)
			w.(http.Flusher).Flush()
		}
		_, _ = fmt.Fprintf(w, `{"model":"llama3.2","created_at":"2025-06-12T09:15:02Z","message":{"role":"assistant","content":""},"done_reason":%q,"done":true,`+
			`"prompt_eval_count":31,"eval_count":%d}`+"\n", reason, limit)
	}
}

// An Ollama that honours num_predict, and whose model ends the answer
// with the cap's last token (its end of text, which streams nothing but
// counts in eval_count), gives a whole answer within the cap: it is not
// refused for reporting the cap.
func TestChatCappedTakesAWholeAnswerThatReportsItsCap(t *testing.T) {
	req := chatRequestFor("llama3.2")
	req.Options.MaxOutputTokens = 20
	srv := newFakeOllama(t, atNumPredict(t, 20, "stop"))
	resp, err := models.ChatCapped(context.Background(), New(srv.URL, srv.Client()), req, nil)
	require.NoError(t, err, "a whole answer of 20 tokens, within its cap of 20")
	require.Equal(t, strings.Repeat(" дом", 19), resp.Message.Content)
	require.Equal(t, 20, resp.CompletionTokens)
}

// An Ollama that honours num_predict and stops the answer at its cap
// (done_reason "length") is not cut by the caller's count before it can
// say so: the call fails as Ollama reports it, with its own counts,
// which are what a token budget is charged, not the estimate (which
// counts Cyrillic three times over) and the prompt's estimate.
func TestChatCappedLetsAnHonestOllamaStopAtItsCap(t *testing.T) {
	req := chatRequestFor("llama3.2")
	req.Options.MaxOutputTokens = 20
	srv := newFakeOllama(t, atNumPredict(t, 20, "length"))
	streamed := 0
	resp, err := models.ChatCapped(context.Background(), New(srv.URL, srv.Client()), req, func(models.Chunk) error {
		streamed++
		return nil
	})
	require.Nil(t, resp)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Truncated, me.Kind)
	require.Equal(t, 20, streamed)
	require.Contains(t, err.Error(), `done_reason "length"`, "Ollama stopped it, as it was asked to")
	require.Equal(t, 31, me.PromptTokens, "Ollama's count")
	require.Equal(t, 20, me.CompletionTokens, "Ollama's count")
}
