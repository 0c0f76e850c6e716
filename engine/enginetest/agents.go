package enginetest

import (
	"context"
	"encoding/json"
	"strings"
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
