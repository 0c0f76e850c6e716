package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// The tasks of one superstep, the steps after them and the nodes of a
// subgraph share one value per run; the next Invoke makes it again.
func TestRunValueIsSharedByTheRunsTasks(t *testing.T) {
	type key struct{}
	var made atomic.Int32
	bump := func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		v, err := engine.RunValue(ctx, key{}, func() (any, error) { made.Add(1); return new(atomic.Int32), nil })
		if err != nil {
			return nil, err
		}
		v.(*atomic.Int32).Add(1)
		return nil, nil
	}
	var seen atomic.Int32
	last := func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		v, err := engine.RunValue(ctx, key{}, func() (any, error) { return nil, errors.New("made twice") })
		if err != nil {
			return nil, err
		}
		seen.Store(v.(*atomic.Int32).Load())
		return nil, nil
	}
	sub := oneNodeSubgraph(t, bump)
	b := engine.NewGraph("outer")
	x := engine.Replace[string](b, "x")
	b.AddNode("a", bump)
	b.AddNode("b", bump)
	b.AddSubgraph("sub", sub)
	b.AddNode("last", last)
	b.AddEdge(engine.Start, "a")
	b.AddEdge(engine.Start, "b")
	b.AddEdge("a", "sub")
	b.AddEdge("b", "sub")
	b.AddEdge("sub", "last")
	b.AddEdge("last", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)

	store := engine.NewMemoryStore()
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store}, x.Set("go"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, int32(1), made.Load(), "made once for the run")
	require.Equal(t, int32(3), seen.Load(), "a, b and the subgraph's node counted on one value")

	_, err = engine.RunValue(context.Background(), key{}, nil)
	require.Error(t, err, "outside a node")

	_, err = g.Invoke(context.Background(), engine.RunConfig{Thread: "t2", Store: store}, x.Set("go"))
	require.NoError(t, err)
	require.Equal(t, int32(2), made.Load(), "another run makes its own")
}

// The run's token budget reaches its nodes, subgraphs' included: the
// smaller of the manager's and the agent's.
func TestMaxTokensReachesTheRunsNodes(t *testing.T) {
	for _, tc := range []struct{ manager, agent, want int }{
		{0, 0, 0}, {100, 0, 100}, {0, 50, 50}, {100, 50, 50}, {30, 50, 30},
	} {
		var seen, deep atomic.Int64
		g, x := nodeThenSubgraph(t, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			info, _ := engine.InfoFrom(ctx)
			seen.Store(int64(info.MaxTokens))
			return nil, nil
		}, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			info, _ := engine.InfoFrom(ctx)
			deep.Store(int64(info.MaxTokens))
			return nil, nil
		})
		ag := &engine.Agent{Name: "tok", Graph: g, MaxTokens: tc.agent}
		m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{MaxTokens: tc.manager}, ag)
		run, err := m.Invoke(context.Background(), engine.RunRequest{Thread: "t", Agent: "tok", Writes: []engine.Write{x.Set("go")}})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, run.Status, run.Error)
		require.Equal(t, int64(tc.want), seen.Load(), "manager %d agent %d", tc.manager, tc.agent)
		require.Equal(t, int64(tc.want), deep.Load(), "in the subgraph")
	}
}

// RunInfo.Resumed tells a node whether its run began in an earlier call,
// and so whether a RunValue must be rebuilt from a record: false in the
// call that starts the run, true once it is resumed, in its subgraphs too.
func TestRunInfoSaysWhetherTheRunWasResumed(t *testing.T) {
	var resumed []bool
	var mu sync.Mutex
	note := func(ctx context.Context) {
		info, _ := engine.InfoFrom(ctx)
		mu.Lock()
		resumed = append(resumed, info.Resumed)
		mu.Unlock()
	}
	g, _ := nodeThenSubgraph(t, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		note(ctx)
		_, err := engine.Interrupt(ctx, "go on?")
		return nil, err
	}, func(ctx context.Context, _ engine.State) ([]engine.Write, error) { note(ctx); return nil, nil })
	cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore()}
	res, err := g.Invoke(context.Background(), cfg)
	require.NoError(t, err)
	cfg.Run = res.Run
	_, err = g.Resume(context.Background(), cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, true}, resumed, "a, a again on the resume, then the subgraph's node")
}

// oneNodeSubgraph is a graph, to run as a subgraph, of one node ("deep")
// and the channel x.
func oneNodeSubgraph(t *testing.T, deep engine.NodeFunc) *engine.Graph {
	t.Helper()
	sb := engine.NewGraph("inner")
	engine.Replace[string](sb, "x")
	sb.AddNode("deep", deep)
	sb.AddEdge(engine.Start, "deep")
	sb.AddEdge("deep", engine.End)
	sub, err := sb.Compile()
	require.NoError(t, err)
	return sub
}

// nodeThenSubgraph is a graph that runs first (node "a"), then a subgraph
// ("sub") that runs deep; both share the channel x it returns.
func nodeThenSubgraph(t *testing.T, first, deep engine.NodeFunc) (*engine.Graph, engine.Chan[string]) {
	t.Helper()
	b := engine.NewGraph("outer")
	x := engine.Replace[string](b, "x")
	b.AddNode("a", first)
	b.AddSubgraph("sub", oneNodeSubgraph(t, deep))
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "sub")
	b.AddEdge("sub", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	return g, x
}
