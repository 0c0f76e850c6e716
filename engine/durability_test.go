package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
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

// sideEffectGraph is a -> b -> c; b calls EnsureDurable (twice: the second
// finds nothing left to commit) before its side effect, and blocks there
// until its run is stopped while block is set.
func sideEffectGraph(t *testing.T, calls *counter, block *atomic.Bool, blocked chan<- struct{}) *engine.Graph {
	b := engine.NewGraph("effect")
	log := engine.Append[string](b, "log")
	b.AddNode("a", calls.counted(writes(engine.Push(log, "a"))))
	b.AddNode("b", calls.counted(func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		for range 2 {
			if err := engine.EnsureDurable(ctx); err != nil {
				return nil, err
			}
		}
		if block.Load() {
			blocked <- struct{}{}
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		return []engine.Write{engine.Push(log, "b")}, nil
	}))
	b.AddNode("c", calls.counted(writes(engine.Push(log, "c"))))
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "b")
	b.AddEdge("b", "c")
	return mustCompile(t, b)
}

// In exit durability, EnsureDurable commits the checkpoint the calling task
// runs from with the run's record, once per step; a run that never calls it
// commits once, at its end. In sync durability it commits nothing more.
func TestEnsureDurableCommitsTheStepOnce(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		durability engine.Durability
		commits    int
	}{
		{engine.DurabilitySync, 4},
		{engine.DurabilityExit, 2}, // b's step before its effect, then the end
	} {
		s := newRecordingStore()
		var block atomic.Bool
		g := sideEffectGraph(t, newCounter(), &block, nil)
		res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: s, Durability: tt.durability})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		require.Equal(t, tt.commits, checkpointCommits(s), "durability %q", tt.durability)
		if tt.durability == engine.DurabilityExit {
			first := s.commits[0]
			require.NotNil(t, first.Run, "the run's record commits with the step")
			require.False(t, first.Run.Status.Terminal())
			require.Equal(t, []string{"b"}, taskNodesOf(first.Checkpoint.Next), "the step b runs from")
		}
	}
	require.ErrorContains(t, engine.EnsureDurable(ctx), "outside a running node")
}

func taskNodesOf(ts []engine.TaskSpec) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Node)
	}
	return out
}

// A crash after EnsureDurable in exit durability leaves a run that recovery
// finds and resumes from the step that called it: the steps before it do
// not run again, and the run ends.
func TestEnsureDurableRunSurvivesACrashInExitDurability(t *testing.T) {
	ctx := context.Background()
	calls := newCounter()
	var block atomic.Bool
	block.Store(true)
	blocked := make(chan struct{}, 1)
	ag := &engine.Agent{Name: "effect", Graph: sideEffectGraph(t, calls, &block, blocked)}
	store := engine.NewMemoryStore()
	opts := engine.ManagerOptions{Durability: engine.DurabilityExit}

	m1 := engine.NewManager(store, resolver(ag), opts)
	run, err := m1.Start(ctx, engine.RunRequest{Thread: "t", Agent: "effect"})
	require.NoError(t, err)
	<-blocked
	m1.Close()
	stored, err := store.Run(ctx, run.ID)
	require.NoError(t, err, "the run is on record before b's side effect")
	require.False(t, stored.Status.Terminal())

	block.Store(false)
	m2 := newManager(t, store, opts, ag)
	n, err := m2.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	done := waitFor(t, m2, run.ID)
	require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
	require.Equal(t, 1, calls.get("a"), "a's step was committed with b's")
	require.Equal(t, 2, calls.get("b"))
	require.Equal(t, 1, calls.get("c"))
}

// dyingStore is a MemoryStore whose process dies at the first commit that
// carries a run's record: that commit, and any after it, never happen.
type dyingStore struct {
	*engine.MemoryStore
	mu   sync.Mutex
	dead bool
}

var errDied = errors.New("the process died")

func (d *dyingStore) Commit(ctx context.Context, c *engine.Commit) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead || c.Run != nil {
		d.dead = true
		return errDied
	}
	return d.MemoryStore.Commit(ctx, c)
}

