package wiring

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models/ollama"
)

// lateOllama is an address that refuses connections until up is called,
// and then serves Ollama's /api/tags, with the model once pulled is.
type lateOllama struct {
	addr   string
	pulled atomic.Bool
	srv    *httptest.Server
}

func newLateOllama(t *testing.T) *lateOllama {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := &lateOllama{addr: l.Addr().String()}
	require.NoError(t, l.Close()) // refused from now until up
	return o
}

func (o *lateOllama) up(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", o.addr)
	require.NoError(t, err)
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/tags" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		list := `{"models":[{"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b"}]}`
		if o.pulled.Load() {
			list = `{"models":[{"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b"},{"name":"llama3.2:3b","model":"llama3.2:3b"}]}`
		}
		fmt.Fprint(w, list)
	}))
	o.srv.Listener.Close()
	o.srv.Listener = l
	o.srv.Start()
	t.Cleanup(o.srv.Close)
}

type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(f string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(f, a...))
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "waited 10s for %s", what)
		time.Sleep(5 * time.Millisecond)
	}
}

// An Ollama that refused connections at start is probed with a backoff;
// once it answers with the model installed, new model calls go to it, and
// the switch is logged and reported. Answering without the model is not
// enough: the scripted rules go on serving, and the log says what to pull.
func TestOllamaSwitchMovesToOllamaOnceItServesTheModel(t *testing.T) {
	o := newLateOllama(t)
	var log logLines
	sw := NewOllamaSwitch(ollama.New("http://"+o.addr, nil), "llama3.2:3b",
		SwitchOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, Logf: log.logf})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sw.Run(ctx) }()

	waitFor(t, "a refused probe", func() bool { return !sw.Status().LastProbe.IsZero() })
	st := sw.Status()
	assert.False(t, st.Live)
	assert.Contains(t, st.LastError, "connection refused")
	assert.False(t, st.NextProbe.IsZero(), "the next probe is planned")
	p, model := sw.Models()
	assert.Nil(t, p, "the scripted rules serve while Ollama refuses")
	assert.Empty(t, model)

	o.up(t)
	waitFor(t, "a probe that finds no model", func() bool { return strings.Contains(sw.Status().LastError, "ollama pull llama3.2:3b") })
	p, _ = sw.Models()
	assert.Nil(t, p, "an Ollama without the model does not take the calls")

	o.pulled.Store(true)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the switch did not happen")
	}
	p, model = sw.Models()
	require.NotNil(t, p)
	assert.Equal(t, "ollama", p.Name())
	assert.Equal(t, "llama3.2:3b", model)
	st = sw.Status()
	assert.True(t, st.Live)
	assert.False(t, st.SwitchedAt.IsZero())
	assert.Empty(t, st.LastError)
	assert.True(t, st.NextProbe.IsZero(), "no more probes")
	logged := log.String()
	assert.Contains(t, logged, "has no model llama3.2:3b (ollama pull llama3.2:3b); still using the scripted model")
	assert.Contains(t, logged, "model: Ollama at http://"+o.addr+" answers with llama3.2:3b: new model calls use it")
	assert.Equal(t, 1, strings.Count(logged, "has no model"), "said once, not at every probe")
}

// Stopping the appliance stops the probes; the scripted rules served all
// along.
func TestOllamaSwitchStopsWithItsContext(t *testing.T) {
	o := newLateOllama(t)
	sw := NewOllamaSwitch(ollama.New("http://"+o.addr, nil), "llama3.2:3b", SwitchOptions{MinBackoff: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, sw.Run(ctx), context.DeadlineExceeded)
	p, _ := sw.Models()
	assert.Nil(t, p)
	assert.False(t, sw.Status().Live)
	assert.True(t, sw.Status().NextProbe.IsZero())
}
