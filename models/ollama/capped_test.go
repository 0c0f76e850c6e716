package ollama

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// bigChunk is an Ollama, or a proxy before one, that sends many tokens in
// one chunk: it streams before chunks of " dose" a line, then one line
// whose content is " dose" repeated to bytes bytes (written as it goes, so
// a line of many megabytes is never held whole on either side), then the
// lines of after. done marks the big line as the final chunk of an answer
// that comes whole (stream false, or a proxy that buffers the stream),
// with Ollama's counts.
type bigChunk struct {
	before, bytes int
	done          bool
	after         []string

	written atomic.Int64 // bytes of the big line's content written
}

func (s *bigChunk) chat(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	for range s.before {
		_, _ = fmt.Fprintln(w, `{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":" dose"},"done":false}`)
	}
	_, _ = fmt.Fprint(w, `{"model":"llama3.2","created_at":"2025-06-12T09:14:03.118394Z","message":{"role":"assistant","content":"`)
	piece := []byte(strings.Repeat(" dose", 64<<10/5))
	for s.written.Load() < int64(s.bytes) {
		n, err := w.Write(piece[:min(len(piece), s.bytes-int(s.written.Load()))])
		s.written.Add(int64(n))
		if err != nil {
			return
		}
	}
	if s.done {
		_, _ = fmt.Fprintf(w, `"},"done_reason":"stop","done":true,"total_duration":1873512083,"prompt_eval_count":31,"eval_count":%d}`+"\n", s.bytes/5)
	} else {
		_, _ = fmt.Fprintln(w, `"},"done":false}`)
	}
	for _, line := range s.after {
		_, _ = fmt.Fprintln(w, line)
	}
}

// countingTransport counts the bytes of response bodies the client reads.
type countingTransport struct {
	base http.RoundTripper
	read *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil {
		resp.Body = countingBody{resp.Body, t.read}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	read *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

const (
	ollamaFinal = `{"model":"llama3.2","created_at":"2025-06-12T09:14:09.118394Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"prompt_eval_count":31,"eval_count":9000}`
	ollamaError = `{"error":"an error was encountered while running the model: unexpected EOF"}`
)

// The answer's cap holds against a provider that sends many tokens in
// one chunk, or its whole answer in one line: the call fails as an answer
// past its cap, whether the line is short enough to be counted (cut by
// the caller's count) or so long that it is not read whole (cut by its
// length, a few kilobytes in, not after the 8 MB that are read of a line
// with no cap), and an error the server sends after it does not hide that.
// Only the chunks within the cap reach the caller.
func TestChatCappedHoldsAgainstBigChunks(t *testing.T) {
	const limit = 50
	line := fmt.Sprintf("a line of its stream ran past %d bytes, more than an answer of %d tokens takes, and was not read", maxLine(limit), limit)
	// A chunk of 1,000 words and the words before it, counted low: a
	// third of the estimate (a token a word), rounded up.
	counted := func(before int) string {
		return fmt.Sprintf("it was cut at %d tokens by the caller's count", (1000+before+2)/3)
	}
	for _, tc := range []struct {
		name     string
		s        *bigChunk
		streamed string // what the caller was handed
		why      string // how the call found the answer over its cap
		charged  int    // the answer's tokens the call reports
	}{
		// A line too long to read is charged as an answer that stopped at
		// its cap; a line that was read, its estimate.
		{"one huge chunk", &bigChunk{before: 3, bytes: 64 << 20, after: []string{ollamaFinal}},
			strings.Repeat(" dose", 3), line, limit},
		{"a chunk of a few megabytes", &bigChunk{before: 3, bytes: 4 << 20, after: []string{ollamaFinal}},
			strings.Repeat(" dose", 3), line, limit},
		{"a chunk of many tokens", &bigChunk{before: 3, bytes: 5000, after: []string{ollamaFinal}},
			strings.Repeat(" dose", 3), counted(3), 1003},
		{"a whole answer in one line", &bigChunk{bytes: 5000, done: true},
			"", counted(0), 1000},
		{"a huge whole answer in one line", &bigChunk{bytes: 64 << 20, done: true},
			"", line, limit},
		{"a mid-stream error after a huge chunk", &bigChunk{before: 2, bytes: 64 << 20, after: []string{ollamaError}},
			strings.Repeat(" dose", 2), line, limit},
		{"a mid-stream error after a big chunk", &bigChunk{before: 2, bytes: 5000, after: []string{ollamaError}},
			strings.Repeat(" dose", 2), counted(2), 1002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeOllama(t, tc.s.chat)
			var read atomic.Int64
			hc := &http.Client{Transport: countingTransport{srv.Client().Transport, &read}}
			req := chatRequestFor("llama3.2")
			req.Options.MaxOutputTokens = limit
			var got strings.Builder
			resp, err := models.ChatCapped(context.Background(), New(srv.URL, hc), req, func(c models.Chunk) error {
				got.WriteString(c.Content)
				return nil
			})
			require.Nil(t, resp)
			require.ErrorIs(t, err, models.ErrTruncated, "%v", err)
			require.Contains(t, err.Error(), "the answer reached its cap of 50 tokens (num_predict) and Ollama did not stop it: "+tc.why)
			require.NotContains(t, err.Error(), "unexpected EOF", "the cap is what the call reports")
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.charged, me.CompletionTokens)
			require.False(t, models.IsTransient(err), "the same call would run past its cap again")
			require.Equal(t, tc.streamed, got.String())
			require.Less(t, read.Load(), int64(256<<10), "the client read %d bytes of the stream", read.Load())
		})
	}
}
