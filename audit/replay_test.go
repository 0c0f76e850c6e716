package audit

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/policy"
)

// graph asks the model, then has a person review the answer.
func graph(t *testing.T, p models.Provider, log agent.CallLog, blobs engine.BlobStore, suffix string) *engine.Graph {
	t.Helper()
	b := engine.NewGraph("audit")
	input := engine.Replace[string](b, "input")
	draft := engine.Replace[string](b, "draft")
	final := engine.Replace[string](b, "final")
	mc := &agent.ModelCall{Provider: p, Log: log, Blobs: blobs, Lane: &policy.Lane{Agent: "audit", Models: []string{"scripted"}}}
	b.AddNode("generate", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "scripted", Messages: []models.Message{{Role: models.RoleUser, Content: input.Get(s)}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{draft.Set(resp.Message.Content + suffix)}, nil
	})
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, draft.Get(s))
		if err != nil {
			return nil, err
		}
		if d.Kind == engine.Edit {
			return []engine.Write{final.Set(strings.Trim(string(d.Value), `"`))}, nil
		}
		return []engine.Write{final.Set(draft.Get(s))}, nil
	})
	b.AddEdge(engine.Start, "generate").AddEdge("generate", "review")
	g, err := b.Compile()
	require.NoError(t, err)
	return g
}

// original runs two turns, the second edited by a person, and returns the
// store, the call log and the second run.
func original(t *testing.T) (*engine.MemoryStore, agent.CallLog, *engine.Run) {
	t.Helper()
	ctx := context.Background()
	store := engine.NewMemoryStore()
	log := agent.NewMemoryCallLog()
	p, err := scripted.New([]scripted.Rule{{Match: "(?i)metformin", Respond: "Take metformin when remembered [kb-01]."}})
	require.NoError(t, err)
	g := graph(t, p, log, store, "")
	in := engine.Replace[string](engine.NewGraph("x"), "input")
	var last *engine.Run
	for i, text := range []string{"I forgot my metformin", "metformin again"} {
		res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store}, in.Set(text))
		require.NoError(t, err)
		require.Equal(t, engine.StatusInterrupted, res.Run.Status)
		d := engine.Decision{Kind: engine.Approve, By: "nurse"}
		if i == 1 {
			d = engine.Decision{Kind: engine.Edit, Value: []byte(`"call your pharmacist"`), By: "nurse"}
		}
		res, err = g.Resume(ctx, engine.RunConfig{Thread: "t", Store: store, Run: res.Run},
			map[string]engine.Decision{res.Run.Interrupts[0].ID: d})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		last = res.Run
	}
	return store, log, last
}

func TestReplayReachesTheSameState(t *testing.T) {
	store, log, run := original(t)
	g := graph(t, NoModel{}, ReplayLog{Original: log}, store, "")
	rep, err := Replay(context.Background(), g, store, run)
	require.NoError(t, err)
	require.True(t, rep.Same, "%v", rep.Diff)
	require.Equal(t, 2, rep.Steps)
}

func TestReplaySaysWhereItParts(t *testing.T) {
	store, log, run := original(t)
	// The graph changed since: generate now appends to the model's answer.
	g := graph(t, NoModel{}, ReplayLog{Original: log}, store, " (revised)")
	rep, err := Replay(context.Background(), g, store, run)
	require.NoError(t, err)
	require.False(t, rep.Same)
	require.Equal(t, "draft", rep.Diff.Channel)
	require.Equal(t, []string{"generate"}, rep.Diff.Nodes)
	require.Contains(t, rep.Diff.Replayed, "(revised)")
	require.NotContains(t, rep.Diff.Original, "(revised)")
}

func TestReplayNeverCallsTheModel(t *testing.T) {
	store, _, run := original(t)
	// An empty record: the replay needs a model answer it does not have.
	g := graph(t, NoModel{}, ReplayLog{Original: agent.NewMemoryCallLog()}, store, "")
	rep, err := Replay(context.Background(), g, store, run)
	require.NoError(t, err)
	require.False(t, rep.Same)
	require.Contains(t, rep.Diff.Detail, "the replay stopped before")
	require.Contains(t, rep.Diff.Detail, "a model call to scripted that the original run did not make")
}

// A run recorded with a durability other than sync or exit is refused: older
// binaries ran such a value in exit mode, with no per-step checkpoints.
func TestReplayRefusesAnUnknownDurability(t *testing.T) {
	store, log, run := original(t)
	g := graph(t, NoModel{}, ReplayLog{Original: log}, store, "")
	for d, want := range map[engine.Durability]error{"bogus": engine.ErrBadDurability, engine.DurabilityExit: nil} {
		r := *run
		r.Durability = d
		_, err := Replay(context.Background(), g, store, &r)
		require.Error(t, err, "durability %q", d)
		if want != nil {
			require.ErrorIs(t, err, want)
		} else {
			require.Contains(t, err.Error(), "exit durability")
		}
	}
}
