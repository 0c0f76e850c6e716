package engine_test

// The crash-loop guard's attribution: which recovered runs a crash counts
// against, and what progress clears the count. The guard's basics are in
// manager_test.go (TestRecoveryLimit...), with life and startLife.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
	"github.com/stretchr/testify/require"
)

// heldAgent's node reports that it runs, then waits for its thread's gate
// (or the end of its process) to finish.
func heldAgent(t *testing.T, entered chan<- string, gates map[string]chan struct{}) *engine.Agent {
	b := engine.NewGraph("held")
	out := engine.Replace[string](b, "out")
	b.AddNode("work", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		entered <- info.Run
		select {
		case <-gates[info.Thread]:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []engine.Write{out.Set("done")}, nil
	})
	b.AddEdge(engine.Start, "work")
	return &engine.Agent{Name: "held", Graph: mustCompile(t, b)}
}

// noneEnters fails the test if a run enters its node within a moment.
func noneEnters(t *testing.T, entered <-chan string, why string) {
	t.Helper()
	select {
	case id := <-entered:
		t.Fatalf("run %s ran: %s", id, why)
	case <-time.After(100 * time.Millisecond):
	}
}

// enters waits for run id to enter its node, and fails with why if it does
// not within 10 seconds, or if another run enters first.
func enters(t *testing.T, entered <-chan string, id, why string) {
	t.Helper()
	select {
	case got := <-entered:
		require.Equal(t, id, got)
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

// nextEntered is the next run to enter its node, within 10 seconds.
func nextEntered(t *testing.T, entered <-chan string) string {
	t.Helper()
	select {
	case id := <-entered:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("no run entered its node in 10s")
		return ""
	}
}

// startOn starts a run of agent on each thread, and returns their ids in
// the same order.
func startOn(t *testing.T, m *engine.Manager, agent string, threads ...string) []string {
	t.Helper()
	ids := make([]string, len(threads))
	for i, th := range threads {
		run, err := m.Start(context.Background(), engine.RunRequest{Thread: th, Agent: agent})
		require.NoError(t, err)
		ids[i] = run.ID
	}
	return ids
}

func liveStatus(t *testing.T, m *engine.Manager, runID string) engine.RunStatus {
	t.Helper()
	r, err := m.Run(context.Background(), runID)
	require.NoError(t, err)
	return r.Status
}

// Two runs cut short together twice are both suspects at the next start:
// they run one at a time and alone, and a run started meanwhile waits
// until both have had their turns. Only the suspect that runs is counted;
// the one that waits for its turn is not, and neither is the new run.
func TestRecoverySuspectsRunOneAtATimeAndAlone(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 3)
	gates := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{}), "new": make(chan struct{})}
	agents := []*engine.Agent{heldAgent(t, entered, gates)}
	opts := engine.ManagerOptions{Workers: 4}

	l, m, _ := startLife(t, store, opts, agents...)
	ids := startOn(t, m, "held", "a", "b")
	thread := map[string]string{ids[0]: "a", ids[1]: "b"}
	<-entered
	<-entered
	l.crash(m)
	l, m, n := startLife(t, store, opts, agents...)
	require.Equal(t, 2, n)
	require.Zero(t, m.Suspects(), "a first recovery makes no suspect")
	<-entered
	<-entered
	for id := range thread {
		require.Equal(t, "1", recoveries(t, store, id), "the first recovery runs both together and counts both")
	}
	l.crash(m)

	_, m, n = startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 2, n)
	require.Equal(t, 2, m.Suspects())
	next := startOn(t, m, "held", "new")[0]
	first := <-entered
	noneEnters(t, entered, "a suspect runs alone")
	var second string
	for id := range thread {
		if id != first {
			second = id
		}
	}
	require.Equal(t, "2", recoveries(t, store, first))
	require.Equal(t, "1", recoveries(t, store, second), "a suspect waiting for its turn is not counted")
	require.Equal(t, engine.StatusQueued, liveStatus(t, m, next), "a new run waits while a suspect runs alone")

	close(gates[thread[first]])
	require.Equal(t, second, <-entered, "the next suspect runs once the first one is done, before any other run")
	noneEnters(t, entered, "the second suspect runs alone")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, first).Status)
	require.Equal(t, "2", recoveries(t, store, second))

	close(gates[thread[second]])
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, second).Status)
	require.Equal(t, next, <-entered, "the new run goes on once the suspects are done")
	close(gates["new"])
	done := waitFor(t, m, next)
	require.Equal(t, engine.StatusCompleted, done.Status)
	require.Empty(t, done.Meta[engine.MetaRecoveries])
}

// slowStart adds s0 -> s1 to b, from Start. s0 hangs until the process
// dies the first two times it runs (calling EnsureDurable first, when
// durable), then adds 1 to the returned channel; s1 reports that it runs,
// then waits for gate and adds 10.
func slowStart(b *engine.Builder, entered chan<- string, gate <-chan struct{}, calls *counter, durable bool) engine.Chan[int] {
	out := engine.Sum[int](b, "out")
	b.AddNode("s0", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		if durable {
			if err := engine.EnsureDurable(ctx); err != nil {
				return nil, err
			}
		}
		if calls.inc("s0") <= 2 {
			entered <- "s0"
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []engine.Write{out.Set(1)}, nil
	})
	b.AddNode("s1", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		entered <- "s1"
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []engine.Write{out.Set(10)}, nil
	})
	b.AddEdge(engine.Start, "s0")
	b.AddEdge("s0", "s1")
	return out
}

