package engine

import (
	"strconv"
	"time"
)

// A run's active time: how long it has been running, summed over the
// stretches between its start, its pauses and its end, without the time
// it waited for a person or for the appliance to start again. The wall-time
// budget (RunConfig.MaxDuration) bounds it, across resumes and recovery
// alike, so that neither gives a run its whole budget again.
//
// The run record keeps it in Meta, written with the record at each pause
// and at the end (the record is not rewritten at every step):
//   - MetaActive, the active time of the stretches that ended, in
//     milliseconds;
//   - MetaRunningSince, while the run runs again after a pause or a
//     recovery, when that stretch began.
//
// A run that ran in one stretch, from its start to its end (most runs),
// keeps neither: its active time is the span between StartedAt (when it
// began running, after any wait in the manager's queue) and EndedAt, and
// its record is not made any larger for it.
//
// A crash ends a stretch without a word. Recovery counts it up to the
// newest checkpoint the run committed, from MetaRunningSince, or from the
// run's creation when no stretch has ended yet. A stretch that committed
// nothing (exit durability) counts for nothing. The run manager puts both
// keys on record as it recovers a run, before the run executes anything
// (see Manager.Recover), so that the next stretch is counted from the
// recovery even when it too ends in a crash. What a crash cuts off after
// a run's newest commit is not counted: no record says how long it ran.
// The recovery limit (ManagerOptions.MaxRecoveries) bounds how many such
// stretches a run that makes no progress gets, and each stretch is cut at
// the budget that is left.
const (
	MetaActive       = "engine.active_ms"
	MetaRunningSince = "engine.running_since"
)

// Active returns r's active time as its record holds it: the stretches
// that ended before its last pause, or all of them once it has ended.
func (r *Run) Active() time.Duration {
	if d, ok := r.recordedActive(); ok {
		return d
	}
	if r.EndedAt.IsZero() {
		return 0
	}
	from := r.StartedAt
	if from.IsZero() {
		from = r.CreatedAt
	}
	return max(r.EndedAt.Sub(from), 0)
}

// recordedActive is the active time r's record keeps (MetaActive), and
// whether it keeps one.
func (r *Run) recordedActive() (time.Duration, bool) {
	v, ok := r.Meta[MetaActive]
	if !ok {
		return 0, false
	}
	ms, _ := strconv.ParseInt(v, 10, 64)
	return time.Duration(max(ms, 0)) * time.Millisecond, true
}

// activeUpTo is r's active time as a resume or a recovery finds it, with
// head the thread's newest checkpoint: what the record keeps, plus the
// stretch a crash cut short, counted up to head when r committed it. kept
// says the record keeps its active time (MetaActive).
func (r *Run) activeUpTo(head *Checkpoint) (d time.Duration, kept bool) {
	d, kept = r.recordedActive()
	var since time.Time
	if v, ok := r.Meta[MetaRunningSince]; ok {
		since, _ = time.Parse(time.RFC3339Nano, v)
	} else if !kept {
		since = r.CreatedAt
	}
	// A run's own input checkpoint ends no stretch: a run that starts
	// from it (every new run) has nothing to count, nor to rewrite.
	if head != nil && head.RunID == r.ID && head.Source != SourceInput && !since.IsZero() && head.Created.After(since) {
		d += head.Created.Sub(since)
	}
	return d, kept
}

// startActive starts the clock of a stretch of the root run: it takes the
// active time before it from the record, plus, after a crash, the stretch
// the crash cut short. A stretch after a pause or a recovery is put on
// record at the run's next commit, so that a later crash is counted from
// it rather than from the time before the appliance stopped.
func (e *execution) startActive() {
	e.activeFrom = e.cfg.now()
	if e.cfg.ns != "" || e.run == nil {
		return
	}
	if e.fresh {
		// A new run starts running now, after any wait in the manager's
		// queue: its first stretch runs from StartedAt.
		e.run.StartedAt = e.activeFrom.UTC()
	}
	before, paused := e.run.activeUpTo(e.head)
	e.activeBefore = before
	e.stretched = !e.fresh || before > 0 || paused
	if before > 0 || paused {
		e.setMeta(strconv.FormatInt(before.Milliseconds(), 10), e.activeFrom.UTC().Format(time.RFC3339Nano))
		e.runChanged = true
	}
}

// stopActive puts the active time, this stretch included, on the record,
// unless the run ran in one stretch from its start (see Run.Active).
func (e *execution) stopActive() {
	if e.cfg.ns != "" || e.run == nil {
		return
	}
	if !e.stretched && e.run.Status.Terminal() {
		return // Run.Active is EndedAt - StartedAt
	}
	total := e.activeBefore + e.cfg.now().Sub(e.activeFrom)
	e.setMeta(strconv.FormatInt(total.Milliseconds(), 10), "")
}

// setMeta sets the run's MetaActive to active and its MetaRunningSince to
// since (or removes it, with ""), in a new map: the one it replaces may be
// shared (with the request the run came from, or a result handed out).
func (e *execution) setMeta(active, since string) {
	m := make(map[string]string, len(e.run.Meta)+2)
	for key, val := range e.run.Meta {
		m[key] = val
	}
	m[MetaActive] = active
	if since == "" {
		delete(m, MetaRunningSince)
	} else {
		m[MetaRunningSince] = since
	}
	e.run.Meta = m
}
