package ollama

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
)

func TestProviderSuite(t *testing.T) {
	modelstest.RunProviderSuite(t, func() models.Provider {
		srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
		return New(srv.URL, srv.Client())
	})
}

func chatRequestFor(model string) models.Request {
	return models.Request{
		Model:    model,
		Messages: []models.Message{{Role: models.RoleUser, Content: "I forgot my metformin dose"}},
	}
}

func TestChatReplaysRecordedStreams(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		model   string
	}{
		{"plain.ndjson", "llama3.2"},
		{"tool_calls.ndjson", "llama3.2"},
		{"thinking.ndjson", "qwen3:0.6b"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			want := expectFixture(t, tc.fixture)
			srv := newFakeOllama(t, replayStream(t, tc.fixture))
			c := New(srv.URL, srv.Client())

			var chunks []models.Chunk
			resp, err := c.Chat(context.Background(), chatRequestFor(tc.model), func(ch models.Chunk) error {
				chunks = append(chunks, ch)
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, "ollama", resp.Provider)
			require.Equal(t, want.model, resp.Model)
			require.Equal(t, models.RoleAssistant, resp.Message.Role)
			require.Equal(t, want.content, resp.Message.Content)
			require.Equal(t, want.thinking, resp.Message.Thinking)
			require.Equal(t, want.doneReason, resp.DoneReason)
			require.Equal(t, want.promptTokens, resp.PromptTokens)
			require.Equal(t, want.completionTokens, resp.CompletionTokens)
			require.Equal(t, want.totalDuration, resp.Duration)
			require.Len(t, chunks, want.chunks, "one chunk per line that carries text or calls")
			require.Len(t, resp.Message.ToolCalls, len(want.toolCalls))
			for i, w := range want.toolCalls {
				got := resp.Message.ToolCalls[i]
				require.Equal(t, w.id, got.ID)
				require.Equal(t, w.name, got.Name)
				require.JSONEq(t, string(w.args), string(got.Arguments))
			}
		})
	}
}