// A suspect holds the others up only until it makes progress: once its
// step commits, a new run goes on beside it.
func TestRecoverySuspectLetsOthersRunOnceItProgresses(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	gate := make(chan struct{})
	b := engine.NewGraph("slowstart")
	slowStart(b, entered, gate, newCounter(), false)
	open := make(chan struct{})
	close(open)
	agents := []*engine.Agent{{Name: "slowstart", Graph: mustCompile(t, b)}, gatedAgent(t, "ok", open, nil)}

	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agents...)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "slowstart"})
	require.NoError(t, err)
	require.Equal(t, "s0", <-entered)
	l.crash(m)
	l, m, _ = startLife(t, store, engine.ManagerOptions{}, agents...)
	require.Equal(t, "s0", <-entered)
	l.crash(m)

	_, m, _ = startLife(t, store, engine.ManagerOptions{}, agents...)
	defer m.Close()
	next, err := m.Start(ctx, engine.RunRequest{Thread: "new", Agent: "ok"})
	require.NoError(t, err)
	require.Equal(t, "s1", <-entered, "s0 runs to its end this time")
	require.Empty(t, recoveries(t, store, run.ID), "s0's commit took the count off")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, next.ID).Status, "the new run goes on beside the suspect")
	require.Equal(t, engine.StatusRunning, liveStatus(t, m, run.ID))
	close(gate)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, run.ID).Status)
}

// A run whose only node is a long subgraph makes progress with each of the
// subgraph's steps, though its own step does not end between crashes:
// the first subgraph step after a recovery takes the count off the run's
// record, and the run is recovered as often as it crashes. In exit
// durability too: a suspect commits its subgraph's steps, as its own, as
// sync would until one is committed, so that a crash in a later one does
// not take the subgraph back to its start every time.
func TestRecoveryLimitCountsSubgraphStepsAsProgress(t *testing.T) {
	const steps = 4
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			entered := make(chan string, 1)
			ib := engine.NewGraph("inner")
			flakySteps(ib, steps, entered, d == engine.DurabilityExit)
			ob := engine.NewGraph("outer")
			engine.Sum[int](ob, "out")
			ob.AddSubgraph("inner", mustCompile(t, ib))
			ob.AddEdge(engine.Start, "inner")
			agent := &engine.Agent{Name: "outer", Graph: mustCompile(t, ob)}
			done := crashAtEachStep(t, engine.NewMemoryStore(), d, agent, entered, steps)
			require.Equal(t, d, done.Durability)
			if d == engine.DurabilitySync {
				require.Equal(t, steps+1, done.Steps, "the subgraph's and its own")
			}
		})
	}
}

// loadDeath is a process that dies while a recovered run loads its state:
// the store's read of the run's pending writes (the last part of loading)
// kills it.
type loadDeath struct {
	*life
	died chan struct{}
	once sync.Once
}

func (d *loadDeath) Writes(ctx context.Context, thread, ns, ckpt string) ([]engine.PendingWrite, error) {
	d.dead.Store(true)
	d.once.Do(func() { close(d.died) })
	return nil, errDead
}

// A run whose state kills the process as it is loaded (too large a state,
// say) is counted before it loads, so it too is stopped at the limit.
func TestRecoveryLimitCountsLoadingTheState(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	agent, runID := crashedHangRun(t, store, entered)
	for i := 1; i <= engine.DefaultMaxRecoveries; i++ {
		d := &loadDeath{life: &life{Store: store}, died: make(chan struct{})}
		m := engine.NewManager(d, resolver(agent), engine.ManagerOptions{})
		// What fails after the death is the dead process's own doing.
		_, _ = m.Recover(ctx)
		<-d.died
		m.Close()
		require.Equal(t, fmt.Sprint(i), recoveries(t, store, runID), "start %d: the recovery is on record before the state loads", i)
	}
	m := newManager(t, store, engine.ManagerOptions{}, agent)
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	done, err := store.Run(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Contains(t, done.Error, engine.ErrCrashLoop.Error())
}

// A recovered run cancelled while it waits for a worker ends without its
// state loaded, and is not counted; its record still holds the steps it
// took.
func TestRecoveredRunCancelledInTheQueueKeepsItsSteps(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 2)
	b := engine.NewGraph("twostep")
	out := engine.Sum[int](b, "out")
	b.AddNode("s0", writes(out.Set(1)))
	b.AddNode("s1", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		entered <- info.Run
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b.AddEdge(engine.Start, "s0")
	b.AddEdge("s0", "s1")
	agent := &engine.Agent{Name: "twostep", Graph: mustCompile(t, b)}

	l, m, _ := startLife(t, store, engine.ManagerOptions{Workers: 2}, agent)
	ids := startOn(t, m, "twostep", "a", "b")
	<-entered
	<-entered
	l.crash(m)

	_, m, _ = startLife(t, store, engine.ManagerOptions{Workers: 1}, agent)
	defer m.Close()
	running := <-entered
	for _, id := range ids {
		if id == running {
			continue
		}
		require.NoError(t, m.Cancel(ctx, id))
		done := waitFor(t, m, id)
		require.Equal(t, engine.StatusCancelled, done.Status)
		require.Equal(t, 1, done.Steps, "the step it took before the crash")
		require.Empty(t, done.Meta[engine.MetaRecoveries], "it never ran")
	}
}

// A stop for a shutdown, not a crash, takes back the recovery that the
// start counted, and only that one: a suspect stopped by Close while it
// runs keeps the count of the crashes before, and is a suspect at the
// next start as it was at this one.
func TestShutdownTakesBackOnlyItsOwnRecovery(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 1)
	agent, runID := crashedHangRun(t, store, entered)
	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agent)
	require.Equal(t, runID, <-entered)
	require.Equal(t, "1", recoveries(t, store, runID))
	l.crash(m)

	_, m, _ = startLife(t, store, engine.ManagerOptions{}, agent)
	require.Equal(t, runID, <-entered)
	require.Equal(t, "2", recoveries(t, store, runID))
	m.Close() // a restart, say
	require.Equal(t, "1", recoveries(t, store, runID), "the crash before this start still counts")

	_, m, _ = startLife(t, store, engine.ManagerOptions{}, agent)
	defer m.Close()
	require.Equal(t, runID, <-entered)
	require.Equal(t, "2", recoveries(t, store, runID))
}

