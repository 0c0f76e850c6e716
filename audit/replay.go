// Package audit re-executes past runs to check that they are reproducible:
// Replay runs a finished run again, on a scratch copy of its thread, with
// every model response and tool result served from what the original run
// recorded, and says exactly where the two part, if they do. A recorded
// answer is served only to the question it answered: a call that asks a
// model or a tool something the original did not is stopped and named.
//
// The entry points are Replay and ReplayLog; the graph to replay must be
// built with a ReplayLog and a model provider that fails (NoModel), so that
// nothing outside the record can enter the replay.
package audit

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
)

// ErrDiverged is wrapped by the errors of a replay that left the record: a
// call the original did not make, an interrupt it was not asked.
var ErrDiverged = errors.New("replay diverged from the original run")

// Report is the outcome of a replay.
type Report struct {
	Run   string `json:"run"`
	Steps int    `json:"steps"`
	// Same is true when every checkpoint of the replay equals the
	// original's, channel by channel, and the run ends the same way.
	Same bool        `json:"same"`
	Diff *Difference `json:"difference,omitempty"`
	// Notes name the recorded calls the replay could not check against
	// what it asked: their records, made by older versions, keep no
	// digest of the request. They were served all the same.
	Notes []string `json:"notes,omitempty"`
}

// Difference is the first place where replay and original part.
type Difference struct {
	Step int `json:"step"`
	// Namespace names the subgraph instance where they part ("" for the
	// run's own graph).
	Namespace string `json:"namespace,omitempty"`
	// Checkpoint is the original's checkpoint where they part; for a call
	// (Call), the one its task ran from.
	Checkpoint string   `json:"checkpoint,omitempty"`
	Nodes      []string `json:"nodes,omitempty"`
	Channel    string   `json:"channel,omitempty"`
	Original   string   `json:"original"`
	Replayed   string   `json:"replayed"`
	Detail     string   `json:"detail"`
	// Call, Tool and Part are set when the replay asked a recorded call
	// something other than the original asked: the call's key, its tool
	// ("model:NAME" for a model call), and the part that differs ("model",
	// "messages", "message N", "tools", "tool NAME", "options", "request";
	// "tool", "argument NAME", "arguments"). Original and Replayed then
	// show digests, and at most the first few dozen characters of a
	// message or an argument, with personal data masked.
	Call string `json:"call,omitempty"`
	Tool string `json:"tool,omitempty"`
	Part string `json:"part,omitempty"`
}

func (d *Difference) String() string {
	return fmt.Sprintf("step %d %v: %s", d.Step, d.Nodes, d.Detail)
}