// In exit durability a subgraph commits its own checkpoints when it ends or
// pauses, before its run's record is committed. What it did must not be
// announced until the run is durable: a crash in between takes the run
// back, and a subscriber would have seen a pause or a step of a run that
// the store does not know.
func TestExitDurabilitySubgraphEventsWaitForTheRun(t *testing.T) {
	for _, pauses := range []bool{false, true} {
		t.Run(map[bool]string{false: "ends", true: "pauses"}[pauses], func(t *testing.T) {
			ctx := context.Background()
			ib := engine.NewGraph("inner")
			draft := engine.Replace[string](ib, "draft")
			ib.AddNode("draft", writes(draft.Set("take it when remembered")))
			ib.AddNode("review", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
				if pauses {
					if _, err := engine.Interrupt(ctx, "ok?"); err != nil {
						return nil, err
					}
				}
				return nil, nil
			})
			ib.AddEdge(engine.Start, "draft")
			ib.AddEdge("draft", "review")
			ob := engine.NewGraph("outer")
			engine.Replace[string](ob, "draft")
			ob.AddSubgraph("reviewed", mustCompile(t, ib))
			ob.AddEdge(engine.Start, "reviewed")
			g := mustCompile(t, ob)

			store := &dyingStore{MemoryStore: engine.NewMemoryStore()}
			bus := engine.NewBus()
			sub := bus.Subscribe(1000, nil)
			res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store, Durability: engine.DurabilityExit, Events: bus})
			require.ErrorIs(t, err, errDied)
			bus.Close()
			_, err = store.Run(ctx, res.Run.ID)
			require.ErrorIs(t, err, engine.ErrRunNotFound, "the run died before its record was committed")
			for e := range sub.C() {
				require.True(t, e.Live, "%s event (node %q) of a run the store does not know: %s", e.Type, e.Node, e.Data)
			}

			// Without the crash, they go out with the run's commit.
			bus = engine.NewBus()
			sub = bus.Subscribe(1000, nil)
			res, err = g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore(), Durability: engine.DurabilityExit, Events: bus})
			require.NoError(t, err)
			bus.Close()
			var inner []string
			for e := range sub.C() {
				if e.Type == engine.EventNodeCompleted {
					inner = append(inner, e.Node)
				}
			}
			want := []string{"reviewed/draft", "reviewed/review", "reviewed"}
			if pauses {
				want = []string{"reviewed/draft"}
				require.Equal(t, engine.StatusInterrupted, res.Run.Status)
			}
			require.Equal(t, want, inner)
		})
	}
}

// The tasks of one step may call EnsureDurable at once, from the step
// itself or from subgraphs they run: the step is committed once, and each
// subgraph's own step once.
func TestEnsureDurableFromConcurrentTasks(t *testing.T) {
	ensure := func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		return nil, engine.EnsureDurable(ctx)
	}
	ib := engine.NewGraph("inner")
	ib.AddNode("effect", ensure)
	ib.AddEdge(engine.Start, "effect")
	inner := mustCompile(t, ib)
	for _, tt := range []struct {
		name    string
		commits int
		add     func(b *engine.Builder)
	}{
		// The fan-out's step, then the end.
		{"nodes", 2, func(b *engine.Builder) { b.AddNode("work", ensure) }},
		// The same, plus each subgraph's input checkpoint, then its end.
		{"subgraphs", 2 + 8*2, func(b *engine.Builder) { b.AddSubgraph("work", inner) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := engine.NewGraph("fanout")
			b.AddNode("plan", noop)
			tt.add(b)
			b.AddEdge(engine.Start, "plan")
			b.AddFanout("plan", func(engine.State) []engine.Send {
				sends := make([]engine.Send, 8)
				for i := range sends {
					sends[i] = engine.Send{Node: "work", Input: i}
				}
				return sends
			}, "work")
			g := mustCompile(t, b)
			s := newRecordingStore()
			bus := engine.NewBus()
			sub := bus.Subscribe(1000, nil)
			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: s, Durability: engine.DurabilityExit, Events: bus})
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Run.Status)
			require.Equal(t, tt.commits, checkpointCommits(s))
			bus.Close()
			n := 0
			for e := range sub.C() {
				if e.Type == engine.EventRunCompleted {
					n++
				}
			}
			require.Equal(t, 1, n)
		})
	}
}
