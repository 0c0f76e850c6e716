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
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// The child runs from init, before TestMain, as the tool crash test's does.
func init() {
	if dir := os.Getenv("OUTPOST_CRASHLOOP_CHILD"); dir != "" {
		if err := crashLoopChild(dir, os.Getenv("OUTPOST_CRASHLOOP_START") != ""); err != nil {
			fmt.Fprintln(os.Stderr, "crash-loop child:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
}

// crashLoopAgents are "boom", whose one node kills the process, and "ok",
// which answers at once.
func crashLoopAgents() (engine.Resolver, error) {
	boom := engine.NewGraph("boom")
	engine.Replace[string](boom, "out")
	boom.AddNode("kill", func(context.Context, engine.State) ([]engine.Write, error) {
		self, err := os.FindProcess(os.Getpid())
		if err == nil {
			err = self.Kill() // SIGKILL: no deferred call, no clean shutdown
		}
		if err != nil {
			return nil, err
		}
		select {} // the signal is on its way
	})
	boom.AddEdge(engine.Start, "kill")
	ok := engine.NewGraph("ok")
	out := engine.Replace[string](ok, "out")
	ok.AddNode("answer", func(context.Context, engine.State) ([]engine.Write, error) {
		return []engine.Write{out.Set("served")}, nil
	})
	ok.AddEdge(engine.Start, "answer")
	agents := map[string]*engine.Agent{}
	for _, b := range []*engine.Builder{boom, ok} {
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

// crashLoopChild is one start of the appliance, with the manager's
// default options: it recovers what an earlier start left running and
// waits for it, then starts the boom run (start) or serves two runs, one
// on the boom run's thread.
func crashLoopChild(dir string, start bool) error {
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	resolve, err := crashLoopAgents()
	if err != nil {
		return err
	}
	m := engine.NewManager(db, resolve, engine.ManagerOptions{})
	defer m.Close()
	if _, err := m.Recover(ctx); err != nil {
		return err
	}
	runs, err := db.Runs(ctx, engine.RunFilter{Thread: "loop"})
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

func TestCrashLoopIsStopped(t *testing.T) {
	dir := t.TempDir()
	// startChild runs one start of the appliance to its end and reports
	// how it ended.
	startChild := func(env ...string) error {
		self, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(append(os.Environ(), "OUTPOST_CRASHLOOP_CHILD="+dir), env...)
		cmd.Stderr = os.Stderr
		return cmd.Run()
	}
	killed := func(err error) bool {
		var ee *exec.ExitError
		return errors.As(err, &ee) && !ee.Exited() // ended by a signal
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
