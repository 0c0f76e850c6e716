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
	b := engine.NewGraph("asks")
	out := engine.Replace[string](b, "out")
	b.AddNode("ask", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		ran++
		if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
			return nil, err
		}
		return []engine.Write{out.Set("done")}, nil
	})
	b.AddEdge(engine.Start, "ask")
	agents := []*engine.Agent{{Name: "asks", Graph: mustCompile(t, b)}}

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
