package crashtest

// Several runs cut short together by two crashes in a row are all suspects
// of the crash-loop guard at the next start, on one bbolt store. Each must
// have its turn alone, one after another, before any run that is not a
// suspect (one recovered from the queue, a new one) takes a worker: even
// while a suspect whose turn ended on its first committed step runs on.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
	"github.com/outpost-edge/outpost/store"
)

var errDead = errors.New("the process is dead")

// dyingDB is one process's hold on a bbolt store: once the process dies,
// nothing it does reaches the file, and what it ran stays as its last
// commit left it.
type dyingDB struct {
	*store.DB
	dead atomic.Bool
}

func (d *dyingDB) Commit(ctx context.Context, c *engine.Commit) error {
	if d.dead.Load() {
		return errDead
	}
	return d.DB.Commit(ctx, c)
}

// process is one start of the appliance on the store in a folder.
type process struct {
	db *dyingDB
	m  *engine.Manager
	n  int // runs its recovery resumed
}

func startProcess(t *testing.T, dir string, resolve engine.Resolver, opts engine.ManagerOptions) *process {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	p := &process{db: &dyingDB{DB: db}}
	p.m = engine.NewManager(p.db, resolve, opts)
	p.n, err = p.m.Recover(context.Background())
	require.NoError(t, err)
	return p
}

// crash kills the process: its store takes no more commits, its runs are
// let go, and its file is closed as the kernel would close it.
func (p *process) crash(t *testing.T) {
	p.db.dead.Store(true)
	p.m.Close()
	require.NoError(t, p.db.Close())
}

// twoStep resolves "twostep" to enginetest.TwoStepAgent.
func twoStep(t *testing.T, entered chan<- string, gates map[string][2]chan struct{}) engine.Resolver {
	agent := enginetest.TwoStepAgent(t, entered, gates)
	return func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name != agent.Name {
			return nil, fmt.Errorf("%w: %s", engine.ErrUnknownAgent, name)
		}
		return agent, nil
	}
}

func TestSuspectsEachHaveATurnBeforeOtherRuns(t *testing.T) {
	for _, k := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d suspects", k), func(t *testing.T) {
			suspectsTakeTurnsFirst(t, k)
		})
	}
}

// suspectsTakeTurnsFirst makes k suspects, a run recovered from the queue
// and a new run, and checks that each suspect runs alone before any of the
// other two executes a step.
func suspectsTakeTurnsFirst(t *testing.T, k int) {
	dir := t.TempDir()
	ctx := context.Background()
	// Each process has its own: what a dead process's runs report is no
	// concern of the next one.
	var entered chan string
	gates := map[string][2]chan struct{}{}
	var suspects []string
	for i := range k {
		suspects = append(suspects, fmt.Sprintf("suspect%d", i))
	}
	for _, th := range append([]string{"queued", "new"}, suspects...) {
		gates[th] = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	}
	life := func(opts engine.ManagerOptions) *process {
		entered = make(chan string, 2*k+4)
		return startProcess(t, dir, twoStep(t, entered, gates), opts)
	}
	thread := map[string]string{}
	next := func(why string) string {
		t.Helper()
		select {
		case id := <-entered:
			return id
		case <-time.After(10 * time.Second):
			t.Fatal(why)
			return ""
		}
	}
	start := func(m *engine.Manager, th string) {
		run, err := m.Start(ctx, engine.RunRequest{Thread: th, Agent: "twostep"})
		require.NoError(t, err)
		thread[run.ID] = th
	}

	// The suspects are cut short in their first step twice; the second
	// time a run waits in the queue behind them, which is not counted.
	p := life(engine.ManagerOptions{})
	for _, th := range suspects {
		start(p.m, th)
	}
	for range k {
		next("a run did not start")
	}
	p.crash(t)
	p = life(engine.ManagerOptions{Workers: k})
	require.Equal(t, k, p.n)
	for range k {
		next("a recovered run did not start")
	}
	start(p.m, "queued")
	p.crash(t)

	opts := engine.ManagerOptions{Workers: 4, MaxAlone: time.Minute}
	p = life(opts)
	defer p.crash(t)
	require.Equal(t, k+1, p.n)
	require.Equal(t, k, p.m.Suspects())
	start(p.m, "new")

	had := map[string]bool{}
	for turn := range k {
		id := next("no suspect had its turn")
		th := thread[id]
		require.Contains(t, suspects, th, "turn %d: %s executed a step before every suspect had its turn", turn+1, th)
		require.False(t, had[th], "%s had its turn already", th)
		had[th] = true
		close(gates[th][0]) // its first step commits: its turn ends
		if turn < k-1 {
			got := next("the suspect did not go on")
			require.Equal(t, id, got, "turn %d: %s executed a step before every suspect had its turn (%s runs on, %d to come)", turn+1, thread[got], th, k-1-turn)
			select {
			case other := <-entered:
				t.Fatalf("turn %d: %s executed a step before every suspect had its turn (%s runs on, %d to come)", turn+1, thread[other], th, k-1-turn)
			case <-time.After(200 * time.Millisecond):
			}
		}
		close(gates[th][1])
		done, err := p.m.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
		require.Empty(t, done.Meta[engine.MetaRecoveries])
	}
	for _, th := range []string{"queued", "new"} {
		close(gates[th][0])
		close(gates[th][1])
	}
	for id, th := range thread {
		done, err := p.m.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, done.Status, "%s: %s", th, done.Error)
	}
}

// A recovery pass that fails part-way takes back the runs it registered:
// with nothing calling the manager again (a program that embeds the
// engine and only reads), it reports no run it will not resume, and the
// pass tried again resumes them all.
func TestFailedRecoveryPassLeavesNoRunRegistered(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	gates := map[string][2]chan struct{}{}
	for _, th := range []string{"a", "b"} {
		gates[th] = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	}
	entered := make(chan string, 4)
	resolve := twoStep(t, entered, gates)
	// a runs, b waits for the one worker; the process dies.
	p := startProcess(t, dir, resolve, engine.ManagerOptions{Workers: 1})
	ids := map[string]string{}
	for _, th := range []string{"a", "b"} {
		run, err := p.m.Start(ctx, engine.RunRequest{Thread: th, Agent: "twostep"})
		require.NoError(t, err)
		ids[th] = run.ID
	}
	<-entered
	p.crash(t)

	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	entered = make(chan string, 4)
	m := engine.NewManager(&enginetest.FailsRunningOnce{Store: db}, twoStep(t, entered, gates), engine.ManagerOptions{})
	defer m.Close()
	_, err = m.Recover(ctx)
	require.ErrorContains(t, err, "listing failed", "both runs are registered, the listing of running ones fails")
	for th, id := range ids {
		held, ok := m.ThreadRun(th)
		require.False(t, ok, "thread %s is held by run %s, which the failed pass left registered", th, held)
		r, err := m.Run(ctx, id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusQueued, r.Status, "its record is as the crash left it")
	}
	require.Zero(t, m.Active(), "runs the failed pass registered are reported queued")

	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the pass tried again resumes both")
	for th, id := range ids {
		close(gates[th][0])
		close(gates[th][1])
		done, err := m.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, done.Status, "%s: %s", th, done.Error)
	}
}
