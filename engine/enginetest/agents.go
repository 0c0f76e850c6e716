package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outpost-edge/outpost/engine"
)

// HoldAgent returns an agent named name, of one node, whose input is a
// JSON string, for tests that look at runs in flight: a run whose input
// says "durable" makes its place durable first (engine.EnsureDurable, as
// a tool call does), and one whose input says "hold" is held until
// release is closed or the run stops. Its output is "done".
func HoldAgent(t testing.TB, name string, release <-chan struct{}) *engine.Agent {
	t.Helper()
	b := engine.NewGraph(name)
	input := engine.Replace[string](b, "input")
	b.AddNode("work", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		if strings.Contains(input.Get(s), "durable") {
			if err := engine.EnsureDurable(ctx); err != nil {
				return nil, err
			}
		}
		if strings.Contains(input.Get(s), "hold") {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, nil
	})
	b.AddEdge(engine.Start, "work")
	b.AddEdge("work", engine.End)
	g, err := b.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return &engine.Agent{Name: name, Graph: g, Bundle: engine.BundleRef{Name: "test", Version: 1, Digest: "sha256:test"},
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			return []engine.Write{input.Set(s)}, nil
		},
		Output: func(engine.State) json.RawMessage { return json.RawMessage(`"done"`) }}
}

// TwoStepAgent returns an agent named "twostep" of two steps, w1 then w2,
// for tests that look at the order in which runs execute: each reports its
// run on entered, then waits for its thread's gate (gates[thread][0] for
// w1, [1] for w2) or the end of the run.
func TwoStepAgent(t testing.TB, entered chan<- string, gates map[string][2]chan struct{}) *engine.Agent {
	t.Helper()
	b := engine.NewGraph("twostep")
	out := engine.Sum[int](b, "out")
	step := func(i int) engine.NodeFunc {
		return func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			info, _ := engine.InfoFrom(ctx)
			entered <- info.Run
			select {
			case <-gates[info.Thread][i]:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return []engine.Write{out.Set(1)}, nil
		}
	}
	b.AddNode("w1", step(0))
	b.AddNode("w2", step(1))
	b.AddEdge(engine.Start, "w1")
	b.AddEdge("w1", "w2")
	g, err := b.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return &engine.Agent{Name: "twostep", Graph: g}
}

// FailsRunningOnce is a store whose first listing of running runs fails,
// after the listings of the other statuses: a recovery pass that fails
// part-way, as a store that cannot be read to its end makes one.
type FailsRunningOnce struct {
	engine.Store
	failed atomic.Bool
}

func (s *FailsRunningOnce) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	if f.Status == engine.StatusRunning && s.failed.CompareAndSwap(false, true) {
		return nil, errors.New("listing failed")
	}
	return s.Store.Runs(ctx, f)
}
