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

// looping is a graph of one node that runs n supersteps, one after the
// other, counting them in a channel of its own.
func looping(t *testing.T, n int) *engine.Graph {
	sb := engine.NewGraph("looping")
	count := engine.Sum[int](sb, "count")
	sb.AddNode("x", writes(count.Set(1)))
	sb.AddEdge(engine.Start, "x")
	sb.AddConditionalEdge("x", func(s engine.State) []string {
		if count.Get(s) >= n {
			return []string{engine.End}
		}
		return []string{"x"}
	}, "x", engine.End)
	return mustCompile(t, sb)
}

// A subgraph's supersteps counted against a limit of their own, the
// run's StepLimit afresh, so a run could take the limit's steps in each
// subgraph it ran. They now count against the run's: all of its steps, at
// any depth of subgraphs, and the run ends budget_exceeded at the limit.
func TestSubgraphStepsCountAgainstTheRunsStepLimit(t *testing.T) {
	for depth := 1; depth <= 2; depth++ {
		t.Run(map[int]string{1: "subgraph", 2: "nested"}[depth], func(t *testing.T) {
			inner := looping(t, 4) // 4 steps, each within the limit alone
			for range depth - 1 {
				mb := engine.NewGraph("middle")
				mb.AddSubgraph("deeper", inner)
				mb.AddEdge(engine.Start, "deeper")
				inner = mustCompile(t, mb)
			}
			b := engine.NewGraph("outer")
			log := engine.Append[string](b, "log")
			prev := engine.Start
			for _, n := range []string{"a", "b", "c"} {
				b.AddNode(n, writes(engine.Push(log, n)))
				b.AddEdge(prev, n)
				prev = n
			}
			b.AddSubgraph("team", inner)
			b.AddEdge(prev, "team")
			g := mustCompile(t, b)

			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", StepLimit: 5})
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status,
				"3 steps, then the subgraph's 4 ran under a limit of 5 (%d counted): %v", res.Run.Steps, err)
			require.ErrorIs(t, err, engine.ErrBudgetExceeded)
			require.ErrorIs(t, err, engine.ErrStepLimit)
			require.LessOrEqual(t, res.Run.Steps, 5)

			res, err = g.Invoke(context.Background(), engine.RunConfig{Thread: "t", StepLimit: 7 + depth})
			require.NoError(t, err, "3 + 4 + the steps that run the subgraphs fit")
			require.Equal(t, engine.StatusCompleted, res.Run.Status)
			require.Equal(t, 7+depth, res.Run.Steps, "a run's steps are all of its supersteps")
		})
	}
}

// The run record is not rewritten at every step: a run recovered or
// resumed counts its steps from its checkpoints, its subgraphs' included.
func TestStepCountOfAResumedRunIncludesItsSubgraphs(t *testing.T) {
	ctx := context.Background()
	b := engine.NewGraph("outer")
	log := engine.Append[string](b, "log")
	b.AddSubgraph("team", looping(t, 3))
	b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(log, "ask")}, nil
	})
	b.AddEdge(engine.Start, "team")
	b.AddEdge("team", "ask")
	prev := "ask"
	for _, n := range []string{"d", "e"} {
		b.AddNode(n, writes(engine.Push(log, n)))
		b.AddEdge(prev, n)
		prev = n
	}
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	cfg := engine.RunConfig{Thread: "t", Store: store, StepLimit: 6}
	res, err := g.Invoke(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	require.Equal(t, 4, res.Run.Steps, "the subgraph's 3 and the step that ran it")

	// A record written before the subgraph ran, as a crash leaves it.
	stale := res.Run.Clone()
	stale.Steps = 0
	require.NoError(t, store.Commit(ctx, &engine.Commit{Run: stale, Sync: true}))

	cfg.Run = nil // adopted from the store, as after a restart
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status, "ask, d and e ran past the limit of 6 (%d counted): %v", res.Run.Steps, err)
	require.ErrorIs(t, err, engine.ErrStepLimit)
	require.Equal(t, 6, res.Run.Steps)
}
