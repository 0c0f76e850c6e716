package replay_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
	"github.com/outpost-edge/outpost/models/replay"
	"github.com/outpost-edge/outpost/models/scripted"
)

// blobStore stands in for the store: responses kept as encoded blobs, as
// the engine keeps them.
type blobStore struct {
	mu    sync.Mutex
	blobs map[replay.Key][]byte
}

func (s *blobStore) record(t testing.TB, key replay.Key, resp *models.Response) {
	t.Helper()
	b, err := models.EncodeResponse(resp)
	require.NoError(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blobs == nil {
		s.blobs = map[replay.Key][]byte{}
	}
	s.blobs[key] = b
}

func (s *blobStore) lookup(_ context.Context, key replay.Key) (*models.Response, error) {
	s.mu.Lock()
	b, ok := s.blobs[key]
	s.mu.Unlock()
	if !ok {
		return nil, replay.ErrNotRecorded
	}
	return models.DecodeResponse(b)
}

// keyed makes the suite's calls under a fixed key, as a model node would.
type keyed struct {
	*replay.Provider
	key replay.Key
}

func (k keyed) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	return k.Provider.Chat(replay.WithKey(ctx, k.key), req, stream)
}

func recordScripted(t testing.TB, store *blobStore, key replay.Key, req models.Request) *models.Response {
	t.Helper()
	p, err := scripted.Load([]byte(`[{"match": "metformin", "thinking": "look it up",
		"respond": "Take it with your next meal.", "tool_calls": [{"name": "kb_search", "arguments": {"query": "{{input}}"}}]}]`))
	require.NoError(t, err)
	resp, err := p.Chat(context.Background(), req, nil)
	require.NoError(t, err)
	store.record(t, key, resp)
	return resp
}

func TestProviderSuite(t *testing.T) {
	key := replay.Key{Run: "r1", Step: 2, Task: "generate_response", Call: 0}
	modelstest.RunProviderSuite(t, func() models.Provider {
		store := &blobStore{}
		recordScripted(t, store, key, modelstest.SuiteRequest())
		return keyed{replay.New(store.lookup), key}
	})
}

