package ollama

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fixtureDir holds the recorded streams, shared with the rest of the repo's
// test data.
var fixtureDir = filepath.Join("..", "..", "testdata", "ollama")

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, name))
	require.NoError(t, err)
	return b
}

func fixtureLines(t testing.TB, name string) [][]byte {
	t.Helper()
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(readFixture(t, name)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			// A full slice expression keeps append(line, '\n') from writing
			// into a buffer that concurrent handlers share.
			line := append([]byte(nil), sc.Bytes()...)
			lines = append(lines, line[:len(line):len(line)])
		}
	}
	require.NoError(t, sc.Err())
	return lines
}

// expected is what a fixture should turn into, worked out from the file with
// a plain decoder rather than the code under test, so that re-recorded
// fixtures need no edits to the tests.
type expected struct {
	model, content, thinking, doneReason string
	toolCalls                            []expectedCall
	chunks                               int // lines that carry content, thinking or tool calls
	promptTokens, completionTokens       int
	totalDuration                        time.Duration
}

type expectedCall struct {
	id, name string
	args     json.RawMessage
}

func expectFixture(t testing.TB, name string) expected {
	t.Helper()
	var e expected
	for _, line := range fixtureLines(t, name) {
		var l struct {
			Model   string `json:"model"`
			Message struct {
				Content   string `json:"content"`
				Thinking  string `json:"thinking"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct {
						Name      string          `json:"name"`
						Arguments json.RawMessage `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			Done            bool   `json:"done"`
			DoneReason      string `json:"done_reason"`
			PromptEvalCount int    `json:"prompt_eval_count"`
			EvalCount       int    `json:"eval_count"`
			TotalDuration   int64  `json:"total_duration"`
		}
		require.NoError(t, json.Unmarshal(line, &l))
		e.model = l.Model
		e.content += l.Message.Content
		e.thinking += l.Message.Thinking
		for _, tc := range l.Message.ToolCalls {
			e.toolCalls = append(e.toolCalls, expectedCall{tc.ID, tc.Function.Name, tc.Function.Arguments})
		}
		if l.Message.Content != "" || l.Message.Thinking != "" || len(l.Message.ToolCalls) > 0 {
			e.chunks++
		}
		if l.Done {
			e.doneReason = l.DoneReason
			e.promptTokens = l.PromptEvalCount
			e.completionTokens = l.EvalCount
			e.totalDuration = time.Duration(l.TotalDuration)
		}
	}
	return e
}

// fakeOllama is an httptest server standing in for Ollama. Each test sets
// the /api/chat handler; every request body is kept for inspection.
type fakeOllama struct {
	*httptest.Server
	mu     sync.Mutex
	chat   http.HandlerFunc
	bodies [][]byte
}

func newFakeOllama(t testing.TB, chat http.HandlerFunc) *fakeOllama {
	t.Helper()
	f := &fakeOllama{chat: chat}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(r.Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, buf.Bytes())
		f.mu.Unlock()
		f.chat(w, r)
	})
	mux.HandleFunc("GET /api/tags", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"models":[{"name":"llama3.2:latest","model":"llama3.2:latest","modified_at":"2025-06-01T10:00:00Z","size":2019393189,"digest":"a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72","details":{"format":"gguf","family":"llama","parameter_size":"3.2B","quantization_level":"Q4_K_M"}},{"name":"registry.local:5000/team/qwen3:0.6b","model":"registry.local:5000/team/qwen3:0.6b","modified_at":"2025-06-01T10:00:00Z","size":522653767,"digest":"7df6b6e09427","details":{}}]}`))
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeOllama) lastBody(t *testing.T) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.bodies, "the server saw no request")
	var m map[string]any
	require.NoError(t, json.Unmarshal(f.bodies[len(f.bodies)-1], &m))
	return m
}

func (f *fakeOllama) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// replayStream answers with a fixture's lines, flushing each as Ollama does.
func replayStream(t testing.TB, name string) http.HandlerFunc {
	lines := fixtureLines(t, name)
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, line := range lines {
			if _, err := w.Write(append(line, '\n')); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// answerStatus answers with a status and a fixture (or literal) JSON body.
func answerStatus(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(strings.TrimSpace(body)))
	}
}
