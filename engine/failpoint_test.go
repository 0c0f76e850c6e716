package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

var errKilled = errors.New("killed at a failpoint")

// failpointGraph is a -> b -> c, counting each node's executions.
func failpointGraph(t *testing.T, calls map[string]*atomic.Int32) (*Graph, Chan[[]string]) {
	t.Helper()
	b := NewGraph("failpoints")
	trace := Append[string](b, "trace")
	for _, n := range []string{"a", "b", "c"} {
		calls[n] = &atomic.Int32{}
		b.AddNode(n, func(_ context.Context, _ State) ([]Write, error) {
			calls[n].Add(1)
			return []Write{Push(trace, n)}, nil
		})
	}
	b.AddEdge(Start, "a").AddEdge("a", "b").AddEdge("b", "c")
	g, err := b.Compile()
	require.NoError(t, err)
	return g, trace
}

// killThenRecover runs a turn that dies at a failpoint, then recovers it
// with a new manager over the same store, as a restarted process would.
func killThenRecover(t *testing.T, arm func(), calls map[string]*atomic.Int32) (*Snapshot, []Event) {
	t.Helper()
	g, _ := failpointGraph(t, calls)
	agent := &Agent{Name: "fp", Graph: g}
	resolve := func(string, BundleRef) (*Agent, error) { return agent, nil }
	store := NewMemoryStore()
	ctx := context.Background()

	bus := NewBus()
	sub := bus.Subscribe(1000, nil)
	m := NewManager(store, resolve, ManagerOptions{Events: bus})
	arm()
	run, err := m.Invoke(ctx, RunRequest{Thread: "t", Agent: "fp"})
	require.NoError(t, err)
	m.Close()
	failpoints.afterStepBeforeCommit, failpoints.afterCommitBeforePublish = nil, nil
	bus.Close()
	var seen []Event
	for e := range sub.C() {
		seen = append(seen, e)
	}
	stored, err := store.Run(ctx, run.ID)
	require.NoError(t, err)
	require.False(t, stored.Status.Terminal(), "the killed run is left unfinished in the store")

	m = NewManager(store, resolve, ManagerOptions{})
	defer m.Close()
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	done, err := m.Wait(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, done.Status, done.Error)
	snap, err := g.StateAt(ctx, RunConfig{Thread: "t", Store: store}, "")
	require.NoError(t, err)
	return snap, seen
}

func TestFailpointAfterStepBeforeCommit(t *testing.T) {
	calls := map[string]*atomic.Int32{}
	snap, _ := killThenRecover(t, func() {
		failpoints.afterStepBeforeCommit = func(step int) error {
			if calls["b"].Load() == 1 {
				return errKilled // b ran; its step is not committed
			}
			return nil
		}
	}, calls)
	// b's step was lost with the process, so b runs again; a's was
	// committed and does not. Every write is in the state once.
	require.Equal(t, int32(1), calls["a"].Load())
	require.Equal(t, int32(2), calls["b"].Load())
	require.Equal(t, int32(1), calls["c"].Load())
	require.Equal(t, []string{"a", "b", "c"}, snap.vals["trace"])
}

func TestFailpointAfterCommitBeforePublish(t *testing.T) {
	calls := map[string]*atomic.Int32{}
	var killedAt string
	snap, seen := killThenRecover(t, func() {
		failpoints.afterCommitBeforePublish = func(c *Commit) error {
			if c.Checkpoint != nil && len(c.Checkpoint.Nodes) == 1 && c.Checkpoint.Nodes[0] == "b" {
				killedAt = c.Checkpoint.ID
				return errKilled // b's step is durable; nobody has heard of it
			}
			return nil
		}
	}, calls)
	require.NotEmpty(t, killedAt)
	// The committed step is never executed again.
	for _, n := range []string{"a", "b", "c"} {
		require.Equal(t, int32(1), calls[n].Load(), n)
	}
	require.Equal(t, []string{"a", "b", "c"}, snap.vals["trace"])
	// And what the dead process announced stops short of b's commit.
	for _, e := range seen {
		require.NotContains(t, string(e.Data), killedAt, "%s event of the unannounced commit", e.Type)
		if e.Type == EventNodeCompleted {
			require.NotEqual(t, "b", e.Node)
		}
	}
}

func TestManagerReportsWorkingRunAsRunning(t *testing.T) {
	b := NewGraph("slow")
	out := Replace[string](b, "out")
	release := make(chan struct{})
	entered := make(chan struct{})
	b.AddNode("wait", func(ctx context.Context, _ State) ([]Write, error) {
		close(entered)
		<-release
		return []Write{out.Set("done")}, nil
	})
	b.AddEdge(Start, "wait")
	g, err := b.Compile()
	require.NoError(t, err)
	agent := &Agent{Name: "slow", Graph: g}
	store := NewMemoryStore()
	m := NewManager(store, func(string, BundleRef) (*Agent, error) { return agent, nil }, ManagerOptions{})
	defer m.Close()
	ctx := context.Background()
	run, err := m.Start(ctx, RunRequest{Thread: "t", Agent: "slow"})
	require.NoError(t, err)
	<-entered
	stored, err := store.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusQueued, stored.Status, "the store is not rewritten before the first step commits")
	live, err := m.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusRunning, live.Status)
	close(release)
	done, err := m.Wait(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, done.Status)
	live, err = m.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, live.Status)
}

