package console

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

// endlessStore refuses the commit that ends a run, as a full or failing
// disk does: the run's end is then never announced.
type endlessStore struct{ engine.Store }

func (s endlessStore) Commit(ctx context.Context, c *engine.Commit) error {
	if c.Run != nil && c.Run.Status.Terminal() {
		return errors.New("disk full")
	}
	return s.Store.Commit(ctx, c)
}

// The step-latency metric tracks a run from its start to its end, which it
// learns from the run's events. A run whose end is never announced (its
// last commit failed) was tracked for the life of the process: one entry
// per such run, without bound.
func TestStepMetricForgetsRunsWithoutAnEnd(t *testing.T) {
	defer func(n int) { stepRunsMax = n }(stepRunsMax)
	stepRunsMax = 16
	const runs = 40

	b := engine.NewGraph("two-steps")
	out := engine.Replace[string](b, "out")
	for _, n := range []string{"draft", "answer"} {
		b.AddNode(n, func(context.Context, engine.State) ([]engine.Write, error) {
			return []engine.Write{out.Set(n)}, nil
		})
	}
	b.AddEdge(engine.Start, "draft")
	b.AddEdge("draft", "answer")
	b.AddEdge("answer", engine.End)
	g, err := b.Compile()
	if err != nil {
		t.Fatal(err)
	}
	ag := &engine.Agent{Name: "two-steps", Graph: g}
	resolve := func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }

	bus := engine.NewBus()
	defer bus.Close()
	m := NewMetrics()
	h := newHub(bus, EventOptions{}, m)
	defer h.close()
	mgr := engine.NewManager(InstrumentStore(endlessStore{engine.NewMemoryStore()}, m), resolve,
		engine.ManagerOptions{Workers: 2, Events: bus})
	defer mgr.Close()

	ctx := context.Background()
	for i := range runs {
		run, err := mgr.Start(ctx, engine.RunRequest{Thread: fmt.Sprintf("t%d", i), Agent: ag.Name})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mgr.Wait(ctx, run.ID); err != nil {
			t.Fatal(err)
		}
	}
	// The hub follows the bus on its own goroutine.
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		caught := h.last == bus.Seq()
		h.mu.Unlock()
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hub did not catch up with the bus")
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.mu.Lock()
	tracked := m.lastStep.Len()
	m.mu.Unlock()
	if m.commitFails.Load() != runs {
		t.Fatalf("%d final commits failed, want %d", m.commitFails.Load(), runs)
	}
	if m.step.n == 0 {
		t.Fatal("no step latency observed")
	}
	if tracked > stepRunsMax {
		t.Fatalf("the metrics track %d runs after %d runs that never ended; want at most %d", tracked, runs, stepRunsMax)
	}
}

// A run forgotten from the ring is only the one that held the slot: a run
// that ended and was tracked again since holds a newer slot, and stays.
func TestStepMetricKeepsARunTrackedAgain(t *testing.T) {
	defer func(n int) { stepRunsMax = n }(stepRunsMax)
	stepRunsMax = 3
	m := NewMetrics()
	at := time.Now()
	ev := func(typ, run string) {
		at = at.Add(time.Millisecond)
		m.observeEvent(engine.Event{Type: typ, Run: run, Time: at})
	}
	ev(engine.EventRunStarted, "r1") // slot 0
	ev(engine.EventInterrupt, "r1")  // paused: forgotten
	ev(engine.EventRunStarted, "r2") // slot 1
	ev(engine.EventRunResumed, "r1") // slot 2
	ev(engine.EventRunStarted, "r3") // slot 0 again: r1 is no longer there
	ev(engine.EventCheckpoint, "r1")
	if m.step.n != 1 {
		t.Fatalf("%d steps measured, want 1 (r1's, from its resume)", m.step.n)
	}
	ev(engine.EventRunStarted, "r4") // slot 1: r2 goes
	if _, ok := m.lastStep.Get("r2"); ok || m.lastStep.Len() != 3 {
		t.Fatalf("tracked %v; want r1, r3 and r4", m.lastStep)
	}
}

// slowRuns is a store whose run listings take delay each, and counts them.
type slowRuns struct {
	engine.Store
	delay time.Duration
	calls atomic.Int32
}

func (s *slowRuns) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	s.calls.Add(1)
	time.Sleep(s.delay)
	return s.Store.Runs(ctx, f)
}

// /metrics counts the stored runs by reading every record. On a store of
// months of runs, scraped every few seconds, that kept a core busy: a
// count is now kept for 20 times as long as it took, if that is longer
// than the least time between counts.
func TestRunCountsTakeAtMostAShareOfTheTime(t *testing.T) {
	defer func(d time.Duration) { runCountsEvery = d }(runCountsEvery)
	runCountsEvery = 10 * time.Millisecond
	st := &slowRuns{Store: engine.NewMemoryStore(), delay: 40 * time.Millisecond}
	mgr := engine.NewManager(st, func(string, engine.BundleRef) (*engine.Agent, error) { return nil, engine.ErrUnknownAgent },
		engine.ManagerOptions{})
	defer mgr.Close()
	s := New(Config{Manager: mgr, Metrics: NewMetrics()})
	defer s.Close()
	ctx := context.Background()
	count := func() int32 {
		t.Helper()
		if _, _, err := s.runCounts(ctx); err != nil {
			t.Fatal(err)
		}
		return st.calls.Load()
	}
	first := count()
	if first == 0 {
		t.Fatal("the first count reads the runs")
	}
	time.Sleep(100 * time.Millisecond) // past runCountsEvery, not past 20 × 40 ms
	if n := count(); n != first {
		t.Fatalf("a count that took 40 ms was read again after 100 ms (%d listings, then %d)", first, n)
	}
	s.metrics.runsMu.Lock()
	hold := runCountsShare * s.metrics.runsTook // 800 ms or more
	s.metrics.runsMu.Unlock()
	time.Sleep(hold)
	if n := count(); n == first {
		t.Fatal("a count is read again once 20 times its duration has passed")
	}
}
