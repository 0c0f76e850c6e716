package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A run whose thread no longer holds the checkpoint it paused at (a store
// salvaged after damage lost it) is not resumed: it would go on from an
// earlier state, or an empty one, under decisions about a pause it cannot
// see, and end with an outcome it never reached. The resume is refused and
// the run stays interrupted, for a person to cancel.
func TestResumeRefusedWhenThePauseIsLost(t *testing.T) {
	ctx := context.Background()
	ran := 0
	agents := asksAgent(t, &ran, 1)

	_, first, _ := startLife(t, engine.NewMemoryStore(), engine.ManagerOptions{Workers: 1}, agents...)
	started, err := first.Start(ctx, engine.RunRequest{Thread: "t", Agent: "asks"})
	require.NoError(t, err)
	run := waitFor(t, first, started.ID)
	require.Equal(t, engine.StatusInterrupted, run.Status)
	first.Close()
	// The copy keeps the run's record and loses every checkpoint of its
	// thread.
	damaged := engine.NewMemoryStore()
	require.NoError(t, damaged.Commit(ctx, &engine.Commit{Run: run}))

	_, m, _ := startLife(t, damaged, engine.ManagerOptions{Workers: 1}, agents...)
	defer m.Close()
	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound, "the run was resumed from a thread that lost its pause")
	require.ErrorContains(t, err, "the checkpoint it paused at is not in the store")
	after, err := damaged.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, after.Status, "the run stays interrupted, for a person to cancel")
	require.Equal(t, 1, ran, "the node ran again")
	require.NoError(t, m.Cancel(ctx, run.ID), "a person can still cancel it")
	require.Equal(t, engine.StatusCancelled, waitFor(t, m, run.ID).Status)
}

// The same holds where the thread kept an earlier run's checkpoints and
// lost those of the run that paused: it would go on from the earlier
// run's end.
func TestResumeRefusedWhenThePauseIsLostBehindAnEarlierRun(t *testing.T) {
	ctx := context.Background()
	ran := 0
	agents := asksAgent(t, &ran, 2)

	whole := engine.NewMemoryStore()
	_, first, _ := startLife(t, whole, engine.ManagerOptions{Workers: 1}, agents...)
	var runs []*engine.Run
	for range 2 {
		started, err := first.Start(ctx, engine.RunRequest{Thread: "t", Agent: "asks"})
		require.NoError(t, err)
		runs = append(runs, waitFor(t, first, started.ID))
	}
	first.Close()
	require.Equal(t, engine.StatusCompleted, runs[0].Status)
	require.Equal(t, engine.StatusInterrupted, runs[1].Status)

	// The copy keeps both records and the first run's checkpoints alone.
	history, err := whole.History(ctx, "t", "", "", 0)
	require.NoError(t, err)
	damaged := engine.NewMemoryStore()
	kept := 0
	for i := len(history) - 1; i >= 0; i-- {
		if history[i].RunID == runs[0].ID {
			require.NoError(t, damaged.Commit(ctx, &engine.Commit{Checkpoint: history[i]}))
			kept++
		}
	}
	require.NotZero(t, kept)
	for _, r := range runs {
		require.NoError(t, damaged.Commit(ctx, &engine.Commit{Run: r}))
	}

	_, m, _ := startLife(t, damaged, engine.ManagerOptions{Workers: 1}, agents...)
	defer m.Close()
	paused := runs[1]
	_, err = m.Resume(ctx, paused.ID, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound, "the run was resumed from the earlier run's end")
	after, err := damaged.Run(ctx, paused.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, after.Status)
	require.Equal(t, 2, ran, "the node ran again")
}

// asksAgent is an agent of one node that asks a person from its from-th
// execution on, counting its executions in ran.
func asksAgent(t *testing.T, ran *int, from int) []*engine.Agent {
	t.Helper()
	b := engine.NewGraph("asks")
	out := engine.Replace[string](b, "out")
	b.AddNode("ask", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		*ran++
		if *ran >= from {
			if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
				return nil, err
			}
		}
		return []engine.Write{out.Set("done")}, nil
	})
	b.AddEdge(engine.Start, "ask")
	return []*engine.Agent{{Name: "asks", Graph: mustCompile(t, b)}}
}