// A recovered run that pauses and is resumed in the same process is
// resumed, not recovered again: its resume counts no recovery on its
// record, so a crash before its next step is its first in a row.
func TestResumeOfARecoveredRunCountsNoRecovery(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	gate := make(chan struct{})
	calls := newCounter()
	b := engine.NewGraph("askafter")
	out := engine.Replace[string](b, "out")
	b.AddNode("ask", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		if calls.inc("ask") == 1 {
			entered <- "ask"
			<-ctx.Done() // the process dies here the first time
			return nil, ctx.Err()
		}
		d, err := engine.Interrupt(ctx, "go on?")
		if err != nil {
			return nil, err
		}
		entered <- "resumed"
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []engine.Write{out.Set(d.Kind)}, nil
	})
	b.AddEdge(engine.Start, "ask")
	agent := &engine.Agent{Name: "askafter", Graph: mustCompile(t, b)}

	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agent)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "askafter"})
	require.NoError(t, err)
	require.Equal(t, "ask", <-entered)
	l.crash(m)

	seen := &countsSeen{Store: store}
	m = engine.NewManager(seen, resolver(agent), engine.ManagerOptions{})
	defer m.Close()
	_, err = m.Recover(ctx)
	require.NoError(t, err)
	paused := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusInterrupted, paused.Status)
	require.Empty(t, paused.Meta[engine.MetaRecoveries], "the pause took the count off")
	require.Equal(t, []string{"1"}, seen.get(), "the recovery")
	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, "resumed", <-entered)
	require.Equal(t, []string{"1"}, seen.get(), "a resume is not a recovery: no record it writes counts one")
	close(gate)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, run.ID).Status)
}

// countsSeen is a store that notes the recovery count of each run record
// committed with one.
type countsSeen struct {
	engine.Store
	mu     sync.Mutex
	counts []string
}

func (s *countsSeen) Commit(ctx context.Context, c *engine.Commit) error {
	if c.Run != nil {
		if n, ok := c.Run.Meta[engine.MetaRecoveries]; ok {
			s.mu.Lock()
			s.counts = append(s.counts, n)
			s.mu.Unlock()
		}
	}
	return s.Store.Commit(ctx, c)
}

func (s *countsSeen) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.counts)
}

// hangBesideOK returns a hangAgent and "ok", which answers at once, and
// options under which a suspect's turn alone runs out in a moment.
func hangBesideOK(t *testing.T, entered chan<- string) ([]*engine.Agent, engine.ManagerOptions) {
	open := make(chan struct{})
	close(open)
	agents := []*engine.Agent{hangAgent(t, entered), gatedAgent(t, "ok", open, nil)}
	return agents, engine.ManagerOptions{Workers: 4, MaxAlone: 50 * time.Millisecond}
}

// A suspect whose step is only slow holds the others up no longer than
// MaxAlone: then a recovered run and a new one get workers beside it. A
// crash from then on counts against every run it cuts short, as it would
// without the guard: the suspect, and the recovered run that ran beside
// it, which is a suspect at the next start.
func TestRecoverySuspectTurnAloneIsBounded(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 3)
	agents, opts := hangBesideOK(t, entered)

	slow, beside := slowAndBeside(t, store, opts, entered, agents)

	l, m, n := startLife(t, store, opts, agents...)
	require.Equal(t, 2, n)
	require.Equal(t, 1, m.Suspects(), "the slow run, at its second recovery")
	next := startOn(t, m, "ok", "new")[0]
	// Which of the two enters its step first is the scheduler's choice
	// on a loaded machine: the suspect's turn alone is a moment here.
	require.ElementsMatch(t, []string{slow, beside}, []string{<-entered, <-entered},
		"the recovered run goes on beside the suspect, whose turn alone ran out")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, next).Status, "the new run goes on beside the suspect")
	require.Equal(t, engine.StatusRunning, liveStatus(t, m, slow), "the suspect's step goes on")
	require.Equal(t, "2", recoveries(t, store, slow))
	require.Equal(t, "1", recoveries(t, store, beside), "the recovered run beside the suspect is counted")
	l.crash(m)

	_, m, n = startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 2, n)
	require.Equal(t, 2, m.Suspects(), "both were cut short in company")
}

