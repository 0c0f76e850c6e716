package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

func resolver(agents ...*engine.Agent) engine.Resolver {
	return func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		for _, a := range agents {
			if a.Name == name {
				return a, nil
			}
		}
		return nil, fmt.Errorf("%w: %s", engine.ErrUnknownAgent, name)
	}
}

func newManager(t *testing.T, store engine.Store, opts engine.ManagerOptions, agents ...*engine.Agent) *engine.Manager {
	t.Helper()
	m := engine.NewManager(store, resolver(agents...), opts)
	t.Cleanup(m.Close)
	return m
}

func waitFor(t *testing.T, m *engine.Manager, runID string) *engine.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	run, err := m.Wait(ctx, runID)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "run %s did not stop in time", runID)
	return run
}

// gatedAgent's node waits for the gate (or its context) before finishing.
func gatedAgent(t *testing.T, name string, gate <-chan struct{}, started chan<- string) *engine.Agent {
	b := engine.NewGraph(name)
	out := engine.Replace[string](b, "out")
	b.AddNode("work", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		if started != nil {
			started <- info.Run
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []engine.Write{out.Set("done " + info.Thread)}, nil
	})
	b.AddEdge(engine.Start, "work")
	return &engine.Agent{Name: name, Graph: mustCompile(t, b), Output: func(s engine.State) json.RawMessage {
		raw, _ := json.Marshal(out.Get(s))
		return raw
	}}
}

func TestManagerRunsAndOutputs(t *testing.T) {
	gate := make(chan struct{})
	close(gate)
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, gatedAgent(t, "agent", gate, nil))
	ctx := context.Background()
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t1", Agent: "agent", CorrelationID: "c-1"})
	require.NoError(t, err)
	require.NotEmpty(t, run.ID)
	require.Equal(t, "c-1", run.CorrelationID)
	// The run record exists before Start returns.
	stored, err := m.Store().Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, run.ID, stored.ID)

	run = waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.JSONEq(t, `"done t1"`, string(run.Output))

	_, err = m.Start(ctx, engine.RunRequest{Thread: "t1", Agent: "nobody"})
	require.ErrorIs(t, err, engine.ErrUnknownAgent)
	_, err = m.Start(ctx, engine.RunRequest{Agent: "agent"})
	require.ErrorContains(t, err, "thread is required")

	m.Close()
	_, err = m.Start(ctx, engine.RunRequest{Thread: "t2", Agent: "agent"})
	require.ErrorIs(t, err, engine.ErrManagerClosed)
}

func TestManagerBoundsWorkers(t *testing.T) {
	var inflight, peak atomic.Int64
	b := engine.NewGraph("busy")
	b.AddNode("work", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		n := inflight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		inflight.Add(-1)
		return nil, nil
	})
	b.AddEdge(engine.Start, "work")
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{Workers: 2}, &engine.Agent{Name: "busy", Graph: mustCompile(t, b)})
	ctx := context.Background()
	var ids []string
	for i := range 6 {
		run, err := m.Start(ctx, engine.RunRequest{Thread: fmt.Sprint("t", i), Agent: "busy"})
		require.NoError(t, err)
		ids = append(ids, run.ID)
	}
	for _, id := range ids {
		require.Equal(t, engine.StatusCompleted, waitFor(t, m, id).Status)
	}
	require.Equal(t, int64(2), peak.Load())
	require.Equal(t, 0, m.Active())
}

func TestManagerOneActiveRunPerThread(t *testing.T) {
	gate := make(chan struct{})
	started := make(chan string, 4)
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, gatedAgent(t, "agent", gate, started))
	ctx := context.Background()
	first, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	<-started

	_, err = m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.ErrorIs(t, err, engine.ErrThreadBusy)
	require.ErrorContains(t, err, first.ID)

	// Another thread is not held up.
	other, err := m.Start(ctx, engine.RunRequest{Thread: "other", Agent: "agent"})
	require.NoError(t, err)
	<-started

	second := make(chan *engine.Run, 1)
	go func() {
		run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent", WaitForThread: true})
		if err != nil {
			t.Error(err)
		}
		second <- run
	}()
	select {
	case <-second:
		t.Fatal("the second run started while the first was active")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	var run *engine.Run
	select {
	case run = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting run never started")
	}
	<-started
	done := waitFor(t, m, first.ID)
	require.Equal(t, engine.StatusCompleted, done.Status)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, run.ID).Status)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, other.ID).Status)
	require.True(t, run.CreatedAt.After(done.EndedAt) || run.CreatedAt.Equal(done.EndedAt), "never interleaved")

	// A waiting Start gives up with its context.
	gate2 := make(chan struct{})
	m2 := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, gatedAgent(t, "agent", gate2, nil))
	_, err = m2.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = m2.Start(short, engine.RunRequest{Thread: "t", Agent: "agent", WaitForThread: true})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(gate2)
}

