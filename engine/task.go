package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

// taskResult is one task's outcome in a superstep.
type taskResult struct {
	spec      TaskSpec
	writes    []Write
	err       error
	attempts  int
	saved     bool // writes came from a pending write
	resume    []Decision
	newResume bool
}

// runStep runs the tasks of the current superstep, concurrently up to the
// configured bound. Tasks with saved writes are not run again.
func (e *execution) runStep(ctx context.Context, decisions map[string]Decision) []taskResult {
	results := make([]taskResult, len(e.next))
	for i := range e.next {
		t := e.next[i]
		if t.ID == "" {
			t.ID = taskID(e.head.ID, t.Node, i)
		}
		results[i].spec = t
		for _, w := range e.writes[t.ID] {
			switch w.Kind {
			case WriteKindWrites:
				ws, err := e.decodeWrites(ctx, w.Writes)
				results[i].writes, results[i].err, results[i].saved = ws, err, err == nil
			case WriteKindResume:
				var ds []Decision
				if err := json.Unmarshal(w.Data, &ds); err == nil {
					results[i].resume = ds
				}
			}
		}
	}
	var todo []int
	for i := range results {
		if !results[i].saved {
			todo = append(todo, i)
		}
	}
	multi := len(results) > 1
	run := func(i int) {
		r := &results[i]
		r.writes, r.attempts, r.err = e.runTask(ctx, r, decisions)
		if r.err == nil && multi && e.commitsEachStep() {
			// Save the task's writes now, so a crash or a failing sibling
			// does not make it run again.
			if err := e.saveWrites(ctx, r); err != nil {
				r.err = err
			}
		}
	}
	if len(todo) == 1 {
		run(todo[0])
		return results
	}
	sem := make(chan struct{}, e.cfg.MaxConcurrency)
	var wg sync.WaitGroup
	for _, i := range todo {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			run(i)
		}()
	}
	wg.Wait()
	return results
}

func (e *execution) pendingWrite(r *taskResult) (PendingWrite, map[BlobRef][]byte, error) {
	pw := PendingWrite{TaskID: r.spec.ID, Node: r.spec.Node, Kind: WriteKindWrites}
	blobs := map[BlobRef][]byte{}
	for _, w := range r.writes {
		spec := e.g.channels[w.Channel]
		b, err := spec.encode(w.Value)
		if err != nil {
			return pw, nil, fmt.Errorf("encode write to %q: %w", w.Channel, err)
		}
		v := Value{Inline: b}
		if len(b) > BlobThreshold {
			ref := RefOf(b)
			blobs[ref] = b
			v = Value{Blob: ref}
		}
		pw.Writes = append(pw.Writes, ChannelValue{Channel: w.Channel, Value: v})
	}
	return pw, blobs, nil
}

func (e *execution) saveWrites(ctx context.Context, r *taskResult) error {
	pw, blobs, err := e.pendingWrite(r)
	if err != nil {
		return err
	}
	c := &Commit{Blobs: blobs, Sync: true, Writes: []CommitWrites{{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID, Write: pw}}}
	// Saved, the task is not run again: that is its run's progress, and
	// the first writes saved after a recovery take the count off.
	root := e.carryCount(c)
	if err := e.store.Commit(context.WithoutCancel(ctx), c); err != nil {
		return fmt.Errorf("save writes of task %s (%s): %w", r.spec.ID, r.spec.Node, err)
	}
	root.countedProgress()
	r.saved = true
	return nil
}

func (e *execution) decodeWrites(ctx context.Context, cvs []ChannelValue) ([]Write, error) {
	out := make([]Write, 0, len(cvs))
	for _, cv := range cvs {
		spec := e.g.channels[cv.Channel]
		if spec == nil {
			return nil, fmt.Errorf("saved write to undeclared channel %q", cv.Channel)
		}
		v, err := decodeValue(ctx, e.blobs, spec, cv.Value)
		if err != nil {
			return nil, fmt.Errorf("saved write to %q: %w", cv.Channel, err)
		}
		out = append(out, Write{Channel: cv.Channel, Value: v})
	}
	return out, nil
}

// runTask runs one task with its retry policy, timeout and panic guard.
func (e *execution) runTask(ctx context.Context, r *taskResult, decisions map[string]Decision) ([]Write, int, error) {
	n := e.g.nodes[r.spec.Node]
	if n == nil {
		return nil, 0, fmt.Errorf("checkpoint schedules unknown node %q", r.spec.Node)
	}
	var input any
	if len(r.spec.Input) > 0 {
		input = json.RawMessage(r.spec.Input)
	}
	st := &view{g: e.g, vals: e.vals, input: input, node: n.name, step: e.step}
	p := n.retry
	attempts := max(p.MaxAttempts, 1)
	classify := p.Classify
	if classify == nil {
		classify = KindOf
	}
	if e.cfg.Events != nil {
		e.cfg.Events.Publish(Event{Type: EventNodeStarted, Run: e.run.ID, Thread: e.cfg.Thread,
			Node: e.cfg.nodePrefix + n.name, Time: time.Now().UTC(), Data: json.RawMessage(`{"task":"` + r.spec.ID + `"}`), Live: true})
	}
	var err error
	for a := 1; ; a++ {
		sp := &scratch{exec: e, thread: e.cfg.Thread, ns: e.cfg.ns, ckpt: e.head.ID, taskID: r.spec.ID,
			node: n.name, resume: slices.Clone(r.resume), decisions: decisions}
		var ws []Write
		ws, err = e.call(ctx, n, st, sp)
		if sp.fresh {
			r.resume, r.newResume = sp.resume, true
		}
		if err == nil {
			if err = e.checkWrites(n.name, ws); err == nil {
				return ws, a, nil
			}
		}
		var ie *InterruptError
		if errors.As(err, &ie) || ctx.Err() != nil {
			return nil, a, err
		}
		kind := classify(err)
		if kind == Permanent || a >= attempts {
			return nil, a, &NodeError{Node: n.name, Attempts: a, Kind: kind, Err: err}
		}
		if err := sleepCtx(ctx, backoff(p, a)); err != nil {
			return nil, a, err
		}
	}
}

func (e *execution) call(ctx context.Context, n *node, st *view, sp *scratch) (ws []Write, err error) {
	cctx := context.WithValue(ctx, scratchKey{}, sp)
	if n.timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeoutCause(cctx, n.timeout, &nodeTimeoutError{node: n.name, d: n.timeout})
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			err = MarkPermanent(fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
	}()
	ws, err = n.fn(cctx, st)
	if err != nil && cctx.Err() != nil && ctx.Err() == nil {
		// The node's own timeout fired: report it as such.
		if cause := context.Cause(cctx); cause != nil {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}
	return ws, err
}

func backoff(p RetryPolicy, attempt int) time.Duration {
	initial, factor, maxD := p.Initial, p.Factor, p.Max
	if initial <= 0 {
		initial = 100 * time.Millisecond
	}
	if factor < 1 {
		factor = 2
	}
	if maxD <= 0 {
		maxD = 10 * time.Second
	}
	d := float64(initial)
	for i := 1; i < attempt; i++ {
		d *= factor
		if d > float64(maxD) {
			d = float64(maxD)
			break
		}
	}
	if p.Jitter {
		d = rand.Float64() * d
	}
	return time.Duration(d)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