// With MaxRecoveries 1 a run is failed by the first crash in its first
// recovery, so every run recovered is a suspect at once and has its turn
// alone: the crash counts against the run that caused it, and the run
// that was cut short beside it is not failed but ends.
func TestRecoveryLimitOneGivesEachRunATurnAlone(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 2)
	gates := map[string]chan struct{}{"bystander": make(chan struct{})}
	agents := []*engine.Agent{hangAgent(t, entered), heldAgent(t, entered, gates)}
	opts := engine.ManagerOptions{Workers: 4, MaxRecoveries: 1}

	l, m, _ := startLife(t, store, opts, agents...)
	killer := startOn(t, m, "hang", "killer")[0]
	bystander := startOn(t, m, "held", "bystander")[0]
	<-entered
	<-entered
	l.crash(m)

	l, m, n := startLife(t, store, opts, agents...)
	require.Equal(t, 2, n)
	require.Equal(t, 2, m.Suspects(), "one more crash would fail either")
	if <-entered == bystander {
		noneEnters(t, entered, "the bystander runs alone")
		close(gates["bystander"])
		require.Equal(t, engine.StatusCompleted, waitFor(t, m, bystander).Status)
		require.Equal(t, killer, <-entered)
	}
	noneEnters(t, entered, "the killer runs alone")
	require.Equal(t, "1", recoveries(t, store, killer))
	l.crash(m)

	_, m, n = startLife(t, store, opts, agents...)
	defer m.Close()
	done, err := store.Run(context.Background(), killer)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Contains(t, done.Error, engine.ErrCrashLoop.Error())
	select {
	case <-gates["bystander"]:
		require.Zero(t, n, "the bystander ended before the crash")
	default:
		require.Equal(t, 1, n, "the bystander was not counted, and is recovered")
		require.Equal(t, bystander, <-entered)
		close(gates["bystander"])
	}
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, bystander).Status)
}

// savedSignal is a store that tells when a task's writes are saved while
// its step is unfinished (a fan-out's partial results).
type savedSignal struct {
	engine.Store
	saved chan struct{}
}

func (s *savedSignal) Commit(ctx context.Context, c *engine.Commit) error {
	err := s.Store.Commit(ctx, c)
	for _, w := range c.Writes {
		if err == nil && w.Write.Kind == engine.WriteKindWrites {
			s.saved <- struct{}{}
		}
	}
	return err
}

// A fan-out task whose writes are saved is not run again: that is its
// run's progress, though its step does not end between crashes. The
// first writes saved after a recovery take the count off the run's
// record, so with MaxRecoveries 1 a run whose tasks get done one per
// recovery is recovered as often as it crashes, and each task runs to
// its end once.
func TestRecoveryLimitCountsSavedWritesAsProgress(t *testing.T) {
	store := &savedSignal{Store: engine.NewMemoryStore(), saved: make(chan struct{}, 4)}
	entered := make(chan int, 2)
	calls := newCounter()
	b := engine.NewGraph("fan")
	done := engine.Append[int](b, "done")
	b.AddNode("plan", noop)
	// Task i hangs until the process dies the first i+1 times it runs.
	b.AddNode("work", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		i, err := engine.InputOf[int](s)
		if err != nil {
			return nil, err
		}
		if calls.inc(fmt.Sprint(i)) <= i+1 {
			entered <- i
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []engine.Write{engine.Push(done, i)}, nil
	})
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(engine.State) []engine.Send {
		return []engine.Send{{Node: "work", Input: 0}, {Node: "work", Input: 1}}
	}, "work")
	agent := &engine.Agent{Name: "fan", Graph: mustCompile(t, b)}
	opts := engine.ManagerOptions{MaxRecoveries: 1}

	l, m, _ := startLife(t, store, opts, agent)
	run := startOn(t, m, "fan", "t")[0]
	<-entered
	<-entered
	l.crash(m)

	l, m, n := startLife(t, store, opts, agent)
	require.Equal(t, 1, n)
	require.Equal(t, 1, <-entered, "task 1 hangs again")
	<-store.saved // task 0's writes
	require.Empty(t, recoveries(t, store, run), "task 0's saved writes took the count off")
	l.crash(m)

	_, m, n = startLife(t, store, opts, agent)
	defer m.Close()
	require.Equal(t, 1, n, "recovered: it made progress before the crash")
	end := waitFor(t, m, run)
	require.Equal(t, engine.StatusCompleted, end.Status, end.Error)
	snap, err := agent.Graph.StateAt(context.Background(), engine.RunConfig{Thread: "t", Store: store}, "")
	require.NoError(t, err)
	require.ElementsMatch(t, []int{0, 1}, done.Get(snap))
	require.Equal(t, 2, calls.get("0"), "task 0's saved writes were not run again")
}

