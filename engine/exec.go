package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultStepLimit bounds the supersteps of one run, as LangGraph.js does.
const DefaultStepLimit = 25

// RunConfig says where and how a graph runs.
type RunConfig struct {
	Thread string
	// Store keeps checkpoints and blobs. Nil means a fresh MemoryStore,
	// which forgets everything when the call returns.
	Store Checkpointer
	Blobs BlobStore // defaults to Store when it is also a BlobStore
	// Run is the run record to keep up to date (ID, agent, bundle...). Nil
	// starts a new one.
	Run        *Run
	Durability Durability // default sync
	// StepLimit bounds the run's supersteps, its subgraphs' included
	// (Run.Steps); default DefaultStepLimit. Past it the run ends
	// budget_exceeded.
	StepLimit int
	// MaxConcurrency bounds the tasks of one superstep that run at once.
	MaxConcurrency int // default 16
	// MaxDuration is the run's wall-time budget (0: none). It bounds the
	// run's active time, summed over its stretches between pauses and
	// restarts, without the time it waits for a person (see Run.Active).
	MaxDuration time.Duration
	// MaxTokens is the run's token budget (0: none). The engine does not
	// count tokens: nodes that call models read it from RunInfo and count
	// them against it (package agent does), subgraphs' nodes included.
	MaxTokens int
	Events    EventSink
	// EventValues names channels whose value a node.completed event
	// carries when its node wrote them (see EventNodeCompleted): a reader
	// of the stream then knows the value as of that step, which a read of
	// the run later may find changed by a later step.
	EventValues []string
	Cache       *StateCache
	// Output derives the run record's output from the final state.
	Output func(State) json.RawMessage
	// IDs, when set, supplies the ids of new checkpoints, the root
	// graph's and its subgraphs': ns is the checkpoint's namespace ("" for
	// the root) and parent the id of the checkpoint before it there (""
	// for the first of a namespace). An audit replay re-executes a run
	// under its original ids, so that its task ids, the namespaces of its
	// subgraphs (named after those task ids) and its idempotency keys are
	// the original ones. Ids must keep increasing within a namespace; ""
	// leaves the id to the engine.
	IDs func(ns, parent string) string

	ns         string
	nodePrefix string
	// parent is the execution whose task runs this one, as a subgraph
	// node (nil for the root graph).
	parent *execution
	// clock, when set, stands in for the wall clock where a run's active
	// time and its record's times are read (see now): tests that check
	// the wall-time budget move it themselves, so that a loaded machine's
	// scheduling does not move their margins.
	clock func() time.Time
}

// now is the time by cfg's clock: the wall clock unless one is set.
func (cfg *RunConfig) now() time.Time {
	if cfg.clock != nil {
		return cfg.clock()
	}
	return time.Now()
}

// Result is how a call to Invoke or Resume ended.
type Result struct {
	Run   *Run
	State *Snapshot
}

// Snapshot is the state at one checkpoint.
type Snapshot struct {
	vals       values
	Checkpoint *Checkpoint
	// Next names the nodes that run next (empty when the thread is done).
	Next     []string
	Versions map[string]uint64
}

// Value implements State.
func (s *Snapshot) Value(c string) (any, bool) { v, ok := s.vals[c]; return v, ok }

// Input implements State.
func (s *Snapshot) Input() any { return nil }

// Node implements State.
func (s *Snapshot) Node() string { return "" }

// Step implements State.
func (s *Snapshot) Step() int {
	if s.Checkpoint == nil {
		return 0
	}
	return s.Checkpoint.Step
}

