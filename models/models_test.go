package models_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
)

func TestErrorKinds(t *testing.T) {
	cause := errors.New("cause")
	for _, tc := range []struct {
		err       *models.Error
		msg       string
		transient bool
		is        error
	}{
		{&models.Error{Kind: models.NotFound, Provider: "ollama", Model: "llama3.2", Status: 404, Err: cause, Hint: `run "ollama pull llama3.2"`},
			`model llama3.2 is not installed: run "ollama pull llama3.2"`, false, models.ErrModelNotFound},
		{&models.Error{Kind: models.Unreachable, Provider: "ollama", Model: "m", URL: "http://127.0.0.1:11434", Err: cause},
			"Ollama is not reachable at http://127.0.0.1:11434: cause", true, models.ErrUnreachable},
		{&models.Error{Kind: models.Timeout, Provider: "ollama", Model: "m", Err: context.DeadlineExceeded},
			"model m did not answer in time: context deadline exceeded", true, models.ErrTimeout},
		{&models.Error{Kind: models.Stream, Model: "m", Err: cause}, "model m failed mid-answer: cause", false, nil},
		{&models.Error{Kind: models.Stream, Model: "m", Err: fmt.Errorf("%w: eof", models.ErrDropped)},
			"model m failed mid-answer: connection dropped mid-stream: eof", true, models.ErrDropped},
		{&models.Error{Kind: models.BadRequest, Provider: "ollama", Model: "m", Status: 400, Err: cause},
			"Ollama refused the request for model m (status 400 Bad Request): cause", false, nil},
		{&models.Error{Kind: models.Server, Provider: "ollama", Model: "m", Status: 500, Err: cause},
			"Ollama failed serving model m (status 500 Internal Server Error): cause", true, nil},
		{&models.Error{Kind: models.Server, Provider: "ollama", Model: "m", Status: http.StatusTooManyRequests},
			"Ollama failed serving model m (status 429 Too Many Requests)", true, nil},
		{&models.Error{Kind: models.Canceled, Model: "m", Err: context.Canceled}, "call to model m canceled: context canceled", false, context.Canceled},
		{&models.Error{Kind: models.Truncated, Provider: "ollama", Model: "m", Err: errors.New(`done_reason "length"`)},
			`model m stopped at its token limit: the answer is cut short: done_reason "length"`, false, models.ErrTruncated},
	} {
		t.Run(tc.err.Kind.String(), func(t *testing.T) {
			wrapped := fmt.Errorf("node generate_response: %w", tc.err)
			require.Equal(t, tc.msg, tc.err.Error())
			require.Equal(t, tc.transient, models.IsTransient(wrapped))
			if tc.is != nil {
				require.ErrorIs(t, wrapped, tc.is)
			}
			for _, s := range []error{models.ErrModelNotFound, models.ErrUnreachable, models.ErrTimeout, models.ErrTruncated} {
				if s != tc.is {
					require.NotErrorIs(t, wrapped, s)
				}
			}
			kind, ok := models.ParseErrorKind(tc.err.Kind.String())
			require.True(t, ok)
			require.Equal(t, tc.err.Kind, kind)
		})
	}
	require.False(t, models.IsTransient(errors.New("plain")))
	require.False(t, models.IsTransient(nil))
	_, ok := models.ParseErrorKind("unknown")
	require.False(t, ok)
}

func sampleResponse() *models.Response {
	return &models.Response{
		Provider: "ollama", Model: "llama3.2",
		Message: models.Message{Role: "assistant", Content: "Take it with food.", Thinking: "hmm",
			ToolCalls: []models.ToolCall{{ID: "call_1", Name: "kb_search", Arguments: json.RawMessage(`{"query":"metformin"}`)}}},
		PromptTokens: 31, CompletionTokens: 16, DoneReason: "stop", Duration: 1873512083,
		RequestHash: "sha256:abc",
	}
}

func TestEncodeResponse(t *testing.T) {
	b, err := models.EncodeResponse(sampleResponse())
	require.NoError(t, err)
	require.JSONEq(t, `{"v":1,"provider":"ollama","model":"llama3.2",
		"message":{"role":"assistant","content":"Take it with food.","thinking":"hmm",
			"tool_calls":[{"id":"call_1","name":"kb_search","arguments":{"query":"metformin"}}]},
		"prompt_tokens":31,"completion_tokens":16,"done_reason":"stop","duration_ns":1873512083,"request_hash":"sha256:abc"}`, string(b))
	got, err := models.DecodeResponse(b)
	require.NoError(t, err)
	require.Equal(t, sampleResponse(), got)

	_, err = models.EncodeResponse(nil)
	require.Error(t, err)
}

