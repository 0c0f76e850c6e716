package store

import (
	"context"
	"errors"
	"slices"
	"sort"

	"github.com/outpost-edge/outpost/engine"
)

// LiveRuns is what the run manager that works a store knows of its runs
// beyond their records: engine.Manager. The store keeps a run queued
// until it ends or pauses (a worker's progress is not rewritten at every
// step), and in exit durability has no record of a run at all until then
// (or until it calls a tool).
type LiveRuns interface {
	// Run returns one run as it is now, stored or not.
	Run(ctx context.Context, id string) (*engine.Run, error)
	// Unstored returns the runs opened in exit durability that may have
	// no record yet, as they opened, copies, with their live status.
	Unstored(f engine.RunFilter) []*engine.Run
	// SetLive sets a run a store listed to what it is now: its live
	// status, and whether it is held (engine.Run.Held).
	SetLive(r *engine.Run)
}

// ListLive lists runs as they are now: the records rs holds, with live's
// statuses, and the runs live has not stored yet, merged in the filter's
// order, each once (its stored record over its opened one), and
// summarized as the store's are when f.Summary is set. f.Status is a live
// status: running lists the stored queued runs that a worker executes.
// f.Damaged is told of each record that cannot be read once, though each
// stored status's listing meets it. It is what GET /api/v1/runs and "outpost
// runs list" through serve's control socket show; with a nil live it is
// rs.Runs.
func ListLive(ctx context.Context, rs engine.RunStore, live LiveRuns, f engine.RunFilter) ([]*engine.Run, error) {
	if live == nil {
		return rs.Runs(ctx, f)
	}
	status, want := f.Status, f.Limit // want 0: all
	var stored []engine.RunStatus
	switch status {
	case engine.StatusQueued, engine.StatusRunning:
		stored = []engine.RunStatus{engine.StatusQueued, engine.StatusRunning}
	default:
		stored = []engine.RunStatus{status}
	}
	if damaged := f.Damaged; damaged != nil {
		told := map[string]bool{}
		f.Damaged = func(key string, err error) {
			if !told[key] {
				told[key] = true
				damaged(key, err)
			}
		}
	}
	// before reports whether run ID a comes before b in the listing's order.
	before := func(a, b string) bool { return a < b != f.Desc }
	var out []*engine.Run
	for {
		var page, unstored []*engine.Run
		if status == "" || status == engine.StatusQueued || status == engine.StatusRunning {
			// Asked first: a run the manager no longer has was stored
			// before, and the store's listing below has it.
			unstored = live.Unstored(f)
		}
		for _, st := range stored {
			f.Status = st
			runs, err := rs.Runs(ctx, f)
			if err != nil {
				return nil, err
			}
			page = append(page, runs...)
		}
		for _, run := range unstored {
			if slices.ContainsFunc(page, func(p *engine.Run) bool { return p.ID == run.ID }) {
				continue
			}
			if status != "" && storedElsewhere(ctx, rs, run.ID) {
				// Stored under a status this listing did not read: a
				// pause stores its run before the manager lets go of it.
				continue
			}
			if f.Summary {
				Summarize(run) // a copy (Unstored)
			}
			page = append(page, run)
		}
		sort.Slice(page, func(i, j int) bool { return before(page[i].ID, page[j].ID) })
		if want > 0 && len(page) > want {
			page = page[:want]
		}
		if len(page) == 0 {
			break
		}
		for _, run := range page {
			live.SetLive(run)
			if status == "" || run.Status == status {
				out = append(out, run)
			}
		}
		// A page of stored statuses that became other live ones (queued
		// runs that run, for status=queued) may hold fewer than asked
		// for: the next one starts after it.
		f.After = page[len(page)-1].ID
		if want == 0 || len(page) < want || len(out) >= want {
			break
		}
	}
	if want > 0 && len(out) > want {
		out = out[:want]
	}
	return out, nil
}

// storedElsewhere reports whether rs holds a record of run id; ListLive
// asks it of a run the manager opened that a listing by status did not
// find. A record that cannot be read counts as one: the listing names it
// as damaged where its status is listed.
func storedElsewhere(ctx context.Context, rs engine.RunStore, id string) bool {
	_, err := rs.Run(ctx, id)
	return !errors.Is(err, engine.ErrRunNotFound)
}
