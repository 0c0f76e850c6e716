package engine_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// testClock is a clock that moves only when the test moves it: a run's
// active time under it is what its steps and the test say, however long
// a loaded machine takes to schedule them.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// sleepyGraph runs a, asks a person (when ask is set), then b; a and b
// each take d (take(d): time.Sleep, or a test clock's Advance), and b
// waits first for gate, or its run's end, when gate is not nil.
func sleepyGraph(t *testing.T, take func(time.Duration), d time.Duration, ask bool, gate <-chan struct{}) *engine.Graph {
	b := engine.NewGraph("sleepy")
	log := engine.Append[string](b, "log")
	sleep := func(name string, wait <-chan struct{}) engine.NodeFunc {
		return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			if wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			}
			take(d)
			return []engine.Write{engine.Push(log, name)}, nil
		}
	}
	b.AddNode("a", sleep("a", nil))
	b.AddNode("b", sleep("b", gate))
	b.AddEdge(engine.Start, "a")
	if ask {
		b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			_, err := engine.Interrupt(ctx, "go on?")
			return nil, err
		})
		b.AddEdge("a", "ask")
		b.AddEdge("ask", "b")
	} else {
		b.AddEdge("a", "b")
	}
	return mustCompile(t, b)
}

// The wall-time budget bounds a run's active time across a pause: each of
// its two stretches fits the budget, both together do not. The time it
// waited for the person does not count. The steps and the person take
// their time on a test clock, so that the active time is exact.
func TestWallTimeBudgetHoldsAcrossAPause(t *testing.T) {
	ctx := context.Background()
	const step, budget, wait = 40 * time.Minute, time.Hour, 10 * time.Hour
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			clock := newTestClock()
			s := engine.NewMemoryStore()
			ag := &engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, clock.Advance, step, true, nil), MaxDuration: budget}
			m := newManager(t, s, engine.WithManagerClock(engine.ManagerOptions{Durability: d}, clock.Now), ag)
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "sleepy"})
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, run.Status)
			stored, err := s.Run(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, step, stored.Active(), "the stretch before the pause is on record")
			clock.Advance(wait) // the person takes their time: not counted
			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.NoError(t, err)
			end := waitFor(t, m, run.ID)
			require.Equal(t, engine.StatusBudgetExceeded, end.Status, "ran %s under a budget of %s", end.Active(), budget)
			require.Contains(t, end.Error, "wall-time")
			require.Equal(t, 2*step, end.Active(), "both stretches count, and the wait for the person does not")

			// Graph.Resume, adopting the paused run from the store, counts
			// the same way.
			g := sleepyGraph(t, clock.Advance, step, true, nil)
			cfg := engine.WithClock(engine.RunConfig{Thread: "g", Store: s, Durability: d, MaxDuration: budget}, clock.Now)
			res, err := g.Invoke(ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, res.Run.Status)
			clock.Advance(wait)
			res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.ErrorIs(t, err, engine.ErrDeadline)
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
			require.Equal(t, 2*step, res.Run.Active())
		})
	}
}

// A run recovered after the appliance stopped keeps the active time it had
// committed to: the stretch before the stop counts up to its last
// checkpoint, and the time the appliance was down does not. The steps and
// the stop take their time on a test clock, so that the active time is
// exact.
func TestWallTimeBudgetHoldsAcrossRecovery(t *testing.T) {
	ctx := context.Background()
	const step, budget, down = 40 * time.Minute, time.Hour, 10 * time.Hour
	clock := newTestClock()
	opts := engine.WithManagerClock(engine.ManagerOptions{Durability: engine.DurabilitySync}, clock.Now)
	s := engine.NewMemoryStore()
	gate := make(chan struct{}) // never opened: b waits until the stop
	m := engine.NewManager(s, resolver(&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, clock.Advance, step, false, gate), MaxDuration: budget}), opts)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "sleepy"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		h, err := s.Checkpoint(ctx, "t", "", "")
		return err == nil && h != nil && slices.Contains(h.Nodes, "a")
	}, 5*time.Second, 5*time.Millisecond, "a committed")
	m.Close() // b is stopped: the run stays running in the store
	stored, err := s.Run(ctx, run.ID)
	require.NoError(t, err)
	require.False(t, stored.Status.Terminal(), "status %s", stored.Status)
	clock.Advance(down) // the appliance is down: not counted

	m2 := newManager(t, s, opts, &engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, clock.Advance, step, false, nil), MaxDuration: budget})
	n, err := m2.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	end := waitFor(t, m2, run.ID)
	require.Equal(t, engine.StatusBudgetExceeded, end.Status, "ran %s under a budget of %s", end.Active(), budget)
	require.Equal(t, 2*step, end.Active(), "both stretches count, and the time the appliance was down does not")
}

// A run that runs from its start to its end in one stretch keeps no active
// time in its record (most runs: the record stays as small as it was), and
// Active reads it from StartedAt and EndedAt; a run that paused keeps it.
func TestActiveTimeOfARunInOneStretch(t *testing.T) {
	ctx := context.Background()
	const step = 20 * time.Millisecond
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			s := engine.NewMemoryStore()
			m := newManager(t, s, engine.ManagerOptions{Durability: d},
				&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, time.Sleep, step, false, nil)},
				&engine.Agent{Name: "asks", Graph: sleepyGraph(t, time.Sleep, step, true, nil)})
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "sleepy"})
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, run.Status)
			stored, err := s.Run(ctx, run.ID)
			require.NoError(t, err)
			require.NotContains(t, stored.Meta, engine.MetaActive)
			require.NotContains(t, stored.Meta, engine.MetaRunningSince)
			require.GreaterOrEqual(t, stored.Active(), 2*step)
			require.Equal(t, stored.EndedAt.Sub(stored.StartedAt), stored.Active())

			run, err = m.Invoke(ctx, engine.RunRequest{Thread: "u", Agent: "asks"})
			require.NoError(t, err)
			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.NoError(t, err)
			end := waitFor(t, m, run.ID)
			require.Equal(t, engine.StatusCompleted, end.Status)
			require.Contains(t, end.Meta, engine.MetaActive)
			require.NotContains(t, end.Meta, engine.MetaRunningSince)
			require.GreaterOrEqual(t, end.Active(), 2*step)
		})
	}
}

// A run's wait in the manager's queue, for a worker, is not active time.
func TestActiveTimeLeavesOutTheQueue(t *testing.T) {
	ctx := context.Background()
	const step = 50 * time.Millisecond
	s := engine.NewMemoryStore()
	m := newManager(t, s, engine.ManagerOptions{Workers: 1, Durability: engine.DurabilitySync},
		&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, time.Sleep, step, false, nil)})
	first, err := m.Start(ctx, engine.RunRequest{Thread: "a", Agent: "sleepy"})
	require.NoError(t, err)
	second, err := m.Start(ctx, engine.RunRequest{Thread: "b", Agent: "sleepy"})
	require.NoError(t, err)
	a, b := waitFor(t, m, first.ID), waitFor(t, m, second.ID)
	end := b // the one the worker took second
	if a.StartedAt.After(b.StartedAt) {
		end = a
	}
	require.Equal(t, engine.StatusCompleted, end.Status)
	require.NotContains(t, end.Meta, engine.MetaActive)
	require.GreaterOrEqual(t, end.Active(), 2*step)
	require.GreaterOrEqual(t, end.EndedAt.Sub(end.CreatedAt)-end.Active(), 3*step/2, "the wait for the first run's two steps was counted")
}
