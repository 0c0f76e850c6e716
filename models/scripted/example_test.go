package scripted_test

import (
	"context"
	"fmt"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
)

// A two-rule tool loop: search first, then answer from what was found.
func Example() {
	p, err := scripted.Load([]byte(`[
	  {"match": "(?i)metformin", "when_no_tool_result": true,
	   "tool_calls": [{"name": "kb_search", "arguments": {"query": "{{input}}"}}]},
	  {"match": "(?i)metformin", "when_tool_result": true, "respond": "From the leaflet: {{context}}"}]`))
	if err != nil {
		panic(err)
	}
	msgs := []models.Message{{Role: models.RoleUser, Content: "I forgot my metformin dose"}}
	resp, _ := p.Chat(context.Background(), models.Request{Model: "llama3.2", Messages: msgs}, nil)
	call := resp.Message.ToolCalls[0]
	fmt.Println(resp.Provider, call.Name, string(call.Arguments))

	msgs = append(msgs, resp.Message,
		models.Message{Role: models.RoleTool, ToolName: call.Name, Content: "[doc-7] Take it with your next meal."})
	resp, _ = p.Chat(context.Background(), models.Request{Model: "llama3.2", Messages: msgs}, nil)
	fmt.Println(resp.Message.Content)
	// Output:
	// scripted kb_search {"query":"I forgot my metformin dose"}
	// From the leaflet: [doc-7] Take it with your next meal.
}