func TestManagerCancel(t *testing.T) {
	started := make(chan string, 1)
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, gatedAgent(t, "agent", make(chan struct{}), started))
	ctx := context.Background()
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	<-started
	require.NoError(t, m.Cancel(ctx, run.ID))
	done := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCancelled, done.Status)
	require.Equal(t, "run cancelled", done.Error, "the reason reads once")
	require.Error(t, m.Cancel(ctx, run.ID), "an ended run cannot be cancelled")
	_, err = m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err, "the thread is free again")
}

func approvalAgent(t *testing.T, calls *counter) *engine.Agent {
	b := engine.NewGraph("approval")
	out := engine.Replace[string](b, "out")
	b.AddNode("ask", calls.counted(func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, "ship it?")
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(d.Kind)}, nil
	}))
	b.AddEdge(engine.Start, "ask")
	return &engine.Agent{Name: "approval", Graph: mustCompile(t, b), Output: func(s engine.State) json.RawMessage {
		raw, _ := json.Marshal(out.Get(s))
		return raw
	}}
}

func TestManagerResume(t *testing.T) {
	calls := newCounter()
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, approvalAgent(t, calls))
	ctx := context.Background()
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.NoError(t, err)
	paused := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusInterrupted, paused.Status)
	require.Len(t, paused.Interrupts, 1)
	id := paused.Interrupts[0].ID

	_, err = m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval", WaitForThread: true})
	require.ErrorIs(t, err, engine.ErrThreadBusy, "a paused run holds its thread")
	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{"int_nope": {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrUnknownInterrupt)
	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{id: {Kind: "yes"}})
	require.ErrorIs(t, err, engine.ErrBadDecision)
	_, err = m.Resume(ctx, run.ID, nil)
	require.Error(t, err)

	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{id: {Kind: engine.Reject, Reason: "not today", By: "ops"}})
	require.NoError(t, err)
	done := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCompleted, done.Status)
	require.JSONEq(t, `"reject"`, string(done.Output))
	require.Len(t, done.Decisions, 1)
	require.Equal(t, "ops", done.Decisions[0].By)
	require.Equal(t, "not today", done.Decisions[0].Reason)
	require.Equal(t, 2, calls.get("ask"))

	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{id: {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrNotInterrupted)
}

func TestManagerCancelPausedRun(t *testing.T) {
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, approvalAgent(t, newCounter()))
	ctx := context.Background()
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, waitFor(t, m, run.ID).Status)
	require.NoError(t, m.Cancel(ctx, run.ID))
	done := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCancelled, done.Status)
	require.Equal(t, "run cancelled", done.Error)
	require.Empty(t, done.Interrupts)
	_, err = m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.NoError(t, err)
}

