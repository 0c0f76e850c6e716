package ollama

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/outpost-edge/outpost/models"
)

// FuzzChatStream answers a chat with arbitrary bytes as a 200 NDJSON body:
// Chat must return a response or a *models.Error, never panic, and a
// response only when a final chunk ended a complete answer.
func FuzzChatStream(f *testing.F) {
	for _, name := range []string{"plain.ndjson", "tool_calls.ndjson", "thinking.ndjson", "error_midstream.ndjson", "length.ndjson", "load.ndjson"} {
		f.Add(readFixture(f, name))
	}
	f.Add([]byte(`{"done":true,"done_reason":"stop","message":{"tool_calls":[{"function":{"name":"x","arguments":[1]}}]}}`))
	f.Add([]byte("not json\n"))
	var body atomic.Pointer[[]byte]
	srv := newFakeOllama(f, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write(*body.Load())
	})
	c := New(srv.URL, srv.Client())
	f.Fuzz(func(t *testing.T, b []byte) {
		body.Store(&b)
		resp, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error { return nil })
		var me *models.Error
		switch {
		case err != nil && !errors.As(err, &me):
			t.Fatalf("an error that is not a *models.Error: %v", err)
		case err == nil && resp == nil:
			t.Fatal("no response and no error")
		case err == nil && !bytes.Contains(b, []byte(`"done"`)):
			t.Fatalf("a response from a body with no final chunk: %+v", resp)
		case err == nil && (resp.DoneReason == "length" || resp.DoneReason == "load"):
			t.Fatalf("an unfinished answer returned as complete: %+v", resp)
		}
	})
}
