package crashtest

// A crash is the doing of one run, but every run that was running beside
// it is cut short too. This test runs a killer, whose node SIGKILLs the
// process every time it runs, beside a slow bystander that is cut short
// before its first step commits, and starts the process again and again
// on one bbolt store. The crash-loop guard must stop the killer only: the
// bystander, run alone once it is a suspect, makes progress and ends.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

const bystanderSteps = 3

// bystanderAgents are "killer", whose node kills the process once the
// bystander has begun its step (or a moment has passed: it runs alone),
// and "bystander", whose steps take a while each.
func bystanderAgents() (engine.Resolver, error) {
	began := make(chan struct{})
	var once sync.Once
	killer := engine.NewGraph("killer")
	engine.Replace[string](killer, "out")
	killer.AddNode("kill", func(context.Context, engine.State) ([]engine.Write, error) {
		select {
		case <-began:
		case <-time.After(300 * time.Millisecond):
		}
		return nil, killSelf()
	})
	killer.AddEdge(engine.Start, "kill")
	bystander := engine.NewGraph("bystander")
	steps := engine.Sum[int](bystander, "steps")
	prev := engine.Start
	for i := range bystanderSteps {
		node := fmt.Sprintf("step%d", i)
		bystander.AddNode(node, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			once.Do(func() { close(began) })
			select {
			case <-time.After(150 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return []engine.Write{steps.Set(1)}, nil
		})
		bystander.AddEdge(prev, node)
		prev = node
	}
	return compileAgents(killer, bystander)
}

// bystanderChild starts the bystander and then the killer (start), or
// waits for the runs the start recovered.
func bystanderChild(ctx context.Context, db *store.DB, m *engine.Manager, start bool) error {
	if !start {
		return waitUnfinished(ctx, db, m, "")
	}
	if _, err := m.Start(ctx, engine.RunRequest{Thread: "bystander", Agent: "bystander"}); err != nil {
		return err
	}
	_, err := m.Invoke(ctx, engine.RunRequest{Thread: "loop", Agent: "killer"})
	return err
}

func TestCrashLoopSparesTheRunsBesideIt(t *testing.T) {
	for _, limit := range []int{engine.DefaultMaxRecoveries, 1} {
		t.Run(fmt.Sprintf("max %d recoveries", limit), func(t *testing.T) {
			crashLoopBesideABystander(t, limit)
		})
	}
}

// crashLoopBesideABystander runs the killer beside the bystander, with
// limit as the recovery limit, until the killer is given up, and checks
// that the bystander ended.
func crashLoopBesideABystander(t *testing.T, limit int) {
	dir := t.TempDir()
	child := "OUTPOST_BYSTANDER_CHILD=" + dir
	limitEnv := fmt.Sprintf("OUTPOST_MAX_RECOVERIES=%d", limit)
	err := startChild(t, child, limitEnv, "OUTPOST_BYSTANDER_START=1")
	require.True(t, killed(err), "the killer kills the process that starts it (%v)", err)
	// With the default limit, the first recovery runs both runs together
	// and counts both; after that each is a suspect and runs alone, so
	// only the killer's crashes count against it, and the bystander,
	// whichever goes first, ends. With a limit of 1 each is a suspect at
	// its first recovery already.
	for i := 1; i <= limit; i++ {
		err := startChild(t, child, limitEnv)
		require.True(t, killed(err), "start %d: the recovered killer kills the process again (%v)", i, err)
	}
	require.NoError(t, startChild(t, child, limitEnv), "start %d: the process should serve, with the killer given up", limit+1)

	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	runs, err := db.Runs(ctx, engine.RunFilter{})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	for _, r := range runs {
		switch r.Agent {
		case "bystander":
			require.Equal(t, engine.StatusCompleted, r.Status, "the bystander is not the cause of the crashes: %s", r.Error)
			require.Equal(t, bystanderSteps, r.Steps)
		case "killer":
			require.Equal(t, engine.StatusFailed, r.Status)
			require.Contains(t, r.Error, engine.ErrCrashLoop.Error())
			require.Contains(t, r.Error, fmt.Sprintf("recovered %d times", limit))
		}
	}
	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "db check: %v", rep.Problems)
}
