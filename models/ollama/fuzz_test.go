package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/ollama/ollama/api"

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

// FuzzChatLine hands chatLine one arbitrary line under each kind of
// status. A line under an error status is never an answer: it comes back
// as the server's error. Under 200, a line is an answer handed to fn once
// (and re-encoded, it decodes to the same answer) or an error with a
// message, never both.
func FuzzChatLine(f *testing.F) {
	for _, name := range []string{"plain.ndjson", "tool_calls.ndjson", "thinking.ndjson", "error_midstream.ndjson"} {
		for _, line := range fixtureLines(f, name) {
			f.Add(line, 200)
		}
	}
	f.Add([]byte(`{"error": "model not found"}`), 404)
	f.Add([]byte(`{"error": "unauthorized", "signin_url": "https://ollama.com/connect"}`), 401)
	f.Add([]byte(`not json`), 500)
	f.Add([]byte(`{"message": {"role": "assistant", "content": 1}}`), 200)
	f.Add([]byte(`[1, 2]`), 200)
	f.Fuzz(func(t *testing.T, line []byte, status int) {
		code := []int{http.StatusOK, http.StatusUnauthorized, http.StatusNotFound, http.StatusInternalServerError}[uint(status)%4]
		resp := &http.Response{StatusCode: code, Status: http.StatusText(code)}
		var answers []api.ChatResponse
		err := chatLine(resp, line, func(r api.ChatResponse) error {
			answers = append(answers, r)
			return nil
		})
		switch {
		case err != nil && err.Error() == "":
			t.Fatalf("an error with no message: %#v", err)
		case code >= http.StatusBadRequest && err == nil:
			t.Fatalf("status %d: no error for %q", code, line)
		case code >= http.StatusBadRequest && len(answers) > 0:
			t.Fatalf("status %d: an answer handed on: %+v", code, answers)
		case err == nil && len(answers) != 1, err != nil && len(answers) != 0:
			t.Fatalf("%d answers with error %v", len(answers), err)
		}
		if code >= http.StatusBadRequest {
			var se api.StatusError
			var ae api.AuthorizationError
			if !errors.As(err, &se) && !errors.As(err, &ae) {
				t.Fatalf("status %d: not the server's error: %#v", code, err)
			}
			return
		}
		if err != nil {
			return
		}
		enc, err := json.Marshal(answers[0])
		if err != nil {
			t.Fatalf("the answer does not encode: %v", err)
		}
		var again []api.ChatResponse
		if err := chatLine(resp, enc, func(r api.ChatResponse) error {
			again = append(again, r)
			return nil
		}); err != nil || len(again) != 1 {
			t.Fatalf("the answer re-encoded (%s) reads as %d answers, error %v", enc, len(again), err)
		}
		if enc2, _ := json.Marshal(again[0]); !bytes.Equal(enc, enc2) {
			t.Fatalf("the answer re-encoded reads as another:\n%s\n%s", enc, enc2)
		}
	})
}
