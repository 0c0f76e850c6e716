package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/models/ollama"
)

// fakeOllama answers as Ollama does, with llama3.2:3b pulled, streaming
// the recorded plain answer, and keeps every chat request's body.
type fakeOllama struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (f *fakeOllama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/api/version":
		fmt.Fprint(w, `{"version":"0.17.4"}`)
	case "/api/tags":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"models":[{"name":"llama3.2:3b","model":"llama3.2:3b","modified_at":"2025-06-01T10:00:00Z","size":2019393189,"digest":"a80c4f17acd5","details":{"format":"gguf","family":"llama"}}]}`)
	case "/api/chat":
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "ollama", "plain.ndjson"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
			_, _ = w.Write(line)
			w.(http.Flusher).Flush()
		}
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeOllama) chats() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.bodies...)
}

// serve --model ollama:NAME that finds no Ollama at start serves the
// scripted model and says so, then moves new model calls to Ollama once
// it answers with the model: the switch is logged, /healthz reports it,
// and the calls from then on reach Ollama, with the keep-alive that keeps
// the model loaded between turns.
func TestServeMovesToOllamaOnceItAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // refused until the fake comes up

	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, errs := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"serve", "--data", data, "--listen", "127.0.0.1:0",
			"--model", "ollama:llama3.2:3b", "--ollama", "http://" + addr}, out, errs)
	}()
	consoleURL := regexp.MustCompile(`console: (http://\S+)/`)
	require.Eventually(t, func() bool { return consoleURL.MatchString(out.String()) }, 20*time.Second, 10*time.Millisecond,
		"serve did not start: %s %s", out, errs)
	s := &serving{url: consoleURL.FindStringSubmatch(out.String())[1]}
	tok, err := console.ReadToken(data)
	require.NoError(t, err)
	s.token = tok
	assert.Contains(t, errs.String(), "falling back to the scripted model")
	assert.Contains(t, out.String(), "model: no Ollama reachable at http://"+addr+": using the scripted model until it answers with llama3.2:3b")

	health := func() string {
		_, body := s.call(t, http.MethodGet, "/healthz", "")
		return string(body)
	}
	assert.Contains(t, health(), "no Ollama reachable at http://"+addr+" at start: using the scripted model until it answers with llama3.2:3b")
	turn := func(thread string) string {
		code, body := s.call(t, http.MethodPost, "/api/v1/threads/"+thread+"/runs",
			`{"agent": "medication-adherence", "input": "I forgot my metformin dose this morning, what should I do?", "wait": "20s"}`)
		require.Equal(t, http.StatusCreated, code, "%s", body)
		var run struct{ Status string }
		require.NoError(t, json.Unmarshal(body, &run))
		assert.NotEqual(t, "failed", run.Status, "%s", body)
		return string(body)
	}
	assert.Contains(t, turn("before"), "[kb-01]", "the scripted rules answer")

	fake := &fakeOllama{}
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(fake)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()

	require.Eventually(t, func() bool { return strings.Contains(out.String(), "model: Ollama at") }, 20*time.Second, 20*time.Millisecond,
		"serve did not switch: %s", out)
	assert.Contains(t, out.String(), "model: Ollama at http://"+addr+" answers with llama3.2:3b: new model calls use it")
	h := health()
	assert.Contains(t, h, `"detail":"ollama:llama3.2:3b (since `)
	assert.Contains(t, h, `"switched_at"`)
	assert.Empty(t, fake.chats(), "no call reached Ollama before a turn asked")

	turn("after")
	chats := fake.chats()
	require.NotEmpty(t, chats, "the turn after the switch called Ollama")
	assert.Equal(t, "llama3.2:3b", chats[0]["model"])
	assert.Equal(t, "24h0m0s", chats[0]["keep_alive"], "the model stays loaded between turns")

	cancel()
	select {
	case code := <-done:
		assert.Zero(t, code, "%s", errs)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// The model's calls carry a keep-alive, 24h unless --ollama-keep-alive
// says otherwise, so that an idle appliance's model is not unloaded
// between turns; 0 leaves it to Ollama's own setting.
func TestOllamaKeepAliveFlag(t *testing.T) {
	fake := &fakeOllama{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	for _, tc := range []struct {
		flag []string
		want any // nil: not sent
	}{
		{nil, "24h0m0s"},
		{[]string{"--ollama-keep-alive", "2h"}, "2h0m0s"},
		{[]string{"--ollama-keep-alive", "-1"}, float64(-1)},
		{[]string{"--ollama-keep-alive", "0"}, nil},
	} {
		args := append([]string{"run", "--data", t.TempDir(), "--model", "ollama:llama3.2:3b", "--ollama", srv.URL}, tc.flag...)
		code, _, errs := outpost(t, append(args, "I forgot my metformin dose this morning")...)
		require.Equal(t, 0, code, "%v: %s", tc.flag, errs)
		chats := fake.chats()
		require.NotEmpty(t, chats, "%v", tc.flag)
		got, sent := chats[len(chats)-1]["keep_alive"]
		if tc.want == nil {
			assert.False(t, sent, "%v: keep_alive %v", tc.flag, got)
		} else {
			assert.Equal(t, tc.want, got, "%v", tc.flag)
		}
	}
	code, _, errs := outpost(t, "run", "--data", t.TempDir(), "--ollama-keep-alive", "a while", "hello")
	assert.NotZero(t, code)
	assert.Contains(t, errs, "want a duration such as 24h")
}

// /healthz, which anyone may call, asks Ollama for its models at most once
// per healthTTL, however often it is polled.
func TestHealthAsksOllamaOncePerTTL(t *testing.T) {
	var tags atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/tags" {
			tags.Add(1)
		}
		(&fakeOllama{}).ServeHTTP(w, r)
	}))
	defer srv.Close()
	mc := &modelChoice{model: "ollama:llama3.2:3b", ollama: srv.URL}
	check := modelCheck(context.Background(), mc, ollama.New(srv.URL, nil), "llama3.2:3b", nil, io.Discard)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := check(context.Background())
			assert.Equal(t, console.StateOK, h.State, h.Detail)
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), tags.Load(), "20 health checks asked Ollama for its models")

	// A check its caller gave up on is not the answer for the next ones.
	cached := cachedHasModel(ollama.New(srv.URL, nil), "llama3.2:3b")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := cached(gone)
	require.Error(t, err)
	has, err := cached(context.Background())
	require.NoError(t, err)
	require.True(t, has)
}
