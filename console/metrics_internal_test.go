package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
	"github.com/outpost-edge/outpost/store"
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
		if _, _, _, err := s.runCounts(ctx); err != nil {
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

// /metrics counts runs by status. In exit durability the store has no
// record of a run until it pauses or ends, and /metrics left such a run
// out; one that called a tool has a record by then (EnsureDurable), and is
// counted once all the same, as the manager has it. Once stored, each is
// counted by its record.
func TestMetricsCountExitRunsNotStoredYet(t *testing.T) {
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	defer db.Close()
	release := make(chan struct{})
	ag := enginetest.HoldAgent(t, "hold", release)
	mgr := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil },
		engine.ManagerOptions{Durability: engine.DurabilityExit, Workers: 4})
	defer mgr.Close()
	s := New(Config{Manager: mgr, Token: "secret", CountRuns: db.CountRuns})
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	ctx := t.Context()
	start := func(thread, in string) string {
		raw, _ := json.Marshal(in)
		r, err := mgr.Start(ctx, engine.RunRequest{Thread: thread, Agent: "hold", Input: raw})
		require.NoError(t, err)
		return r.ID
	}
	// runs scrapes /metrics afresh, and returns outpost_runs by status.
	runs := func() map[string]string {
		t.Helper()
		s.metrics.runsMu.Lock()
		s.metrics.runsByStat = nil
		s.metrics.runsMu.Unlock()
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer secret")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		out := map[string]string{}
		for _, m := range regexp.MustCompile(`(?m)^outpost_runs\{status="(\w+)"\} (\d+)$`).FindAllStringSubmatch(string(body), -1) {
			if m[2] != "0" {
				out[m[1]] = m[2]
			}
		}
		return out
	}

	done := start("done", "go")
	_, err = mgr.Wait(ctx, done)
	require.NoError(t, err)
	held, durable := start("held", "hold"), start("durable", "durable hold")
	for _, id := range []string{held, durable} {
		require.Eventually(t, func() bool {
			r, _ := mgr.Run(ctx, id)
			return r != nil && r.Status == engine.StatusRunning
		}, 5*time.Second, time.Millisecond)
	}
	require.Eventually(t, func() bool {
		_, err := db.Run(ctx, durable)
		return err == nil
	}, 5*time.Second, time.Millisecond, "EnsureDurable stores the run")
	_, err = db.Run(ctx, held)
	require.ErrorIs(t, err, engine.ErrRunNotFound, "exit durability stores the run when it ends")
	assert.Equal(t, map[string]string{"completed": "1", "running": "2"}, runs())

	close(release)
	for _, id := range []string{held, durable} {
		_, err := mgr.Wait(ctx, id)
		require.NoError(t, err)
	}
	assert.Equal(t, map[string]string{"completed": "3"}, runs())
}
