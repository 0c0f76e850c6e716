package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// sleepyGraph runs a, asks a person (when ask is set), then b; a and b
// each take d, and b waits first for gate, or its run's end, when gate is
// not nil.
func sleepyGraph(t *testing.T, d time.Duration, ask bool, gate <-chan struct{}) *engine.Graph {
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
			time.Sleep(d)
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
// waited for the person does not count.
func TestWallTimeBudgetHoldsAcrossAPause(t *testing.T) {
	ctx := context.Background()
	// Each stretch has a third of a step to spare, for a loaded machine.
	const step, budget = 400 * time.Millisecond, 600 * time.Millisecond
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			s := engine.NewMemoryStore()
			ag := &engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, step, true, nil), MaxDuration: budget}
			m := newManager(t, s, engine.ManagerOptions{Durability: d}, ag)
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "sleepy"})
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, run.Status)
			stored, err := s.Run(ctx, run.ID)
			require.NoError(t, err)
			require.GreaterOrEqual(t, stored.Active(), step, "the stretch before the pause is on record")
			require.Less(t, stored.Active(), budget)
			time.Sleep(budget) // the person takes their time: not counted
			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.NoError(t, err)
			end := waitFor(t, m, run.ID)
			require.Equal(t, engine.StatusBudgetExceeded, end.Status, "ran %s under a budget of %s", end.Active(), budget)
			require.Contains(t, end.Error, "wall-time")
			require.GreaterOrEqual(t, end.Active(), budget)
			require.Less(t, end.Active(), 2*budget, "the wait for the person was counted")

			// Graph.Resume, adopting the paused run from the store, counts
			// the same way.
			g := sleepyGraph(t, step, true, nil)
			cfg := engine.RunConfig{Thread: "g", Store: s, Durability: d, MaxDuration: budget}
			res, err := g.Invoke(ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, res.Run.Status)
			res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.ErrorIs(t, err, engine.ErrDeadline)
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
		})
	}
}

// A run recovered after the appliance stopped keeps the active time it had
// committed to: the stretch before the stop counts up to its last
// checkpoint, and the time the appliance was down does not.
func TestWallTimeBudgetHoldsAcrossRecovery(t *testing.T) {
	ctx := context.Background()
	// Each stretch has a third of a step to spare, for a loaded machine.
	const step, budget = 400 * time.Millisecond, 600 * time.Millisecond
	s := engine.NewMemoryStore()
	gate := make(chan struct{}) // never opened: b waits until the stop
	m := engine.NewManager(s, resolver(&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, step, false, gate), MaxDuration: budget}),
		engine.ManagerOptions{Durability: engine.DurabilitySync})
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
	time.Sleep(budget) // the appliance is down: not counted

	m2 := newManager(t, s, engine.ManagerOptions{Durability: engine.DurabilitySync},
		&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, step, false, nil), MaxDuration: budget})
	n, err := m2.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	end := waitFor(t, m2, run.ID)
	require.Equal(t, engine.StatusBudgetExceeded, end.Status, "ran %s under a budget of %s", end.Active(), budget)
	require.Less(t, end.Active(), 2*budget, "the time the appliance was down was counted")
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
				&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, step, false, nil)},
				&engine.Agent{Name: "asks", Graph: sleepyGraph(t, step, true, nil)})
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
		&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, step, false, nil)})
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