func TestChatFailures(t *testing.T) {
	partial := fixtureLines(t, "plain.ndjson")[:2]

	for _, tc := range []struct {
		name      string
		handler   http.HandlerFunc
		timeout   time.Duration
		kind      models.ErrorKind
		transient bool
		is        error
		contains  []string
		status    int
		chunks    int // chunks delivered before the failure
	}{
		{
			name:     "error line mid-stream",
			handler:  replayStream(t, "error_midstream.ndjson"),
			kind:     models.Stream,
			contains: []string{"model llama3.2 failed mid-answer", "unexpected EOF"},
			chunks:   2,
		},
		{
			name: "slow first token",
			handler: func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-time.After(5 * time.Second):
				}
			},
			timeout:   100 * time.Millisecond,
			kind:      models.Timeout,
			transient: true,
			is:        models.ErrTimeout,
			contains:  []string{"model llama3.2 did not answer in time", "100ms"},
		},
		{
			name: "stalls after first tokens",
			handler: func(w http.ResponseWriter, r *http.Request) {
				for _, line := range partial {
					_, _ = w.Write(append(line, '\n'))
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			timeout:   150 * time.Millisecond,
			kind:      models.Timeout,
			transient: true,
			is:        context.DeadlineExceeded,
			chunks:    2,
		},
		{
			name:      "connection dropped mid-stream",
			handler:   dropAfter(partial),
			kind:      models.Stream,
			transient: true,
			is:        models.ErrDropped,
			chunks:    2,
		},
		{
			name:      "connection dropped before answering",
			handler:   dropAfter(nil),
			kind:      models.Unreachable,
			transient: true,
			is:        models.ErrUnreachable,
		},
		{
			name:     "model not pulled",
			handler:  answerStatus(http.StatusNotFound, string(readFixture(t, "not_found.json"))),
			kind:     models.NotFound,
			is:       models.ErrModelNotFound,
			status:   404,
			contains: []string{`model llama3.2 is not installed: run "ollama pull llama3.2"`},
		},
		{
			name:     "model cannot use tools",
			handler:  answerStatus(http.StatusBadRequest, `{"error":"registry.ollama.ai/library/llama3.2 does not support tools"}`),
			kind:     models.BadRequest,
			status:   400,
			contains: []string{"does not support tools"},
		},
		{
			name:      "server error",
			handler:   answerStatus(http.StatusInternalServerError, `{"error":"llama runner process has terminated: signal: killed"}`),
			kind:      models.Server,
			transient: true,
			status:    500,
			contains:  []string{"llama runner process has terminated"},
		},
		{
			name:     "error status with no body",
			handler:  answerStatus(http.StatusBadRequest, ""),
			kind:     models.BadRequest,
			status:   400,
			contains: []string{"no error message"},
		},
		{
			name:      "server error with no body",
			handler:   answerStatus(http.StatusInternalServerError, ""),
			kind:      models.Server,
			transient: true,
			status:    500,
			contains:  []string{"no error message"},
		},
		{
			name:      "busy",
			handler:   answerStatus(http.StatusServiceUnavailable, `{"error":"server busy, please try again.  maximum pending requests exceeded"}`),
			kind:      models.Server,
			transient: true,
			status:    503,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeOllama(t, tc.handler)
			c := New(srv.URL, srv.Client())
			req := chatRequestFor("llama3.2")
			req.Timeout = tc.timeout

			chunks := 0
			start := time.Now()
			resp, err := c.Chat(context.Background(), req, func(models.Chunk) error { chunks++; return nil })
			require.Nil(t, resp)
			require.Less(t, time.Since(start), 3*time.Second, "a failure must not wait out the server")

			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.kind, me.Kind, "error: %v", err)
			require.Equal(t, "ollama", me.Provider)
			require.Equal(t, "llama3.2", me.Model)
			require.Equal(t, srv.URL, me.URL)
			require.Equal(t, tc.status, me.Status)
			require.Equal(t, tc.transient, models.IsTransient(err), "transient? error: %v", err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			for _, s := range tc.contains {
				require.Contains(t, err.Error(), s)
			}
			require.Equal(t, tc.chunks, chunks)
		})
	}
}

// dropAfter writes the given lines as a chunked 200 response, then closes
// the connection without the terminating chunk, as a crashed server would.
// With no lines it closes before sending any headers.
func dropAfter(lines [][]byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		if lines == nil {
			return
		}
		fmt.Fprint(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, line := range lines {
			fmt.Fprintf(buf, "%x\r\n%s\n\r\n", len(line)+1, line)
		}
		_ = buf.Flush()
	}
}

func TestChatConnectionRefused(t *testing.T) {
	url := refusingURL(t)
	c := New(url, nil)
	resp, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrUnreachable)
	require.True(t, models.IsTransient(err))
	require.True(t, strings.HasPrefix(err.Error(), "Ollama is not reachable at "+url), err.Error())
	require.Contains(t, err.Error(), "connection refused")
	require.Contains(t, err.Error(), "ollama serve")

	require.ErrorIs(t, c.Ping(context.Background()), models.ErrUnreachable)
	_, err = c.HasModel(context.Background(), "llama3.2")
	require.ErrorIs(t, err, models.ErrUnreachable)
}

// refusingURL returns the URL of a loopback port that nothing listens on.
func refusingURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

func TestChatStreamCallbackStops(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	c := New(srv.URL, srv.Client())
	stop := errors.New("client disconnected")
	seen := 0
	resp, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), func(ch models.Chunk) error {
		seen++
		if seen == 3 {
			return stop
		}
		return nil
	})
	require.Nil(t, resp)
	require.Same(t, stop, err, "the callback's error is returned as is")
	require.Equal(t, 3, seen)
}

