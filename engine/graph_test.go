package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

func TestCompileReportsEveryProblem(t *testing.T) {
	b := engine.NewGraph("faulty")
	engine.Replace[string](b, "msg")
	engine.Replace[int](b, "msg") // declared twice
	b.AddNode("a", noop, engine.Writes("msg", "nope"), engine.Reads("ghost"))
	b.AddNode("a", noop)      // duplicate
	b.AddNode("island", noop) // unreachable from Start
	b.AddNode("loop", noop)   // no path to End
	b.AddNode("bad/name", noop)
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "missing")
	b.AddEdge("a", "loop")
	b.AddEdge("loop", "loop")
	b.AddEdge("island", engine.End)
	b.AddEdge("nowhere", engine.End)
	b.AddConditionalEdge("a", func(engine.State) []string { return nil }, "undeclared", engine.End)
	b.AddFanout("a", func(engine.State) []engine.Send { return nil }, "phantom")

	g, err := b.Compile(engine.InterruptBefore("ghost-node"))
	require.Nil(t, g)
	require.ErrorIs(t, err, engine.ErrInvalidGraph)
	var ce *engine.CompileError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "faulty", ce.Graph)

	want := []string{
		`channel "msg" declared twice`,
		`duplicate node "a"`,
		`node name "bad/name" may not contain`,
		`edge from "a" to unknown node "missing"`,
		`edge from unknown node "nowhere"`,
		`conditional edge from "a" declares unknown target "undeclared"`,
		`fan-out edge from "a" declares unknown target "phantom"`,
		`node "a" uses undeclared channel "nope"`,
		`node "a" uses undeclared channel "ghost"`,
		`node "island" is unreachable from Start`,
		`node "loop" has no path to End`,
		`static interrupt on unknown node "ghost-node"`,
	}
	for _, w := range want {
		t.Run(w, func(t *testing.T) {
			require.Contains(t, err.Error(), w)
		})
	}
	// Each problem is reported once, as its own entry.
	require.Len(t, ce.Problems, len(want))
}

func TestCompileRejects(t *testing.T) {
	tests := []struct {
		name  string
		build func(b *engine.Builder)
		want  string
	}{
		{"no edge from Start", func(b *engine.Builder) { b.AddNode("a", noop) }, "no edge from Start"},
		{"reserved name", func(b *engine.Builder) {
			b.AddNode(engine.End, noop)
			b.AddEdge(engine.Start, engine.End)
		}, "reserved or empty"},
		{"empty name", func(b *engine.Builder) {
			b.AddNode("", noop)
			b.AddEdge(engine.Start, engine.End)
		}, "reserved or empty"},
		{"nil function", func(b *engine.Builder) {
			b.AddNode("a", nil)
			b.AddEdge(engine.Start, engine.End)
		}, `node "a" has no function`},
		{"edge to Start", func(b *engine.Builder) {
			b.AddNode("a", noop)
			b.AddEdge(engine.Start, "a")
			b.AddEdge("a", engine.Start)
		}, `edge from "a" to Start`},
		{"edge from End", func(b *engine.Builder) {
			b.AddNode("a", noop)
			b.AddEdge(engine.Start, "a")
			b.AddEdge(engine.End, "a")
		}, "edge from End"},
		{"router without targets", func(b *engine.Builder) {
			b.AddNode("a", noop)
			b.AddEdge(engine.Start, "a")
			b.AddConditionalEdge("a", func(engine.State) []string { return nil })
		}, "declares no targets"},
		{"nil router", func(b *engine.Builder) {
			b.AddNode("a", noop)
			b.AddEdge(engine.Start, "a")
			b.AddConditionalEdge("a", nil, engine.End)
		}, "has no router"},
		{"conditional edge from unknown node", func(b *engine.Builder) {
			b.AddNode("a", noop)
			b.AddEdge(engine.Start, "a")
			b.AddConditionalEdge("zz", func(engine.State) []string { return nil }, engine.End)
		}, `conditional edge from unknown node "zz"`},
		{"subgraph channel kind mismatch", func(b *engine.Builder) {
			sb := engine.NewGraph("sub")
			engine.Append[string](sb, "log")
			sb.AddNode("s", noop)
			sb.AddEdge(engine.Start, "s")
			sub, err := sb.Compile()
			if err != nil {
				panic(err)
			}
			engine.Replace[[]string](b, "log")
			b.AddSubgraph("sub", sub)
			b.AddEdge(engine.Start, "sub")
		}, `channel "log" is replace here and append in the subgraph`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := engine.NewGraph("g")
			tt.build(b)
			_, err := b.Compile()
			require.ErrorIs(t, err, engine.ErrInvalidGraph)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestCompileAcceptsValidGraph(t *testing.T) {
	b := engine.NewGraph("ok")
	n := engine.Sum[int](b, "n")
	b.AddNode("a", writes(n.Set(1)), engine.Writes("n"), engine.Reads("n"))
	b.AddNode("b", noop)
	b.AddEdge(engine.Start, "a")
	b.AddConditionalEdge("a", func(engine.State) []string { return []string{"b"} }, "b", engine.End)
	g := mustCompile(t, b)
	require.Equal(t, "ok", g.Name())
	require.Equal(t, []string{"a", "b"}, g.Nodes())
}

func TestRouterReturningUndeclaredTargetFailsRun(t *testing.T) {
	b := engine.NewGraph("g")
	b.AddNode("a", noop)
	b.AddNode("b", noop)
	b.AddNode("c", noop)
	b.AddEdge(engine.Start, "a")
	b.AddConditionalEdge("a", func(engine.State) []string { return []string{"b"} }, "c", engine.End)
	b.AddEdge("b", engine.End)
	b.AddEdge(engine.Start, "b") // keep b reachable
	g := mustCompile(t, b)

	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
	require.Error(t, err)
	require.ErrorContains(t, err, `router after "a" returned "b"`)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Contains(t, res.Run.Error, `"b"`)
}

func TestFanoutToUndeclaredTargetFailsRun(t *testing.T) {
	b := engine.NewGraph("g")
	b.AddNode("a", noop)
	b.AddNode("w", noop)
	b.AddEdge(engine.Start, "a")
	b.AddFanout("a", func(engine.State) []engine.Send {
		return []engine.Send{{Node: "a", Input: 1}}
	}, "w")
	g := mustCompile(t, b)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
	require.ErrorContains(t, err, `fan-out after "a" sent to "a"`)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
}

func TestInvokeRequiresThread(t *testing.T) {
	b := engine.NewGraph("g")
	b.AddNode("a", noop)
	b.AddEdge(engine.Start, "a")
	g := mustCompile(t, b)
	_, err := g.Invoke(context.Background(), engine.RunConfig{})
	require.ErrorContains(t, err, "thread is required")
	require.False(t, errors.Is(err, engine.ErrInvalidGraph))
}
