package firmware

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/policy"
)

// The runtime keeps the tool sets of at most maxPins runs, however many runs
// an appliance runs; a run's set no longer kept is found again as it was
// at its next call.
func TestPinsAreBounded(t *testing.T) {
	ctx := context.Background()
	s := engine.NewMemoryStore()
	reg, err := policy.NewRegistry([]policy.Tool{{Name: "kb_search", Kind: policy.KindRead,
		Description: "search", Schema: json.RawMessage(`{"type":"object"}`)}})
	require.NoError(t, err)
	set, err := policy.Resolve(reg, nil, nil, nil)
	require.NoError(t, err)
	raw, err := set.MarshalJSON()
	require.NoError(t, err)

	rt := &Runtime{Runs: s}
	n := maxPins + 200
	for i := range n {
		id := fmt.Sprintf("run_%05d", i)
		run := &engine.Run{ID: id, Thread: "t" + id, Agent: "a", Status: engine.StatusRunning,
			Meta: map[string]string{MetaActiveTools: string(raw)}, CreatedAt: time.Now().UTC()}
		require.NoError(t, s.Commit(ctx, &engine.Commit{Run: run, Sync: true}))
		got, err := rt.ActiveTools(ctx, reg, nil, id)
		require.NoError(t, err)
		require.NotNil(t, got)
	}
	require.LessOrEqual(t, rt.pinned.size(), maxPins, "the runtime keeps a tool set per run it ever ran")

	// The first run's set, no longer kept, is read from its record again.
	got, err := rt.ActiveTools(ctx, reg, nil, "run_00000")
	require.NoError(t, err)
	again, err := got.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(again))

	// A run the store does not know gets the same set again once it is no
	// longer kept.
	direct, err := rt.ActiveTools(ctx, reg, nil, "run_direct")
	require.NoError(t, err)
	for i := range maxPins + 10 {
		_, err := rt.ActiveTools(ctx, reg, nil, fmt.Sprintf("run_%05d", i))
		require.NoError(t, err)
	}
	_, kept := rt.pinned.get("run_direct")
	require.False(t, kept)
	again2, err := rt.ActiveTools(ctx, reg, nil, "run_direct")
	require.NoError(t, err)
	require.Equal(t, []string{"kb_search"}, again2.Names())
	require.Equal(t, direct.Names(), again2.Names())
	require.LessOrEqual(t, rt.pinned.size(), maxPins)
}
