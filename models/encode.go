package models

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// responseVersion is the version of the stored response encoding. Bump it,
// and keep decoding the old one, when the shape changes.
const responseVersion = 1

// MaxEncodedResponse bounds what DecodeResponse accepts, so a corrupt or
// hostile blob cannot make the decoder allocate without limit.
const MaxEncodedResponse = 16 << 20

// ErrCorruptResponse is wrapped by every DecodeResponse failure.
var ErrCorruptResponse = errors.New("corrupt model response record")

// storedResponse is the on-disk shape of a Response. It is a separate type so
// that renaming a Go field never silently changes what is stored.
type storedResponse struct {
	V                int           `json:"v"`
	Provider         string        `json:"provider"`
	Model            string        `json:"model"`
	Message          storedMessage `json:"message"`
	PromptTokens     int           `json:"prompt_tokens"`
	CompletionTokens int           `json:"completion_tokens"`
	DoneReason       string        `json:"done_reason,omitempty"`
	DurationNS       int64         `json:"duration_ns"`
	RequestHash      string        `json:"request_hash,omitempty"`
}

type storedMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	ToolCalls []storedToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type storedToolCall struct {
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// EncodeResponse returns the versioned JSON form of r, for storing as a blob.
// The same response always encodes to the same bytes.
func EncodeResponse(r *Response) ([]byte, error) {
	if r == nil {
		return nil, errors.New("encode model response: nil response")
	}
	s := storedResponse{
		V:                responseVersion,
		Provider:         r.Provider,
		Model:            r.Model,
		PromptTokens:     r.PromptTokens,
		CompletionTokens: r.CompletionTokens,
		DoneReason:       r.DoneReason,
		DurationNS:       int64(r.Duration),
		RequestHash:      r.RequestHash,
		Message: storedMessage{
			Role:     r.Message.Role,
			Content:  r.Message.Content,
			Thinking: r.Message.Thinking,
			ToolName: r.Message.ToolName,
		},
	}
	for _, tc := range r.Message.ToolCalls {
		args := tc.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		s.Message.ToolCalls = append(s.Message.ToolCalls, storedToolCall{ID: tc.ID, Name: tc.Name, Arguments: args})
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode model response: %w", err)
	}
	return b, nil
}

// DecodeResponse parses what EncodeResponse wrote. It is strict: an unknown
// version or field, trailing bytes, negative counts or an oversized record
// are errors wrapping ErrCorruptResponse, never a panic or a partial value.
func DecodeResponse(b []byte) (*Response, error) {
	if len(b) > MaxEncodedResponse {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrCorruptResponse, len(b), MaxEncodedResponse)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s storedResponse
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptResponse, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the record", ErrCorruptResponse)
	}
	if s.V != responseVersion {
		return nil, fmt.Errorf("%w: unsupported version %d (want %d)", ErrCorruptResponse, s.V, responseVersion)
	}
	if s.PromptTokens < 0 || s.CompletionTokens < 0 || s.DurationNS < 0 {
		return nil, fmt.Errorf("%w: negative token count or duration", ErrCorruptResponse)
	}
	r := &Response{
		Provider:         s.Provider,
		Model:            s.Model,
		PromptTokens:     s.PromptTokens,
		CompletionTokens: s.CompletionTokens,
		DoneReason:       s.DoneReason,
		Duration:         time.Duration(s.DurationNS),
		RequestHash:      s.RequestHash,
		Message: Message{
			Role:     s.Message.Role,
			Content:  s.Message.Content,
			Thinking: s.Message.Thinking,
			ToolName: s.Message.ToolName,
		},
	}
	for i, tc := range s.Message.ToolCalls {
		if tc.Name == "" {
			return nil, fmt.Errorf("%w: tool call %d has no name", ErrCorruptResponse, i)
		}
		if len(tc.Arguments) == 0 {
			return nil, fmt.Errorf("%w: tool call %d has no arguments", ErrCorruptResponse, i)
		}
		r.Message.ToolCalls = append(r.Message.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return r, nil
}

// HashRequest fingerprints what a request asks of the model: model, messages,
// tools, format, options and think. Timeout and KeepAlive are left out
// because they change how a call is served, not what it answers, and so is
// Options.MaxOutputTokens: it follows what the run's token budget has left
// when the call is made, which a retry, a recovery or a replay of the same
// call does not find the same (an answer it cut is an error, never
// recorded as an answer). The result
// is "sha256:" followed by hex; JSON payloads are compacted first, so
// whitespace does not change it.
func HashRequest(req Request) string {
	canon := struct {
		Model       string         `json:"model"`
		Messages    []canonMessage `json:"messages"`
		Tools       []canonTool    `json:"tools"`
		Format      string         `json:"format"`
		Temperature *float64       `json:"temperature"`
		Seed        *int           `json:"seed"`
		NumCtx      int            `json:"num_ctx"`
		Think       bool           `json:"think"`
	}{
		Model:       req.Model,
		Format:      compactJSON(req.Format),
		Temperature: req.Options.Temperature,
		Seed:        req.Options.Seed,
		NumCtx:      req.Options.NumCtx,
		Think:       req.Think,
	}
	for _, m := range req.Messages {
		canon.Messages = append(canon.Messages, canonicalMessage(m))
	}
	for _, t := range req.Tools {
		canon.Tools = append(canon.Tools, canonicalTool(t))
	}
	// Marshal cannot fail: every field is a string, number, bool or slice of them.
	b, _ := json.Marshal(canon)
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// canonMessage and canonTool are the parts of a request that HashRequest
// and DigestRequest fingerprint. Their JSON must not change: recorded
// hashes are compared with hashes made now.
type canonMessage struct {
	Role      string   `json:"role"`
	Content   string   `json:"content"`
	Thinking  string   `json:"thinking"`
	ToolCalls []string `json:"tool_calls"`
	ToolName  string   `json:"tool_name"`
}

type canonTool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Parameters  string `json:"parameters"`
}

func canonicalMessage(m Message) canonMessage {
	cm := canonMessage{Role: m.Role, Content: m.Content, Thinking: m.Thinking, ToolName: m.ToolName}
	for _, tc := range m.ToolCalls {
		cm.ToolCalls = append(cm.ToolCalls, tc.ID+"\x00"+tc.Name+"\x00"+compactJSON(tc.Arguments))
	}
	return cm
}

func canonicalTool(t ToolDef) canonTool {
	return canonTool{Name: t.Name, Description: t.Description, Parameters: compactJSON(t.Parameters)}
}

// compactJSON returns raw without insignificant whitespace, or raw itself
// when it is not valid JSON (the hash must still cover it).
func compactJSON(raw []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}
