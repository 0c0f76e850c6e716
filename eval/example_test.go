package eval_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/eval"
)

// Replay two golden conversations against a one-node agent built in Go: one
// holds, the other expects a node the agent does not have.
func ExampleRun() {
	b := engine.NewGraph("echo")
	text := engine.Replace[string](b, "final")
	b.AddNode("shout", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{text.Set(strings.ToUpper(text.Get(s)))}, nil
	})
	b.AddEdge(engine.Start, "shout")
	g, err := b.Compile()
	if err != nil {
		panic(err)
	}
	agent := &engine.Agent{Name: "echo", Graph: g, Input: func(raw json.RawMessage) ([]engine.Write, error) {
		var s string
		err := json.Unmarshal(raw, &s)
		return []engine.Write{text.Set(s)}, err
	}}
	golden := `{"name": "shouts", "agent": "echo", "turns": [{"input": "hi", "expect": {"path": ["shout"], "final_contains": ["HI"], "status": "completed"}}]}
{"name": "reviews", "agent": "echo", "turns": [{"input": "hi", "expect": {"path": ["shout", "review"]}}]}`
	convs, err := eval.Decode("echo.jsonl", []byte(golden))
	if err != nil {
		panic(err)
	}
	rep, err := eval.Run(context.Background(), convs, eval.Options{
		Resolver: func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil },
	})
	if err != nil {
		panic(err)
	}
	for _, c := range rep.Cases {
		if c.Passed {
			fmt.Println("pass", c.Name)
		} else {
			fmt.Println("FAIL", c.Name+":", c.Failure)
		}
	}
	fmt.Println(rep.Err())
	// Output:
	// pass shouts
	// FAIL reviews: turn 1: path differs at index 1: want review, got nothing (ends); got [shout]
	// golden conversations failed: 1 of 2
}