// In exit durability a step commits nothing, so a suspect commits its
// steps as sync would until one has taken the count off: its first step
// is progress, its turn alone ends there and a new run goes on beside it,
// and a crash after it is not counted against it. The run then goes on in
// exit durability and ends as an exit run does.
func TestRecoveryExitSuspectCommitsItsFirstStep(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	gate := make(chan struct{})
	calls := newCounter()
	b := engine.NewGraph("exitflaky")
	// s0 puts the run on record, as a tool call would.
	out := slowStart(b, entered, gate, calls, true)
	b.AddNode("s2", writes(out.Set(100)))
	b.AddEdge("s1", "s2")
	open := make(chan struct{})
	close(open)
	agents := []*engine.Agent{{Name: "exitflaky", Graph: mustCompile(t, b)}, gatedAgent(t, "ok", open, nil)}
	opts := engine.ManagerOptions{Durability: engine.DurabilityExit}

	l, m, _ := startLife(t, store, opts, agents...)
	run := startOn(t, m, "exitflaky", "t")[0]
	require.Equal(t, "s0", <-entered)
	l.crash(m)
	l, m, _ = startLife(t, store, opts, agents...)
	require.Equal(t, "s0", <-entered)
	l.crash(m)

	l, m, _ = startLife(t, store, opts, agents...)
	require.Equal(t, 1, m.Suspects())
	require.Equal(t, "s1", <-entered, "s0 runs to its end this time")
	require.Empty(t, recoveries(t, store, run), "s0's step was committed, and took the count off")
	next := startOn(t, m, "ok", "new")[0]
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, next).Status, "the new run goes on beside the suspect")
	l.crash(m)

	_, m, n := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 1, n)
	require.Zero(t, m.Suspects(), "the crash in s1 is its first in a row")
	require.Equal(t, "s1", <-entered)
	close(gate)
	end := waitFor(t, m, run)
	require.Equal(t, engine.StatusCompleted, end.Status, end.Error)
	require.Equal(t, engine.DurabilityExit, end.Durability)
	require.Equal(t, 3, end.Steps)
	require.Equal(t, 3, calls.get("s0"), "s0's committed step did not run again")
	snap, err := agents[0].Graph.StateAt(ctx, engine.RunConfig{Thread: "t", Store: store}, "")
	require.NoError(t, err)
	require.Equal(t, 111, out.Get(snap))
}

// A suspect that waits for its turn while the suspect before it runs on
// (here it hangs, and its turn alone ran out) holds the others back: no
// other run takes a worker, so that the runs that hold them end or pause
// and its turn comes. If it still has not come after MaxAlone, the suspect
// waits no longer and runs beside the others, counted as any run is, which
// is no proof of innocence; and the others go on. So neither a slow run
// holds a suspect back for good, nor a suspect the others.
func TestRecoveryWaitingSuspectWaitsForABoundedTime(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 2)
	agents, opts := hangBesideOK(t, entered)

	ids := crashTwiceTogether(t, store, opts, entered, agents, "hang", "a", "b")

	opts.MaxAlone = time.Second
	began := time.Now()
	_, m, n := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 2, n)
	require.Equal(t, 2, m.Suspects())
	slow := <-entered
	waiting := ids[0]
	if waiting == slow {
		waiting = ids[1]
	}
	next := startOn(t, m, "ok", "new")[0]
	require.Equal(t, "2", recoveries(t, store, slow))
	require.Equal(t, "1", recoveries(t, store, waiting), "the waiting suspect is not counted")

	enters(t, entered, waiting, "the suspect still waits for a turn that the hanging run keeps from it")
	done := waitFor(t, m, next)
	require.Equal(t, engine.StatusCompleted, done.Status, "the new run goes on once the suspect stopped waiting")
	// The slow suspect's turn alone, then the waiting one's wait, each
	// MaxAlone: the new run waited for both.
	require.GreaterOrEqual(t, done.StartedAt.Sub(began), 2*opts.MaxAlone, "the new run took a worker while a suspect waited for its turn")
	require.Equal(t, "2", recoveries(t, store, waiting), "a suspect that ran beside others is counted")
}

// A suspect whose wait for its turn ran out runs as any run does at once:
// the suspect after it, which then waits for its own turn, does not hold
// it back. Here all three hang: the first holds its worker, so neither of
// the others' turns comes, and each runs once its wait ran out, one
// MaxAlone after the other.
func TestRecoverySuspectWhoseWaitRanOutIsNotHeldBack(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 3)
	agents, opts := hangBesideOK(t, entered)
	ids := crashTwiceTogether(t, store, opts, entered, agents, "hang", "a", "b", "c")

	opts.MaxAlone = time.Second
	_, m, n := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 3, n)
	require.Equal(t, 3, m.Suspects())
	first := <-entered
	second := <-entered // its wait ran out after the first's turn alone
	third := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == first || id == second })
	require.Len(t, third, 1)
	enters(t, entered, third[0], "the last suspect's wait runs out too")
	// When each worker took its run is on the run's record (the recovery
	// mark). The last one's wait began as the second's ran out; had the
	// second waited for it, both would have been taken at once. Half a
	// MaxAlone is left to the scheduler for the second's worker.
	require.GreaterOrEqual(t, tookAt(t, store, third[0]).Sub(tookAt(t, store, second)), opts.MaxAlone/2, "the suspect whose wait ran out waited for the next one's wait too")
}