// Channels lists the channels that have a value.
func (s *Snapshot) Channels() []string {
	out := make([]string, 0, len(s.vals))
	for k := range s.vals {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// MarshalJSON renders the channel values.
func (s *Snapshot) MarshalJSON() ([]byte, error) { return json.Marshal(map[string]any(s.vals)) }

// execution is one Invoke or Resume call in progress.
type execution struct {
	g     *Graph
	cfg   RunConfig
	store Checkpointer
	blobs BlobStore
	run   *Run

	vals     values
	versions map[string]uint64
	step     int
	next     []TaskSpec
	// head is the newest checkpoint, committed or (in exit mode) not.
	head *Checkpoint
	// committed is the newest committed checkpoint's id.
	committed string
	// baseLen holds, for each channel changed since the last commit, the
	// length of append channels at that commit (0 for other kinds).
	changed map[string]int
	blobBuf map[BlobRef][]byte
	events  []Event
	// writes are the pending writes saved against head, by task id.
	writes map[string][]PendingWrite
	// runChanged says the run record differs from the stored one in more
	// than its step count and head.
	runChanged bool
	// sizes holds each channel's encoded size as committed (see
	// cachedState.sizes); sizesShared says the cache holds it too.
	sizes       map[string]int64
	sizesShared bool
	// versionsShared says versions is also held by the cache or a result,
	// so the next bump must copy it; valsShared says the same of vals. A
	// view given to a task or router shares vals too, but only while it
	// runs, and no step's writes are applied meanwhile.
	versionsShared bool
	valsShared     bool
	// owned marks append channels whose array this execution allocated, so
	// it may append in place (see channelSpec.extend).
	owned map[string]bool
	// startStatus is the status the input checkpoint is committed with
	// (queued under the run manager).
	startStatus RunStatus
	// activeBefore is the run's active time before this execution, and
	// activeFrom when this execution started running it (see active.go).
	activeBefore time.Duration
	activeFrom   time.Time
	// durable serializes, between the step's tasks, ensureDurable, the
	// subgraphs' hand-over of their events (see commit) and, in the root
	// execution, the subgraphs' count of their steps (see countStep).
	durable sync.Mutex
	// fresh: this execution started the run from its input. stretched:
	// the run's record keeps its active time in Meta, for it has paused
	// or been recovered, and is not running in one stretch from its start
	// (see active.go).
	fresh, stretched bool
	// attempt is the run's attempt (see MetaAttempt), read from its
	// record when the execution loads it and counted on by a recovery.
	attempt int
	// runValues holds what nodes keep with RunValue, made on first use,
	// under runValuesMu.
	runValuesMu sync.Mutex
	runValues   map[any]any
	// countOnRecord says, in a recovered run's root execution, that the
	// stored record still holds the recovery count that run leaves out
	// (see Manager.markRecovery). The first commit of progress that
	// carries the record, the root's or a subgraph's step or a task's
	// saved writes, takes it off and calls progressed.
	countOnRecord atomic.Bool
	progressed    func()
	// commitUntilProgress: in exit durability, commit each step of this
	// recovered run's root, and of the subgraphs it runs, as sync would
	// until one takes the recovery count off (see Manager.markRecovery).
	commitUntilProgress bool
}

func (g *Graph) newExecution(cfg RunConfig) (*execution, error) {
	if cfg.Thread == "" {
		return nil, fmt.Errorf("run config: thread is required")
	}
	if cfg.Store == nil {
		m := NewMemoryStore()
		cfg.Store = m
	}
	if cfg.Blobs == nil {
		b, ok := cfg.Store.(BlobStore)
		if !ok {
			return nil, fmt.Errorf("run config: store is not a BlobStore; set Blobs")
		}
		cfg.Blobs = b
	}
	if err := cfg.Durability.check(); err != nil {
		return nil, fmt.Errorf("run config: %w", err)
	}
	if cfg.Durability == "" {
		cfg.Durability = DurabilitySync
	}
	if cfg.StepLimit <= 0 {
		cfg.StepLimit = DefaultStepLimit
	}
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = 16
	}
	run := cfg.Run
	if run == nil {
		run = &Run{ID: NewRunID(), Thread: cfg.Thread, Agent: g.name, CreatedAt: cfg.now().UTC()}
	}
	if cfg.ns != "" {
		run = &Run{ID: run.ID, Thread: run.Thread, Agent: g.name}
	}
	run.Durability = cfg.Durability
	return &execution{g: g, cfg: cfg, store: cfg.Store, blobs: cfg.Blobs, run: run,
		changed: map[string]int{}, blobBuf: map[BlobRef][]byte{}}, nil
}

// Invoke runs the graph on a thread with input writes, from the thread's
// newest checkpoint. It returns when the run completes, pauses at an
// interrupt, or fails; the error is non-nil unless it completed or paused.
func (g *Graph) Invoke(ctx context.Context, cfg RunConfig, input ...Write) (*Result, error) {
	e, err := g.newExecution(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, ""); err != nil {
		return e.result(), err
	}
	if err := e.applyInput(ctx, input); err != nil {
		return e.result(), err
	}
	err = e.loop(ctx, nil)
	return e.result(), err
}

// Resume continues a thread from its newest checkpoint: the tasks of the
// unfinished superstep run, except those whose writes were saved. decisions
// answer pending interrupts by id; resuming with none is how a run is
// recovered after a crash.
func (g *Graph) Resume(ctx context.Context, cfg RunConfig, decisions map[string]Decision) (*Result, error) {
	e, err := g.newExecution(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, ""); err != nil {
		return e.result(), err
	}
	if cfg.Run == nil {
		if err := e.adoptRun(ctx); err != nil {
			return e.result(), err
		}
	} else if cfg.Run.Status == StatusBudgetExceeded {
		return e.result(), overBudgetRun(cfg.Run)
	}
	if len(decisions) > 0 {
		pending := e.pendingInterrupts()
		for id, d := range decisions {
			if err := d.Validate(); err != nil {
				return e.result(), err
			}
			i := slices.IndexFunc(pending, func(p PendingInterrupt) bool { return p.ID == id })
			if i < 0 {
				return e.result(), fmt.Errorf("%w: %s", ErrUnknownInterrupt, id)
			}
			if err := g.checkDecision(e.cfg.ns, pending[i], d); err != nil {
				return e.result(), err
			}
		}
	}
	err = e.loop(ctx, decisions)
	return e.result(), err
}

// adoptRun continues the run that left the thread's head unfinished
// (interrupted, or cut off by a crash) when the caller did not hand a run
// record back, so that run ends instead of staying open in the store.
func (e *execution) adoptRun(ctx context.Context) error {
	rs, ok := e.store.(RunStore)
	if !ok || e.cfg.ns != "" || e.head == nil || e.head.RunID == "" {
		return nil
	}
	run, err := rs.Run(ctx, e.head.RunID)
	if errors.Is(err, ErrRunNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load run %s: %w", e.head.RunID, err)
	}
	if run.Status == StatusBudgetExceeded {
		return overBudgetRun(run)
	}
	if run.Status.Terminal() {
		return nil
	}
	if err := run.Durability.check(); err != nil {
		return fmt.Errorf("resume run %s: recorded durability: %w", run.ID, err)
	}
	steps, err := countSteps(ctx, e.store, e.g, e.head, run.ID)
	if err != nil {
		return err
	}
	run.Steps = max(steps, run.Steps) // see Manager.loadResume
	run.Durability = e.cfg.Durability
	e.run = run
	e.attempt = RunAttempt(run)
	return nil
}

// overBudgetRun refuses to resume a run that ended over a budget: its
// unfinished step would run on with every budget fresh (fail closed). A
// new turn on the thread is a new run, with a budget of its own.
func overBudgetRun(run *Run) error {
	return fmt.Errorf("%w: run %s ended budget_exceeded (%s) and is not resumed; start a new run on the thread", ErrBudgetExceeded, run.ID, run.Error)
}

// commitsEachStep reports whether each superstep is committed as it ends
// (sync) or only the run's last state (exit). newExecution has refused any
// other durability, and only exit gives up the per-step commit.
func (e *execution) commitsEachStep() bool {
	return e.cfg.Durability != DurabilityExit
}

func (e *execution) result() *Result {
	e.versionsShared, e.valsShared = true, true
	snap := &Snapshot{vals: e.vals, Checkpoint: e.head, Versions: e.versions}
	for _, t := range e.next {
		snap.Next = append(snap.Next, t.Node)
	}
	return &Result{Run: e.run.Clone(), State: snap}
}

// commit makes c durable with the buffered blobs and events, then publishes
// the events. A persistence error is returned, never dropped.
func (e *execution) commit(ctx context.Context, c *Commit) error {
	if c.Checkpoint != nil {
		e.run.Checkpoint = c.Checkpoint.ID
	}
	var root *execution // whose record c carries
	if e.cfg.ns == "" && (e.runChanged || e.run.Status.Terminal()) {
		// Intermediate steps leave the stored record alone: its status is
		// what recovery needs, and the step count is rebuilt from the
		// checkpoints (see Manager.loadResume).
		c.Run = e.run.Clone()
		e.runChanged = false
		root = e
	} else if e.cfg.ns != "" && c.Checkpoint != nil && c.Checkpoint.Source == SourceLoop {
		// A subgraph's step is its run's progress too, but the root
		// writes its record only when its own step ends, which a long
		// subgraph may never reach between crashes: the subgraph's first
		// step after a recovery takes the count off.
		root = e.carryCount(c)
	}
	if len(e.blobBuf) > 0 {
		c.Blobs = e.blobBuf
	}
	c.Events = e.events
	c.Sync = true
	if err := e.store.Commit(context.WithoutCancel(ctx), c); err != nil {
		return fmt.Errorf("commit step %d of run %s: %w", e.step, e.run.ID, err)
	}
	root.countedProgress()
	if fp := failpoints.afterCommitBeforePublish; fp != nil {
		if err := fp(c); err != nil {
			return err
		}
	}
	if c.Checkpoint != nil {
		e.committed = c.Checkpoint.ID
		clear(e.changed)
		if e.cfg.Cache != nil && len(c.Checkpoint.Channels) > 0 {
			e.sizes, e.sizesShared = foldSizes(e.sizes, e.sizesShared, c.Checkpoint.Channels), false
		}
		if e.run.Status != StatusRunning && e.run.Status != StatusQueued {
			// Only the state a run stops at is what the next run loads.
			e.cfg.Cache.put(c.Checkpoint.Thread, c.Checkpoint.NS, c.Checkpoint.ID, e.vals, e.versions, e.sizes)
			e.versionsShared, e.sizesShared, e.valsShared = true, true, true
		}
	}
	if len(e.blobBuf) > 0 { // handed to the store with c: a new one
		e.blobBuf = map[BlobRef][]byte{}
	}
	if e.cfg.Events != nil && len(e.events) > 0 {
		if p := e.cfg.parent; p != nil && !e.commitsEachStep() {
			// A subgraph in exit durability commits before its run's
			// record may be: its events go out with the parent's next
			// commit, so that a crash in between cannot take back a step
			// or a pause that a subscriber has seen.
			p.durable.Lock()
			p.events = append(p.events, e.events...)
			p.durable.Unlock()
		} else {
			e.cfg.Events.Publish(e.events...)
		}
	}
	if e.cfg.Events != nil && len(c.Announce) > 0 {
		e.cfg.Events.Publish(c.Announce...)
	}
	e.events = nil
	return nil
}

// carryCount puts the run's record on c, a commit of progress made within
// a step (a subgraph's step, a task's saved writes), when the stored record
// still holds the recovery count that the run leaves out (see
// Manager.markRecovery), so that c takes the count off. It returns the
// root execution whose record c carries, or nil. The step's other tasks
// run concurrently, and may carry the record as well.
func (e *execution) carryCount(c *Commit) *execution {
	r := e.root()
	if !r.countOnRecord.Load() {
		return nil
	}
	r.durable.Lock()
	c.Run = r.run.Clone()
	r.durable.Unlock()
	return r
}

// countedProgress notes, once, that a commit carrying e's record has taken
// the recovery count off it. e may be nil: the commit carried no record.
func (e *execution) countedProgress() {
	if e != nil && e.countOnRecord.CompareAndSwap(true, false) && e.progressed != nil {
		e.progressed()
	}
}

// event queues an event for the next commit. data is a value to marshal, or
// a func() json.RawMessage, so that callers on the hot path build their
// JSON only when someone listens.
func (e *execution) event(typ, node string, data any) {
	if e.cfg.Events == nil {
		return
	}
	var raw json.RawMessage
	switch d := data.(type) {
	case nil:
	case json.RawMessage:
		raw = d
	case func() json.RawMessage:
		raw = d()
	default:
		raw, _ = json.Marshal(d)
	}
	if node != "" {
		node = e.cfg.nodePrefix + node
	}
	e.events = append(e.events, Event{Time: time.Now().UTC(), Type: typ, Run: e.run.ID, Thread: e.cfg.Thread, Node: node, Data: raw})
}

// applyInput writes the input as its own checkpoint, then schedules Start's
// successors.
func (e *execution) applyInput(ctx context.Context, input []Write) error {
	if err := e.checkWrites(Start, input); err != nil {
		return e.fail(ctx, fmt.Errorf("input: %w", err))
	}
	if e.run.StartedAt.IsZero() {
		e.run.StartedAt = e.cfg.now().UTC()
	}
	e.fresh = true
	e.run.Status = StatusRunning
	if e.startStatus != "" {
		e.run.Status = e.startStatus
	}
	e.runChanged = true
	e.apply(input)
	e.step++
	next, err := e.route([]string{Start}, nil)
	if err != nil {
		return e.fail(ctx, err)
	}
	e.next = next
	c, err := e.newCheckpoint(SourceInput, nil)
	if err != nil {
		return e.fail(ctx, err)
	}
	e.head = c
	e.writes = nil
	if e.cfg.ns == "" {
		e.event(EventRunStarted, "", runStartedData(e.run.Agent, c, e.commitsEachStep()))
	}
	if e.commitsEachStep() {
		return e.commit(ctx, &Commit{Checkpoint: c})
	}
	return nil
}

// route computes the tasks that follow the nodes that just ran.
func (e *execution) route(ran []string, sends []Send) ([]TaskSpec, error) {
	st := &view{g: e.g, vals: e.vals, step: e.step}
	var nodes []string
	seen := map[string]bool{}
	add := func(n string) {
		if n != End && !seen[n] {
			seen[n] = true
			nodes = append(nodes, n)
		}
	}
	for _, from := range ran {
		for _, to := range e.g.edges[from] {
			add(to)
		}
		for _, c := range e.g.conds[from] {
			for _, to := range c.router(st) {
				if !slices.Contains(c.targets, to) {
					return nil, fmt.Errorf("router after %q returned %q, which it does not declare (declared: %v)", from, to, c.targets)
				}
				add(to)
			}
		}
		for _, f := range e.g.fanouts[from] {
			for _, s := range f.router(st) {
				if !slices.Contains(f.targets, s.Node) {
					return nil, fmt.Errorf("fan-out after %q sent to %q, which it does not declare (declared: %v)", from, s.Node, f.targets)
				}
				sends = append(sends, s)
			}
		}
	}
	// Ordered by node declaration, then sends in order: the same state
	// always gives the same task list.
	if len(nodes) > 1 {
		order := e.g.order
		sort.SliceStable(nodes, func(i, j int) bool { return order[nodes[i]] < order[nodes[j]] })
	}
	tasks := make([]TaskSpec, 0, len(nodes)+len(sends))
	for _, n := range nodes {
		tasks = append(tasks, TaskSpec{Node: n})
	}
	for _, s := range sends {
		raw, err := json.Marshal(s.Input)
		if err != nil {
			return nil, fmt.Errorf("fan-out input for %q: %w", s.Node, err)
		}
		tasks = append(tasks, TaskSpec{Node: s.Node, Input: raw})
	}
	return tasks, nil
}

// loop runs supersteps until the run ends or pauses.
func (e *execution) loop(ctx context.Context, decisions map[string]Decision) error {
	e.startActive()
	if e.cfg.MaxDuration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, e.cfg.MaxDuration-e.activeBefore, ErrDeadline)
		defer cancel()
	}
	if e.run.Status != StatusRunning {
		// From queued, the stored record is left as it is: recovery treats
		// queued and running alike, and Manager.Run reports a run a worker
		// holds as running. That saves a record rewrite per run.
		e.runChanged = e.runChanged || e.run.Status != StatusQueued
		e.run.Status = StatusRunning
		if e.run.StartedAt.IsZero() {
			e.run.StartedAt = e.cfg.now().UTC()
		}
		if len(decisions) > 0 {
			// Put the decisions on record, as the answers their tasks will
			// be given, and announce the resume, before any node acts on
			// them: a crash from here on does not ask the person again.
			c := &Commit{Writes: e.resumeWrites(decisions)}
			if e.cfg.ns == "" {
				e.recordDecisions(decisions)
				e.event(EventRunResumed, "", map[string]any{"decisions": len(decisions)})
				e.run.Interrupts = nil
			}
			if e.cfg.ns == "" || len(c.Writes) > 0 {
				if err := e.commit(ctx, c); err != nil {
					return err
				}
			}
		}
	}
	if e.run.Interrupts != nil {
		e.run.Interrupts = nil
		e.runChanged = true
	}
	for {
		if err := e.cause(ctx); err != nil {
			return e.stopped(ctx, err)
		}
		if paused, err := e.staticInterrupt(ctx, decisions); paused || err != nil {
			return err
		}
		if len(e.next) == 0 {
			return e.complete(ctx)
		}
		if e.stepsTaken() >= e.cfg.StepLimit {
			return e.budget(ctx, fmt.Errorf("%w: %d supersteps (raise the limit with RunConfig.StepLimit)", ErrStepLimit, e.cfg.StepLimit))
		}
		results := e.runStep(ctx, decisions)
		decisions = nil
		if fp := failpoints.afterStepBeforeCommit; fp != nil {
			if err := fp(e.step); err != nil {
				return err
			}
		}
		if err := e.cause(ctx); err != nil {
			return e.stopped(ctx, err)
		}
		var ins []PendingInterrupt
		var failed *taskResult
		for i := range results {
			r := &results[i]
			var ie *InterruptError
			switch {
			case r.err == nil:
			case errors.As(r.err, &ie):
				ins = append(ins, ie.Interrupts...)
			case failed == nil:
				failed = r
			}
		}
		if failed != nil || len(ins) > 0 {
			return e.pause(ctx, results, ins, failed)
		}
		if err := e.advance(ctx, results); err != nil {
			return err
		}
	}
}

