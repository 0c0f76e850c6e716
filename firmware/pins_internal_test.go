package firmware

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/policy"
)

// The runtime keeps the tool sets of at most maxPins runs that have a
// record to read them from again, however many runs an appliance runs; an
// evicted run's set is read from its record at its next call.
func TestPinsAreBounded(t *testing.T) {
	ctx := context.Background()
	s := engine.NewMemoryStore()
	reg, err := policy.NewRegistry(nil)
	require.NoError(t, err)
	set, err := policy.Resolve(reg, nil, nil)
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
		got, err := rt.ActiveTools(ctx, reg, id)
		require.NoError(t, err)
		require.NotNil(t, got)
	}
	require.LessOrEqual(t, rt.pinned.size(), maxPins, "the runtime keeps a tool set per run it ever ran")

	// The first run's set, no longer kept, is read from its record again.
	got, err := rt.ActiveTools(ctx, reg, "run_00000")
	require.NoError(t, err)
	again, err := got.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, string(raw), string(again))

	// A run the store does not know keeps its set for the process's life.
	direct, err := rt.ActiveTools(ctx, reg, "run_direct")
	require.NoError(t, err)
	for i := range maxPins + 10 {
		_, err := rt.ActiveTools(ctx, reg, fmt.Sprintf("run_%05d", i))
		require.NoError(t, err)
	}
	kept, ok := rt.pinned.get("run_direct")
	require.True(t, ok)
	require.Same(t, direct, kept)
}
