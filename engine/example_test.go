package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/outpost-edge/outpost/engine"
)

// A two-node graph: a node drafts a reply, a router decides whether it is
// good enough, and the run's checkpoints stay in a MemoryStore.
func ExampleGraph_Invoke() {
	b := engine.NewGraph("greeter")
	messages := engine.Append[string](b, "messages")
	drafts := engine.Sum[int](b, "drafts")

	b.AddNode("draft", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		last := messages.Get(s)[len(messages.Get(s))-1]
		return []engine.Write{
			engine.Push(messages, "hello, "+strings.ToLower(last)),
			drafts.Set(1),
		}, nil
	})
	b.AddEdge(engine.Start, "draft")
	b.AddConditionalEdge("draft", func(s engine.State) []string {
		if drafts.Get(s) < 2 {
			return []string{"draft"}
		}
		return []string{engine.End}
	}, "draft", engine.End)

	g, err := b.Compile()
	if err != nil {
		panic(err)
	}
	store := engine.NewMemoryStore()
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "thread-1", Store: store},
		engine.Push(messages, "World"))
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Run.Status, res.Run.Steps)
	fmt.Println(strings.Join(messages.Get(res.State), " | "))
	// Output:
	// completed 2
	// World | hello, world | hello, hello, world
}

// A node asks a person before it acts. The run pauses durably; Resume hands
// the decision back to the node, which runs again from its start.
func ExampleInterrupt() {
	b := engine.NewGraph("shipper")
	order := engine.Replace[int](b, "units")
	shipped := engine.Replace[string](b, "shipped")

	b.AddNode("ship", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		// Code before Interrupt runs again on resume: keep it idempotent.
		units := order.Get(s)
		d, err := engine.Interrupt(ctx, map[string]int{"units": units})
		if err != nil {
			return nil, err // pauses the run
		}
		switch d.Kind {
		case engine.Edit:
			if err := json.Unmarshal(d.Value, &units); err != nil {
				return nil, err
			}
		case engine.Reject:
			return []engine.Write{shipped.Set("nothing: " + d.Reason)}, nil
		}
		return []engine.Write{shipped.Set(fmt.Sprint(units, " units"))}, nil
	})
	b.AddEdge(engine.Start, "ship")
	g, err := b.Compile()
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "order-7", Store: engine.NewMemoryStore()}
	res, err := g.Invoke(ctx, cfg, order.Set(5))
	if err != nil {
		panic(err)
	}
	in := res.Run.Interrupts[0]
	fmt.Println(res.Run.Status, in.Node, string(in.Payload))

	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{
		in.ID: {Kind: engine.Edit, Value: json.RawMessage(`3`), By: "ops"},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Run.Status, shipped.Get(res.State))
	// Output:
	// interrupted ship {"units":5}
	// completed 3 units
}

// Graphs render themselves as Mermaid flowcharts.
func ExampleGraph_Mermaid() {
	b := engine.NewGraph("tiny")
	b.AddNode("hello", func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil })
	b.AddEdge(engine.Start, "hello")
	g, _ := b.Compile()
	fmt.Print(g.Mermaid())
	// Output:
	// flowchart TD
	//   __start__([start])
	//   hello[hello]
	//   __end__([end])
	//   __start__ --> hello
	//   hello --> __end__
}

// A run manager runs agents on a worker pool, one run per thread at a time.
func ExampleManager() {
	b := engine.NewGraph("echo")
	text := engine.Replace[string](b, "text")
	b.AddNode("echo", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{text.Set(strings.ToUpper(text.Get(s)))}, nil
	})
	b.AddEdge(engine.Start, "echo")
	g, _ := b.Compile()
	agent := &engine.Agent{Name: "echo", Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			err := json.Unmarshal(raw, &s)
			return []engine.Write{text.Set(s)}, err
		},
		Output: func(s engine.State) json.RawMessage {
			raw, _ := json.Marshal(text.Get(s))
			return raw
		}}
	m := engine.NewManager(engine.NewMemoryStore(), func(string, engine.BundleRef) (*engine.Agent, error) {
		return agent, nil
	}, engine.ManagerOptions{Workers: 4})
	defer m.Close()

	ctx := context.Background()
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "echo", Input: json.RawMessage(`"quiet"`)})
	if err != nil {
		panic(err)
	}
	run, _ = m.Wait(ctx, run.ID)
	fmt.Println(run.Status, string(run.Output))
	// Output:
	// completed "QUIET"
}
