package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// chainGraph runs three nodes one after another: three supersteps.
func chainGraph(t *testing.T) *engine.Graph {
	b := engine.NewGraph("chain")
	log := engine.Append[string](b, "log")
	for _, n := range []string{"a", "b", "c"} {
		b.AddNode(n, writes(engine.Push(log, n)))
	}
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "b")
	b.AddEdge("b", "c")
	return mustCompile(t, b)
}

func checkpointCommits(s *recordingStore) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.commits {
		if c.Checkpoint != nil {
			n++
		}
	}
	return n
}

func TestParseDurability(t *testing.T) {
	for _, s := range []string{"sync", "exit"} {
		d, err := engine.ParseDurability(s)
		require.NoError(t, err)
		require.Equal(t, engine.Durability(s), d)
	}
	for _, s := range []string{"", "SYNC", "Exit", "bogus", " sync"} {
		_, err := engine.ParseDurability(s)
		require.ErrorIs(t, err, engine.ErrBadDurability, "%q", s)
		require.ErrorContains(t, err, "durability must be sync or exit")
	}
}

// A durability other than sync or exit is refused before anything is
// committed; it used to run as exit, committing only at the end. "" is
// sync: a commit per step.
func TestGraphDurabilityFailsClosed(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		durability engine.Durability
		commits    int // checkpoints committed: input and the three steps (the last with the run's end), or only the end
	}{
		{"", 4},
		{engine.DurabilitySync, 4},
		{engine.DurabilityExit, 1},
	} {
		s := newRecordingStore()
		res, err := chainGraph(t).Invoke(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: tt.durability})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		require.Equal(t, tt.commits, checkpointCommits(s), "durability %q", tt.durability)
	}
	for _, bad := range []engine.Durability{"SYNC", "bogus"} {
		s := newRecordingStore()
		g := chainGraph(t)
		_, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: bad})
		require.ErrorIs(t, err, engine.ErrBadDurability)
		require.ErrorContains(t, err, string(bad))
		_, err = g.Resume(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: bad}, nil)
		require.ErrorIs(t, err, engine.ErrBadDurability)
		_, err = g.UpdateState(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: bad}, engine.Start)
		require.ErrorIs(t, err, engine.ErrBadDurability)
		require.Empty(t, s.commits, "nothing may be committed under %q", bad)
	}
}

