package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/outpost-edge/outpost/models"
)

// chatRequest translates a models.Request into Ollama's. It fails on input
// Ollama would reject less clearly, or not at all (a malformed schema).
func chatRequest(req models.Request) (*api.ChatRequest, error) {
	if req.Model == "" {
		return nil, fmt.Errorf("no model named")
	}
	if len(req.Messages) == 0 {
		// Ollama takes a chat without messages as "load the model" and
		// answers done_reason "load" with no text at all.
		return nil, fmt.Errorf("no messages to answer")
	}
	streamOn := true
	creq := &api.ChatRequest{Model: req.Model, Stream: &streamOn}

	for i, m := range req.Messages {
		am := api.Message{Role: m.Role, Content: m.Content, Thinking: m.Thinking, ToolName: m.ToolName}
		for j, tc := range m.ToolCalls {
			call := api.ToolCall{ID: tc.ID, Function: api.ToolCallFunction{Index: j, Name: tc.Name}}
			if len(bytes.TrimSpace(tc.Arguments)) > 0 {
				if err := json.Unmarshal(tc.Arguments, &call.Function.Arguments); err != nil {
					return nil, fmt.Errorf("message %d tool call %q: arguments are not a JSON object: %w", i, tc.Name, err)
				}
			}
			am.ToolCalls = append(am.ToolCalls, call)
		}
		creq.Messages = append(creq.Messages, am)
	}

	for _, t := range req.Tools {
		tool := api.Tool{Type: "function", Function: api.ToolFunction{Name: t.Name, Description: t.Description}}
		// Ollama's typed schema keeps type, properties, required, items and
		// enums; keywords it has no field for are dropped, as Ollama would
		// ignore them anyway.
		params := t.Parameters
		if len(bytes.TrimSpace(params)) == 0 {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		if err := json.Unmarshal(params, &tool.Function.Parameters); err != nil {
			return nil, fmt.Errorf("tool %q: parameters are not a JSON schema object: %w", t.Name, err)
		}
		if tool.Function.Parameters.Properties == nil {
			tool.Function.Parameters.Properties = api.NewToolPropertiesMap()
		}
		creq.Tools = append(creq.Tools, tool)
	}

	if f := bytes.TrimSpace(req.Format); len(f) > 0 {
		if string(f) == "json" {
			// Accept the bare word too: it is what people write in YAML.
			f = []byte(`"json"`)
		}
		if !json.Valid(f) {
			return nil, fmt.Errorf("format is neither a JSON schema nor \"json\"")
		}
		creq.Format = json.RawMessage(f)
	}

	opts := map[string]any{}
	if req.Options.Temperature != nil {
		opts["temperature"] = *req.Options.Temperature
	}
	if req.Options.Seed != nil {
		opts["seed"] = *req.Options.Seed
	}
	if req.Options.NumCtx > 0 {
		opts["num_ctx"] = req.Options.NumCtx
	}
	if req.Options.MaxOutputTokens > 0 {
		opts["num_predict"] = req.Options.MaxOutputTokens
	}
	if len(opts) > 0 {
		creq.Options = opts
	}
	if req.KeepAlive != nil {
		creq.KeepAlive = &api.Duration{Duration: *req.KeepAlive}
	}
	// Think is sent only when asked for: "think": false is an error on some
	// servers for models that cannot think, and leaving it out keeps the
	// model's default.
	if req.Think {
		creq.Think = &api.ThinkValue{Value: true}
	}
	return creq, nil
}

// accumulator folds the stream's chunks into the final response.
type accumulator struct {
	model      string
	content    strings.Builder
	thinking   strings.Builder
	toolCalls  []models.ToolCall
	done       bool
	doneReason string
	metrics    api.Metrics
}

// add records one streamed chunk and returns what it adds to the answer.
func (a *accumulator) add(r api.ChatResponse) models.Chunk {
	if r.Model != "" {
		a.model = r.Model
	}
	chunk := models.Chunk{Content: r.Message.Content, Thinking: r.Message.Thinking}
	for _, tc := range r.Message.ToolCalls {
		args, err := json.Marshal(tc.Function.Arguments)
		if err != nil {
			// Arguments came from JSON, so they re-encode; keep the call
			// rather than lose it if that ever changes.
			args = []byte("{}")
		}
		chunk.ToolCalls = append(chunk.ToolCalls, models.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: args})
	}
	a.content.WriteString(chunk.Content)
	a.thinking.WriteString(chunk.Thinking)
	a.toolCalls = append(a.toolCalls, chunk.ToolCalls...)
	if r.Done {
		a.done = true
		a.doneReason = r.DoneReason
		a.metrics = r.Metrics
	}
	return chunk
}

// message is the answer so far.
func (a *accumulator) message() models.Message {
	return models.Message{
		Role:      models.RoleAssistant,
		Content:   a.content.String(),
		Thinking:  a.thinking.String(),
		ToolCalls: a.toolCalls,
	}
}

func (a *accumulator) response(wall time.Duration) *models.Response {
	d := a.metrics.TotalDuration
	if d <= 0 {
		d = wall
	}
	return &models.Response{
		Provider:         providerName,
		Model:            a.model,
		Message:          a.message(),
		PromptTokens:     a.metrics.PromptEvalCount,
		CompletionTokens: a.metrics.EvalCount,
		DoneReason:       a.doneReason,
		Duration:         d,
	}
}
