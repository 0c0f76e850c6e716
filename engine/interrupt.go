package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Decision kinds.
const (
	Approve = "approve"
	Edit    = "edit"
	Reject  = "reject"
)

// Decision is a person's answer to an interrupt.
type Decision struct {
	Kind   string          `json:"decision"`
	Value  json.RawMessage `json:"value,omitempty"`
	Reason string          `json:"reason,omitempty"`
	By     string          `json:"by,omitempty"`
	At     time.Time       `json:"at,omitzero"`
}

// Validate checks the decision's kind.
func (d Decision) Validate() error {
	switch d.Kind {
	case Approve, Reject:
		return nil
	case Edit:
		if len(d.Value) == 0 {
			return fmt.Errorf("%w: edit needs a value", ErrBadDecision)
		}
		return nil
	}
	return fmt.Errorf("%w (got %q)", ErrBadDecision, d.Kind)
}

// InterruptError is returned by Interrupt when the run must pause. A node
// returns it unchanged; the engine records the interrupts durably.
type InterruptError struct {
	Interrupts []PendingInterrupt
}

func (e *InterruptError) Error() string {
	ids := make([]string, len(e.Interrupts))
	for i, in := range e.Interrupts {
		ids[i] = in.ID
	}
	return "interrupted: waiting for a decision on " + strings.Join(ids, ", ")
}

// scratch is a task's private context: where it runs and which resume values
// it has been given.
type scratch struct {
	exec      *execution
	thread    string
	ns        string
	ckpt      string
	taskID    string
	node      string
	resume    []Decision // answers to this task's interrupts, by index
	fresh     bool       // resume gained values in this attempt
	next      int        // index of the next Interrupt call
	decisions map[string]Decision
}

type scratchKey struct{}

func scratchFrom(ctx context.Context) *scratch {
	s, _ := ctx.Value(scratchKey{}).(*scratch)
	return s
}

// interruptID is stable for a given task and index, so a re-run of the same
// task raises the same interrupt, and a second Interrupt call in a node gets
// its own id instead of overwriting the first.
func interruptID(thread, ns, ckpt, task string, index int) string {
	h := xxhash.New()
	for _, p := range []string{thread, ns, ckpt, task, fmt.Sprint(index)} {
		_, _ = h.WriteString(p)
		_, _ = h.Write([]byte{0})
	}
	return fmt.Sprintf("int_%016x", h.Sum64())
}

// Interrupt pauses the run for a person's decision on payload, and returns the
// decision once the run is resumed. The node is re-run from its start on
// resume: code before Interrupt runs again and must be idempotent. Several
// calls in one node are matched to their decisions by order.
//
// Return the error unchanged from the node:
//
//	d, err := engine.Interrupt(ctx, draft)
//	if err != nil {
//		return nil, err
//	}
func Interrupt(ctx context.Context, payload any) (Decision, error) {
	sp := scratchFrom(ctx)
	if sp == nil {
		return Decision{}, fmt.Errorf("engine.Interrupt called outside a running node")
	}
	i := sp.next
	sp.next++
	if i < len(sp.resume) {
		return sp.resume[i], nil
	}
	id := interruptID(sp.thread, sp.ns, sp.ckpt, sp.taskID, i)
	if d, ok := sp.decisions[id]; ok && i == len(sp.resume) {
		sp.resume = append(sp.resume, d)
		sp.fresh = true
		return d, nil
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return Decision{}, fmt.Errorf("interrupt payload: %w", err)
	}
	return Decision{}, &InterruptError{Interrupts: []PendingInterrupt{{
		ID: id, Node: sp.node, NS: sp.ns, TaskID: sp.taskID, Index: i, Payload: raw,
	}}}
}

// Emit publishes a live progress event (a model token, a tool's progress)
// from inside a running node. Live events are not stored; they are delivered
// in order with the committed ones.
func Emit(ctx context.Context, typ string, data any) { publish(ctx, typ, data, true) }

// Announce publishes an event about state that the node itself has just
// made durable outside the checkpoint (a tool call's intent or result in
// the call log). Unlike Emit's, the event is not marked live: what it
// describes survives a crash.
func Announce(ctx context.Context, typ string, data any) { publish(ctx, typ, data, false) }

// EnsureDurable makes the running task's place in its run durable before
// the node does something a crash cannot take back: a side effect, or a
// record keyed by the task's identity (an idempotency key from InfoFrom).
// In exit durability a run's steps are committed only when it ends or
// pauses, so it commits the checkpoint the task runs from and the run's
// record, unless they are committed already (and, in a subgraph, the
// parent's, first). After a crash, recovery then finds the run, and runs
// the task again under the same task id, so with the same idempotency
// keys. In sync durability they always are committed, and it costs
// nothing; in exit durability it costs one commit per superstep that
// calls it, and none for a run that never does.
func EnsureDurable(ctx context.Context) error {
	sp := scratchFrom(ctx)
	if sp == nil || sp.exec == nil {
		return fmt.Errorf("engine.EnsureDurable called outside a running node")
	}
	return sp.exec.ensureDurable(ctx)
}

func publish(ctx context.Context, typ string, data any, live bool) {
	sp := scratchFrom(ctx)
	if sp == nil || sp.exec == nil || sp.exec.cfg.Events == nil {
		return
	}
	raw, ok := data.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			raw = json.RawMessage(`{}`)
		}
	}
	e := sp.exec
	e.cfg.Events.Publish(Event{Type: typ, Run: e.run.ID, Thread: e.cfg.Thread,
		Node: e.cfg.nodePrefix + sp.node, Data: raw, Live: live, Time: time.Now().UTC()})
}

// RunInfo tells a node which run, thread and task it serves (for idempotency
// keys of side effects).
type RunInfo struct {
	Run, Thread, NS, Checkpoint, Task, Node string
	// Path is Node's path through the subgraphs, as events name it
	// (Event.Node): "team/loop" for the node loop of the subgraph that the
	// node team runs, Node alone in the run's own graph. Node is the bare
	// name, which every instance of a subgraph shares with any node of
	// that name elsewhere: a record that a person reads names Path.
	Path string
	Step int
	// MaxTokens is the run's token budget (RunConfig.MaxTokens), for the
	// node's model calls to count against; 0 means none.
	MaxTokens int
	// Resumed says the run began in an earlier Invoke or Resume call: it
	// was resumed after a pause, or recovered after a restart. What it
	// did before is durable, but no RunValue holds it: a count kept there
	// must be rebuilt from a record (see RunValue).
	Resumed bool
	// Attempt is the run's attempt (MetaAttempt): 0 until it is first
	// recovered, one more at each recovery. A record a node keeps of its
	// work names it, so that what an attempt a crash cut short did can be
	// told from what the run's path holds.
	Attempt int
}

// InfoFrom returns the running task's identity, or false outside a node.
func InfoFrom(ctx context.Context) (RunInfo, bool) {
	sp := scratchFrom(ctx)
	if sp == nil || sp.exec == nil {
		return RunInfo{}, false
	}
	return RunInfo{Run: sp.exec.run.ID, Thread: sp.thread, NS: sp.ns, Checkpoint: sp.ckpt,
		Task: sp.taskID, Node: sp.node, Path: sp.exec.cfg.nodePrefix + sp.node, Step: sp.exec.step, MaxTokens: sp.exec.cfg.MaxTokens,
		Resumed: !sp.exec.root().fresh, Attempt: sp.exec.root().attempt}, true
}