// cause is why the run must stop at this safe point, or nil: ctx's cause,
// or ErrDeadline once the run's active time has reached its wall-time
// budget. The clock is read here too, since the timer that cancels ctx at
// the deadline runs its cancel on a goroutine of its own, which a busy
// machine may not have run yet when the step that overran it ends.
func (e *execution) cause(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if d := e.cfg.MaxDuration; d > 0 && e.activeBefore+e.cfg.now().Sub(e.activeFrom) >= d {
		return ErrDeadline
	}
	return nil
}

// stepsTaken is what the step limit is checked against before a step: the
// run's supersteps so far, plus, in a subgraph, the steps of the graphs
// around it that are running it, which count when they end. The limit
// bounds all of a run's supersteps, its subgraphs' at any depth included:
// the root run's record counts them all (Run.Steps, see countStep).
func (e *execution) stepsTaken() int {
	r := e.root()
	if r == e {
		return e.run.Steps
	}
	depth := 0
	for p := e; p.cfg.parent != nil; p = p.cfg.parent {
		depth++
	}
	r.durable.Lock()
	defer r.durable.Unlock()
	return r.run.Steps + depth
}

// countStep counts a superstep that has run in the root run's record; a
// subgraph's, under the root's durable lock, for the subgraphs of one step
// run concurrently.
func (e *execution) countStep() {
	r := e.root()
	if r == e {
		e.run.Steps++
		return
	}
	r.durable.Lock()
	r.run.Steps++
	r.durable.Unlock()
}

