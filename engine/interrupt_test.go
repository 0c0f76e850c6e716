package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// reviewGraph asks a person about a draft and writes the outcome.
func reviewGraph(t *testing.T, calls *counter) (*engine.Graph, engine.Chan[string]) {
	b := engine.NewGraph("review")
	outcome := engine.Replace[string](b, "outcome")
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		calls.inc("before")
		d, err := engine.Interrupt(ctx, map[string]string{"draft": "send 5 units"})
		if err != nil {
			return nil, err
		}
		calls.inc("after")
		switch d.Kind {
		case engine.Approve:
			return []engine.Write{outcome.Set("approved")}, nil
		case engine.Edit:
			var v string
			if err := json.Unmarshal(d.Value, &v); err != nil {
				return nil, err
			}
			return []engine.Write{outcome.Set("edited: " + v)}, nil
		default:
			return []engine.Write{outcome.Set("rejected: " + d.Reason)}, nil
		}
	})
	b.AddEdge(engine.Start, "review")
	return mustCompile(t, b), outcome
}

func TestInterruptAndResume(t *testing.T) {
	tests := []struct {
		name     string
		decision engine.Decision
		want     string
	}{
		{"approve", engine.Decision{Kind: engine.Approve}, "approved"},
		{"edit", engine.Decision{Kind: engine.Edit, Value: json.RawMessage(`"send 3 units"`)}, "edited: send 3 units"},
		{"reject", engine.Decision{Kind: engine.Reject, Reason: "too many"}, "rejected: too many"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := newCounter()
			g, outcome := reviewGraph(t, calls)
			store := engine.NewMemoryStore()
			ctx := context.Background()
			cfg := engine.RunConfig{Thread: "t", Store: store}

			res, err := g.Invoke(ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, res.Run.Status)
			require.Len(t, res.Run.Interrupts, 1)
			in := res.Run.Interrupts[0]
			require.NotEmpty(t, in.ID)
			require.Equal(t, "review", in.Node)
			require.Equal(t, 0, in.Index)
			require.JSONEq(t, `{"draft":"send 5 units"}`, string(in.Payload))
			require.Equal(t, []string{"review"}, res.State.Next)

			// The pause is durable: the stored run lists the interrupt.
			stored, err := store.Run(ctx, res.Run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, stored.Status)
			require.Equal(t, res.Run.Interrupts, stored.Interrupts)

			cfg.Run = res.Run
			res, err = g.Resume(ctx, cfg, map[string]engine.Decision{in.ID: tt.decision})
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Run.Status)
			require.Empty(t, res.Run.Interrupts)
			require.Equal(t, tt.want, outcome.Get(res.State))
			require.Equal(t, 2, calls.get("before"), "the node re-runs from its start")
			require.Equal(t, 1, calls.get("after"))
			require.Len(t, res.Run.Decisions, 1)
			require.Equal(t, in.ID, res.Run.Decisions[0].Interrupt)
			require.Equal(t, tt.decision.Kind, res.Run.Decisions[0].Decision)
		})
	}
}

