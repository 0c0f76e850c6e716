package engine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

func TestSubgraphSharesChannelsWithoutDuplication(t *testing.T) {
	calls := newCounter()
	sb := engine.NewGraph("inner")
	smsgs := engine.Append[string](sb, "messages")
	stotal := engine.Sum[int](sb, "total")
	scratch := engine.Replace[string](sb, "scratch")
	sb.AddNode("s1", calls.counted(writes(engine.Push(smsgs, "s1"), stotal.Set(1), scratch.Set("private"))))
	sb.AddNode("s2", calls.counted(func(_ context.Context, s engine.State) ([]engine.Write, error) {
		// The subgraph sees the parent's messages as its input.
		return []engine.Write{engine.Push(smsgs, "s2 saw "+smsgs.Get(s)[0]), stotal.Set(2)}, nil
	}))
	sb.AddEdge(engine.Start, "s1")
	sb.AddEdge("s1", "s2")
	sub := mustCompile(t, sb)

	b := engine.NewGraph("outer")
	msgs := engine.Append[string](b, "messages")
	total := engine.Sum[int](b, "total")
	b.AddNode("p1", calls.counted(writes(engine.Push(msgs, "p1"), total.Set(10))))
	b.AddSubgraph("inner", sub)
	b.AddNode("p2", calls.counted(writes(engine.Push(msgs, "p2"))))
	b.AddEdge(engine.Start, "p1")
	b.AddEdge("p1", "inner")
	b.AddEdge("inner", "p2")
	g := mustCompile(t, b)

	store := newRecordingStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg, engine.Push(msgs, "in"), total.Set(100))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, []string{"in", "p1", "s1", "s2 saw in", "p2"}, msgs.Get(res.State))
	require.Equal(t, 113, total.Get(res.State))
	_, ok := res.State.Value("scratch")
	require.False(t, ok, "the subgraph's own channels stay inside it")
	for _, n := range []string{"p1", "s1", "s2", "p2"} {
		require.Equal(t, 1, calls.get(n), n)
	}

	// The subgraph kept its own checkpoints, under its own namespace.
	nss := store.namespaces()
	require.Len(t, nss, 2)
	require.Equal(t, "", nss[0])
	ns := nss[1]
	require.Regexp(t, `^inner:[0-9a-f]{16}$`, ns)
	subHist, err := store.History(ctx, "t", ns, "", 0)
	require.NoError(t, err)
	require.Len(t, subHist, 3, "input, s1, s2")
	for _, c := range subHist {
		require.Equal(t, ns, c.NS)
	}
	// The parent's history does not include them.
	hist, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	require.Len(t, hist, 4)

	// A second turn runs the subgraph in a fresh namespace and still hands
	// back only the new items.
	res, err = g.Invoke(ctx, cfg, engine.Push(msgs, "again"))
	require.NoError(t, err)
	require.Equal(t, []string{"in", "p1", "s1", "s2 saw in", "p2", "again", "p1", "s1", "s2 saw in", "p2"}, msgs.Get(res.State))
	require.Equal(t, 126, total.Get(res.State))
	require.Len(t, store.namespaces(), 3)
}

func TestSubgraphInterruptSurfacesAndResumes(t *testing.T) {
	calls := newCounter()
	sb := engine.NewGraph("inner")
	smsgs := engine.Append[string](sb, "messages")
	sb.AddNode("prepare", calls.counted(writes(engine.Push(smsgs, "prepared"))))
	sb.AddNode("approve", calls.counted(func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, map[string]int{"items": len(smsgs.Get(s))})
		if err != nil {
			return nil, err
		}
		var v string
		if err := json.Unmarshal(d.Value, &v); err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(smsgs, "approved "+v)}, nil
	}))
	sb.AddEdge(engine.Start, "prepare")
	sb.AddEdge("prepare", "approve")
	sub := mustCompile(t, sb)

	b := engine.NewGraph("outer")
	msgs := engine.Append[string](b, "messages")
	b.AddNode("p1", calls.counted(writes(engine.Push(msgs, "p1"))))
	b.AddSubgraph("inner", sub)
	b.AddNode("p2", calls.counted(writes(engine.Push(msgs, "p2"))))
	b.AddEdge(engine.Start, "p1")
	b.AddEdge("p1", "inner")
	b.AddEdge("inner", "p2")
	g := mustCompile(t, b)

	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg, engine.Push(msgs, "in"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	require.Len(t, res.Run.Interrupts, 1)
	in := res.Run.Interrupts[0]
	require.Equal(t, "approve", in.Node)
	require.NotEmpty(t, in.NS, "the interrupt names the subgraph's namespace")
	require.JSONEq(t, `{"items":3}`, string(in.Payload))
	require.Equal(t, []string{"in", "p1"}, msgs.Get(res.State))
	stored, err := store.Run(ctx, res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, stored.Status)

	cfg.Run = res.Run
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{in.ID: {Kind: engine.Edit, Value: json.RawMessage(`"by ops"`)}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, []string{"in", "p1", "prepared", "approved by ops", "p2"}, msgs.Get(res.State))
	require.Equal(t, 1, calls.get("p1"))
	require.Equal(t, 1, calls.get("prepare"), "the subgraph resumes where it stopped")
	require.Equal(t, 2, calls.get("approve"))
	require.Equal(t, 1, calls.get("p2"))
}

// TestSubgraphAndSiblingInterruptTogether answers an interrupt raised inside
// a subgraph and one raised by a sibling task in the same Resume call.
func TestSubgraphAndSiblingInterruptTogether(t *testing.T) {
	sb := engine.NewGraph("inner")
	smsgs := engine.Append[string](sb, "messages")
	sb.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "inner?")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(smsgs, "inner "+d.Kind)}, nil
	})
	sb.AddEdge(engine.Start, "ask")
	sub := mustCompile(t, sb)

	b := engine.NewGraph("outer")
	msgs := engine.Append[string](b, "messages")
	b.AddSubgraph("inner", sub)
	b.AddNode("sibling", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "outer?")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(msgs, "sibling "+d.Kind)}, nil
	})
	b.AddEdge(engine.Start, "inner")
	b.AddEdge(engine.Start, "sibling")
	g := mustCompile(t, b)

	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore()}
	res, err := g.Invoke(ctx, cfg)
	require.NoError(t, err)
	require.Len(t, res.Run.Interrupts, 2)
	decisions := map[string]engine.Decision{}
	for _, in := range res.Run.Interrupts {
		decisions[in.ID] = engine.Decision{Kind: engine.Approve}
	}
	cfg.Run = res.Run
	res, err = g.Resume(ctx, cfg, decisions)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, []string{"inner approve", "sibling approve"}, msgs.Get(res.State))
}