// TestManagerRecover leaves a run mid-step when its manager closes, then has a
// new manager over the same store finish it: only the unfinished task re-runs.
func TestManagerRecover(t *testing.T) {
	calls := newCounter()
	var block atomic.Bool
	block.Store(true)
	blocked := make(chan struct{}, 1)
	b := engine.NewGraph("recover")
	got := engine.Merge[string, int](b, "got")
	b.AddNode("fast", calls.counted(writes(got.Set(map[string]int{"fast": 1}))))
	b.AddNode("slow", calls.counted(func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		if block.Load() {
			blocked <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []engine.Write{got.Set(map[string]int{"slow": 1})}, nil
	}))
	b.AddNode("join", calls.counted(writes(got.Set(map[string]int{"join": 1}))))
	b.AddEdge(engine.Start, "fast")
	b.AddEdge(engine.Start, "slow")
	b.AddEdge("fast", "join")
	b.AddEdge("slow", "join")
	agent := &engine.Agent{Name: "recover", Graph: mustCompile(t, b)}
	store := engine.NewMemoryStore()
	ctx := context.Background()

	m1 := engine.NewManager(store, resolver(agent), engine.ManagerOptions{})
	run, err := m1.Start(ctx, engine.RunRequest{Thread: "t", Agent: "recover"})
	require.NoError(t, err)
	<-blocked
	require.Eventually(t, func() bool { return calls.get("fast") == 1 }, 5*time.Second, time.Millisecond)
	m1.Close()

	stored, err := store.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Contains(t, []engine.RunStatus{engine.StatusQueued, engine.StatusRunning}, stored.Status, "a shut-down run is left for recovery")
	require.Equal(t, 0, calls.get("join"))

	block.Store(false)
	// The store also holds a run record that cannot be read: recovery
	// names it, and resumes the run it can read all the same.
	m2 := newManager(t, damagedRuns{store}, engine.ManagerOptions{}, agent)
	n, err := m2.Recover(ctx)
	var dmg *engine.DamagedRunsError
	require.ErrorAs(t, err, &dmg)
	require.Equal(t, []string{"run_damaged"}, dmg.Keys, "named once, though each status's listing meets it")
	require.Equal(t, 1, n)
	done := waitFor(t, m2, run.ID)
	require.Equal(t, engine.StatusCompleted, done.Status)
	require.Equal(t, 1, calls.get("fast"), "a task with saved writes is not re-run")
	require.Equal(t, 2, calls.get("slow"))
	require.Equal(t, 1, calls.get("join"))

	snap, err := agent.Graph.StateAt(ctx, engine.RunConfig{Thread: "t", Store: store}, "")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"fast": 1, "slow": 1, "join": 1}, got.Get(snap))

	// Nothing is left to recover.
	m3 := newManager(t, store, engine.ManagerOptions{}, agent)
	n, err = m3.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// A program that embeds the engine may start a run before it calls
// Recover, or never call it. The manager recovers first all the same: a new
// run on the thread of a run that a crash left unfinished finds the thread
// held by the recovered run, which runs to its end; before, the new run
// took the thread, and the crashed run was left for the next start. A
// later Recover reports what that pass found and recovers nothing again.
func TestManagerRecoversBeforeItsFirstRun(t *testing.T) {
	gate := make(chan struct{})
	started := make(chan string, 4)
	agent := gatedAgent(t, "agent", gate, started)
	store := engine.NewMemoryStore()
	ctx := context.Background()

	m1 := engine.NewManager(store, resolver(agent), engine.ManagerOptions{})
	crashed, err := m1.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	<-started
	m1.Close() // the run is left running, as a crash leaves it

	m2 := newManager(t, damagedRuns{store}, engine.ManagerOptions{}, agent)
	_, err = m2.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.ErrorIs(t, err, engine.ErrThreadBusy, "a new run took the thread of a run that recovery had not reached")
	require.Equal(t, crashed.ID, <-started, "the crashed run is not resumed")
	other, err := m2.Start(ctx, engine.RunRequest{Thread: "u", Agent: "agent"})
	require.NoError(t, err, "a damaged record that recovery left out stops new runs")
	close(gate)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m2, crashed.ID).Status)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m2, other.ID).Status)

	n, err := m2.Recover(ctx)
	var dmg *engine.DamagedRunsError
	require.ErrorAs(t, err, &dmg, "Recover does not report what the pass before the first run found")
	require.Equal(t, []string{"run_damaged"}, dmg.Keys)
	require.Equal(t, 1, n)
	next, err := m2.Start(ctx, engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, waitFor(t, m2, next.ID).Status)
	require.Len(t, started, 2, "a run was started again: %d", len(started))
}

// A manager closed before it recovered does not recover when asked for a
// run: it is closed, and the runs a crash left stay as they are in the
// store, for the next start, where a pass would fail one that crashed too
// often.
func TestManagerClosedBeforeRecoverLeavesTheStore(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	agent, id := crashedHangRun(t, store, entered)
	opts := engine.ManagerOptions{MaxRecoveries: 1}
	l, m, _ := startLife(t, store, opts, agent)
	require.Equal(t, id, <-entered)
	l.crash(m)
	require.Equal(t, "1", recoveries(t, store, id))
	before, err := store.Run(ctx, id)
	require.NoError(t, err)

	m = engine.NewManager(store, resolver(agent), opts)
	m.Close()
	_, err = m.Start(ctx, engine.RunRequest{Thread: "u", Agent: "hang"})
	require.ErrorIs(t, err, engine.ErrManagerClosed)
	run, err := store.Run(ctx, id)
	require.NoError(t, err)
	require.Equal(t, before.Status, run.Status, "the closed manager recovered nothing")
	require.Equal(t, "1", run.Meta[engine.MetaRecoveries])
}