// With no bound on the turn alone, a suspect waiting for its turn is not
// held back without bound either: once the suspect before it made progress,
// no other run takes a worker until the waiting suspect has had its turn,
// as the runs that hold workers end.
func TestRecoveryUnboundedSuspectIsNotHeldBack(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 4)
	gates := map[string][2]chan struct{}{}
	for _, th := range []string{"a", "b", "new"} {
		gates[th] = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	}
	agents := []*engine.Agent{enginetest.TwoStepAgent(t, entered, gates)}
	opts := engine.ManagerOptions{Workers: 2, MaxAlone: -1}

	ids := crashTwiceTogether(t, store, opts, entered, agents, "twostep", "a", "b")
	thread := map[string]string{ids[0]: "a", ids[1]: "b"}

	_, m, _ := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 2, m.Suspects())
	first := <-entered
	second := otherOf(ids, first)
	close(gates[thread[first]][0])
	require.Equal(t, first, <-entered, "the first suspect's step committed, and it goes on")
	next := startOn(t, m, "twostep", "new")[0]
	noneEnters(t, entered, "the second suspect waits for its turn, and no other run takes a worker meanwhile")
	require.Equal(t, engine.StatusQueued, liveStatus(t, m, next))

	close(gates[thread[first]][1])
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, first).Status)
	enters(t, entered, second, "the second suspect has its turn once the first ended")
	noneEnters(t, entered, "the second suspect runs alone")
	close(gates[thread[second]][0])
	close(gates["new"][0])
	close(gates["new"][1])
	close(gates[thread[second]][1])
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, second).Status)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, next).Status)
}

// tookAt is when a worker took recovered run id: the recovery mark on its
// record (engine.MetaRunningSince).
func tookAt(t *testing.T, store engine.Store, id string) time.Time {
	t.Helper()
	r, err := store.Run(context.Background(), id)
	require.NoError(t, err)
	at, err := time.Parse(time.RFC3339Nano, r.Meta[engine.MetaRunningSince])
	require.NoError(t, err)
	return at
}

// crashTwiceTogether starts a run of agent on each thread and lets the
// process die while all of them run, at that start and at the next: at
// the start after, they are all suspects. It returns their ids in the
// order of threads.
func crashTwiceTogether(t *testing.T, store engine.Store, opts engine.ManagerOptions, entered <-chan string, agents []*engine.Agent, agent string, threads ...string) []string {
	t.Helper()
	l, m, _ := startLife(t, store, opts, agents...)
	ids := startOn(t, m, agent, threads...)
	for life := range 2 {
		if life > 0 {
			l, m, _ = startLife(t, store, opts, agents...)
		}
		for range threads {
			<-entered
		}
		l.crash(m)
	}
	return ids
}

// slowListing is a store whose listing of running runs takes a while, as a
// large store's does.
type slowListing struct {
	engine.Store
	delay time.Duration
}

func (s *slowListing) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	if f.Status == engine.StatusRunning && f.After == "" {
		time.Sleep(s.delay)
	}
	return s.Store.Runs(ctx, f)
}

// A suspect's wait for its turn begins when Recover hands the runs to the
// workers, not while it goes on over the store: however long the pass
// takes, the suspect runs alone first, for its whole turn.
func TestRecoverySuspectRunsFirstAfterASlowPass(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 2)
	agents, opts := hangBesideOK(t, entered)
	opts.MaxAlone = 300 * time.Millisecond

	slow, beside := slowAndBeside(t, store, opts, entered, agents)

	delay := 3 * opts.MaxAlone
	m := engine.NewManager(&slowListing{Store: store, delay: delay}, resolver(agents...), opts)
	defer m.Close()
	began := time.Now()
	n, err := m.Recover(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 1, m.Suspects())
	require.ElementsMatch(t, []string{slow, beside}, []string{<-entered, <-entered})
	// The time each worker took its run is on the run's record (the
	// recovery mark), which a loaded machine can only make later: the
	// suspect's turn began after the pass, and the other run's worker
	// took it only once that whole turn alone had run out.
	require.GreaterOrEqual(t, tookAt(t, store, slow).Sub(began), delay)
	require.GreaterOrEqual(t, tookAt(t, store, beside).Sub(began), delay+opts.MaxAlone, "the recovered run ran beside the suspect during its turn alone")
}

// slowAndBeside lets the process die twice under a hangAgent run, slow,
// and the second time also under beside, started after slow's recovery:
// at the next start slow is a suspect and beside is recovered a first time.
func slowAndBeside(t *testing.T, store engine.Store, opts engine.ManagerOptions, entered <-chan string, agents []*engine.Agent) (slow, beside string) {
	t.Helper()
	l, m, _ := startLife(t, store, opts, agents...)
	slow = startOn(t, m, "hang", "slow")[0]
	require.Equal(t, slow, <-entered)
	l.crash(m)
	l, m, _ = startLife(t, store, opts, agents...)
	require.Equal(t, slow, <-entered)
	beside = startOn(t, m, "hang", "beside")[0]
	require.Equal(t, beside, <-entered)
	l.crash(m)
	return slow, beside
}

