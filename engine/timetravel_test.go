package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// chatGraph appends a reply to every user message and counts turns.
func chatGraph(t *testing.T, calls *counter) (*engine.Graph, engine.Chan[[]string], engine.Chan[int]) {
	b := engine.NewGraph("chat")
	msgs := engine.Append[string](b, "messages")
	turns := engine.Sum[int](b, "turns")
	b.AddNode("reply", calls.counted(func(_ context.Context, s engine.State) ([]engine.Write, error) {
		m := msgs.Get(s)
		return []engine.Write{engine.Push(msgs, "re: "+m[len(m)-1]), turns.Set(1)}, nil
	}))
	b.AddNode("audit", calls.counted(noop))
	b.AddEdge(engine.Start, "reply")
	b.AddEdge("reply", "audit")
	return mustCompile(t, b), msgs, turns
}

func TestHistoryAndStateAt(t *testing.T) {
	g, msgs, turns := chatGraph(t, newCounter())
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	for i := range 3 {
		_, err := g.Invoke(ctx, cfg, engine.Push(msgs, fmt.Sprint("m", i)))
		require.NoError(t, err)
	}
	hist, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	require.Len(t, hist, 9, "three turns of input, reply and audit checkpoints")
	for i := 1; i < len(hist); i++ {
		require.Greater(t, hist[i-1].ID, hist[i].ID, "newest first")
		require.GreaterOrEqual(t, hist[i-1].Step, hist[i].Step)
	}
	limited, err := g.History(ctx, store, "t", 2)
	require.NoError(t, err)
	require.Equal(t, hist[:2], limited)

	// Every checkpoint's state: the oldest holds only the first message.
	for i, c := range hist {
		snap, err := g.StateAt(ctx, cfg, c.ID)
		require.NoError(t, err)
		require.Equal(t, c.ID, snap.Checkpoint.ID)
		turn := (len(hist) - 1 - i) / 3 // 0, 0, 0, 1, 1, 1, ...
		pos := (len(hist) - 1 - i) % 3  // 0 input, 1 reply, 2 audit
		wantMsgs := 2*turn + 1
		wantTurns := turn
		if pos > 0 {
			wantMsgs++
			wantTurns++
		}
		require.Len(t, msgs.Get(snap), wantMsgs, "checkpoint %d", i)
		require.Equal(t, wantTurns, turns.Get(snap), "checkpoint %d", i)
	}
	_, err = g.StateAt(ctx, cfg, "ffffffffffffffff")
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound)
}

func TestForkRunsOnANewBranch(t *testing.T) {
	g, msgs, turns := chatGraph(t, newCounter())
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	for i := range 3 {
		_, err := g.Invoke(ctx, cfg, engine.Push(msgs, fmt.Sprint("m", i)))
		require.NoError(t, err)
	}
	before, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	// The end of the first turn.
	base := before[len(before)-3]
	require.Empty(t, base.Next)

	fork, err := g.Fork(ctx, cfg, base.ID)
	require.NoError(t, err)
	require.Equal(t, base.ID, fork.ParentID)
	require.Equal(t, engine.SourceFork, fork.Source)

	res, err := g.Invoke(ctx, cfg, engine.Push(msgs, "other"))
	require.NoError(t, err)
	require.Equal(t, []string{"m0", "re: m0", "other", "re: other"}, msgs.Get(res.State))
	require.Equal(t, 2, turns.Get(res.State))

	// The old branch is untouched and still readable.
	for _, c := range before {
		got, err := store.Checkpoint(ctx, "t", "", c.ID)
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	old, err := g.StateAt(ctx, cfg, before[0].ID)
	require.NoError(t, err)
	require.Equal(t, []string{"m0", "re: m0", "m1", "re: m1", "m2", "re: m2"}, msgs.Get(old))

	after, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	require.Len(t, after, len(before)+4, "fork plus the new turn's three checkpoints")
	require.Equal(t, fork.ID, after[3].ID)
	// Every checkpoint names a run that exists, or none: no run made the
	// fork.
	require.Empty(t, fork.RunID)
	for _, c := range after {
		if c.RunID != "" {
			_, err := store.Run(ctx, c.RunID)
			require.NoError(t, err, "checkpoint %s names run %s", c.ID, c.RunID)
		}
	}

	_, err = g.Fork(ctx, cfg, "")
	require.Error(t, err)
	_, err = g.Fork(ctx, cfg, "0000000000000001")
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound)
}

func TestForkMidRunResumesFromThere(t *testing.T) {
	calls := newCounter()
	g, msgs, _ := chatGraph(t, calls)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	_, err := g.Invoke(ctx, cfg, engine.Push(msgs, "hi"))
	require.NoError(t, err)
	hist, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	afterReply := hist[1]
	require.Equal(t, []string{"reply"}, afterReply.Nodes)

	_, err = g.Fork(ctx, cfg, afterReply.ID)
	require.NoError(t, err)
	res, err := g.Resume(ctx, cfg, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, 1, calls.get("reply"), "the fork replays only what came after")
	require.Equal(t, 2, calls.get("audit"))
	require.Equal(t, []string{"hi", "re: hi"}, msgs.Get(res.State))
}

func TestUpdateStateAsNode(t *testing.T) {
	calls := newCounter()
	g, msgs, turns := chatGraph(t, calls)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	_, err := g.Invoke(ctx, cfg, engine.Push(msgs, "hi"))
	require.NoError(t, err)

	c, err := g.UpdateState(ctx, cfg, "reply", engine.Push(msgs, "edited reply"), turns.Set(10))
	require.NoError(t, err)
	require.Equal(t, engine.SourceUpdate, c.Source)
	require.Equal(t, []string{"reply"}, c.Nodes)
	require.Len(t, c.Next, 1)
	require.Equal(t, "audit", c.Next[0].Node, "routes on from the named node")

	res, err := g.Resume(ctx, cfg, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, 1, calls.get("reply"))
	require.Equal(t, 2, calls.get("audit"))
	require.Equal(t, []string{"hi", "re: hi", "edited reply"}, msgs.Get(res.State))
	require.Equal(t, 11, turns.Get(res.State))

	t.Run("as Start", func(t *testing.T) {
		c, err := g.UpdateState(ctx, cfg, engine.Start, engine.Push(msgs, "again"))
		require.NoError(t, err)
		require.Equal(t, "reply", c.Next[0].Node)
	})
	t.Run("unknown node", func(t *testing.T) {
		_, err := g.UpdateState(ctx, cfg, "nobody", turns.Set(1))
		require.ErrorContains(t, err, `unknown node "nobody"`)
	})
	t.Run("wrong type", func(t *testing.T) {
		_, err := g.UpdateState(ctx, cfg, "reply", engine.Write{Channel: "turns", Value: "x"})
		require.ErrorIs(t, err, engine.ErrWrongType)
	})
}