// Cancel, too, recovers first: a run paused before a restart is cancelled,
// where it was reported ended though its record said interrupted.
func TestManagerCancelsAPausedRunBeforeRecover(t *testing.T) {
	agent := approvalAgent(t, newCounter())
	store := engine.NewMemoryStore()
	ctx := context.Background()
	m1 := engine.NewManager(store, resolver(agent), engine.ManagerOptions{})
	run, err := m1.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, waitFor(t, m1, run.ID).Status)
	m1.Close()

	m2 := newManager(t, store, engine.ManagerOptions{}, agent)
	require.NoError(t, m2.Cancel(ctx, run.ID))
	stored, err := store.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, stored.Status)
}

func TestManagerRecoverRegistersPausedRuns(t *testing.T) {
	calls := newCounter()
	agent := approvalAgent(t, calls)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	m1 := engine.NewManager(store, resolver(agent), engine.ManagerOptions{})
	run, err := m1.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.NoError(t, err)
	paused := waitFor(t, m1, run.ID)
	m1.Close()

	m2 := newManager(t, store, engine.ManagerOptions{}, agent)
	n, err := m2.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, n, "paused runs wait for a person, they are not resumed")
	_, err = m2.Start(ctx, engine.RunRequest{Thread: "t", Agent: "approval"})
	require.ErrorIs(t, err, engine.ErrThreadBusy)
	_, err = m2.Resume(ctx, run.ID, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	done := waitFor(t, m2, run.ID)
	require.Equal(t, engine.StatusCompleted, done.Status)
	require.JSONEq(t, `"approve"`, string(done.Output))
}

func TestManagerInvoke(t *testing.T) {
	gate := make(chan struct{})
	close(gate)
	m := newManager(t, engine.NewMemoryStore(), engine.ManagerOptions{}, gatedAgent(t, "agent", gate, nil))
	run, err := m.Invoke(context.Background(), engine.RunRequest{Thread: "t", Agent: "agent"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	stored, err := m.Store().Run(context.Background(), run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, stored.Status)
	require.JSONEq(t, `"done t"`, string(stored.Output))
}

// damagedRuns is a store whose run listing also meets one record that
// cannot be read, as a bbolt store with a damaged record does.
type damagedRuns struct{ *engine.MemoryStore }

func (d damagedRuns) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	if f.Damaged == nil {
		return nil, errors.New("corrupt record in bucket runs, key \"run_damaged\"")
	}
	f.Damaged("run_damaged", errors.New("checksum mismatch"))
	return d.MemoryStore.Runs(ctx, f)
}

// Cancel and Resume of the same paused run, at once: one of them claims
// it. Either the cancel marks it cancelled and the resume is refused, or
// the resume runs it and the cancel stops it as it runs; it ends once.
// Cancel read the paused mark without the lock, and both could go ahead:
// the run was resumed and marked cancelled, and released twice (a panic).
func TestCancelAndResumeRace(t *testing.T) {
	ctx := context.Background()
	for i := 0; i < 30; i++ {
		calls := newCounter()
		g, _ := reviewGraph(t, calls)
		s := newRecordingStore()
		m := newManager(t, s, engine.ManagerOptions{}, &engine.Agent{Name: "review", Graph: g})
		run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "review"})
		require.NoError(t, err)
		require.Equal(t, engine.StatusInterrupted, run.Status)

		var wg sync.WaitGroup
		var resumeErr, cancelErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, resumeErr = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
		}()
		go func() {
			defer wg.Done()
			cancelErr = m.Cancel(ctx, run.ID)
		}()
		wg.Wait()
		end := waitFor(t, m, run.ID)
		require.True(t, end.Status.Terminal(), "status %s", end.Status)
		if resumeErr != nil {
			require.ErrorIs(t, resumeErr, engine.ErrNotInterrupted)
			require.Equal(t, engine.StatusCancelled, end.Status)
			require.Zero(t, calls.get("after"), "a refused resume went past the decision")
		}
		ends := 0
		s.mu.Lock()
		for _, c := range s.commits {
			if c.Run != nil && c.Run.ID == run.ID && c.Run.Status.Terminal() {
				ends++
			}
		}
		s.mu.Unlock()
		require.Equal(t, 1, ends, "resume error %v, cancel error %v, final %s", resumeErr, cancelErr, end.Status)
		m.Close()
	}
}

