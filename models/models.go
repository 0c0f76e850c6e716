package models

import (
	"context"
	"encoding/json"
	"time"
)

// Roles used in [Message.Role]. They are the roles every chat model accepts.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one turn of a chat. A tool result is a Message with Role "tool"
// and ToolName naming the tool that produced it.
type Message struct {
	Role      string     `json:"role"`
	Content   string     `json:"content"`
	Thinking  string     `json:"thinking,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	ToolName  string     `json:"tool_name,omitempty"`
}

// ToolCall is a model's request to run a tool. Arguments is a JSON object.
// ID is empty when the model (or server) does not assign one.
type ToolCall struct {
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// ToolDef describes a tool the model may call. Parameters is the JSON schema
// of the tool's arguments object.
type ToolDef struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Options are the sampling options Outpost sets. Pointers distinguish "not
// set, use the model's default" from an explicit zero (temperature 0 and seed
// 0 are both meaningful).
type Options struct {
	Temperature *float64
	Seed        *int
	NumCtx      int // context window in tokens; 0 keeps the model's default
	// MaxOutputTokens caps the answer's tokens (Ollama's num_predict); 0
	// means no cap. An answer that reaches it is cut there and reported
	// as an *Error of kind Truncated, with the tokens it spent. A caller
	// with a token budget sets it to what the budget has left (see
	// agent.ModelCall), and calls through ChatCapped, which holds a
	// provider that does not honour the cap to it.
	MaxOutputTokens int
}

// Request is one chat call.
type Request struct {
	Model    string
	Messages []Message
	Tools    []ToolDef
	// Format constrains the answer: a JSON schema, or the JSON string "json"
	// for any JSON value. Empty means free text.
	Format    json.RawMessage
	Options   Options
	KeepAlive *time.Duration // how long the server keeps the model loaded; nil keeps its default
	// Timeout bounds the whole call, first token included. Zero means only
	// ctx bounds it. Running out gives an *Error of kind Timeout, which is
	// transient.
	Timeout time.Duration
	Think   bool // ask a reasoning model to return its thinking separately
}

// Chunk is one piece of a streamed answer. Concatenating the Content (and
// Thinking) of every chunk gives the final Message's; ToolCalls are appended.
type Chunk struct {
	Content   string
	Thinking  string
	ToolCalls []ToolCall
}

// Response is the outcome of a chat call.
type Response struct {
	// Provider names the implementation that answered ("ollama",
	// "scripted", ...), so events and outcomes never mistake a scripted
	// answer for a model's.
	Provider string
	Model    string
	Message  Message // always Role "assistant"

	PromptTokens     int
	CompletionTokens int
	DoneReason       string        // "stop", "length", ... as the provider reports it
	Duration         time.Duration // the provider's own measure when it has one, else wall time

	// RequestHash is HashRequest of the request that produced this response.
	// Providers set it so that a recorded response carries the fingerprint
	// that models/replay checks a re-executed request against.
	RequestHash string
}

// Provider is the seam for every model call.
type Provider interface {
	// Name identifies the implementation; it is also Response.Provider.
	Name() string
	// Chat runs one call. stream may be nil. When stream returns a non-nil
	// error, the stream stops and Chat returns that error unchanged. Other
	// failures are *Error values.
	Chat(ctx context.Context, req Request, stream func(Chunk) error) (*Response, error)
}