func TestResumeRejectsBadDecisions(t *testing.T) {
	g, _ := reviewGraph(t, newCounter())
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg)
	require.NoError(t, err)
	id := res.Run.Interrupts[0].ID

	_, err = g.Resume(ctx, cfg, map[string]engine.Decision{"int_0000000000000000": {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrUnknownInterrupt)
	_, err = g.Resume(ctx, cfg, map[string]engine.Decision{id: {Kind: "maybe"}})
	require.ErrorIs(t, err, engine.ErrBadDecision)
	_, err = g.Resume(ctx, cfg, map[string]engine.Decision{id: {Kind: engine.Edit}})
	require.ErrorIs(t, err, engine.ErrBadDecision, "edit needs a value")

	// Refused resumes change nothing: the interrupt is still pending.
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{id: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
}

func TestInterruptOutsideNode(t *testing.T) {
	_, err := engine.Interrupt(context.Background(), "x")
	require.ErrorContains(t, err, "outside a running node")
}

func TestTwoInterruptsInOneNode(t *testing.T) {
	calls := newCounter()
	b := engine.NewGraph("two")
	got := engine.Append[string](b, "got")
	b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		calls.inc("ask")
		first, err := engine.Interrupt(ctx, "first?")
		if err != nil {
			return nil, err
		}
		second, err := engine.Interrupt(ctx, "second?")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(got, string(first.Value), string(second.Value))}, nil
	})
	b.AddEdge(engine.Start, "ask")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}

	res, err := g.Invoke(ctx, cfg)
	require.NoError(t, err)
	require.Len(t, res.Run.Interrupts, 1)
	first := res.Run.Interrupts[0]
	require.Equal(t, 0, first.Index)
	require.JSONEq(t, `"first?"`, string(first.Payload))

	cfg.Run = res.Run
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{first.ID: {Kind: engine.Edit, Value: json.RawMessage(`"one"`)}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	require.Len(t, res.Run.Interrupts, 1)
	second := res.Run.Interrupts[0]
	require.Equal(t, 1, second.Index)
	require.NotEqual(t, first.ID, second.ID, "each interrupt has its own id")
	require.JSONEq(t, `"second?"`, string(second.Payload))

	// Answering the first again is refused: it is no longer pending.
	_, err = g.Resume(ctx, cfg, map[string]engine.Decision{first.ID: {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrUnknownInterrupt)

	cfg.Run = res.Run
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{second.ID: {Kind: engine.Edit, Value: json.RawMessage(`"two"`)}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	// The first answer was kept, not overwritten by the second.
	require.Equal(t, []string{`"one"`, `"two"`}, got.Get(res.State))
	require.Equal(t, 3, calls.get("ask"))
	require.Len(t, res.Run.Decisions, 2)
}

func TestParallelTasksInterrupt(t *testing.T) {
	calls := newCounter()
	b := engine.NewGraph("par")
	got := engine.Merge[string, string](b, "got")
	for _, name := range []string{"left", "right"} {
		b.AddNode(name, calls.counted(func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			d, err := engine.Interrupt(ctx, s.Node())
			if err != nil {
				return nil, err
			}
			return []engine.Write{got.Set(map[string]string{s.Node(): d.Kind})}, nil
		}))
		b.AddEdge(engine.Start, name)
	}
	g := mustCompile(t, b)
	ctx := context.Background()

	t.Run("both answered at once", func(t *testing.T) {
		cfg := engine.RunConfig{Thread: "both", Store: engine.NewMemoryStore()}
		res, err := g.Invoke(ctx, cfg)
		require.NoError(t, err)
		require.Len(t, res.Run.Interrupts, 2)
		ids := map[string]string{}
		for _, in := range res.Run.Interrupts {
			ids[in.Node] = in.ID
		}
		require.Len(t, ids, 2)
		require.NotEqual(t, ids["left"], ids["right"])
		cfg.Run = res.Run
		res, err = g.Resume(ctx, cfg, map[string]engine.Decision{
			ids["left"]:  {Kind: engine.Approve},
			ids["right"]: {Kind: engine.Reject, Reason: "no"},
		})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		require.Equal(t, map[string]string{"left": engine.Approve, "right": engine.Reject}, got.Get(res.State))
	})

	t.Run("one at a time", func(t *testing.T) {
		calls.n = map[string]int{}
		cfg := engine.RunConfig{Thread: "one", Store: engine.NewMemoryStore()}
		res, err := g.Invoke(ctx, cfg)
		require.NoError(t, err)
		ids := map[string]string{}
		for _, in := range res.Run.Interrupts {
			ids[in.Node] = in.ID
		}
		cfg.Run = res.Run
		res, err = g.Resume(ctx, cfg, map[string]engine.Decision{ids["left"]: {Kind: engine.Approve}})
		require.NoError(t, err)
		require.Equal(t, engine.StatusInterrupted, res.Run.Status)
		require.Len(t, res.Run.Interrupts, 1)
		require.Equal(t, ids["right"], res.Run.Interrupts[0].ID, "the unanswered interrupt keeps its id")

		cfg.Run = res.Run
		res, err = g.Resume(ctx, cfg, map[string]engine.Decision{ids["right"]: {Kind: engine.Approve}})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		require.Equal(t, map[string]string{"left": engine.Approve, "right": engine.Approve}, got.Get(res.State))
		require.Equal(t, 2, calls.get("left"), "left's writes were saved once it was answered")
		require.Equal(t, 3, calls.get("right"))
	})
}

func TestStaticInterrupts(t *testing.T) {
	tests := []struct {
		name       string
		opt        engine.CompileOption
		when       string
		ranAtPause []string
	}{
		{"before b", engine.InterruptBefore("b"), "before", []string{"a"}},
		{"after a", engine.InterruptAfter("a"), "after", []string{"a"}},
		{"after b", engine.InterruptAfter("b"), "after", []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, decision := range []engine.Decision{{Kind: engine.Approve}, {Kind: engine.Reject, Reason: "stop here"}} {
				t.Run(decision.Kind, func(t *testing.T) {
					calls := newCounter()
					b := engine.NewGraph("static")
					b.AddNode("a", calls.counted(noop))
					b.AddNode("b", calls.counted(noop))
					b.AddNode("c", calls.counted(noop))
					b.AddEdge(engine.Start, "a")
					b.AddEdge("a", "b")
					b.AddEdge("b", "c")
					g := mustCompile(t, b, tt.opt)
					ctx := context.Background()
					cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore()}

					res, err := g.Invoke(ctx, cfg)
					require.NoError(t, err)
					require.Equal(t, engine.StatusInterrupted, res.Run.Status)
					require.Len(t, res.Run.Interrupts, 1)
					var payload struct {
						When  string
						Nodes []string
					}
					require.NoError(t, json.Unmarshal(res.Run.Interrupts[0].Payload, &payload))
					require.Equal(t, tt.when, payload.When)
					for _, n := range []string{"a", "b", "c"} {
						want := 0
						for _, r := range tt.ranAtPause {
							if r == n {
								want = 1
							}
						}
						require.Equal(t, want, calls.get(n), "node %s at the pause", n)
					}

					cfg.Run = res.Run
					res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: decision})
					if decision.Kind == engine.Reject {
						require.ErrorIs(t, err, engine.ErrRejected)
						require.ErrorContains(t, err, "stop here")
						require.Equal(t, engine.StatusCancelled, res.Run.Status)
						require.Equal(t, 0, calls.get("c"))
						return
					}
					require.NoError(t, err)
					require.Equal(t, engine.StatusCompleted, res.Run.Status)
					for _, n := range []string{"a", "b", "c"} {
						require.Equal(t, 1, calls.get(n), "node %s runs once", n)
					}
				})
			}
		})
	}
}