// A run cancelled after it opened and before a worker took it (its id is
// known from run.started, or ThreadRun) is stopped when the worker takes
// it; Cancel used to call a stop function that was not set yet.
func TestCancelBeforeAWorkerTakesTheRun(t *testing.T) {
	ctx := context.Background()
	calls := newCounter()
	g, _ := reviewGraph(t, calls)
	s := newRecordingStore()
	m := newManager(t, s, engine.ManagerOptions{}, &engine.Agent{Name: "review", Graph: g})
	var cancelErr error
	cancelled := false
	s.onCommit = func(c *engine.Commit) {
		if c.Run != nil && !cancelled {
			cancelled = true
			cancelErr = m.Cancel(ctx, c.Run.ID) // the input's commit, inside Start
		}
	}
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "review"})
	require.NoError(t, err)
	require.True(t, cancelled)
	require.NoError(t, cancelErr)
	end := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCancelled, end.Status)
	require.Zero(t, calls.get("before"), "the cancelled run ran a node")
}

// A run cancelled while its Resume is still preparing it (between the
// claim and the hand-off to a worker) is stopped when a worker takes it;
// Cancel called the stop function of the run's previous execution, which
// stopped nothing, and the resumed run went on.
func TestCancelWhileResumePrepares(t *testing.T) {
	ctx := context.Background()
	calls := newCounter()
	g, _ := reviewGraph(t, calls)
	ag := &engine.Agent{Name: "review", Graph: g}
	resolving := make(chan struct{})
	proceed := make(chan struct{})
	var n atomic.Int32
	resolve := func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if n.Add(1) == 2 { // the Resume's
			close(resolving)
			<-proceed
		}
		return ag, nil
	}
	m := engine.NewManager(engine.NewMemoryStore(), resolve, engine.ManagerOptions{})
	t.Cleanup(m.Close)
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "review"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, run.Status)
	resumed := make(chan error, 1)
	go func() {
		_, err := m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
		resumed <- err
	}()
	<-resolving
	require.NoError(t, m.Cancel(ctx, run.ID))
	close(proceed)
	require.NoError(t, <-resumed)
	end := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCancelled, end.Status)
	require.Zero(t, calls.get("after"), "the cancelled run went on past the decision")
}

// In exit durability a run is stored only when it pauses or ends; until
// then the manager that runs it still answers for it, as the API's
// GET /runs/{id} asks right after the run's id is returned.
func TestExitRunIsKnownBeforeItIsStored(t *testing.T) {
	ctx := context.Background()
	s := engine.NewMemoryStore()
	gate := make(chan struct{})
	m := newManager(t, s, engine.ManagerOptions{Durability: engine.DurabilityExit},
		&engine.Agent{Name: "sleepy", Graph: sleepyGraph(t, time.Sleep, time.Millisecond, false, gate)})
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "sleepy"})
	require.NoError(t, err)
	_, err = s.Run(ctx, run.ID)
	require.ErrorIs(t, err, engine.ErrRunNotFound, "exit durability stored the run as it opened")
	got, err := m.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, run.ID, got.ID)
	require.Contains(t, []engine.RunStatus{engine.StatusQueued, engine.StatusRunning}, got.Status)
	close(gate)
	end := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCompleted, end.Status)
	_, err = m.Run(ctx, "run_unknown")
	require.ErrorIs(t, err, engine.ErrRunNotFound)
}

// life is one process's view of a store that outlives it: once the
// process dies, nothing it does reaches the store, and whatever it was
// running stays as the last commit left it.
type life struct {
	engine.Store
	dead atomic.Bool
}

var errDead = errors.New("the process is dead")

func (l *life) Commit(ctx context.Context, c *engine.Commit) error {
	if l.dead.Load() {
		return errDead
	}
	return l.Store.Commit(ctx, c)
}

