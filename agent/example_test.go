package agent_test

import (
	"context"
	"fmt"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/policy"
)

// A tool loop answers from the knowledge base: the scripted model calls
// kb_search, reads the neutralized result and answers.
func ExampleToolLoop() {
	provider, err := scripted.Load([]byte(`[
	 {"when_no_tool_result": true, "tool_calls": [{"name": "kb_search", "arguments": {"query": "{{input}}"}}]},
	 {"when_tool_result": true, "respond": "Here is what the notes say."}]`))
	if err != nil {
		panic(err)
	}
	reg, err := policy.NewRegistry(agent.BuiltinDefs())
	if err != nil {
		panic(err)
	}
	store := engine.NewMemoryStore()
	log := agent.NewMemoryCallLog()

	b := engine.NewGraph("assistant")
	messages := engine.Append[models.Message](b, "messages")
	answer := engine.Replace[string](b, "answer")
	node, err := agent.ToolLoop(agent.LoopConfig{
		Provider: provider, Model: "scripted",
		Lane: policy.Lane{Agent: "assistant", Models: []string{"scripted"}},
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) {
			return policy.Resolve(reg, nil, nil, []string{agent.ToolKBSearch}) // the request narrows the set
		},
		Impls: map[string]agent.Tool{agent.ToolKBSearch: agent.NewKBSearch([]agent.Document{
			{ID: "doc-1", Title: "Missed doses", Text: "Take a missed metformin dose with the next meal."}})},
		Log: log, Blobs: store, Messages: messages, Answer: answer,
	})
	if err != nil {
		panic(err)
	}
	b.AddNode("loop", node)
	b.AddEdge(engine.Start, "loop")
	g, err := b.Compile()
	if err != nil {
		panic(err)
	}
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t1", Store: store},
		engine.Push(messages, models.Message{Role: models.RoleUser, Content: "missed metformin"}))
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Run.Status, answer.Get(res.State))
	for _, rec := range log.Records(res.Run.ID) {
		fmt.Println(rec.Tool, rec.Status, rec.Decision, rec.DecidedBy)
	}
	// Output:
	// completed Here is what the notes say.
	// kb_search done allow rule:default
}