// advance applies the step's writes in task order, routes, and commits the
// new checkpoint (in sync mode).
func (e *execution) advance(ctx context.Context, results []taskResult) error {
	var all []Write
	var ran []string
	for _, r := range results {
		all = append(all, r.writes...)
		if !slices.Contains(ran, r.spec.Node) {
			ran = append(ran, r.spec.Node)
		}
	}
	e.apply(all)
	e.step++
	e.countStep()
	next, err := e.route(ran, nil)
	if err != nil {
		return e.fail(ctx, err)
	}
	e.next = next
	c, err := e.newCheckpoint(SourceLoop, ran)
	if err != nil {
		return e.fail(ctx, err)
	}
	e.head = c
	e.writes = nil
	if e.cfg.Events != nil {
		for _, r := range results {
			e.event(EventNodeCompleted, r.spec.Node, e.nodeCompletedData(r))
		}
		// In exit durability only a step that ends the run commits now;
		// a marker that an interrupt or an error commits later is
		// marked committed then (see uncommitted).
		e.event(EventCheckpoint, "", checkpointData(c, e.commitsEachStep() || len(e.next) == 0))
	}
	if len(e.next) == 0 {
		// A step that ends the run is committed with the run's final
		// status, in one transaction (see end).
		return nil
	}
	if e.commitsEachStep() {
		return e.commit(ctx, &Commit{Checkpoint: c})
	}
	if r := e.root(); r.commitUntilProgress && r.countOnRecord.Load() {
		// As EnsureDurable commits a step's checkpoint, with its marker
		// event, which then names it committed. A subgraph's step is its
		// run's progress as well (see commit), and the root's step that
		// runs it may not end between crashes: it is committed too, after
		// the heads of the graphs around it.
		if p := e.cfg.parent; p != nil {
			if err := p.ensureDurable(ctx); err != nil {
				return err
			}
		}
		head, err := e.uncommitted()
		if err != nil {
			return e.fail(ctx, err)
		}
		return e.commit(ctx, &Commit{Checkpoint: head})
	}
	return nil
}