func TestChatCallerCancel(t *testing.T) {
	started := make(chan struct{})
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	})
	c := New(srv.URL, srv.Client())
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	_, err := c.Chat(ctx, chatRequestFor("llama3.2"), nil)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Canceled, me.Kind)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, models.IsTransient(err))
}

func TestChatSendsRequestAsOllamaExpects(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "tool_calls.ndjson"))
	c := New(srv.URL, srv.Client())
	temp, seed, keep := 0.2, 42, 10*time.Minute
	req := models.Request{
		Model: "llama3.2",
		Messages: []models.Message{
			{Role: models.RoleSystem, Content: "Answer from the knowledge base."},
			{Role: models.RoleUser, Content: "I forgot my metformin dose"},
			{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{ID: "call_1", Name: "kb_search", Arguments: json.RawMessage(`{"query":"metformin"}`)}}},
			{Role: models.RoleTool, ToolName: "kb_search", Content: "[doc-7] Take a missed dose with the next meal."},
		},
		Tools: []models.ToolDef{{
			Name:        "kb_search",
			Description: "Search the knowledge base.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"query":{"type":"string","description":"keywords"}},"required":["query"]}`),
		}},
		Format:    json.RawMessage(`{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}`),
		Options:   models.Options{Temperature: &temp, Seed: &seed, NumCtx: 4096},
		KeepAlive: &keep,
		Think:     true,
	}
	_, err := c.Chat(context.Background(), req, nil)
	require.NoError(t, err)

	body, err := json.Marshal(srv.lastBody(t))
	require.NoError(t, err)
	require.JSONEq(t, `{
		"model": "llama3.2",
		"stream": true,
		"messages": [
			{"role": "system", "content": "Answer from the knowledge base."},
			{"role": "user", "content": "I forgot my metformin dose"},
			{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "function": {"index": 0, "name": "kb_search", "arguments": {"query": "metformin"}}}]},
			{"role": "tool", "content": "[doc-7] Take a missed dose with the next meal.", "tool_name": "kb_search"}
		],
		"tools": [{"type": "function", "function": {"name": "kb_search", "description": "Search the knowledge base.",
			"parameters": {"type": "object", "required": ["query"], "properties": {"query": {"type": "string", "description": "keywords"}}}}}],
		"format": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
		"options": {"temperature": 0.2, "seed": 42, "num_ctx": 4096},
		"keep_alive": "10m0s",
		"think": true
	}`, string(body))
}

func TestChatFormatAndDefaults(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	c := New(srv.URL, srv.Client())
	for _, format := range []string{`json`, `"json"`} {
		req := chatRequestFor("llama3.2")
		req.Format = json.RawMessage(format)
		_, err := c.Chat(context.Background(), req, nil)
		require.NoError(t, err)
		body := srv.lastBody(t)
		require.Equal(t, "json", body["format"])
		require.Nil(t, body["options"], "no options set: the model's defaults apply")
		require.NotContains(t, body, "think", "think is left to the model unless asked for")
		require.NotContains(t, body, "keep_alive")
	}
}

func TestChatRefusesBadInputBeforeSending(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	c := New(srv.URL, srv.Client())
	for name, mutate := range map[string]func(*models.Request){
		"no model":        func(r *models.Request) { r.Model = "" },
		"no messages":     func(r *models.Request) { r.Messages = nil },
		"format not JSON": func(r *models.Request) { r.Format = json.RawMessage(`{schema`) },
		"schema not obj":  func(r *models.Request) { r.Tools = []models.ToolDef{{Name: "x", Parameters: json.RawMessage(`[1]`)}} },
		"args not object": func(r *models.Request) {
			r.Messages[0].ToolCalls = []models.ToolCall{{Name: "x", Arguments: json.RawMessage(`"q"`)}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			req := chatRequestFor("llama3.2")
			mutate(&req)
			_, err := c.Chat(context.Background(), req, nil)
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, models.BadRequest, me.Kind)
			require.False(t, models.IsTransient(err))
			require.Zero(t, srv.requests())
		})
	}
}