// Replay re-executes run (which must have ended or paused) with graph g,
// which must be the graph of the run's pinned bundle, built over a
// ReplayLog. src is the store that holds the original.
func Replay(ctx context.Context, g *engine.Graph, src engine.Store, run *engine.Run) (*Report, error) {
	if !run.Status.Terminal() && run.Status != engine.StatusInterrupted {
		return nil, fmt.Errorf("replay run %s: it is %s; only a run that ended or paused can be replayed", run.ID, run.Status)
	}
	if run.Durability != "" {
		// An unknown value was run in exit mode by older binaries.
		if _, err := engine.ParseDurability(string(run.Durability)); err != nil {
			return nil, fmt.Errorf("replay run %s: %w", run.ID, err)
		}
	}
	if run.Durability == engine.DurabilityExit {
		return nil, fmt.Errorf("replay run %s: it ran with exit durability, which keeps no per-step checkpoints to compare", run.ID)
	}
	mine, err := ofRun(ctx, src, run, "")
	if err != nil {
		return nil, fmt.Errorf("replay run %s: %w", run.ID, err)
	}
	if len(mine) == 0 || mine[0].Source != engine.SourceInput {
		return nil, fmt.Errorf("replay run %s: its input checkpoint is gone (pruned?)", run.ID)
	}
	input, steps := mine[0], mine[1:]

	scratch := engine.NewMemoryStore()
	if err := copyChain(ctx, src, scratch, input); err != nil {
		return nil, fmt.Errorf("replay run %s: %w", run.ID, err)
	}
	ids := &originalIDs{ctx: ctx, src: src, run: run, next: map[string]map[string]string{}}
	ids.next[""], err = successors("", mine)
	if err != nil {
		return nil, fmt.Errorf("replay run %s: %w", run.ID, err)
	}
	ctx, found := withFindings(ctx)
	replayed := &engine.Run{ID: run.ID, Thread: run.Thread, Agent: run.Agent, Status: engine.StatusRunning,
		Bundle: run.Bundle, CorrelationID: run.CorrelationID, Input: run.Input, CreatedAt: run.CreatedAt}
	cfg := engine.RunConfig{Thread: run.Thread, Store: scratch, Run: replayed, IDs: ids.id, StepLimit: 1 << 20}
	res, err := g.Resume(ctx, cfg, nil)
	// Interrupts are answered with the decisions the original recorded.
	for err == nil && res.Run.Status == engine.StatusInterrupted {
		ds := map[string]engine.Decision{}
		for _, in := range res.Run.Interrupts {
			i := slices.IndexFunc(run.Decisions, func(d engine.DecisionRecord) bool { return d.Interrupt == in.ID })
			if i < 0 {
				break
			}
			d := run.Decisions[i]
			ds[in.ID] = engine.Decision{Kind: d.Decision, Value: d.Value, Reason: d.Reason, By: d.By, At: d.At}
		}
		if len(ds) < len(res.Run.Interrupts) {
			break // the original paused here too, or diverged: compared below
		}
		cfg.Run = res.Run
		res, err = g.Resume(ctx, cfg, ds)
	}
	if ids.err != nil {
		return nil, fmt.Errorf("replay run %s: %w", run.ID, ids.err)
	}
	rep := &Report{Run: run.ID, Steps: len(steps), Notes: found.sortedNotes()}
	if c := found.first(); c != nil {
		// Asked something else, the call was stopped, and what follows
		// differs too. The report names the call, unless the state had
		// parted already where it ran, before the call was made (the
		// checkpoint a call names is the one its task ran from; ids grow
		// with time).
		rep.Diff = c
		d, derr := compareNS(ctx, src, scratch, run, c.Namespace)
		if derr != nil {
			return nil, fmt.Errorf("replay run %s: %w", run.ID, derr)
		}
		if d != nil && d.Checkpoint != "" && d.Checkpoint <= c.Checkpoint {
			d.Detail += fmt.Sprintf("; then call %s (%s) asks something other than the original (%s)", c.Call, c.Tool, c.Part)
			rep.Diff = d
		}
		return rep, nil
	}
	got, herr := ofRun(ctx, scratch, run, "")
	if herr != nil {
		return nil, herr
	}
	theirs := slices.DeleteFunc(got, func(c *engine.Checkpoint) bool { return c.Source == engine.SourceInput })
	if d, derr := compare(ctx, src, scratch, steps, theirs); derr != nil {
		return nil, derr
	} else if d != nil {
		if why := replayError(res, err); why != "" && d.Replayed == "" {
			d.Detail += ", because " + why
		}
		rep.Diff = d
		return rep, nil
	}
	// Then the subgraphs' checkpoints, namespace by namespace, parents
	// before the subgraphs nested in them: a subgraph hands back only the
	// channels its parent shares, so a replay that parts inside one (in
	// its own conversation, say) may leave the root's checkpoints equal.
	for _, ns := range ids.namespaces() {
		if d, derr := compareNS(ctx, src, scratch, run, ns); derr != nil {
			return nil, fmt.Errorf("replay run %s: %w", run.ID, derr)
		} else if d != nil {
			rep.Diff = d
			return rep, nil
		}
	}
	status := engine.RunStatus("")
	if res != nil {
		status = res.Run.Status
	}
	if err != nil && !errors.Is(err, ErrDiverged) && status == "" {
		return nil, fmt.Errorf("replay run %s: %w", run.ID, err)
	}
	if status != run.Status {
		detail := fmt.Sprintf("the run ends %s, the original %s", status, run.Status)
		if err != nil {
			detail += ": " + err.Error()
		}
		rep.Diff = &Difference{Step: len(steps), Original: string(run.Status), Replayed: string(status), Detail: detail}
		return rep, nil
	}
	rep.Same = true
	return rep, nil
}

// compareNS returns the first difference between the checkpoints the
// original (in src) and the replay (in scratch) made in namespace ns; in
// the root namespace, their input checkpoints left out (the replay's is a
// copy).
func compareNS(ctx context.Context, src, scratch engine.Store, run *engine.Run, ns string) (*Difference, error) {
	want, err := ofRun(ctx, src, run, ns)
	if err != nil {
		return nil, err
	}
	got, err := ofRun(ctx, scratch, run, ns)
	if err != nil {
		return nil, err
	}
	if ns == "" {
		isInput := func(c *engine.Checkpoint) bool { return c.Source == engine.SourceInput }
		want, got = slices.DeleteFunc(want, isInput), slices.DeleteFunc(got, isInput)
	}
	d, err := compare(ctx, src, scratch, want, got)
	if d != nil && ns != "" {
		d.Namespace, d.Detail = ns, fmt.Sprintf("in subgraph %s: %s", ns, d.Detail)
	}
	return d, err
}