// runStartedData is {"agent","checkpoint"}, with "committed": false while
// the input checkpoint is only a marker (exit durability, see
// EventCheckpoint).
func runStartedData(agent string, c *Checkpoint, committed bool) json.RawMessage {
	b := make([]byte, 0, 64)
	b = append(b, `{"agent":`...)
	b = AppendJSONString(b, agent)
	b = append(b, `,"checkpoint":`...)
	b = AppendJSONString(b, c.ID)
	if !committed {
		b = append(b, `,"committed":false`...)
	}
	return append(b, '}')
}

// nodeCompletedData is {"task","writes","attempts"}, and "values" when the
// task wrote channels of cfg.EventValues (see EventNodeCompleted), built
// by hand: it is made for every task of every step.
func (e *execution) nodeCompletedData(r taskResult) json.RawMessage {
	b := make([]byte, 0, 96)
	b = append(b, `{"task":`...)
	b = AppendJSONString(b, r.spec.ID)
	b = append(b, `,"writes":[`...)
	for i, w := range r.writes {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendJSONString(b, w.Channel)
	}
	b = append(b, `],"attempts":`...)
	b = strconv.AppendInt(b, int64(r.attempts), 10)
	b = e.appendValues(b, r.writes)
	return append(b, '}')
}

// EventValuesLimit bounds the bytes of the values that one node.completed
// event carries inline (RunConfig.EventValues). Flags are short strings, so
// a few hundred fit in it; a value past it would make every copy of the
// event large: the console keeps the newest 10,000 events in memory to
// answer a client that reconnects, and sends each to every client. It is
// the size of the previews that run listings carry (store.SummaryBytes).
const EventValuesLimit = 8 << 10