func TestUnparseableBaseURL(t *testing.T) {
	c := New("http://[::1", nil)
	_, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.BadRequest, me.Kind)
	require.Contains(t, err.Error(), "invalid Ollama URL")
	require.ErrorAs(t, c.Ping(context.Background()), &me)
}

func TestPingAndHasModel(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	c := New(strings.TrimPrefix(srv.URL, "http://")+"/", srv.Client())
	require.NoError(t, c.Ping(context.Background()))
	for name, want := range map[string]bool{
		"llama3.2":                            true,
		"llama3.2:latest":                     true,
		"llama3.2:1b":                         false,
		"qwen3:0.6b":                          false,
		"registry.local:5000/team/qwen3:0.6b": true,
		"registry.local:5000/team/qwen3":      false,
	} {
		got, err := c.HasModel(context.Background(), name)
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
}

func TestNewDefaults(t *testing.T) {
	require.Equal(t, DefaultURL, New("", nil).URL())
	require.Equal(t, "http://10.0.0.5:11434", New("10.0.0.5:11434", nil).URL())
	require.Equal(t, "ollama", New("", nil).Name())
}

// A slow response body must not be mistaken for a finished one: the stream
// ends without an error when its body does, so this pins the "no final
// chunk" check.
func TestChatIncompleteStreamWithoutError(t *testing.T) {
	lines := fixtureLines(t, "plain.ndjson")
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		bw := bufio.NewWriter(w)
		for _, l := range lines[:len(lines)-1] {
			_, _ = bw.Write(append(l, '\n'))
		}
		_ = bw.Flush()
	})
	c := New(srv.URL, srv.Client())
	_, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.ErrorIs(t, err, models.ErrDropped)
	require.True(t, models.IsTransient(err))
}

func TestErrorMessages(t *testing.T) {
	url := refusingURL(t)
	_, err := New(url, nil).Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	t.Log(err)
	srv := newFakeOllama(t, answerStatus(404, string(readFixture(t, "not_found.json"))))
	_, err = New(srv.URL, nil).Chat(context.Background(), chatRequestFor("llama3.2"), nil)
	require.EqualError(t, err, `model llama3.2 is not installed: run "ollama pull llama3.2"`)
}

// A final chunk that does not end an answer must not pass for one: "length"
// means the model hit its token limit mid-answer, and "load" is what Ollama
// answers when it only loaded the model (a chat with no messages).
func TestChatRefusesAnswersThatDidNotFinish(t *testing.T) {
	for _, tc := range []struct {
		fixture        string
		kind           models.ErrorKind
		is             error
		contains       []string
		chunks         int
		prompt, answer int // the counts the error carries: what the call spent
	}{
		{"length.ndjson", models.Truncated, models.ErrTruncated,
			[]string{"model llama3.2 stopped at its token limit", `done_reason "length"`, "num_ctx"}, 8, 31, 8},
		{"load.ndjson", models.Stream, nil, []string{"model llama3.2 failed mid-answer", `done_reason "load"`}, 0, 0, 0},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			srv := newFakeOllama(t, replayStream(t, tc.fixture))
			c := New(srv.URL, srv.Client())
			chunks := 0
			resp, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error { chunks++; return nil })
			require.Nil(t, resp, "a cut-short answer is not returned as a complete one")
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.kind, me.Kind, "error: %v", err)
			require.False(t, models.IsTransient(err), "the same call would stop the same way")
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			for _, s := range tc.contains {
				require.Contains(t, err.Error(), s)
			}
			require.Equal(t, tc.chunks, chunks, "the tokens that did come were still streamed")
			require.Equal(t, tc.prompt, me.PromptTokens, "a refused answer's tokens were still spent")
			require.Equal(t, tc.answer, me.CompletionTokens)
		})
	}
}