// startLife starts a process over store: a manager that has recovered what
// the last process left running. n is the number of runs it resumed.
func startLife(t *testing.T, store engine.Store, opts engine.ManagerOptions, agents ...*engine.Agent) (l *life, m *engine.Manager, n int) {
	t.Helper()
	l = &life{Store: store}
	m = engine.NewManager(l, resolver(agents...), opts)
	n, err := m.Recover(context.Background())
	require.NoError(t, err)
	return l, m, n
}

// crash kills the process that m runs in: its store takes no more
// commits, then its goroutines are let go.
func (l *life) crash(m *engine.Manager) {
	l.dead.Store(true)
	m.Close()
}

// hangAgent's node "work" reports that it runs, then hangs until the
// process dies, on every call: a step that kills the process each time.
func hangAgent(t *testing.T, entered chan<- string) *engine.Agent {
	b := engine.NewGraph("hang")
	out := engine.Replace[string](b, "out")
	b.AddNode("work", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		entered <- info.Run
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b.AddNode("after", writes(out.Set("never")))
	b.AddEdge(engine.Start, "work")
	b.AddEdge("work", "after")
	return &engine.Agent{Name: "hang", Graph: mustCompile(t, b)}
}

// crashedHangRun starts a hangAgent run on thread "t" over store and lets
// its process die in its step: a first start that crashed. It returns the
// agent and the run's id.
func crashedHangRun(t *testing.T, store engine.Store, entered chan string) (*engine.Agent, string) {
	t.Helper()
	agent := hangAgent(t, entered)
	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agent)
	run, err := m.Start(context.Background(), engine.RunRequest{Thread: "t", Agent: "hang"})
	require.NoError(t, err)
	require.Equal(t, run.ID, <-entered)
	l.crash(m)
	return agent, run.ID
}

func recoveries(t *testing.T, s engine.Store, runID string) string {
	t.Helper()
	r, err := s.Run(context.Background(), runID)
	require.NoError(t, err)
	return r.Meta[engine.MetaRecoveries]
}

// A run whose step kills the process every time is recovered
// MaxRecoveries times; at the next start it ends failed, with
// ErrCrashLoop, run.failed and its thread free, and the manager serves on.
func TestRecoveryLimitEndsACrashLoop(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	gate := make(chan struct{})
	close(gate)
	agents := []*engine.Agent{hangAgent(t, entered), gatedAgent(t, "ok", gate, nil)}

	l, m, _ := startLife(t, store, engine.ManagerOptions{}, agents...)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "hang"})
	require.NoError(t, err)
	require.Equal(t, run.ID, <-entered)
	l.crash(m)
	require.Empty(t, recoveries(t, store, run.ID), "a run that was never recovered keeps no count")

	for i := 1; i <= engine.DefaultMaxRecoveries; i++ {
		l, m, n := startLife(t, store, engine.ManagerOptions{}, agents...)
		require.Equal(t, 1, n)
		require.Equal(t, run.ID, <-entered)
		require.Equal(t, fmt.Sprint(i), recoveries(t, store, run.ID), "the recovery is on record before the run executes")
		l.crash(m)
	}

	bus := engine.NewBus()
	sub := bus.Subscribe(16, nil)
	m = newManager(t, store, engine.ManagerOptions{Events: bus}, agents...)
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the run is not resumed")
	select {
	case id := <-entered:
		t.Fatalf("run %s ran again", id)
	default:
	}
	done, err := store.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Contains(t, done.Error, engine.ErrCrashLoop.Error())
	require.Contains(t, done.Error, "recovered 3 times and crashed each time")
	require.False(t, done.EndedAt.IsZero())
	require.Contains(t, done.Meta, engine.MetaActive, "its active time is on record")
	require.NotContains(t, done.Meta, engine.MetaRunningSince, "and no stretch is open")
	ev := <-sub.C()
	require.Equal(t, engine.EventRunFailed, ev.Type)
	require.Equal(t, run.ID, ev.Run)
	require.JSONEq(t, fmt.Sprintf(`{"status":"failed","error":%q}`, done.Error), string(ev.Data))

	next, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: "ok"})
	require.NoError(t, err, "the thread is free")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, next.ID).Status)
}