// originalIDs gives each checkpoint of a replay the id that the original
// run gave the checkpoint in the same place: in the same namespace, after
// the same parent. A subgraph's namespace is named after the parent's task
// that runs it (node name and task id, see engine.RunConfig.IDs), and a
// task id after the checkpoint its step starts from and the task's place
// in the step; so once the root's checkpoints have their original ids,
// each instance of a subgraph (several at one step under a fan-out, one
// inside another when nested) runs in the namespace the original instance
// ran in, and its checkpoints take that instance's ids, and its calls its
// keys. A checkpoint the original has no counterpart for (the replay went
// on past it, or ran in a namespace it never ran in) gets a new id, so
// its calls have keys the record lacks: a divergence, named by its key.
type originalIDs struct {
	ctx context.Context
	src engine.Store
	run *engine.Run

	mu sync.Mutex
	// next maps namespace and parent checkpoint id to the id of the
	// original's checkpoint that followed that parent, loaded the first
	// time the replay commits in the namespace.
	next map[string]map[string]string
	err  error
}

// namespaces lists the subgraph namespaces the replay committed in, in
// order of their names.
func (o *originalIDs) namespaces() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for ns := range o.next {
		if ns != "" {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out
}

// id implements engine.RunConfig.IDs. Sibling subgraphs ask concurrently.
func (o *originalIDs) id(ns, parent string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	m, ok := o.next[ns]
	if !ok {
		cs, err := ofRun(o.ctx, o.src, o.run, ns)
		if err == nil {
			m, err = successors(ns, cs)
		}
		if err != nil {
			o.err = cmp.Or(o.err, fmt.Errorf("the original's checkpoints in namespace %q: %w", ns, err))
			return ""
		}
		o.next[ns] = m
	}
	return m[parent]
}

// successors maps the parent of each of cs, the checkpoints one run made
// in namespace ns, to that checkpoint's id. Within one namespace a run
// commits a chain, each checkpoint on the one before it; two checkpoints
// on one parent would make the mapping ambiguous, and are refused.
func successors(ns string, cs []*engine.Checkpoint) (map[string]string, error) {
	m := map[string]string{}
	for _, c := range cs {
		if other, ok := m[c.ParentID]; ok {
			return nil, fmt.Errorf("checkpoints %s and %s of namespace %q both follow %q", other, c.ID, ns, c.ParentID)
		}
		m[c.ParentID] = c.ID
	}
	return m, nil
}

// ofRun lists the checkpoints that run made in namespace ns of its thread
// in s, oldest first.
func ofRun(ctx context.Context, s engine.Checkpointer, run *engine.Run, ns string) ([]*engine.Checkpoint, error) {
	hist, err := s.History(ctx, run.Thread, ns, "", 0)
	if err != nil {
		return nil, err
	}
	var out []*engine.Checkpoint
	for _, c := range hist {
		if c.RunID == run.ID {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// copyChain copies c and its ancestors, with the blobs they name, into dst.
func copyChain(ctx context.Context, src engine.Store, dst *engine.MemoryStore, c *engine.Checkpoint) error {
	var chain []*engine.Checkpoint
	for cur := c; ; {
		chain = append(chain, cur)
		if cur.ParentID == "" {
			break
		}
		p, err := src.Checkpoint(ctx, cur.Thread, cur.NS, cur.ParentID)
		if err != nil {
			return err
		}
		cur = p
	}
	for i := len(chain) - 1; i >= 0; i-- {
		cp := *chain[i]
		blobs := map[engine.BlobRef][]byte{}
		for _, cv := range cp.Channels {
			if !cv.Value.Blob.IsZero() {
				b, err := src.Blob(ctx, cv.Value.Blob)
				if err != nil {
					return err
				}
				blobs[cv.Value.Blob] = b
			}
		}
		if err := dst.Commit(ctx, &engine.Commit{Checkpoint: &cp, Blobs: blobs, Sync: true}); err != nil {
			return err
		}
	}
	return nil
}

// compare returns the first difference between two runs' checkpoints.
func compare(ctx context.Context, src, dst engine.Store, want, got []*engine.Checkpoint) (*Difference, error) {
	for i := 0; i < max(len(want), len(got)); i++ {
		if i >= len(got) {
			w := want[i]
			return &Difference{Step: w.Step, Checkpoint: w.ID, Nodes: w.Nodes, Original: fmt.Sprint(w.Nodes),
				Detail: fmt.Sprintf("the replay stopped before the original's step %d (%v)", w.Step, w.Nodes)}, nil
		}
		if i >= len(want) {
			g := got[i]
			return &Difference{Step: g.Step, Checkpoint: g.ID, Nodes: g.Nodes, Replayed: fmt.Sprint(g.Nodes),
				Detail: fmt.Sprintf("the replay went on past the original's end, with step %d (%v)", g.Step, g.Nodes)}, nil
		}
		w, g := want[i], got[i]
		if !slices.Equal(w.Nodes, g.Nodes) {
			return &Difference{Step: w.Step, Checkpoint: w.ID, Nodes: w.Nodes, Original: fmt.Sprint(w.Nodes), Replayed: fmt.Sprint(g.Nodes),
				Detail: fmt.Sprintf("different nodes ran: original %v, replay %v", w.Nodes, g.Nodes)}, nil
		}
		wv, err := channelBytes(ctx, src, w)
		if err != nil {
			return nil, err
		}
		gv, err := channelBytes(ctx, dst, g)
		if err != nil {
			return nil, err
		}
		names := map[string]bool{}
		for k := range wv {
			names[k] = true
		}
		for k := range gv {
			names[k] = true
		}
		keys := make([]string, 0, len(names))
		for k := range names {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, ch := range keys {
			if !bytes.Equal(wv[ch], gv[ch]) {
				return &Difference{Step: w.Step, Checkpoint: w.ID, Nodes: w.Nodes, Channel: ch,
					Original: clip(wv[ch]), Replayed: clip(gv[ch]),
					Detail: fmt.Sprintf("channel %q differs after %v", ch, w.Nodes)}, nil
			}
		}
	}
	return nil, nil
}

func channelBytes(ctx context.Context, s engine.Store, c *engine.Checkpoint) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, cv := range c.Channels {
		b := cv.Value.Inline
		if !cv.Value.Blob.IsZero() {
			var err error
			if b, err = s.Blob(ctx, cv.Value.Blob); err != nil {
				return nil, fmt.Errorf("checkpoint %s channel %s: %w", c.ID, cv.Channel, err)
			}
		}
		out[cv.Channel] = b
	}
	return out, nil
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:197]) + "..."
	}
	return string(b)
}

// ReplayLog answers a replay's calls from the original run's records. A
// call the original did not complete, or one that asks something other
// than the original asked (see VerifyRequest), is refused with
// ErrDiverged: a replay never runs a tool or asks a model.
type ReplayLog struct{ Original agent.CallLog }

// Get returns the original record.
func (l ReplayLog) Get(ctx context.Context, key string) (*agent.CallRecord, error) {
	return l.Original.Get(ctx, key)
}

// Intent returns the original record, which must hold the call's outcome
// and have been asked what rec asks: a tool call's name and arguments, a
// model call's failed attempt its request's hash and digest.
func (l ReplayLog) Intent(ctx context.Context, rec agent.CallRecord) (*agent.CallRecord, error) {
	orig, err := l.Original.Get(ctx, rec.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: call %s (%s) was not made by the original run", ErrDiverged, rec.Key, rec.Tool)
	}
	if !orig.Done() {
		return nil, fmt.Errorf("%w: call %s (%s) has no recorded outcome", ErrDiverged, rec.Key, rec.Tool)
	}
	if strings.HasPrefix(rec.Key, agent.ModelKeyPrefix(rec.Run)) {
		// A model call's failed attempt (agent's "#spent" records): a
		// replay of a call the original never got an answer to fails
		// there too, and records its attempt as the original did.
		err = verifyModelCall(ctx, *orig, askedBy(rec))
	} else {
		err = verifyToolCall(ctx, orig, rec)
	}
	if err != nil {
		return nil, err
	}
	return orig, nil
}

// Done accepts only the outcome the original recorded.
func (l ReplayLog) Done(ctx context.Context, key string, result json.RawMessage, errText string) error {
	orig, err := l.Original.Get(ctx, key)
	if err != nil || !orig.Done() {
		return fmt.Errorf("%w: call %s has no recorded outcome", ErrDiverged, key)
	}
	return nil
}

// NoModel is the model provider of a replay: every model call must be
// answered from the record, so reaching it means the replay diverged.
type NoModel struct{}

// Name implements models.Provider.
func (NoModel) Name() string { return "replay" }

// Chat implements models.Provider.
func (NoModel) Chat(_ context.Context, req models.Request, _ func(models.Chunk) error) (*models.Response, error) {
	return nil, fmt.Errorf("%w: a model call to %s that the original run did not make", ErrDiverged, req.Model)
}

// replayError is why a replay ended early, if it did.
func replayError(res *engine.Result, err error) string {
	if err != nil {
		return err.Error()
	}
	if res != nil && res.Run.Error != "" {
		return res.Run.Error
	}
	return ""
}