// A turn alone that ends as it begins (MaxAlone a few microseconds: its
// timer fires while the worker is still taking the run) leaves the suspect
// one worker, not every one: a new run gets the other. The timing is
// tried many times over, for the moment where the timer falls between the
// worker's taking the slots and its counting them.
func TestRecoverySuspectTurnEndingAsItBeginsKeepsOneWorker(t *testing.T) {
	for i := range 300 {
		store := engine.NewMemoryStore()
		entered := make(chan string, 1)
		agents, opts := hangBesideOK(t, entered)
		opts.Workers, opts.MaxAlone = 2, 3*time.Microsecond
		crashTwiceTogether(t, store, opts, entered, agents, "hang", "slow")
		_, m, _ := startLife(t, store, opts, agents...)
		<-entered
		next := startOn(t, m, "ok", "new")[0]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := m.Wait(ctx, next)
		require.NoError(t, err)
		require.NoError(t, ctx.Err(), "try %d: the new run got no worker beside the suspect whose turn alone ended", i)
		cancel()
		m.Close()
	}
}

// A recovery pass that fails part-way hands none of the runs it registered
// to workers: the pass that succeeds hands them all, suspects first, so
// that a suspect it finds still runs alone before them.
func TestRecoveryRetriedAfterAFailedPassKeepsTheSuspectsTurn(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 4)
	queue := make(chan struct{})
	agents := []*engine.Agent{hangAgent(t, entered), gatedAgent(t, "queued", queue, entered)}
	opts := engine.ManagerOptions{Workers: 1, MaxAlone: time.Minute}
	l, m, _ := startLife(t, store, opts, agents...)
	slow := startOn(t, m, "hang", "slow")[0]
	require.Equal(t, slow, <-entered)
	l.crash(m)
	// slow crashes again; q1 and q2 wait behind it for the one worker.
	l, m, _ = startLife(t, store, opts, agents...)
	require.Equal(t, slow, <-entered)
	queued := startOn(t, m, "queued", "q1", "q2")
	l.crash(m)

	// A pass lists the queued runs before the running ones: with slow's
	// record running, it registers q1 and q2 before its listing of
	// running runs fails, and slow after, when it is tried again.
	rec, err := store.Run(ctx, slow)
	require.NoError(t, err)
	rec.Status = engine.StatusRunning
	require.NoError(t, store.Commit(ctx, &engine.Commit{Run: rec, Sync: true}))

	m = newManager(t, &enginetest.FailsRunningOnce{Store: store}, opts, agents...)
	_, err = m.Recover(ctx)
	require.Error(t, err, "the queued runs are registered, the listing of running ones fails")
	// A run that a worker took meanwhile may end: the suspect's turn
	// comes before any other run takes the worker after it.
	select {
	case <-entered:
	case <-time.After(200 * time.Millisecond):
	}
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	close(queue)
	enters(t, entered, slow, "the suspect did not run")
	noneEnters(t, entered, "the suspect runs alone")
	for _, id := range queued {
		require.Equal(t, engine.StatusQueued, liveStatus(t, m, id), "run %s waits for the suspect's turn", id)
	}
	require.Equal(t, 3, n, "the runs of both passes")
	require.Equal(t, 1, m.Suspects())
}

// A suspect whose wait for its turn ran out runs beside the others for
// that execution alone. Once it pauses for a person, which is progress, a
// resume of it is a run as any other: it waits for the suspects' turns, as
// a new run does, rather than take a worker while a suspect still waits.
// Here the first suspect hangs and holds its worker, the second pauses
// once its wait ran out, and it is resumed while the third waits.
func TestRecoveryResumedSuspectWaitsForTheSuspectsTurns(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 8)
	var mu sync.Mutex
	pausing := false
	roles := map[string]string{}
	b := engine.NewGraph("pausing")
	out := engine.Replace[string](b, "out")
	b.AddNode("work", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		mu.Lock()
		role := roles[info.Run]
		if role == "" && pausing {
			role = []string{"hang", "pause", "hang"}[len(roles)]
			roles[info.Run] = role
		}
		mu.Unlock()
		entered <- info.Run
		if role == "pause" {
			if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
				return nil, err
			}
			return []engine.Write{out.Set("done")}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b.AddEdge(engine.Start, "work")
	agents := []*engine.Agent{{Name: "pausing", Graph: mustCompile(t, b)}}
	opts := engine.ManagerOptions{Workers: 4, MaxAlone: 50 * time.Millisecond}
	crashTwiceTogether(t, store, opts, entered, agents, "pausing", "a", "b", "c")

	mu.Lock()
	pausing = true
	mu.Unlock()
	// The third's wait, which starts as the second's runs out, lasts well
	// past the resume: once it runs out, the third and the resumed run
	// take workers at the same moment, in either order.
	opts.MaxAlone, opts.MaxSuspectWait = time.Second, 2*time.Second
	_, m, n := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 3, m.Suspects(), "of %d", n)
	<-entered // the first, whose turn alone runs out while it hangs
	second := <-entered
	paused := waitFor(t, m, second) // its wait ran out: it ran, and paused
	require.Equal(t, engine.StatusInterrupted, paused.Status)
	mu.Lock()
	require.Equal(t, "pause", roles[second])
	mu.Unlock()

	_, err := m.Resume(context.Background(), second, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	noneEnters(t, entered, "the resumed run took a worker while the third suspect waited for its turn")
	next := []string{nextEntered(t, entered), nextEntered(t, entered)}
	require.Contains(t, next, second, "the resumed run goes on once no suspect waits")
	require.NotEqual(t, next[0], next[1], "the third suspect had its turn")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, second).Status)
}