// flakySteps adds the steps s0, s1, ... in a row to b, from Start. Each
// hangs until the process dies the first time it runs, reporting its name
// on entered, and adds 1 to the returned channel the second time. With
// durable, s0 first puts its run on record (engine.EnsureDurable, as a
// tool call does), which exit durability needs for a run to be recovered.
func flakySteps(b *engine.Builder, steps int, entered chan<- string, durable bool) engine.Chan[int] {
	var mu sync.Mutex
	ran := map[string]bool{}
	out := engine.Sum[int](b, "out")
	prev := engine.Start
	for i := range steps {
		node := fmt.Sprintf("s%d", i)
		b.AddNode(node, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			if durable && node == "s0" {
				if err := engine.EnsureDurable(ctx); err != nil {
					return nil, err
				}
			}
			mu.Lock()
			again := ran[node]
			ran[node] = true
			mu.Unlock()
			if !again {
				entered <- node
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return []engine.Write{out.Set(1)}, nil
		})
		b.AddEdge(prev, node)
		prev = node
	}
	return out
}

// crashAtEachStep starts agent's run on thread "t", whose steps are
// flakySteps, lets the process die at each step in turn and starts it
// again, with MaxRecoveries 1: each step that commits must take the count
// off the run's record, or the next start fails the run. It returns the
// run as it ends. d is the manager's durability.
func crashAtEachStep(t *testing.T, store engine.Store, d engine.Durability, agent *engine.Agent, entered <-chan string, steps int) *engine.Run {
	t.Helper()
	ctx := context.Background()
	opts := engine.ManagerOptions{MaxRecoveries: 1, Durability: d}
	l, m, _ := startLife(t, store, opts, agent)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "t", Agent: agent.Name})
	require.NoError(t, err)
	require.Equal(t, "s0", <-entered)
	l.crash(m)
	for i := 1; i < steps; i++ {
		l, m, n := startLife(t, store, opts, agent)
		require.Equal(t, 1, n, "recovery %d: the step before committed, so this is the first crash in a row", i)
		require.Equal(t, fmt.Sprintf("s%d", i), <-entered)
		require.Empty(t, recoveries(t, store, run.ID), "the step the run committed took the count off")
		l.crash(m)
	}
	m = newManager(t, store, opts, agent)
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	done := waitFor(t, m, run.ID)
	require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
	require.Empty(t, done.Meta[engine.MetaRecoveries])
	return done
}

// The limit counts recoveries in a row: a run that commits a step after
// each recovery is making progress, and is recovered as often as it
// crashes. With no limit, a run is recovered whatever its count.
func TestRecoveryLimitCountsCrashesWithoutProgress(t *testing.T) {
	const steps = 4
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	b := engine.NewGraph("flaky")
	out := flakySteps(b, steps, entered, false)
	agent := &engine.Agent{Name: "flaky", Graph: mustCompile(t, b)}
	crashAtEachStep(t, store, engine.DurabilitySync, agent, entered, steps)
	snap, err := agent.Graph.StateAt(ctx, engine.RunConfig{Thread: "t", Store: store}, "")
	require.NoError(t, err)
	require.Equal(t, steps, out.Get(snap))

	// No limit: a hanging run is recovered past the default limit.
	unbounded := engine.ManagerOptions{MaxRecoveries: -1}
	hang := hangAgent(t, entered)
	l, m, _ := startLife(t, store, unbounded, hang)
	run, err := m.Start(ctx, engine.RunRequest{Thread: "u", Agent: "hang"})
	require.NoError(t, err)
	<-entered
	l.crash(m)
	for i := 1; i <= engine.DefaultMaxRecoveries+1; i++ {
		l, m, n := startLife(t, store, unbounded, hang)
		require.Equal(t, 1, n)
		<-entered
		l.crash(m)
	}
	require.Equal(t, fmt.Sprint(engine.DefaultMaxRecoveries+1), recoveries(t, store, run.ID))
}

