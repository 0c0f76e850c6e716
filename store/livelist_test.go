package store

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// heldRuns is a run manager that still holds, as it opened, a run its
// store has a record of already: the moment between a pause's commit and
// the manager letting go of the run.
type heldRuns struct{ opened []*engine.Run }

func (h heldRuns) Run(context.Context, string) (*engine.Run, error) {
	return nil, engine.ErrRunNotFound
}

func (h heldRuns) Unstored(engine.RunFilter) []*engine.Run {
	var out []*engine.Run
	for _, r := range h.opened {
		out = append(out, r.Clone())
	}
	return out
}

func (h heldRuns) SetLive(r *engine.Run) {
	for _, o := range h.opened {
		if o.ID == r.ID && r.Status == engine.StatusQueued {
			r.Status = engine.StatusRunning
		}
	}
}

// A listing by status takes a run from the manager only if the store has
// no record of it: a run stored as paused is not listed running, though
// the manager still holds it as it opened. A run with no record yet is.
func TestListLiveByStatusSkipsARunStoredUnderAnother(t *testing.T) {
	d := openTest(t)
	ctx := context.Background()
	paused := finalCommit("t1", "run-paused", engine.StatusInterrupted, "0001", nil)
	paused.Run.EndedAt = paused.Run.StartedAt
	require.NoError(t, d.Commit(ctx, paused))
	live := heldRuns{opened: []*engine.Run{
		{ID: "run-paused", Thread: "t1", Agent: "med", Status: engine.StatusQueued},
		{ID: "run-new", Thread: "t2", Agent: "med", Status: engine.StatusQueued},
	}}
	ids := func(status engine.RunStatus) map[string]engine.RunStatus {
		runs, err := ListLive(ctx, d, live, engine.RunFilter{Status: status})
		require.NoError(t, err)
		got := map[string]engine.RunStatus{}
		for _, r := range runs {
			got[r.ID] = r.Status
		}
		return got
	}
	require.Equal(t, map[string]engine.RunStatus{"run-new": engine.StatusRunning}, ids(engine.StatusRunning))
	require.Equal(t, map[string]engine.RunStatus{"run-paused": engine.StatusInterrupted}, ids(engine.StatusInterrupted))
	require.Equal(t, map[string]engine.RunStatus{"run-paused": engine.StatusInterrupted, "run-new": engine.StatusRunning}, ids(""))
}