// Ollama answers 404 both for a model it has not pulled and for a path it
// does not serve (an --ollama URL with a path, or another server behind
// the port). Only the first is fixed by "ollama pull".
func TestChatTellsMissingModelFromWrongURL(t *testing.T) {
	for _, tc := range []struct {
		name, body, contentType string
		kind                    models.ErrorKind
		contains, excludes      []string
	}{
		{"older Ollama", `{"error":"model \"llama3.2\" not found, try pulling it first"}`, "application/json; charset=utf-8",
			models.NotFound, []string{`run "ollama pull llama3.2"`}, nil},
		{"newer Ollama", `{"error":"model 'llama3.2' not found"}`, "application/json; charset=utf-8",
			models.NotFound, []string{`run "ollama pull llama3.2"`}, nil},
		{"no such path", "404 page not found", "text/plain",
			models.BadRequest, []string{"status 404", "404 page not found", "Ollama's base URL"}, []string{"ollama pull", "not installed"}},
		{"proxy page", "<html><body><h1>404 Not Found</h1></body></html>", "text/html",
			models.BadRequest, []string{"status 404", "Ollama's base URL"}, []string{"ollama pull"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(tc.body))
			})
			_, err := New(srv.URL, srv.Client()).Chat(context.Background(), chatRequestFor("llama3.2"), nil)
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.kind, me.Kind, "error: %v", err)
			require.Equal(t, http.StatusNotFound, me.Status)
			require.False(t, models.IsTransient(err))
			for _, s := range tc.contains {
				require.Contains(t, err.Error(), s)
			}
			for _, s := range tc.excludes {
				require.NotContains(t, err.Error(), s)
			}
		})
	}
}

// A line that is not JSON (another server's page, a proxy's, a line cut
// short) fails the call as a stream error that quotes the line, but only
// its start: the error goes into events, the run's record and its outcome.
func TestChatInvalidLineIsQuotedShort(t *testing.T) {
	plain := fixtureLines(t, "plain.ndjson")
	for name, bad := range map[string][]byte{
		"cut short": plain[3][:40],
		"html page": []byte("<!DOCTYPE html><html><body>" + strings.Repeat("<p>lorem ipsum</p>", 8000) + "</body></html>"),
		"sse":       append([]byte("data: "), plain[3]...),
	} {
		t.Run(name, func(t *testing.T) {
			chunks, err := failingStream(t, plain[0], plain[1], bad, plain[len(plain)-1])
			require.Equal(t, 2, chunks, "the lines before it were streamed")
			require.Contains(t, err.Error(), string(bad[:min(len(bad), 30)]))
			require.Less(t, len(err.Error()), 600, "error: %.200s…", err)
		})
	}
}

// A proxy in front of Ollama answers a failure with its own page. When the
// answer is capped, the page is no answer to hold to the cap, however much
// longer it is than a line of the capped answer may be.
func TestChatStatusPageIsQuotedShort(t *testing.T) {
	page := "<html><head><title>502 Bad Gateway</title></head><body>" + strings.Repeat("<!-- padding -->", 4000) + "</body></html>"
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(page))
	})
	for name, limit := range map[string]int{"no cap": 0, "capped": 50} {
		t.Run(name, func(t *testing.T) {
			req := chatRequestFor("llama3.2")
			req.Options.MaxOutputTokens = limit
			_, err := New(srv.URL, srv.Client()).Chat(context.Background(), req, nil)
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, models.Server, me.Kind, "error: %v", err)
			require.Equal(t, http.StatusBadGateway, me.Status)
			require.True(t, models.IsTransient(err))
			require.Contains(t, err.Error(), "<title>502 Bad Gateway</title>", "the page is quoted")
			require.Less(t, len(err.Error()), 600, "error: %.200s…", err)
		})
	}
	require.Greater(t, len(page), maxLine(50), "the page is longer than a line of an answer capped at 50 tokens")
}