// A waiting suspect's wait has a bound of its own, apart from the turn
// alone's: here the first suspect's turn alone ends at once, while it
// hangs on holding its worker, and the second waits for its turn for
// MaxSuspectWait, not for the turn alone's bound.
func TestRecoverySuspectWaitHasItsOwnBound(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 2)
	agents, opts := hangBesideOK(t, entered)
	ids := crashTwiceTogether(t, store, opts, entered, agents, "hang", "a", "b")

	opts.MaxAlone = 20 * time.Millisecond
	opts.MaxSuspectWait = time.Second
	_, m, _ := startLife(t, store, opts, agents...)
	defer m.Close()
	require.Equal(t, 2, m.Suspects())
	first := <-entered
	second := otherOf(ids, first)
	noneEnters(t, entered, "the second suspect stopped waiting for its turn once the turn alone's bound had passed")
	enters(t, entered, second, "the second suspect's wait runs out after MaxSuspectWait")
	require.GreaterOrEqual(t, tookAt(t, store, second).Sub(tookAt(t, store, first)), opts.MaxSuspectWait, "the second suspect waited less than MaxSuspectWait")
}

// otherOf is the id of two that is not id.
func otherOf(two []string, id string) string {
	if two[0] == id {
		return two[1]
	}
	return two[0]
}

// A run a crash left running whose bundle the resolver reports
// unavailable at the next start is neither resumed nor failed: Recover
// leaves its record as it is and holds its thread (Held), a Wait on it
// returns at once, and Cancel ends it. A later start that resolves the
// bundle resumes it, and it completes.
func TestRecoveryHoldsARunWhoseBundleIsUnavailable(t *testing.T) {
	store := engine.NewMemoryStore()
	entered := make(chan string, 2)
	gates := map[string]chan struct{}{"t": make(chan struct{}), "c": make(chan struct{})}
	agent := heldAgent(t, entered, gates)
	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agent)
	ids := startOn(t, m, "held", "t", "c")
	<-entered
	<-entered
	l.crash(m)
	stored := func(id string) *engine.Run {
		t.Helper()
		r, err := store.Run(context.Background(), id)
		require.NoError(t, err)
		return r
	}
	left := stored(ids[0])

	// The held agent's bundle is gone; another agent's serves new runs.
	unavailable := fmt.Errorf("%w: its folder is gone", engine.ErrBundleUnavailable)
	other := *agent
	other.Name = "other"
	m = engine.NewManager(store, func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name == other.Name {
			return &other, nil
		}
		return nil, unavailable
	}, engine.ManagerOptions{})
	n, err := m.Recover(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "no run resumed")
	held := m.Held()
	require.Len(t, held, 2)
	for i, h := range held {
		require.Equal(t, slices.Sorted(slices.Values(ids))[i], h.ID)
		require.ErrorIs(t, h.Err, engine.ErrBundleUnavailable)
		require.Equal(t, left.Status, h.Status)
	}
	require.Equal(t, left, stored(ids[0]), "its record is left as it is")
	require.Equal(t, left.Status, liveStatus(t, m, ids[0]))
	// Its views say it is held and why: Run, and SetLive of a listed copy.
	hold := &engine.Hold{Reason: unavailable.Error(), Bundle: left.Bundle}
	got, err := m.Run(context.Background(), ids[0])
	require.NoError(t, err)
	require.Equal(t, hold, got.Held)
	listed := stored(ids[0])
	m.SetLive(listed)
	require.Equal(t, hold, listed.Held)
	require.Nil(t, stored(ids[0]).Held, "no part of the record")
	require.Zero(t, m.Active(), "a held run does not execute")
	_, err = m.Start(context.Background(), engine.RunRequest{Thread: "t", Agent: "other", WaitForThread: true})
	require.ErrorIs(t, err, engine.ErrThreadBusy)
	require.ErrorContains(t, err, "waiting for its pinned bundle")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := m.Wait(ctx, ids[0])
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "Wait returns at once")
	require.Equal(t, left.Status, r.Status)

	require.NoError(t, m.Cancel(context.Background(), ids[1]))
	require.Equal(t, engine.StatusCancelled, stored(ids[1]).Status)
	require.Len(t, m.Held(), 1, "the cancelled run is held no more")
	got, err = m.Run(context.Background(), ids[1])
	require.NoError(t, err)
	require.Nil(t, got.Held, "the cancelled run is held no more")
	noneEnters(t, entered, "a held run does not run")
	r, err = m.Start(context.Background(), engine.RunRequest{Thread: "c", Agent: "other"})
	require.NoError(t, err, "its thread is free")
	enters(t, entered, r.ID, "a new run on the cancelled run's thread did not run")
	close(gates["c"])
	r, err = m.Wait(context.Background(), r.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, r.Status)
	m.Close()

	_, m, n = startLife(t, store, engine.ManagerOptions{}, agent)
	defer m.Close()
	require.Equal(t, 1, n, "with its bundle back, the run is resumed")
	require.Empty(t, m.Held())
	got, err = m.Run(context.Background(), ids[0])
	require.NoError(t, err)
	require.Nil(t, got.Held, "with its bundle back, it is held no more")
	enters(t, entered, ids[0], "the held run did not run")
	close(gates["t"])
	r, err = m.Wait(context.Background(), ids[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, r.Status)
}