// TestResumeContinuesTheInterruptedRun resumes without handing the run record
// back: the run that paused is the one that completes, so no run is left
// interrupted in the store (a run manager would otherwise hold the thread
// for it forever).
func TestResumeContinuesTheInterruptedRun(t *testing.T) {
	g, outcome := reviewGraph(t, newCounter())
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg)
	require.NoError(t, err)
	paused := res.Run

	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, paused.ID, res.Run.ID)
	require.Equal(t, "approved", outcome.Get(res.State))
	runs, err := store.Runs(ctx, engine.RunFilter{Thread: "t"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, engine.StatusCompleted, runs[0].Status)
	require.Len(t, runs[0].Decisions, 1)
}

func TestInterruptWithExitDurability(t *testing.T) {
	b := engine.NewGraph("exit")
	log := engine.Append[string](b, "log")
	b.AddNode("a", writes(engine.Push(log, "a")))
	b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "go on?")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(log, d.Kind)}, nil
	})
	b.AddNode("c", writes(engine.Push(log, "c")))
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "ask")
	b.AddEdge("ask", "c")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store, Durability: engine.DurabilityExit}
	res, err := g.Invoke(ctx, cfg, engine.Push(log, "in"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	// The pause made the progress so far durable.
	snap, err := g.StateAt(ctx, cfg, "")
	require.NoError(t, err)
	require.Equal(t, []string{"in", "a"}, log.Get(snap))

	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	snap, err = g.StateAt(ctx, cfg, "")
	require.NoError(t, err)
	require.Equal(t, []string{"in", "a", "approve", "c"}, log.Get(snap))
}

// A node's decision check runs before Graph.Resume spends the decision: a
// refused one leaves the run interrupted, and a good one goes through.
func TestCheckDecisionBeforeResume(t *testing.T) {
	b := engine.NewGraph("checked")
	log := engine.Append[string](b, "log")
	b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "edit me")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(log, string(d.Value))}, nil
	}, engine.CheckDecision(func(d engine.Decision) error {
		if d.Kind == engine.Edit && (len(d.Value) == 0 || d.Value[0] != '"') {
			return errors.New("an edit is a JSON string")
		}
		return nil
	}))
	b.AddEdge(engine.Start, "ask")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg, engine.Push(log, "in"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	err = refuseThenAccept(t, g, cfg, store, res.Run, log)
	// The person did choose approve, edit or reject: the message gives the
	// node's reason, not the sentinel's words about the decision's kind.
	require.ErrorContains(t, err, `node "ask" refuses this edit`)
	require.NotContains(t, err.Error(), "must be approve")
}

