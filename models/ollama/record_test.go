package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "record fresh streams from a real Ollama (OLLAMA_HOST or "+DefaultURL+") into testdata/ollama")

// TestRecord refreshes the recorded streams from a real Ollama. It runs only
// with -update, and skips when no Ollama answers, so CI never needs one.
func TestRecord(t *testing.T) {
	if !*update {
		t.Skip("recording needs -update")
	}
	base := os.Getenv("OLLAMA_HOST")
	c := New(base, nil)
	pingCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(pingCtx); err != nil {
		t.Skipf("not recording: %v", err)
	}
	model := envOr("OLLAMA_TEST_MODEL", "llama3.2")
	thinkModel := envOr("OLLAMA_TEST_THINK_MODEL", "qwen3:0.6b")
	system := map[string]any{"role": "system", "content": "You help patients keep to their medication plan. Answer in one short sentence."}
	user := map[string]any{"role": "user", "content": "I forgot my metformin dose"}
	seeded := map[string]any{"temperature": 0, "seed": 42}

	for _, rec := range []struct {
		file string
		body map[string]any
	}{
		{"plain.ndjson", map[string]any{"model": model, "messages": []any{system, user}, "options": seeded}},
		{"tool_calls.ndjson", map[string]any{
			"model": model, "options": seeded,
			"messages": []any{
				map[string]any{"role": "system", "content": "Always call kb_search before answering."},
				user,
			},
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{
				"name": "kb_search", "description": "Search the medication knowledge base.",
				"parameters": map[string]any{"type": "object", "required": []string{"query"},
					"properties": map[string]any{"query": map[string]any{"type": "string", "description": "keywords"}}},
			}}},
		}},
		{"thinking.ndjson", map[string]any{"model": thinkModel, "messages": []any{system, user}, "options": seeded, "think": true}},
	} {
		t.Run(rec.file, func(t *testing.T) {
			rec.body["stream"] = true
			stream := recordChat(t, c.URL(), rec.body)
			path := filepath.Join(fixtureDir, rec.file)
			require.NoError(t, os.WriteFile(path, stream, 0o644))
			t.Logf("recorded %s (%d bytes)", path, len(stream))
		})
	}
}

// recordChat posts body to /api/chat and returns the raw NDJSON, byte for
// byte: the point is to keep Ollama's shapes, not our reading of them.
func recordChat(t *testing.T, base string, body map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/api/chat", bytes.NewReader(b))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "is %s pulled?", body["model"])

	var out bytes.Buffer
	done := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var line struct {
			Done  bool   `json:"done"`
			Error string `json:"error"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		require.Empty(t, line.Error)
		out.Write(sc.Bytes())
		out.WriteByte('\n')
		done = done || line.Done
	}
	require.NoError(t, sc.Err())
	require.True(t, done, "the stream ended without its final chunk")
	return out.Bytes()
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}