// appendValues appends ,"values":{...}: the value after the step of each
// channel of cfg.EventValues that writes wrote, whole (an append
// channel's too), as a checkpoint encodes it, while they fit in
// EventValuesLimit together. A channel whose value does not fit is named
// instead in ,"value_refs":{channel: ref}, by the ref of the blob that
// holds its value as encoded ("xxh64:<hash>:<bytes>"), which the step's
// commit stores, as it does the blobs of its checkpoint, before the
// event is published. Nothing written is left out in silence.
func (e *execution) appendValues(b []byte, writes []Write) []byte {
	n, room := 0, EventValuesLimit
	var refs []string // channel, ref: those past the limit
	for _, ch := range e.cfg.EventValues {
		spec := e.g.channels[ch]
		if spec == nil || !slices.ContainsFunc(writes, func(w Write) bool { return w.Channel == ch }) {
			continue
		}
		v, err := spec.encode(e.vals[ch])
		if err != nil {
			continue // the step's checkpoint fails to encode it as well
		}
		if len(v) > room {
			ref := RefOf(v)
			e.blobBuf[ref] = v
			refs = append(refs, ch, ref.String())
			continue
		}
		room -= len(v)
		if n == 0 {
			b = append(b, `,"values":{`...)
		} else {
			b = append(b, ',')
		}
		n++
		b = AppendJSONString(b, ch)
		b = append(b, ':')
		b = append(b, v...)
	}
	if n > 0 {
		b = append(b, '}')
	}
	for i := 0; i < len(refs); i += 2 {
		if i == 0 {
			b = append(b, `,"value_refs":{`...)
		} else {
			b = append(b, ',')
		}
		b = AppendJSONString(b, refs[i])
		b = append(b, ':')
		b = AppendJSONString(b, refs[i+1])
	}
	if len(refs) > 0 {
		b = append(b, '}')
	}
	return b
}

