package crashtest

// A run whose step kills its own process (the out-of-memory killer, a bug
// that crashes the binary) would be recovered at every start and kill the
// process again: the appliance would never serve anyone. This test has a
// node SIGKILL its own process every time it runs, starts the process again
// and again on one bbolt store, and checks that after the default recovery
// limit the run ends failed, naming the count, and the process serves on.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// The children of this file's test and of bystander_test.go's run from
// init, before TestMain, as the tool crash test's does. PREFIX_CHILD names
// a child's store, and PREFIX_START asks it to start the first runs.
func init() {
	children := map[string]applianceStart{
		"OUTPOST_CRASHLOOP": {crashLoopAgents, crashLoopChild},
		"OUTPOST_BYSTANDER": {bystanderAgents, bystanderChild},
	}
	for prefix, c := range children {
		if dir := os.Getenv(prefix + "_CHILD"); dir != "" {
			if err := c.start(dir, os.Getenv(prefix+"_START") != ""); err != nil {
				fmt.Fprintf(os.Stderr, "%s child: %v\n", prefix, err)
				os.Exit(3)
			}
			os.Exit(0)
		}
	}
}

// crashLoopAgents are "boom", whose one node kills the process, and "ok",
// which answers at once.
func crashLoopAgents() (engine.Resolver, error) {
	boom := engine.NewGraph("boom")
	engine.Replace[string](boom, "out")
	boom.AddNode("kill", func(context.Context, engine.State) ([]engine.Write, error) {
		return nil, killSelf()
	})
	boom.AddEdge(engine.Start, "kill")
	ok := engine.NewGraph("ok")
	out := engine.Replace[string](ok, "out")
	ok.AddNode("answer", func(context.Context, engine.State) ([]engine.Write, error) {
		return []engine.Write{out.Set("served")}, nil
	})
	ok.AddEdge(engine.Start, "answer")
	return compileAgents(boom, ok)
}

// killSelf sends the process SIGKILL: no deferred call runs, and nothing
// shuts down cleanly. It returns only an error.
func killSelf() error {
	self, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = self.Kill()
	}
	if err != nil {
		return err
	}
	select {} // the signal is on its way
}

// compileAgents resolves each graph's name to an agent that runs it.
func compileAgents(graphs ...*engine.Builder) (engine.Resolver, error) {
	agents := map[string]*engine.Agent{}
	for _, b := range graphs {
		g, err := b.Compile()
		if err != nil {
			return nil, err
		}
		agents[g.Name()] = &engine.Agent{Name: g.Name(), Graph: g}
	}
	return func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if a := agents[name]; a != nil {
			return a, nil
		}
		return nil, fmt.Errorf("%w: %s", engine.ErrUnknownAgent, name)
	}, nil
}

// applianceStart is one start of the appliance in a child process: its
// agents, and what it does once it has recovered what an earlier start
// left running (start: it is the first start).
type applianceStart struct {
	agents func() (engine.Resolver, error)
	run    func(ctx context.Context, db *store.DB, m *engine.Manager, start bool) error
}

// start opens the store in dir and a manager with the default options
// over it (but for OUTPOST_MAX_RECOVERIES, when set), recovers, and runs
// the child.
func (c applianceStart) start(dir string, start bool) error {
	ctx := context.Background()
	resolve, err := c.agents()
	if err != nil {
		return err
	}
	var opts engine.ManagerOptions
	if v := os.Getenv("OUTPOST_MAX_RECOVERIES"); v != "" {
		if opts.MaxRecoveries, err = strconv.Atoi(v); err != nil {
			return err
		}
	}
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	m := engine.NewManager(db, resolve, opts)
	defer m.Close()
	if _, err := m.Recover(ctx); err != nil {
		return err
	}
	return c.run(ctx, db, m, start)
}

// waitUnfinished waits for the runs on thread ("" for all) that are not
// over yet: those the manager recovered.
func waitUnfinished(ctx context.Context, db *store.DB, m *engine.Manager, thread string) error {
	runs, err := db.Runs(ctx, engine.RunFilter{Thread: thread})
	if err != nil {
		return err
	}
	for _, r := range runs {
		if !r.Status.Terminal() {
			if _, err := m.Wait(ctx, r.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// crashLoopChild waits for what the start recovered, then starts the boom
// run (start) or serves two runs, one on the boom run's thread.
func crashLoopChild(ctx context.Context, db *store.DB, m *engine.Manager, start bool) error {
	if err := waitUnfinished(ctx, db, m, "loop"); err != nil {
		return err
	}
	if start {
		_, err := m.Invoke(ctx, engine.RunRequest{Thread: "loop", Agent: "boom"})
		return err
	}
	for _, thread := range []string{"other", "loop"} {
		run, err := m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: "ok"})
		if err != nil {
			return err
		}
		if run.Status != engine.StatusCompleted {
			return fmt.Errorf("run %s on thread %s ended %s: %s", run.ID, thread, run.Status, run.Error)
		}
	}
	return nil
}

// startChild runs one start of the appliance, this test binary with env
// added, to its end and reports how it ended.
func startChild(t *testing.T, env ...string) error {
	return childStarter(t, env...)().Wait()
}

// killed says the child ended by a signal: its own SIGKILL.
func killed(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && !ee.Exited()
}

func TestCrashLoopIsStopped(t *testing.T) {
	dir := t.TempDir()
	startChild := func(env ...string) error {
		return startChild(t, append(env, "OUTPOST_CRASHLOOP_CHILD="+dir)...)
	}

	err := startChild("OUTPOST_CRASHLOOP_START=1")
	require.True(t, killed(err), "the boom run kills the process that starts it (%v)", err)
	for i := 1; i <= engine.DefaultMaxRecoveries; i++ {
		err := startChild()
		require.True(t, killed(err), "start %d: the recovered run kills the process again (%v)", i, err)
	}
	require.NoError(t, startChild(), "start %d: the process should serve, with the crashing run given up", engine.DefaultMaxRecoveries+1)

	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	loop, err := db.Runs(ctx, engine.RunFilter{Thread: "loop"})
	require.NoError(t, err)
	require.Len(t, loop, 2)
	boom, next := loop[0], loop[1]
	require.Equal(t, "boom", boom.Agent)
	require.Equal(t, engine.StatusFailed, boom.Status)
	require.Contains(t, boom.Error, fmt.Sprintf("recovered %d times and crashed each time", engine.DefaultMaxRecoveries))
	require.Equal(t, engine.StatusCompleted, next.Status, "a new run on the thread is served")
	other, err := db.Runs(ctx, engine.RunFilter{Thread: "other"})
	require.NoError(t, err)
	require.Len(t, other, 1)
	require.Equal(t, engine.StatusCompleted, other[0].Status)

	// The failure left an outcome, as any run's end does.
	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "db check: %v", rep.Problems)
	outcomes, err := db.Outcomes(ctx, 0, 100)
	require.NoError(t, err)
	var statuses []engine.RunStatus
	for _, o := range outcomes {
		if o.Run == boom.ID {
			statuses = append(statuses, o.Status)
		}
	}
	require.Equal(t, []engine.RunStatus{engine.StatusFailed}, statuses)
}
