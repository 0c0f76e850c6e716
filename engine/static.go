package engine

import (
	"context"
	"encoding/json"
	"slices"
)

// Static interrupts pause before or after named nodes, for debugging. They
// are keyed by the checkpoint they pause at, so approving one lets the run go
// past that point once.
const (
	staticBefore = "__before__"
	staticAfter  = "__after__"
)

// staticInterrupt pauses the run when the head was produced by an
// interrupt-after node or schedules an interrupt-before node, unless a
// decision for that pause was given.
func (e *execution) staticInterrupt(ctx context.Context, decisions map[string]Decision) (bool, error) {
	if e.head == nil {
		return false, nil
	}
	for _, when := range []string{staticAfter, staticBefore} {
		var hit []string
		if when == staticAfter {
			if e.head.Source != SourceLoop {
				continue
			}
			for _, n := range e.head.Nodes {
				if slices.Contains(e.g.after, n) {
					hit = append(hit, n)
				}
			}
		} else {
			for _, t := range e.next {
				if slices.Contains(e.g.before, t.Node) && !slices.Contains(hit, t.Node) {
					hit = append(hit, t.Node)
				}
			}
		}
		if len(hit) == 0 {
			continue
		}
		id := interruptID(e.cfg.Thread, e.cfg.ns, e.head.ID, when, 0)
		if d, ok := decisions[id]; ok {
			if d.Kind == Reject {
				reason := d.Reason
				if reason == "" {
					reason = "no reason given"
				}
				return true, e.end(ctx, StatusCancelled, &rejectedError{reason: reason})
			}
			continue
		}
		payload, _ := json.Marshal(map[string]any{"when": when[2 : len(when)-2], "nodes": hit})
		in := PendingInterrupt{ID: id, Node: hit[0], NS: e.cfg.ns, TaskID: when, Payload: payload}
		head, err := e.uncommitted()
		if err != nil {
			return true, e.fail(ctx, err)
		}
		raw, _ := json.Marshal([]PendingInterrupt{in})
		c := &Commit{Checkpoint: head, Writes: []CommitWrites{{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID,
			Write: PendingWrite{TaskID: when, Node: hit[0], Kind: WriteKindInterrupt, Data: raw}}}}
		e.run.Status = StatusInterrupted
		e.run.Interrupts = []PendingInterrupt{in}
		e.runChanged = true
		e.event(EventInterrupt, hit[0], in)
		return true, e.commit(ctx, c)
	}
	return false, nil
}

type rejectedError struct{ reason string }

func (e *rejectedError) Error() string { return ErrRejected.Error() + ": " + e.reason }
func (e *rejectedError) Unwrap() error { return ErrRejected }
