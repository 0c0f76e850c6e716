package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
	"github.com/outpost-edge/outpost/policy"
)

// A model node whose Ollama stream stalls past the node's timeout is tried
// again under its retry policy: the engine's timeout reaches the Ollama
// client as the context's cause, and must come back as a transient error.
func TestStalledModelCallIsRetriedAfterTheNodeTimeout(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if calls.Add(1) == 1 { // a first token, then nothing
			_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":"If"},"done":false}` + "\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":"ok"},"done":false}` + "\n" +
			`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"prompt_eval_count":3,"eval_count":1}` + "\n"))
	}))
	defer srv.Close()
	store := engine.NewMemoryStore()
	mc := &agent.ModelCall{Provider: ollama.New(srv.URL, srv.Client()), Lane: &policy.Lane{Agent: "a", Models: []string{"llama3.2"}},
		Log: agent.NewMemoryCallLog(), Blobs: store}
	b := engine.NewGraph("a")
	out := engine.Replace[string](b, "out")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "llama3.2", Messages: []models.Message{{Role: "user", Content: "hi"}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(resp.Message.Content)}, nil
	}, engine.WithTimeout(200*time.Millisecond), engine.WithRetry(engine.RetryPolicy{MaxAttempts: 2, Initial: time.Millisecond}))
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store})
	require.NotNil(t, res, "%v", err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, int32(2), calls.Load())
	require.Equal(t, "ok", out.Get(res.State))
}

// A call cut off by the run's wall-time budget spent what its server read
// and wrote before then: it is recorded, though the run is stopping, so
// that the outcome and the run's token count hold it.
func TestModelCallStoppedByTheRunsDeadlineIsRecorded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"model":"llama3.2","message":{"role":"assistant","content":"If you missed a dose"},"done":false}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	log := agent.NewMemoryCallLog()
	store := engine.NewMemoryStore()
	mc := &agent.ModelCall{Provider: ollama.New(srv.URL, srv.Client()), Lane: &policy.Lane{Agent: "a", Models: []string{"llama3.2"}},
		Log: log, Blobs: store, TokenLimit: 1000}
	b := engine.NewGraph("a")
	out := engine.Replace[string](b, "out")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "llama3.2", Messages: []models.Message{{Role: "user", Content: "I forgot my dose"}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(resp.Message.Content)}, nil
	})
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store, MaxDuration: 300 * time.Millisecond})
	require.ErrorIs(t, err, engine.ErrDeadline)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
	tokens, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	// 4 + 4 for the prompt's message, 5 for the 20 bytes streamed.
	require.Equal(t, 13, tokens, "records: %+v", log.Records(agent.ModelKeyPrefix(res.Run.ID)))
}