// A manager given an unknown durability refuses every run instead of
// running them in exit mode.
func TestManagerDurabilityFailsClosed(t *testing.T) {
	ctx := context.Background()
	s := newRecordingStore()
	ag := &engine.Agent{Name: "chain", Graph: chainGraph(t)}
	m := newManager(t, s, engine.ManagerOptions{Durability: "SYNC"}, ag)

	_, err := m.Recover(ctx)
	require.ErrorIs(t, err, engine.ErrBadDurability)
	_, err = m.Invoke(ctx, engine.RunRequest{Thread: "t1", Agent: "chain"})
	require.ErrorIs(t, err, engine.ErrBadDurability)
	_, err = m.Start(ctx, engine.RunRequest{Thread: "t2", Agent: "chain"})
	require.ErrorIs(t, err, engine.ErrBadDurability)
	_, err = m.Resume(ctx, "run_x", map[string]engine.Decision{"int_x": {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrBadDurability)
	require.Empty(t, s.commits)

	// The default is sync: a commit per step.
	s = newRecordingStore()
	m = newManager(t, s, engine.ManagerOptions{}, ag)
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t1", Agent: "chain"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Equal(t, engine.DurabilitySync, run.Durability)
	require.Equal(t, 4, checkpointCommits(s))
}

// A run whose record names an unknown durability is not resumed or
// recovered as if it named exit (or sync): resuming it is an error, and
// recovery fails it with the reason.
func TestRecordedDurabilityFailsClosed(t *testing.T) {
	ctx := context.Background()
	s := engine.NewMemoryStore()
	ag := &engine.Agent{Name: "review", Graph: func() *engine.Graph { g, _ := reviewGraph(t, newCounter()); return g }()}
	now := time.Now().UTC()
	paused := &engine.Run{ID: "run_paused", Thread: "t1", Agent: "review", Status: engine.StatusInterrupted,
		Durability: "bogus", CreatedAt: now, Interrupts: []engine.PendingInterrupt{{ID: "int_1", Node: "review"}}}
	running := &engine.Run{ID: "run_running", Thread: "t2", Agent: "review", Status: engine.StatusRunning,
		Durability: "bogus", CreatedAt: now}
	for _, r := range []*engine.Run{paused, running} {
		require.NoError(t, s.Commit(ctx, &engine.Commit{Run: r, Sync: true}))
	}

	m := newManager(t, s, engine.ManagerOptions{}, ag)
	_, err := m.Recover(ctx)
	require.NoError(t, err)
	got, err := s.Run(ctx, running.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, got.Status)
	require.Contains(t, got.Error, "durability must be sync or exit")

	_, err = m.Resume(ctx, paused.ID, map[string]engine.Decision{"int_1": {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrBadDurability)
	got, err = s.Run(ctx, paused.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, got.Status, "a refused resume leaves the run waiting")

	// Graph.Resume, adopting the run that left the thread's head, refuses
	// it too.
	g, _ := reviewGraph(t, newCounter())
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t3", Store: s})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status)
	r := res.Run.Clone()
	r.Durability = "bogus"
	require.NoError(t, s.Commit(ctx, &engine.Commit{Run: r, Sync: true}))
	_, err = g.Resume(ctx, engine.RunConfig{Thread: "t3", Store: s},
		map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrBadDurability)
}

// In exit durability only the state a run stops at is stored, so an event
// may name a checkpoint only when that checkpoint is stored, or say that
// it is not ("committed": false): run.started names the input checkpoint,
// which is stored only when the run pauses or ends right after its input.
func TestExitDurabilityEventsNameStoredCheckpoints(t *testing.T) {
	ctx := context.Background()
	reviewFirst, _ := reviewGraph(t, newCounter())
	for name, g := range map[string]*engine.Graph{"chain": chainGraph(t), "pause at input": reviewFirst} {
		t.Run(name, func(t *testing.T) {
			s := newRecordingStore()
			bus := engine.NewBus()
			_, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: engine.DurabilityExit, Events: bus})
			require.NoError(t, err)
			s.mu.Lock()
			defer s.mu.Unlock()
			named := 0
			for _, c := range s.commits {
				for _, ev := range c.Events {
					var d struct {
						ID         string `json:"id"`
						Checkpoint string `json:"checkpoint"`
						Committed  *bool  `json:"committed"`
					}
					require.NoError(t, json.Unmarshal(ev.Data, &d))
					id := d.ID
					if ev.Type == engine.EventRunStarted {
						id = d.Checkpoint
					} else if ev.Type != engine.EventCheckpoint {
						continue
					}
					_, err := s.Checkpoint(ctx, "t", "", id)
					if d.Committed != nil && !*d.Committed {
						require.ErrorIs(t, err, engine.ErrCheckpointNotFound, "%s says %s is not stored", ev.Type, id)
						continue
					}
					require.NoError(t, err, "%s names checkpoint %s", ev.Type, id)
					named++
				}
			}
			require.Positive(t, named)
		})
	}
}

// The step limit counts a run's supersteps across a pause in exit
// durability as in sync: only the pause's checkpoint is stored then, so the
// steps before it are not in the checkpoints to be counted again.
func TestStepLimitHoldsAcrossAPauseInExitDurability(t *testing.T) {
	ctx := context.Background()
	build := func() *engine.Graph {
		b := engine.NewGraph("long")
		log := engine.Append[string](b, "log")
		prev := engine.Start
		for _, n := range []string{"a", "b", "c", "ask", "d", "e", "f"} {
			if n == "ask" {
				b.AddNode(n, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
					if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
						return nil, err
					}
					return []engine.Write{engine.Push(log, "ask")}, nil
				})
			} else {
				b.AddNode(n, writes(engine.Push(log, n)))
			}
			b.AddEdge(prev, n)
			prev = n
		}
		return mustCompile(t, b)
	}
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			s := engine.NewMemoryStore()
			ag := &engine.Agent{Name: "long", Graph: build(), StepLimit: 5}
			m := newManager(t, s, engine.ManagerOptions{Durability: d}, ag)
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "long"})
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, run.Status)
			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.NoError(t, err)
			end := waitFor(t, m, run.ID)
			require.Equal(t, engine.StatusBudgetExceeded, end.Status, "7 steps ran under a limit of 5 (%d counted)", end.Steps)
			require.Equal(t, 5, end.Steps)

			// Graph.Resume, adopting the paused run from the store, counts
			// the same way.
			g := build()
			cfg := engine.RunConfig{Thread: "g", Store: s, Durability: d, StepLimit: 5}
			res, err := g.Invoke(ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, res.Run.Status)
			res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
			require.ErrorIs(t, err, engine.ErrStepLimit)
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
		})
	}
}