// A run stopped by Close, a shutdown and not a crash, is not counted as
// crashed, and the time before the crash and after the recovery is on
// record.
func TestRecoveryLimitShutdownIsNotACrash(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 1)
	agent, runID := crashedHangRun(t, store, entered)

	m := engine.NewManager(store, resolver(agent), engine.ManagerOptions{})
	before := time.Now()
	_, err := m.Recover(ctx)
	require.NoError(t, err)
	<-entered
	stored, err := store.Run(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, "1", stored.Meta[engine.MetaRecoveries])
	require.Contains(t, stored.Meta, engine.MetaActive)
	since, err := time.Parse(time.RFC3339Nano, stored.Meta[engine.MetaRunningSince])
	require.NoError(t, err)
	require.False(t, since.Before(before.Add(-time.Millisecond)), "the new stretch is counted from the recovery")
	m.Close()
	require.Empty(t, recoveries(t, store, runID), "a shutdown takes the count back")
}

// A recovered run that waits in the queue for a worker is not counted when
// the process dies: the crash was not its doing.
func TestRecoveryLimitSkipsQueuedRuns(t *testing.T) {
	store := engine.NewMemoryStore()
	ctx := context.Background()
	entered := make(chan string, 2)
	agent := hangAgent(t, entered)
	l, m, _ := startLife(t, store, engine.ManagerOptions{Workers: 2}, agent)
	var ids []string
	for _, thread := range []string{"a", "b"} {
		run, err := m.Start(ctx, engine.RunRequest{Thread: thread, Agent: "hang"})
		require.NoError(t, err)
		ids = append(ids, run.ID)
	}
	<-entered
	<-entered
	l.crash(m)

	l, m, n := startLife(t, store, engine.ManagerOptions{Workers: 1}, agent)
	require.Equal(t, 2, n)
	ran := <-entered
	for _, id := range ids {
		want := ""
		if id == ran {
			want = "1"
		}
		require.Equal(t, want, recoveries(t, store, id), "run %s (the worker took %s)", id, ran)
	}
	l.crash(m)
}

// gatedListing is a store whose listing of runs waits for gate (or its
// context), as a large store's would take long; listed says it began.
type gatedListing struct {
	engine.Store
	gate   <-chan struct{}
	listed chan struct{}
	once   sync.Once
}

func (s *gatedListing) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	s.once.Do(func() { close(s.listed) })
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Runs(ctx, f)
}

// A Start whose context ends while the recovery pass runs returns its
// context's error at once, and the pass goes on: another Start that waits
// for it then runs.
func TestManagerStartLeavesARecoveryPassWhenItsContextEnds(t *testing.T) {
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	defer release() // before Close, which waits for the pass
	store := &gatedListing{Store: engine.NewMemoryStore(), gate: gate, listed: make(chan struct{})}
	open := make(chan struct{})
	close(open)
	m := newManager(t, store, engine.ManagerOptions{}, gatedAgent(t, "a", open, nil))

	type started struct {
		run *engine.Run
		err error
	}
	waited := make(chan started, 1)
	go func() {
		run, err := m.Start(context.Background(), engine.RunRequest{Thread: "patient", Agent: "a"})
		waited <- started{run, err}
	}()
	<-store.listed // the patient Start's pass
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		_, err := m.Start(short, engine.RunRequest{Thread: "short", Agent: "a"})
		ended <- err
	}()
	select {
	case err := <-ended:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("Start still waits for the recovery pass after its context ended")
	}
	select {
	case <-waited:
		t.Fatal("the waiting Start returned before the recovery pass ended")
	default:
	}
	release()
	got := <-waited
	require.NoError(t, got.err, "the pass went on for the Start that waited")
	require.Equal(t, engine.StatusCompleted, waitFor(t, m, got.run.ID).Status)
}

// Close stops the runs that wait for a worker as well as those that run:
// none of them takes the worker that a stopping run frees and begins a
// step (a tool call, say) as the manager closes. The timing is tried many
// times over, for the moment where Close has stopped the running run but
// not yet the waiting one.
func TestCloseBeginsNoStepOfAWaitingRun(t *testing.T) {
	for i := range 200 {
		entered := make(chan string, 2)
		m := engine.NewManager(engine.NewMemoryStore(), resolver(hangAgent(t, entered)), engine.ManagerOptions{Workers: 1})
		running := startOn(t, m, "hang", "a")[0]
		require.Equal(t, running, <-entered)
		waiting := startOn(t, m, "hang", "b")[0]
		m.Close()
		select {
		case id := <-entered:
			require.NotEqual(t, waiting, id, "try %d: the waiting run began a step as the manager closed", i)
		default:
		}
	}
}