// checkpointData is {"id","step","next"}, with "committed": false for a
// marker (see EventCheckpoint).
func checkpointData(c *Checkpoint, committed bool) json.RawMessage {
	b := make([]byte, 0, 96)
	b = append(b, `{"id":`...)
	b = AppendJSONString(b, c.ID)
	b = append(b, `,"step":`...)
	b = strconv.AppendInt(b, int64(c.Step), 10)
	b = append(b, `,"next":[`...)
	for i, t := range c.Next {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendJSONString(b, t.Node)
	}
	b = append(b, ']')
	if !committed {
		b = append(b, `,"committed":false`...)
	}
	return append(b, '}')
}

func taskNodes(ts []TaskSpec) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Node
	}
	return out
}

// uncommitted returns the head checkpoint when it has not been committed yet
// (exit durability), so that it is committed with what follows.
func (e *execution) uncommitted() (*Checkpoint, error) {
	if e.head == nil || e.head.ID == e.committed {
		return nil, nil
	}
	if !e.commitsEachStep() {
		if err := e.encodeChanges(e.head); err != nil {
			return nil, err
		}
		// Its event, still waiting for this commit, no longer says it
		// is a marker: a step's checkpoint event, or run.started when the
		// head is still the input checkpoint. A subgraph's events may
		// follow it (see commit), their checkpoint events among them.
		marker := checkpointData(e.head, false)
		started := runStartedData(e.run.Agent, e.head, false)
		for i := len(e.events) - 1; i >= 0; i-- {
			ev := &e.events[i]
			if ev.Type == EventCheckpoint && bytes.Equal(ev.Data, marker) {
				ev.Data = checkpointData(e.head, true)
				break
			}
			if ev.Type == EventRunStarted && bytes.Equal(ev.Data, started) {
				ev.Data = runStartedData(e.run.Agent, e.head, true)
				break
			}
		}
	}
	return e.head, nil
}

// ensureDurable commits, in exit durability, the head checkpoint (the one
// the running step's tasks run from) with the run's record, and the
// parents' first for a subgraph, unless they are committed already. The
// step's tasks may call it concurrently; the loop is waiting for them
// meanwhile, so nothing else touches what commit changes.
func (e *execution) ensureDurable(ctx context.Context) error {
	if e.commitsEachStep() {
		return nil
	}
	if p := e.cfg.parent; p != nil {
		if err := p.ensureDurable(ctx); err != nil {
			return err
		}
	}
	e.durable.Lock()
	defer e.durable.Unlock()
	head, err := e.uncommitted()
	if err != nil || head == nil {
		return err
	}
	return e.commit(ctx, &Commit{Checkpoint: head})
}

// pause records an interrupt or a failure: the finished tasks' writes are
// kept as pending writes, so resuming re-runs only the others.
func (e *execution) pause(ctx context.Context, results []taskResult, ins []PendingInterrupt, failed *taskResult) error {
	head, err := e.uncommitted()
	if err != nil {
		return e.finish(ctx, &Commit{}, StatusFailed, err)
	}
	c := &Commit{Checkpoint: head}
	for i := range results {
		r := &results[i]
		var ie *InterruptError
		var pw PendingWrite
		switch {
		case r.err == nil && !r.saved:
			w, blobs, err := e.pendingWrite(r)
			if err != nil {
				return e.fail(ctx, err)
			}
			for k, v := range blobs {
				e.blobBuf[k] = v
			}
			pw = w
		case errors.As(r.err, &ie):
			raw, _ := json.Marshal(ie.Interrupts)
			pw = PendingWrite{TaskID: r.spec.ID, Node: r.spec.Node, Kind: WriteKindInterrupt, Data: raw}
		default:
			if r.newResume {
				raw, _ := json.Marshal(r.resume)
				c.Writes = append(c.Writes, CommitWrites{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID,
					Write: PendingWrite{TaskID: r.spec.ID, Node: r.spec.Node, Kind: WriteKindResume, Data: raw}})
			}
			continue
		}
		if r.newResume {
			raw, _ := json.Marshal(r.resume)
			c.Writes = append(c.Writes, CommitWrites{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID,
				Write: PendingWrite{TaskID: r.spec.ID, Node: r.spec.Node, Kind: WriteKindResume, Data: raw}})
		}
		c.Writes = append(c.Writes, CommitWrites{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID, Write: pw})
	}
	if failed != nil {
		if errors.Is(failed.err, ErrBudgetExceeded) {
			return e.finish(ctx, c, StatusBudgetExceeded, failed.err)
		}
		return e.finish(ctx, c, StatusFailed, failed.err)
	}
	e.run.Status = StatusInterrupted
	e.run.Interrupts = ins
	e.stopActive()
	e.runChanged = true
	for _, in := range ins {
		e.event(EventInterrupt, in.Node, in)
	}
	if err := e.commit(ctx, c); err != nil {
		return err
	}
	return nil
}