// A deadline the caller set with a cause of its own (the engine's node
// timeout, a run's wall time) ran out while the model stalled: that is a
// timeout, worth the node's retry, and not a cancel.
func TestChatCallerDeadlineWithCauseIsATimeout(t *testing.T) {
	partial := fixtureLines(t, "plain.ndjson")[:2]
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		for _, line := range partial {
			_, _ = w.Write(append(line, '\n'))
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	nodeTimedOut := errors.New(`node "generate_response" timed out after 150ms`)
	ctx, cancel := context.WithTimeoutCause(context.Background(), 150*time.Millisecond, nodeTimedOut)
	defer cancel()
	_, err := New(srv.URL, srv.Client()).Chat(ctx, chatRequestFor("llama3.2"), nil)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Timeout, me.Kind, "error: %v", err)
	require.True(t, models.IsTransient(err))
	require.ErrorIs(t, err, models.ErrTimeout)
	require.ErrorIs(t, err, nodeTimedOut, "the cause is kept")
	require.Contains(t, err.Error(), `node "generate_response" timed out`)
}

// Lines of up to 8 MB are read, and the stream stops at a longer one. That
// is not a dropped connection: the same call would stop at the same line,
// so it is not worth a retry.
func TestChatLineTooLong(t *testing.T) {
	plain := fixtureLines(t, "plain.ndjson")
	huge := fmt.Sprintf(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":%q},"done":false}`,
		strings.Repeat("metformin ", 900_000))
	chunks, err := failingStream(t, plain[0], []byte(huge), plain[len(plain)-1])
	require.NotErrorIs(t, err, models.ErrDropped)
	require.Contains(t, err.Error(), "longer than")
	require.Equal(t, 1, chunks)
}

// failingStream answers a chat with lines as a 200 NDJSON stream, and
// checks that it fails as a Stream error not worth a retry. It returns the
// chunks streamed before the failure, and the error.
func failingStream(t *testing.T, lines ...[]byte) (int, error) {
	t.Helper()
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, line := range lines {
			_, _ = w.Write(append(line, '\n'))
		}
	})
	chunks := 0
	resp, err := New(srv.URL, srv.Client()).Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error { chunks++; return nil })
	require.Nil(t, resp)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Stream, me.Kind, "error: %v", err)
	require.False(t, models.IsTransient(err), "error: %v", err)
	return chunks, err
}

// The model list is read whole, so a server (or something in its place)
// that sends a list without end is cut off at maxListBody, with an error
// that says so, not read into memory to its end. A list that ends at the
// bound is whole.
func TestModelListIsBounded(t *testing.T) {
	entry := `{"name":"llama3.2:latest","model":"llama3.2:latest"},`
	list := func(n int) string { return `{"models":[` + strings.Repeat(entry, n) + entry[:len(entry)-1] + `]}` }
	fits := (maxListBody - len(list(0))) / len(entry)
	for _, tc := range []struct {
		name string
		body string // "" for one without end
	}{
		{"at the bound", list(fits) + strings.Repeat(" ", maxListBody-len(list(fits)))},
		{"without end", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.body != "" {
					_, _ = io.WriteString(w, tc.body)
					return
				}
				_, _ = io.WriteString(w, `{"models":[`)
				chunk := strings.Repeat(entry, 1<<12)
				for i := 0; i < (64<<20)/len(chunk); i++ {
					if _, err := io.WriteString(w, chunk); err != nil {
						return // the client hung up
					}
				}
			}))
			defer srv.Close()
			c := New(srv.URL, srv.Client())
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			ok, err := c.HasModel(context.Background(), "llama3.2")
			runtime.ReadMemStats(&after)
			if tc.body != "" {
				require.Len(t, tc.body, maxListBody)
				require.NoError(t, err)
				require.True(t, ok)
				return
			}
			// Reading the 64 MB whole would allocate more than twice that;
			// the bound leaves room for the server's side of the test.
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8*maxListBody), "bytes allocated")
			require.Error(t, err)
			require.Contains(t, err.Error(), "longer than the 4 MB")
		})
	}
}
