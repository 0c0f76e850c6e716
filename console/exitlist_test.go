package console_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// In exit durability the store has no record of a run until it pauses or
// ends, but the runs list shows it while it runs, from the run manager:
// in every order and filter that takes it in, once, and once stored, once.
func TestListRunsShowsExitRunsNotStoredYet(t *testing.T) {
	e := newEnvWith(t, t.TempDir(), engine.ManagerOptions{Durability: engine.DurabilityExit}, nil)
	_, done := e.startRun("done", "hello", "20s")
	require.Equal(t, "completed", done["status"])
	_, live := e.startRun("live", "block me", "")
	e.waitStatus(live["id"].(string), "running")
	_, err := e.db.Run(t.Context(), live["id"].(string))
	require.ErrorIs(t, err, engine.ErrRunNotFound, "exit durability stores the run when it ends")

	liveStatus := "running"
	ids := func(query string) []any {
		r := e.do("GET", "/api/v1/runs"+query, nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var out []any
		for _, item := range r.json(t)["runs"].([]any) {
			run := item.(map[string]any)
			out = append(out, run["id"])
			if run["id"] == live["id"] {
				assert.Equal(t, liveStatus, run["status"], query)
			}
		}
		return out
	}
	both := []any{done["id"], live["id"]}
	assert.Equal(t, both, ids(""))
	assert.Equal(t, []any{live["id"], done["id"]}, ids("?order=desc"))
	assert.Equal(t, []any{live["id"]}, ids("?status=running"))
	assert.Equal(t, []any{live["id"]}, ids("?thread=live"))
	assert.Empty(t, ids("?status=interrupted"))
	assert.Equal(t, []any{live["id"]}, ids("?after="+done["id"].(string)))
	assert.Equal(t, []any{done["id"]}, ids("?order=desc&after="+live["id"].(string)))
	first := e.do("GET", "/api/v1/runs?limit=1", nil).json(t)
	assert.Len(t, first["runs"], 1)
	assert.Equal(t, done["id"], first["next"], "the opened run is on the next page")

	e.unblock()
	e.waitStatus(live["id"].(string), "completed")
	liveStatus = "completed"
	assert.Equal(t, both, ids(""), "stored, it is listed once")
}

// hookedRuns calls after, when set, once a listing of the store returns,
// and afterRun once a read of one run does.
type hookedRuns struct {
	engine.Store
	after, afterRun atomic.Pointer[func()]
}

func (h *hookedRuns) Run(ctx context.Context, id string) (*engine.Run, error) {
	run, err := h.Store.Run(ctx, id)
	if after := h.afterRun.Swap(nil); after != nil {
		(*after)()
	}
	return run, err
}

func (h *hookedRuns) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	runs, err := h.Store.Runs(ctx, f)
	if after := h.after.Swap(nil); after != nil {
		(*after)()
	}
	return runs, err
}

// exitRunToEnd starts a run in exit durability on a store that h hooks,
// and returns with it running, and end, which ends it and waits until it
// is stored and has left the manager.
func exitRunToEnd(t *testing.T) (e *env, h *hookedRuns, id string, end func()) {
	h = &hookedRuns{}
	e = newEnvWithStore(t, t.TempDir(), engine.ManagerOptions{Durability: engine.DurabilityExit},
		func(s engine.Store) engine.Store { h.Store = s; return h }, nil)
	_, live := e.startRun("live", "block me", "")
	id = live["id"].(string)
	e.waitStatus(id, "running")
	end = func() {
		e.unblock()
		run, err := e.mgr.Wait(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, run.Status)
	}
	return e, h, id, end
}

// A run that ends and is stored while the list reads the store is listed:
// the list asks the manager for its unstored runs before the store, not
// after, when the run has left the manager and the store read missed it.
func TestListRunsShowsExitRunEndingDuringTheList(t *testing.T) {
	e, h, id, end := exitRunToEnd(t)
	h.after.Store(&end)
	r := e.do("GET", "/api/v1/runs", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var ids []any
	for _, item := range r.json(t)["runs"].([]any) {
		ids = append(ids, item.(map[string]any)["id"])
	}
	assert.Equal(t, []any{id}, ids, "the run ended during the list, and is in it")
}

// A run the list takes from the manager (exit durability, not stored yet)
// is a summary too: an input over store.SummaryBytes is a preview, marked
// input_truncated, as a stored run's is.
func TestListRunsSummarizesExitRunsNotStoredYet(t *testing.T) {
	e := newEnvWith(t, t.TempDir(), engine.ManagerOptions{Durability: engine.DurabilityExit}, nil)
	big := "block me " + strings.Repeat("x", store.SummaryBytes)
	_, live := e.startRun("live", big, "")
	e.waitStatus(live["id"].(string), "running")
	r := e.do("GET", "/api/v1/runs", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	runs := r.json(t)["runs"].([]any)
	require.Len(t, runs, 1)
	run := runs[0].(map[string]any)
	assert.Equal(t, true, run["input_truncated"], "the input is previewed")
	preview, _ := run["input"].(string)
	assert.True(t, strings.HasPrefix(preview, "block me x"), "a preview of the input: %.40q", preview)
	assert.Less(t, len(preview), 1024, "a preview, not the input")
}

// A run that paused is stored, interrupted: the manager, which still holds
// it for its resume, does not list it again as it opened, queued.
func TestListRunsDoesNotListAPausedExitRunAsQueued(t *testing.T) {
	e := newEnvWith(t, t.TempDir(), engine.ManagerOptions{Durability: engine.DurabilityExit}, nil)
	_, paused := e.startRun("paused", "please review", "")
	id := paused["id"].(string)
	e.waitStatus(id, "interrupted")
	for _, query := range []string{"?status=queued", "?status=running", "?status=interrupted", ""} {
		r := e.do("GET", "/api/v1/runs"+query, nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var got []any
		for _, item := range r.json(t)["runs"].([]any) {
			run := item.(map[string]any)
			got = append(got, run["status"])
		}
		switch query {
		case "?status=queued", "?status=running":
			assert.Empty(t, got, query)
		default:
			assert.Equal(t, []any{"interrupted"}, got, query)
		}
	}
}

// A run read while it ends and is stored is found: the manager keeps what
// it holds of the run before the store is read, not after, when the run
// has left it and the store read missed it.
func TestGetRunFindsAnExitRunEndingDuringTheRead(t *testing.T) {
	e, h, id, end := exitRunToEnd(t)
	h.afterRun.Store(&end)
	r := e.do("GET", "/api/v1/runs/"+id, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
}