func TestDecodeResponseRejects(t *testing.T) {
	good, err := models.EncodeResponse(sampleResponse())
	require.NoError(t, err)
	for name, in := range map[string]string{
		"empty":            ``,
		"not json":         `{`,
		"wrong version":    strings.Replace(string(good), `"v":1`, `"v":2`, 1),
		"no version":       strings.Replace(string(good), `"v":1,`, ``, 1),
		"unknown field":    strings.Replace(string(good), `"v":1`, `"v":1,"extra":true`, 1),
		"trailing data":    string(good) + `{}`,
		"negative tokens":  strings.Replace(string(good), `"prompt_tokens":31`, `"prompt_tokens":-1`, 1),
		"negative time":    strings.Replace(string(good), `"duration_ns":1873512083`, `"duration_ns":-5`, 1),
		"nameless call":    strings.Replace(string(good), `"name":"kb_search",`, ``, 1),
		"call without arg": strings.Replace(string(good), `,"arguments":{"query":"metformin"}`, ``, 1),
		"wrong type":       strings.Replace(string(good), `"model":"llama3.2"`, `"model":7`, 1),
		"too big":          `{"v":1,"provider":"` + strings.Repeat("x", models.MaxEncodedResponse) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r, err := models.DecodeResponse([]byte(in))
			require.ErrorIs(t, err, models.ErrCorruptResponse)
			require.Nil(t, r)
		})
	}
}

func FuzzDecodeResponse(f *testing.F) {
	good, _ := models.EncodeResponse(sampleResponse())
	f.Add(good)
	f.Add([]byte(`{"v":1,"provider":"","model":"","message":{"role":"","content":""},"prompt_tokens":0,"completion_tokens":0,"duration_ns":0}`))
	f.Add([]byte(`{"v":1,"message":{"tool_calls":[{"name":"x","arguments":null}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := models.DecodeResponse(data)
		if err != nil {
			if !errors.Is(err, models.ErrCorruptResponse) {
				t.Fatalf("error does not wrap ErrCorruptResponse: %v", err)
			}
			return
		}
		enc, err := models.EncodeResponse(r)
		if err != nil {
			t.Fatalf("a decoded response does not encode: %v", err)
		}
		r2, err := models.DecodeResponse(enc)
		if err != nil {
			t.Fatalf("re-encoded response does not decode: %v\n%s", err, enc)
		}
		enc2, _ := models.EncodeResponse(r2)
		if string(enc) != string(enc2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", enc, enc2)
		}
	})
}

func TestHashRequest(t *testing.T) {
	temp := 0.0
	base := models.Request{
		Model:    "llama3.2",
		Messages: []models.Message{{Role: "user", Content: "hi"}, {Role: "assistant", ToolCalls: []models.ToolCall{{Name: "t", Arguments: json.RawMessage(`{"a": 1}`)}}}},
		Tools:    []models.ToolDef{{Name: "t", Parameters: json.RawMessage(`{"type": "object"}`)}},
		Format:   json.RawMessage(`{"type":"object"}`),
		Options:  models.Options{Temperature: &temp},
	}
	h := models.HashRequest(base)
	require.True(t, strings.HasPrefix(h, "sha256:"))
	require.Len(t, h, len("sha256:")+64)

	same := base
	same.Timeout = time.Minute
	keep := time.Hour
	same.KeepAlive = &keep
	same.Format = json.RawMessage("{ \"type\" : \"object\" }")
	same.Options.MaxOutputTokens = 17
	same.Messages = []models.Message{base.Messages[0], {Role: "assistant", ToolCalls: []models.ToolCall{{Name: "t", Arguments: json.RawMessage(`{"a":1}`)}}}}
	require.Equal(t, h, models.HashRequest(same), "serving options, the answer cap and whitespace do not change what is asked")

	seed := 1
	for name, mutate := range map[string]func(*models.Request){
		"model":       func(r *models.Request) { r.Model = "qwen3" },
		"content":     func(r *models.Request) { r.Messages = []models.Message{{Role: "user", Content: "hi!"}, r.Messages[1]} },
		"role":        func(r *models.Request) { r.Messages = []models.Message{{Role: "system", Content: "hi"}, r.Messages[1]} },
		"tools":       func(r *models.Request) { r.Tools = nil },
		"format":      func(r *models.Request) { r.Format = json.RawMessage(`"json"`) },
		"temperature": func(r *models.Request) { r.Options.Temperature = nil },
		"seed":        func(r *models.Request) { r.Options.Seed = &seed },
		"num_ctx":     func(r *models.Request) { r.Options.NumCtx = 8192 },
		"think":       func(r *models.Request) { r.Think = true },
	} {
		r := base
		mutate(&r)
		require.NotEqual(t, h, models.HashRequest(r), name)
	}
}