// resumeWrites turns the decisions that answer this namespace's pending
// interrupts into resume writes of their tasks (the answers so far plus the
// new one), and adds them to the head's pending writes.
func (e *execution) resumeWrites(decisions map[string]Decision) []CommitWrites {
	var out []CommitWrites
	for _, in := range e.pendingInterrupts() {
		d, ok := decisions[in.ID]
		if !ok || in.NS != e.cfg.ns || in.TaskID == staticBefore || in.TaskID == staticAfter {
			continue
		}
		var answers []Decision
		for _, w := range e.writes[in.TaskID] {
			if w.Kind == WriteKindResume {
				answers = nil
				_ = json.Unmarshal(w.Data, &answers)
			}
		}
		if in.Index != len(answers) {
			continue // answered out of order: the task asks again
		}
		raw, err := json.Marshal(append(answers, d))
		if err != nil {
			continue
		}
		pw := PendingWrite{TaskID: in.TaskID, Node: in.Node, Kind: WriteKindResume, Data: raw}
		e.writes[in.TaskID] = append(e.writes[in.TaskID], pw)
		out = append(out, CommitWrites{Thread: e.cfg.Thread, NS: e.cfg.ns, CheckpointID: e.head.ID, Write: pw})
	}
	return out
}

func (e *execution) recordDecisions(decisions map[string]Decision) {
	for _, id := range sortedKeys(decisions) {
		d := decisions[id]
		at := d.At
		if at.IsZero() {
			at = time.Now().UTC()
		}
		e.run.Decisions = append(e.run.Decisions, DecisionRecord{Interrupt: id, Decision: d.Kind, Value: d.Value, Reason: d.Reason, By: d.By, At: at})
	}
}

func (e *execution) complete(ctx context.Context) error {
	return e.end(ctx, StatusCompleted, nil)
}

func (e *execution) fail(ctx context.Context, err error) error {
	return e.end(ctx, StatusFailed, err)
}

// failUnlessStopped fails the run for err, unless ctx has ended: then
// err is most likely ctx's doing, and the run ends as stopped ends it.
func (e *execution) failUnlessStopped(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return e.stopped(ctx, cause)
	}
	return e.fail(ctx, err)
}

func (e *execution) budget(ctx context.Context, err error) error {
	return e.end(ctx, StatusBudgetExceeded, err)
}

// end commits the head (if it is not yet) with the run's final status.
func (e *execution) end(ctx context.Context, status RunStatus, runErr error) error {
	head, err := e.uncommitted()
	if err != nil {
		status, runErr = StatusFailed, errors.Join(runErr, err)
	}
	return e.finish(ctx, &Commit{Checkpoint: head}, status, runErr)
}

// stopped ends a run whose context ended: a wall-time budget, or a cancel.
func (e *execution) stopped(ctx context.Context, cause error) error {
	if errors.Is(cause, errShutdown) {
		// Leave the run as it is in the store: it is recovered at start.
		return cause
	}
	if errors.Is(cause, ErrDeadline) {
		return e.budget(ctx, fmt.Errorf("%w (%s)", ErrDeadline, e.cfg.MaxDuration))
	}
	if !errors.Is(cause, ErrCancelled) {
		// Another end of the context (a caller's own cancel) still reads
		// as a cancel, with its cause; a cancel's own cause says it once.
		cause = fmt.Errorf("%w: %v", ErrCancelled, cause)
	}
	return e.end(ctx, StatusCancelled, cause)
}

// finish commits the run's last checkpoint together with its final status.
func (e *execution) finish(ctx context.Context, c *Commit, status RunStatus, runErr error) error {
	e.run.Status = status
	e.run.EndedAt = e.cfg.now().UTC()
	e.stopActive()
	if runErr != nil {
		e.run.Error = runErr.Error()
	}
	if status == StatusCompleted && e.cfg.Output != nil {
		e.run.Output = e.cfg.Output(&view{g: e.g, vals: e.vals, step: e.step})
	}
	if e.cfg.ns == "" {
		switch status {
		case StatusCompleted:
			e.event(EventRunCompleted, "", map[string]any{"steps": e.run.Steps})
		case StatusBudgetExceeded:
			e.event(EventBudgetExceeded, "", map[string]any{"error": e.run.Error})
			e.event(EventRunFailed, "", map[string]any{"status": status, "error": e.run.Error})
		default:
			e.event(EventRunFailed, "", map[string]any{"status": status, "error": e.run.Error})
		}
	}
	if err := e.commit(ctx, c); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}