func TestReplaysInOrder(t *testing.T) {
	store := &blobStore{}
	req := modelstest.SuiteRequest()
	k0 := replay.Key{Run: "r1", Step: 3, Task: "tool_loop", Call: 0}
	k1 := replay.Key{Run: "r1", Step: 3, Task: "tool_loop", Call: 1}
	orig0 := recordScripted(t, store, k0, req)
	req1 := req
	req1.Messages = append(append([]models.Message(nil), req.Messages...), orig0.Message,
		models.Message{Role: models.RoleTool, ToolName: "kb_search", Content: "[doc-7]"})
	store.record(t, k1, &models.Response{Provider: "ollama", Model: "llama3.2", DoneReason: "stop",
		Message: models.Message{Role: models.RoleAssistant, Content: "Done [doc-7]"}, RequestHash: models.HashRequest(req1)})

	p := replay.New(store.lookup)
	var chunks []models.Chunk
	got0, err := p.Chat(replay.WithKey(context.Background(), k0), req, func(c models.Chunk) error {
		chunks = append(chunks, c)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "replay", got0.Provider)
	want := *orig0
	want.Provider = "replay"
	require.Equal(t, &want, got0)
	require.Equal(t, []models.Chunk{{Content: orig0.Message.Content, Thinking: orig0.Message.Thinking, ToolCalls: orig0.Message.ToolCalls}}, chunks)

	got1, err := p.Chat(replay.WithKey(context.Background(), k1), req1, nil)
	require.NoError(t, err)
	require.Equal(t, "Done [doc-7]", got1.Message.Content)
	require.Equal(t, "llama3.2", got1.Model)
}

func TestReplayFailures(t *testing.T) {
	store := &blobStore{}
	key := replay.Key{Run: "r9", Step: 4, Task: "generate_response", Call: 1}
	recordScripted(t, store, key, modelstest.SuiteRequest())
	p := replay.New(store.lookup)

	t.Run("missing record names the key", func(t *testing.T) {
		missing := key
		missing.Call = 2
		_, err := p.Chat(replay.WithKey(context.Background(), missing), modelstest.SuiteRequest(), nil)
		require.ErrorIs(t, err, replay.ErrNotRecorded)
		require.Contains(t, err.Error(), `run r9 step 4 task "generate_response" call 2`)
	})
	t.Run("nil record is missing too", func(t *testing.T) {
		p := replay.New(func(context.Context, replay.Key) (*models.Response, error) { return nil, nil })
		_, err := p.Chat(replay.WithKey(context.Background(), key), modelstest.SuiteRequest(), nil)
		require.ErrorIs(t, err, replay.ErrNotRecorded)
	})
	t.Run("no key in the context", func(t *testing.T) {
		_, err := p.Chat(context.Background(), modelstest.SuiteRequest(), nil)
		require.ErrorIs(t, err, replay.ErrNoKey)
	})
	t.Run("storage error is wrapped with the key", func(t *testing.T) {
		boom := errors.New("checksum mismatch")
		p := replay.New(func(context.Context, replay.Key) (*models.Response, error) { return nil, boom })
		_, err := p.Chat(replay.WithKey(context.Background(), key), modelstest.SuiteRequest(), nil)
		require.ErrorIs(t, err, boom)
		require.Contains(t, err.Error(), key.String())
	})
	t.Run("a different request diverges", func(t *testing.T) {
		req := modelstest.SuiteRequest()
		req.Messages[1].Content = "I forgot my insulin dose"
		_, err := p.Chat(replay.WithKey(context.Background(), key), req, nil)
		var d *replay.Diverged
		require.ErrorAs(t, err, &d)
		require.Equal(t, key, d.Key)
		require.Equal(t, models.HashRequest(modelstest.SuiteRequest()), d.Recorded)
		require.Equal(t, models.HashRequest(req), d.Got)
		require.Contains(t, err.Error(), key.String())
		require.False(t, models.IsTransient(err))
	})
	t.Run("timeout and keep-alive do not diverge", func(t *testing.T) {
		req := modelstest.SuiteRequest()
		req.Timeout = 1
		_, err := p.Chat(replay.WithKey(context.Background(), key), req, nil)
		require.NoError(t, err)
	})
	t.Run("a record without a hash is not checked", func(t *testing.T) {
		store.record(t, key, &models.Response{Provider: "ollama", Model: "m", Message: models.Message{Role: "assistant", Content: "x"}})
		req := modelstest.SuiteRequest()
		req.Model = "other"
		resp, err := p.Chat(replay.WithKey(context.Background(), key), req, nil)
		require.NoError(t, err)
		require.Equal(t, "x", resp.Message.Content)
	})
}

func TestReplayedResponseIsACopy(t *testing.T) {
	rec := &models.Response{Provider: "ollama", Model: "m", Message: models.Message{Role: "assistant",
		ToolCalls: []models.ToolCall{{Name: "kb_search", Arguments: json.RawMessage(`{"q":"a"}`)}}}}
	p := replay.New(func(context.Context, replay.Key) (*models.Response, error) { return rec, nil })
	ctx := replay.WithKey(context.Background(), replay.Key{Run: "r"})
	got, err := p.Chat(ctx, models.Request{Model: "m"}, nil)
	require.NoError(t, err)
	got.Message.ToolCalls[0].Arguments[2] = 'X'
	got.Message.ToolCalls[0].Name = "changed"
	require.Equal(t, `{"q":"a"}`, string(rec.Message.ToolCalls[0].Arguments))
	require.Equal(t, "kb_search", rec.Message.ToolCalls[0].Name)
	require.Equal(t, "ollama", rec.Provider)
}

func TestKeyFrom(t *testing.T) {
	_, ok := replay.KeyFrom(context.Background())
	require.False(t, ok)
	k := replay.Key{Run: "r", Step: 1, Task: "t", Call: 2}
	got, ok := replay.KeyFrom(replay.WithKey(context.Background(), k))
	require.True(t, ok)
	require.Equal(t, k, got)
}