func TestNodeBudgetErrorEndsRunAsBudgetExceeded(t *testing.T) {
	b := NewGraph("budget")
	out := Replace[string](b, "out")
	b.AddNode("spend", func(ctx context.Context, _ State) ([]Write, error) {
		Announce(ctx, EventToolCalled, map[string]string{"tool": "x"})
		return []Write{out.Set("x")}, fmt.Errorf("tokens: %w (used 1200 of 1000)", ErrBudgetExceeded)
	})
	b.AddEdge(Start, "spend")
	g, err := b.Compile()
	require.NoError(t, err)
	bus := NewBus()
	sub := bus.Subscribe(100, nil)
	res, err := g.Invoke(context.Background(), RunConfig{Thread: "t", Events: bus})
	require.ErrorIs(t, err, ErrBudgetExceeded)
	require.Equal(t, StatusBudgetExceeded, res.Run.Status)
	bus.Close()
	var types []string
	for e := range sub.C() {
		if e.Type == EventToolCalled {
			require.False(t, e.Live, "announced events are not live")
		}
		types = append(types, e.Type)
	}
	require.Contains(t, types, EventToolCalled)
	require.Contains(t, types, EventRunFailed)
}

func TestInvokeStopsWhenCallerGoesAway(t *testing.T) {
	b := NewGraph("slow")
	out := Replace[string](b, "out")
	entered := make(chan struct{})
	b.AddNode("wait", func(ctx context.Context, _ State) ([]Write, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b.AddNode("after", func(context.Context, State) ([]Write, error) { return []Write{out.Set("x")}, nil })
	b.AddEdge(Start, "wait").AddEdge("wait", "after")
	g, err := b.Compile()
	require.NoError(t, err)
	agent := &Agent{Name: "slow", Graph: g}
	m := NewManager(NewMemoryStore(), func(string, BundleRef) (*Agent, error) { return agent, nil }, ManagerOptions{})
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-entered; cancel() }()
	run, err := m.Invoke(ctx, RunRequest{Thread: "t", Agent: "slow"})
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, run.Status)
	require.Contains(t, run.Error, "caller went away")
}

// A decision is on record before the node acts on it: if the process dies
// after the resume but before the node's step commits, recovery gives the
// node the same decision instead of asking the person again.
func TestDecisionSurvivesCrashAfterResume(t *testing.T) {
	b := NewGraph("ask")
	out := Replace[string](b, "out")
	var asked, ran atomic.Int32
	b.AddNode("ask", func(ctx context.Context, _ State) ([]Write, error) {
		ran.Add(1)
		d, err := Interrupt(ctx, "ok?")
		if err != nil {
			asked.Add(1)
			return nil, err
		}
		return []Write{out.Set(d.Kind)}, nil
	})
	b.AddEdge(Start, "ask")
	g, err := b.Compile()
	require.NoError(t, err)
	agent := &Agent{Name: "ask", Graph: g}
	resolve := func(string, BundleRef) (*Agent, error) { return agent, nil }
	store := NewMemoryStore()
	ctx := context.Background()

	m := NewManager(store, resolve, ManagerOptions{})
	run, err := m.Invoke(ctx, RunRequest{Thread: "t", Agent: "ask"})
	require.NoError(t, err)
	require.Equal(t, StatusInterrupted, run.Status)
	failpoints.afterStepBeforeCommit = func(int) error { return errKilled }
	_, err = m.Resume(ctx, run.ID, map[string]Decision{run.Interrupts[0].ID: {Kind: Approve, By: "nurse"}})
	require.NoError(t, err)
	_, _ = m.Wait(ctx, run.ID)
	m.Close()
	failpoints.afterStepBeforeCommit = nil

	m = NewManager(store, resolve, ManagerOptions{})
	defer m.Close()
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the resumed run was running when it died")
	done, err := m.Wait(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, done.Status, done.Error)
	require.JSONEq(t, `"approve"`, mustJSON(t, out, store))
	require.Equal(t, int32(1), asked.Load(), "the person was asked once")
	require.Equal(t, int32(3), ran.Load(), "first run, resumed run that died, recovered run")
}

func mustJSON(t *testing.T, c Chan[string], store *MemoryStore) string {
	t.Helper()
	cp, err := store.Checkpoint(context.Background(), "t", "", "")
	require.NoError(t, err)
	for _, cv := range cp.Channels {
		if cv.Channel == c.Name() {
			return string(cv.Value.Inline)
		}
	}
	t.Fatalf("channel %s not in the head checkpoint", c.Name())
	return ""
}
