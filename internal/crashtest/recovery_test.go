package crashtest

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// reviewAgent drafts, asks a person, then closes with what they decided.
func reviewAgent(t *testing.T, drafted *atomic.Int32) *engine.Agent {
	b := engine.NewGraph("review")
	draft := engine.Replace[string](b, "draft")
	final := engine.Replace[string](b, "final")
	b.AddNode("draft", func(_ context.Context, _ engine.State) ([]engine.Write, error) {
		drafted.Add(1)
		return []engine.Write{draft.Set("take it when remembered")}, nil
	})
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, map[string]string{"draft": draft.Get(s)})
		if err != nil {
			return nil, err
		}
		switch d.Kind {
		case engine.Edit:
			var v string
			if err := json.Unmarshal(d.Value, &v); err != nil {
				return nil, err
			}
			return []engine.Write{final.Set(v)}, nil
		case engine.Reject:
			return []engine.Write{final.Set("rejected: " + d.Reason)}, nil
		}
		return []engine.Write{final.Set(draft.Get(s))}, nil
	})
	b.AddEdge(engine.Start, "draft")
	b.AddEdge("draft", "review")
	g, err := b.Compile()
	require.NoError(t, err)
	return &engine.Agent{Name: "review", Graph: g, Output: func(s engine.State) json.RawMessage {
		out, _ := json.Marshal(final.Get(s))
		return out
	}}
}

// An interrupted run survives a restart: it stays interrupted with its
// interrupt listed, the thread stays reserved for it, and a decision given
// to the new process finishes it without re-running the committed step.
func TestInterruptedRunSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var drafted atomic.Int32
	agent := reviewAgent(t, &drafted)
	resolve := func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil }

	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	m := engine.NewManager(db, resolve, engine.ManagerOptions{})
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t1", Agent: "review"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, run.Status)
	require.Len(t, run.Interrupts, 1)
	interruptID := run.Interrupts[0].ID
	m.Close()
	require.NoError(t, db.Close())

	db, err = store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	m = engine.NewManager(db, resolve, engine.ManagerOptions{})
	defer m.Close()
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "an interrupted run is not resumed by itself")

	stored, err := db.Run(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, stored.Status)
	require.Len(t, stored.Interrupts, 1)
	require.Equal(t, interruptID, stored.Interrupts[0].ID)
	require.JSONEq(t, `{"draft":"take it when remembered"}`, string(stored.Interrupts[0].Payload))

	_, err = m.Start(ctx, engine.RunRequest{Thread: "t1", Agent: "review"})
	require.ErrorIs(t, err, engine.ErrThreadBusy, "the paused run keeps its thread")

	_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{interruptID: {Kind: engine.Edit, Value: json.RawMessage(`"call your pharmacist"`), By: "nurse"}})
	require.NoError(t, err)
	done, err := m.Wait(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
	require.JSONEq(t, `"call your pharmacist"`, string(done.Output))
	require.Equal(t, int32(1), drafted.Load(), "the committed draft step never ran again")
	require.Len(t, done.Decisions, 1)
	require.Equal(t, "nurse", done.Decisions[0].By)
	require.Equal(t, engine.Edit, done.Decisions[0].Decision)
}

// A second process on the same data folder is refused quickly, naming the
// folder, while the first holds it.
func TestSecondOwnerRefused(t *testing.T) {
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	_, err = store.OpenDir(dir, store.Options{})
	require.ErrorIs(t, err, store.ErrInUse)
	require.Contains(t, err.Error(), dir)
}

// The same for a review inside a subgraph, in both durabilities: after a
// restart the interrupt is listed as it was, and the decision finishes the
// run without re-running the committed draft.
func TestSubgraphInterruptSurvivesRestart(t *testing.T) {
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		t.Run(string(d), func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			var drafted atomic.Int32
			inner := reviewAgent(t, &drafted)
			b := engine.NewGraph("outer")
			engine.Replace[string](b, "draft")
			final := engine.Replace[string](b, "final")
			b.AddSubgraph("reviewed", inner.Graph)
			b.AddEdge(engine.Start, "reviewed")
			g, err := b.Compile()
			require.NoError(t, err)
			agent := &engine.Agent{Name: "outer", Graph: g, Output: func(s engine.State) json.RawMessage {
				out, _ := json.Marshal(final.Get(s))
				return out
			}}
			resolve := func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil }

			db, err := store.OpenDir(dir, store.Options{})
			require.NoError(t, err)
			m := engine.NewManager(db, resolve, engine.ManagerOptions{Durability: d})
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t1", Agent: "outer"})
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, run.Status)
			require.Len(t, run.Interrupts, 1)
			in := run.Interrupts[0]
			require.NotEmpty(t, in.NS)
			m.Close()
			require.NoError(t, db.Close())

			db, err = store.OpenDir(dir, store.Options{})
			require.NoError(t, err)
			defer db.Close()
			m = engine.NewManager(db, resolve, engine.ManagerOptions{Durability: d})
			defer m.Close()
			_, err = m.Recover(ctx)
			require.NoError(t, err)
			stored, err := db.Run(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, stored.Status)
			require.Equal(t, []engine.PendingInterrupt{in}, stored.Interrupts)

			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{in.ID: {Kind: engine.Approve, By: "nurse"}})
			require.NoError(t, err)
			done, err := m.Wait(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
			require.JSONEq(t, `"take it when remembered"`, string(done.Output))
			require.Equal(t, int32(1), drafted.Load(), "the committed draft step never ran again")
		})
	}
}
