package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outpost-edge/outpost/engine"
)

// BenchmarkSuperstep measures one superstep's overhead: a trivial node that
// adds to a sum channel, routed back to itself, with a checkpoint committed
// to a MemoryStore after every step. One op is one superstep.
func BenchmarkSuperstep(b *testing.B) {
	gb := engine.NewGraph("tick")
	n := engine.Sum[int](gb, "n")
	gb.AddNode("tick", func(context.Context, engine.State) ([]engine.Write, error) {
		return []engine.Write{n.Set(1)}, nil
	})
	gb.AddEdge(engine.Start, "tick")
	steps := b.N
	gb.AddConditionalEdge("tick", func(s engine.State) []string {
		if n.Get(s) < steps {
			return []string{"tick"}
		}
		return []string{engine.End}
	}, "tick", engine.End)
	g, err := gb.Compile()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore(), StepLimit: steps + 1})
	if err != nil {
		b.Fatal(err)
	}
	if got := n.Get(res.State); got != steps {
		b.Fatalf("ran %d steps, want %d", got, steps)
	}
}

// BenchmarkLongThread runs a 200-turn conversation on one thread (a user
// message in, a reply appended by a node), as the reference workload does.
// One op is the whole thread.
func BenchmarkLongThread(b *testing.B) {
	const turns = 200
	gb := engine.NewGraph("chat")
	msgs := engine.Append[string](gb, "messages")
	gb.AddNode("reply", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		m := msgs.Get(s)
		return []engine.Write{engine.Push(msgs, fmt.Sprintf("reply %d to %s", len(m), m[len(m)-1]))}, nil
	})
	gb.AddEdge(engine.Start, "reply")
	g, err := gb.Compile()
	if err != nil {
		b.Fatal(err)
	}
	inputs := make([]string, turns)
	for i := range inputs {
		inputs[i] = fmt.Sprintf("user message number %d", i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		cfg := engine.RunConfig{Thread: "long", Store: engine.NewMemoryStore(), Cache: engine.NewStateCache(16, 0)}
		for _, in := range inputs {
			if _, err := g.Invoke(ctx, cfg, engine.Push(msgs, in)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(turns*b.N)/b.Elapsed().Seconds(), "turns/s")
}