// refuseThenAccept resumes paused, whose one interrupt asks for a JSON
// string, with an edit that is not one: the refusal (returned) changes
// nothing stored. A string then completes the run.
func refuseThenAccept(t *testing.T, g *engine.Graph, cfg engine.RunConfig, store *engine.MemoryStore, paused *engine.Run, log engine.Chan[[]string]) error {
	t.Helper()
	ctx := context.Background()
	in := paused.Interrupts[0].ID
	cfg.Run = paused
	_, refused := g.Resume(ctx, cfg, map[string]engine.Decision{in: {Kind: engine.Edit, Value: json.RawMessage(`{"x":1}`)}})
	require.ErrorIs(t, refused, engine.ErrBadDecision)
	require.ErrorContains(t, refused, "an edit is a JSON string")
	run, err := store.Run(ctx, paused.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, run.Status, "the refused decision changed nothing")
	require.Empty(t, run.Decisions)

	cfg.Run = run
	res, err := g.Resume(ctx, cfg, map[string]engine.Decision{in: {Kind: engine.Edit, Value: json.RawMessage(`"fine"`)}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, []string{"in", `"fine"`}, log.Get(res.State))
	return refused
}

// The check of a node inside a subgraph (nested too) runs before the
// parent's Resume spends the decision, as a top-level node's does.
func TestCheckDecisionInsideSubgraph(t *testing.T) {
	checkString := engine.CheckDecision(func(d engine.Decision) error {
		if d.Kind == engine.Edit && (len(d.Value) == 0 || d.Value[0] != '"') {
			return errors.New("an edit is a JSON string")
		}
		return nil
	})
	ib := engine.NewGraph("innermost")
	ilog := engine.Append[string](ib, "log")
	ib.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "edit me")
		if err != nil {
			return nil, err
		}
		return []engine.Write{engine.Push(ilog, string(d.Value))}, nil
	}, checkString)
	ib.AddEdge(engine.Start, "ask")
	innermost := mustCompile(t, ib)

	sb := engine.NewGraph("inner")
	engine.Append[string](sb, "log")
	sb.AddSubgraph("deeper", innermost)
	sb.AddEdge(engine.Start, "deeper")
	inner := mustCompile(t, sb)

	b := engine.NewGraph("outer")
	log := engine.Append[string](b, "log")
	b.AddSubgraph("review", inner)
	b.AddEdge(engine.Start, "review")
	g := mustCompile(t, b)

	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(ctx, cfg, engine.Push(log, "in"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	require.NotEmpty(t, res.Run.Interrupts[0].NS)
	refuseThenAccept(t, g, cfg, store, res.Run, log)
}
