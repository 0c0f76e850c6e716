package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Agent is what the run manager runs: a compiled graph plus how a request's
// JSON input becomes writes and how the final state becomes the run's output.
type Agent struct {
	Name   string
	Graph  *Graph
	Bundle BundleRef
	// Input maps a request's input to writes. Nil accepts only RunRequest.Writes.
	Input func(raw json.RawMessage) ([]Write, error)
	// Output derives the run's output from its final state.
	Output func(State) json.RawMessage
	// StepLimit overrides the manager's default when positive.
	StepLimit int
	// MaxDuration, when positive, is the agent's wall-time budget per run
	// (its active time, see RunConfig.MaxDuration); the manager's, when
	// shorter, still holds.
	MaxDuration time.Duration
	// MaxTokens, when positive, is the agent's token budget per run (see
	// RunConfig.MaxTokens); the manager's, when smaller, still holds.
	MaxTokens int
	// Pin, when set, is called once as a run opens, before its record is
	// first committed: what it puts in run.Meta (the resolved active tool
	// set, say) is stored with the run and holds for its whole life,
	// across restarts. An error refuses the run.
	Pin func(run *Run) error
}

// Resolver finds an agent by name. pinned is the zero BundleRef for a new run
// and the run's recorded bundle when a run is resumed or recovered, so that a
// run finishes on the version it started on.
type Resolver func(name string, pinned BundleRef) (*Agent, error)

// ManagerOptions configures a run manager.
type ManagerOptions struct {
	Workers  int // runs executing at once; default 8
	MaxQueue int // runs waiting for a worker; default 1024
	// Durability is sync (the default, also for "") or exit. Any other
	// value is not read as either: the manager then refuses every run,
	// start, resume and recovery alike, with ErrBadDurability.
	Durability Durability
	StepLimit  int
	// MaxDuration and MaxTokens bound every run (0: no bound); an agent's
	// own may only be smaller.
	MaxDuration time.Duration
	MaxTokens   int
	Events      EventSink
	CacheSize   int // materialized thread states kept; default 1024
	// CacheBytes bounds the kept states by what their values take encoded;
	// default DefaultCacheBytes, and negative for no bound.
	CacheBytes int64
	// MaxRecoveries bounds how many times in a row a run is recovered
	// after a crash without making progress in between; the next start
	// ends it failed with ErrCrashLoop instead of running it again (see
	// Recover). Default DefaultMaxRecoveries; negative for no bound.
	MaxRecoveries int
}

// DefaultMaxRecoveries is how many times in a row a run is recovered, by
// default, before it is taken for the cause of its crashes.
const DefaultMaxRecoveries = 3

// MetaRecoveries is the key of Run.Meta that counts the times a run has
// been recovered since it last made progress. It is on record only in
// between: the first commit that carries the run's record after a
// recovery (its next step, a pause or its end) leaves it out.
const MetaRecoveries = "engine.recoveries"

// RunRequest asks for one turn on a thread.
type RunRequest struct {
	Thread        string
	Agent         string
	Input         json.RawMessage
	Writes        []Write
	CorrelationID string
	Meta          map[string]string
	// WaitForThread waits for the thread's active run to end instead of
	// failing with ErrThreadBusy.
	WaitForThread bool
}

// Manager runs agents on a bounded worker pool, at most one active run per
// thread, and recovers runs left running by a crash.
type Manager struct {
	store   Store
	resolve Resolver
	opts    ManagerOptions
	cache   *StateCache
	sem     chan struct{}
	ctx     context.Context
	stop    context.CancelCauseFunc
	wg      sync.WaitGroup

	// bad is why the manager refuses all runs (its options are invalid).
	bad error

	mu      sync.Mutex
	closed  bool
	queued  int
	threads map[string]*active // thread -> its running or paused run
	runs    map[string]*active // run id -> the same
}

type active struct {
	runID   string
	thread  string
	paused  bool // interrupted: waiting for a decision, not running
	working bool // a worker is executing it
	cancel  context.CancelCauseFunc
	// cancelled: Cancel came before a worker took the run (cancel still
	// nil: opened, or being resumed); launch and execute stop it at once.
	cancelled bool
	done      chan struct{}
	// opened is the run's record as it opened, kept in exit durability,
	// where the store has no record of the run before it pauses or ends
	// (or calls a tool): Run answers from it meanwhile.
	opened *Run
	// recovery is the number of this recovery of the run in a row, which
	// the worker that takes the run puts on its record before it runs it
	// (see markRecovery); 0 when the run is not being recovered.
	recovery int
}

var errShutdown = errors.New("run manager shutting down")

// NewManager returns a manager over store. Call Recover once before serving
// requests, and Close when done.
func NewManager(store Store, resolve Resolver, opts ManagerOptions) *Manager {
	if opts.Workers <= 0 {
		opts.Workers = 8
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = 1024
	}
	if opts.Durability == "" {
		opts.Durability = DurabilitySync
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 1024
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.MaxRecoveries == 0 {
		opts.MaxRecoveries = DefaultMaxRecoveries
	}
	ctx, stop := context.WithCancelCause(context.Background())
	m := &Manager{store: store, resolve: resolve, opts: opts, cache: NewStateCache(opts.CacheSize, opts.CacheBytes),
		sem: make(chan struct{}, opts.Workers), ctx: ctx, stop: stop,
		threads: map[string]*active{}, runs: map[string]*active{}}
	if err := opts.Durability.check(); err != nil {
		m.bad = fmt.Errorf("run manager options: %w", err)
	}
	return m
}

// Store returns the manager's store.
func (m *Manager) Store() Store { return m.store }

// ThreadRun returns the run that holds thread: queued, running, or paused
// at an interrupt. ok is false when the thread is free.
func (m *Manager) ThreadRun(thread string) (runID string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.threads[thread]; a != nil {
		return a.runID, true
	}
	return "", false
}

func (m *Manager) config(a *Agent, run *Run) RunConfig {
	limit := m.opts.StepLimit
	if a.StepLimit > 0 {
		limit = a.StepLimit
	}
	return RunConfig{Thread: run.Thread, Store: m.store, Blobs: m.store, Run: run, Durability: m.opts.Durability,
		StepLimit: limit, MaxDuration: Narrower(m.opts.MaxDuration, a.MaxDuration), MaxTokens: Narrower(m.opts.MaxTokens, a.MaxTokens),
		Events: m.opts.Events, Cache: m.cache, Output: a.Output}
}

// Narrower returns the smaller of two limits, where 0 (or less) is no
// limit: the budget that holds when both bound a run.
func Narrower[T int | time.Duration](a, b T) T {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// claim reserves the thread for a run, waiting if asked to.
func (m *Manager) claim(ctx context.Context, thread string, wait bool) (*active, error) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrManagerClosed
		}
		cur := m.threads[thread]
		if cur == nil {
			if m.queued >= m.opts.MaxQueue {
				m.mu.Unlock()
				return nil, fmt.Errorf("run queue is full (%d waiting)", m.queued)
			}
			a := &active{thread: thread, done: make(chan struct{})}
			m.threads[thread] = a
			m.queued++
			m.mu.Unlock()
			return a, nil
		}
		m.mu.Unlock()
		if cur.paused || !wait {
			state := "running"
			if cur.paused {
				state = "interrupted (resume or cancel it first)"
			}
			return nil, fmt.Errorf("%w: run %s is %s", ErrThreadBusy, cur.runID, state)
		}
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (m *Manager) release(a *active, paused bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.working = false
	if paused {
		a.paused = true
		// Its pause stored its record: it is no longer one of Unstored's,
		// whose record as it opened would list it queued again.
		a.opened = nil
		old := a.done
		a.done = make(chan struct{})
		close(old)
		return
	}
	delete(m.threads, a.thread)
	delete(m.runs, a.runID)
	close(a.done)
}

// Start opens a run. The run record and its input checkpoint are committed
// before Start returns in sync durability; in exit durability, when the run
// ends or pauses, or before then if a node calls EnsureDurable. The run
// then executes on a worker. Use Wait for its end.
func (m *Manager) Start(ctx context.Context, req RunRequest) (*Run, error) {
	a, e, err := m.open(ctx, req)
	if err != nil {
		return nil, err
	}
	snapshot := e.run.Clone()
	m.launch(a, e, nil)
	return snapshot, nil
}

// open claims the thread and commits the run record with its input.
func (m *Manager) open(ctx context.Context, req RunRequest) (*active, *execution, error) {
	if m.bad != nil {
		return nil, nil, fmt.Errorf("start run: %w", m.bad)
	}
	if req.Thread == "" {
		return nil, nil, fmt.Errorf("start run: thread is required")
	}
	ag, err := m.resolve(req.Agent, BundleRef{})
	if err != nil {
		return nil, nil, fmt.Errorf("start run: %w", err)
	}
	writes := req.Writes
	if len(req.Input) > 0 {
		if ag.Input == nil {
			return nil, nil, fmt.Errorf("start run: agent %q takes no JSON input", ag.Name)
		}
		in, err := ag.Input(req.Input)
		if err != nil {
			return nil, nil, fmt.Errorf("start run: input: %w", err)
		}
		writes = append(in, writes...)
	}
	a, err := m.claim(ctx, req.Thread, req.WaitForThread)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now().UTC()
	run := &Run{ID: NewRunID(), Thread: req.Thread, Agent: ag.Name, Status: StatusQueued, Bundle: ag.Bundle,
		CorrelationID: req.CorrelationID, Input: req.Input, Meta: req.Meta, CreatedAt: now}
	if run.CorrelationID == "" {
		run.CorrelationID = "corr_" + run.ID[len("run_"):]
	}
	if ag.Pin != nil {
		if run.Meta == nil {
			run.Meta = map[string]string{}
		} else {
			meta := make(map[string]string, len(run.Meta))
			for k, v := range run.Meta {
				meta[k] = v
			}
			run.Meta = meta
		}
		if err := ag.Pin(run); err != nil {
			m.dequeue()
			m.release(a, false)
			return nil, nil, fmt.Errorf("start run: %w", err)
		}
	}
	a.runID = run.ID
	m.mu.Lock()
	m.runs[run.ID] = a
	if m.opts.Durability == DurabilityExit {
		a.opened = run.Clone()
	}
	m.mu.Unlock()

	e, err := ag.Graph.newExecution(m.config(ag, run))
	if err == nil {
		e.startStatus = StatusQueued
		err = e.load(ctx, "")
	}
	if err == nil {
		err = e.applyInput(ctx, writes)
	}
	if err != nil {
		m.dequeue()
		m.release(a, false)
		return nil, nil, fmt.Errorf("start run: %w", err)
	}
	return a, e, nil
}

// Invoke runs one turn and waits for it to end or pause, executing it on the
// calling goroutine (it still takes a worker slot). It saves the hand-off to
// a worker that Start and Wait pay. Cancel stops it, and so does the end of
// ctx: the run is then recorded as cancelled.
func (m *Manager) Invoke(ctx context.Context, req RunRequest) (*Run, error) {
	a, e, err := m.open(ctx, req)
	if err != nil {
		return nil, err
	}
	m.execute(ctx, a, e, nil)
	return e.run.Clone(), nil
}

func (m *Manager) dequeue() {
	m.mu.Lock()
	m.queued--
	m.mu.Unlock()
}

// launch runs e's loop on a worker goroutine.
func (m *Manager) launch(a *active, e *execution, decisions map[string]Decision) {
	ctx, cancel := context.WithCancelCause(m.ctx)
	m.mu.Lock()
	a.cancel = cancel
	a.paused = false
	if a.cancelled {
		cancel(ErrCancelled)
	}
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.run(ctx, cancel, a, e, decisions)
	}()
}

// execute runs e's loop on the calling goroutine.
func (m *Manager) execute(caller context.Context, a *active, e *execution, decisions map[string]Decision) {
	ctx, cancel := context.WithCancelCause(m.ctx)
	stop := context.AfterFunc(caller, func() { cancel(fmt.Errorf("%w: the caller went away (%v)", ErrCancelled, caller.Err())) })
	defer stop()
	m.mu.Lock()
	a.cancel = cancel
	a.paused = false
	if a.cancelled {
		cancel(ErrCancelled)
	}
	m.mu.Unlock()
	m.wg.Add(1)
	defer m.wg.Done()
	m.run(ctx, cancel, a, e, decisions)
}

// run waits for a worker slot, then runs e's loop to its end or pause.
func (m *Manager) run(ctx context.Context, cancel context.CancelCauseFunc, a *active, e *execution, decisions map[string]Decision) {
	defer cancel(nil)
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
	}
	m.dequeue()
	m.mu.Lock()
	a.working = true
	m.mu.Unlock()
	var err error
	marked := false
	if ctx.Err() == nil {
		if a.recovery > 0 {
			// A run that cannot be marked is not run: it stays as it is
			// in the store, whose failed write stops all writes.
			err = m.markRecovery(ctx, e, a.recovery)
			marked = err == nil
		}
		if err == nil {
			err = e.loop(ctx, decisions)
		}
		<-m.sem
	} else {
		err = e.stopped(ctx, context.Cause(ctx))
	}
	if marked && errors.Is(err, errShutdown) {
		m.takeBackRecovery(e.run.ID)
	}
	m.release(a, e.run.Status == StatusInterrupted)
}

// Wait blocks until the run is no longer executing (it ended or paused at an
// interrupt) or ctx ends, and returns the stored run.
func (m *Manager) Wait(ctx context.Context, runID string) (*Run, error) {
	m.mu.Lock()
	a := m.runs[runID]
	var done chan struct{}
	if a != nil && !a.paused {
		done = a.done
	}
	m.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return m.store.Run(context.WithoutCancel(ctx), runID)
}

// Run returns a run's record. The store is not rewritten at every step, so
// a run that a worker is executing is reported running even while its
// stored record still says queued. In exit durability, a run this manager
// opened and has not yet stored is reported from its record as it opened.
func (m *Manager) Run(ctx context.Context, runID string) (*Run, error) {
	// The record as it opened is taken before the store is read: a run
	// that has left the manager by then was stored before that read.
	var opened *Run
	m.mu.Lock()
	if a := m.runs[runID]; a != nil && a.opened != nil {
		opened = a.opened.Clone()
		opened.Status = a.liveStatus(opened.Status)
	}
	m.mu.Unlock()
	r, err := m.store.Run(ctx, runID)
	if errors.Is(err, ErrRunNotFound) && opened != nil {
		// Exit durability: not stored yet, but opened here and not ended.
		return opened, nil
	}
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	r.Status = m.runs[runID].liveStatus(r.Status)
	m.mu.Unlock()
	return r, nil
}

// Unstored returns the runs this manager opened in exit durability and
// still runs, which the store may have no record of yet (it has one once a
// run pauses, ends or calls a tool), as they opened, with their live
// status: those of f's agent and thread, after f.After in f's order, in
// that order. A listing of the store merges them in, keeping a stored
// record over its opened one.
func (m *Manager) Unstored(f RunFilter) []*Run {
	f.Status = "" // a stored status the caller lists; these runs are live
	m.mu.Lock()
	var out []*Run
	for _, a := range m.runs {
		r := a.opened
		if r == nil || !f.Match(r) || !f.comesAfter(r.ID) {
			continue
		}
		r = r.Clone()
		r.Status = a.liveStatus(r.Status)
		out = append(out, r)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b *Run) int {
		if f.Desc {
			return strings.Compare(b.ID, a.ID)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// LiveStatus is the status of run r, as a store listed it, as the manager
// knows it now: a run that a worker is executing is running, though its
// record still says queued (see Run). Unlike Run, it reads nothing from
// the store, so a listing of many runs costs no more for it.
func (m *Manager) LiveStatus(r *Run) RunStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runs[r.ID].liveStatus(r.Status)
}

// liveStatus is the status of a's run, whose record says stored; a may be
// nil (the manager holds no such run). The caller holds m.mu.
func (a *active) liveStatus(stored RunStatus) RunStatus {
	if a != nil && a.working && stored == StatusQueued {
		return StatusRunning
	}
	return stored
}

// Resume answers an interrupted run's pending interrupts and runs it on.
func (m *Manager) Resume(ctx context.Context, runID string, decisions map[string]Decision) (*Run, error) {
	if m.bad != nil {
		return nil, fmt.Errorf("resume run %s: %w", runID, m.bad)
	}
	run, err := m.store.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	if run.Status != StatusInterrupted {
		return nil, fmt.Errorf("%w: run %s is %s", ErrNotInterrupted, runID, run.Status)
	}
	if len(decisions) == 0 {
		return nil, fmt.Errorf("resume run %s: no decision given", runID)
	}
	known := map[string]PendingInterrupt{}
	for _, in := range run.Interrupts {
		known[in.ID] = in
	}
	for id, d := range decisions {
		if err := d.Validate(); err != nil {
			return nil, err
		}
		if _, ok := known[id]; !ok {
			return nil, fmt.Errorf("%w: %s on run %s", ErrUnknownInterrupt, id, runID)
		}
	}
	m.mu.Lock()
	a := m.runs[runID]
	if a == nil || !a.paused {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: run %s is not paused here", ErrNotInterrupted, runID)
	}
	a.paused = false
	a.cancel = nil // the last execution's; a Cancel from here on waits for launch
	m.queued++
	m.mu.Unlock()
	ag, err := m.resolve(run.Agent, run.Bundle)
	if err != nil {
		m.dequeue()
		m.release(a, true)
		return nil, fmt.Errorf("resume run %s: %w", runID, err)
	}
	// The nodes' own checks, before the decision is spent.
	for id, d := range decisions {
		if err := ag.Graph.checkDecision("", known[id], d); err != nil {
			m.dequeue()
			m.release(a, true)
			return nil, fmt.Errorf("resume run %s: %w", runID, err)
		}
	}
	e, err := m.prepareResume(ctx, ag, run)
	if err != nil {
		m.dequeue()
		m.release(a, true)
		return nil, err
	}
	m.launch(a, e, decisions)
	return run, nil
}

func (m *Manager) prepareResume(ctx context.Context, ag *Agent, run *Run) (*execution, error) {
	// The run goes on in the manager's durability, but a recorded one that
	// is neither sync nor exit says the record cannot be trusted as to how
	// it ran so far.
	if err := run.Durability.check(); err != nil {
		return nil, fmt.Errorf("resume run %s: recorded durability: %w", run.ID, err)
	}
	e, err := ag.Graph.newExecution(m.config(ag, run))
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, ""); err != nil {
		return nil, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	steps, err := countSteps(ctx, m.store, ag.Graph, e.head, run.ID)
	if err != nil {
		return nil, fmt.Errorf("resume run %s: %w", run.ID, err)
	}
	// In exit durability only the checkpoint the run paused at is stored,
	// so the steps before it are not there to be counted; the record
	// written at the pause holds them.
	e.run.Steps = max(steps, run.Steps)
	return e, nil
}

// countSteps counts the supersteps a run has committed, walking back from
// the thread's head through the run's own checkpoints, and down the
// namespaces of the subgraphs its tasks ran (see countStep). The stored run
// record is not rewritten at every step, so this is where its step count
// lives.
func countSteps(ctx context.Context, store Checkpointer, g *Graph, head *Checkpoint, runID string) (int, error) {
	n := 0
	for c := head; c != nil && c.RunID == runID; {
		if c.Source == SourceLoop {
			n++
		}
		sub, err := countSubgraphSteps(ctx, store, g, c, runID)
		if err != nil {
			return 0, err
		}
		n += sub
		if c.ParentID == "" {
			break
		}
		p, err := store.Checkpoint(ctx, c.Thread, c.NS, c.ParentID)
		if err != nil {
			return 0, fmt.Errorf("count steps: %w", err)
		}
		c = p
	}
	return n, nil
}

// countSubgraphSteps counts the supersteps of the subgraphs that c's tasks
// ran (or began) in the run.
func countSubgraphSteps(ctx context.Context, store Checkpointer, g *Graph, c *Checkpoint, runID string) (int, error) {
	n := 0
	for i, t := range c.Next {
		nd := g.nodes[t.Node]
		if nd == nil || nd.subgraph == nil {
			continue
		}
		id := t.ID
		if id == "" {
			id = taskID(c.ID, t.Node, i) // as runStep names it
		}
		head, err := store.Checkpoint(ctx, c.Thread, subgraphNS(c.NS, t.Node, id), "")
		if errors.Is(err, ErrCheckpointNotFound) {
			continue // not begun, or not committed (exit durability)
		}
		if err != nil {
			return 0, fmt.Errorf("count steps: %w", err)
		}
		k, err := countSteps(ctx, store, nd.subgraph, head, runID)
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// Cancel stops a run: an executing run stops at its next safe point; a
// paused or queued one is marked cancelled at once.
func (m *Manager) Cancel(ctx context.Context, runID string) error {
	m.mu.Lock()
	a := m.runs[runID]
	var stop context.CancelCauseFunc
	paused := a != nil && a.paused
	switch {
	case paused:
		// Claimed, as Resume claims it: a Resume that comes meanwhile
		// finds the run not paused, so it is not both resumed and
		// recorded as cancelled.
		a.paused = false
	case a != nil && a.cancel == nil:
		a.cancelled = true // opened or being resumed, not yet handed to a worker
	case a != nil:
		stop = a.cancel
	}
	m.mu.Unlock()
	if a == nil {
		run, err := m.store.Run(ctx, runID)
		if err != nil {
			return err
		}
		return fmt.Errorf("run %s has already ended (%s)", runID, run.Status)
	}
	if !paused {
		if stop != nil {
			stop(ErrCancelled)
		}
		return nil
	}
	run, err := m.store.Run(ctx, runID)
	if err != nil {
		m.release(a, true)
		return err
	}
	run.Status = StatusCancelled
	run.Error = ErrCancelled.Error()
	run.EndedAt = time.Now().UTC()
	run.Interrupts = nil
	ev := Event{Time: run.EndedAt, Type: EventRunFailed, Run: run.ID, Thread: run.Thread,
		Data: json.RawMessage(`{"status":"cancelled"}`)}
	c := &Commit{Run: run, Events: []Event{ev}, Sync: true}
	if err := m.store.Commit(ctx, c); err != nil {
		m.release(a, true)
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	if m.opts.Events != nil {
		m.opts.Events.Publish(ev)
		m.opts.Events.Publish(c.Announce...)
	}
	m.release(a, false)
	return nil
}

// DamagedRunsError is what Recover returns when it had to leave out run
// records that cannot be read: it recovered every other run, and the
// appliance can go on. Keys names the records; db check and db salvage
// deal with them.
type DamagedRunsError struct {
	Keys  []string
	First error // the first record's error, naming its bucket and key
}

func (e *DamagedRunsError) Error() string {
	return fmt.Sprintf("recover: %d run record(s) cannot be read and were left out (their runs are not resumed); first: %v", len(e.Keys), e.First)
}

// Recover resumes every run that a crash left queued or running, from its
// last checkpoint, and registers interrupted runs as paused. It returns the
// number of runs resumed. A run record that cannot be read does not stop
// the others: Recover leaves it out and returns a *DamagedRunsError after
// recovering the rest. One damaged record of a finished run should not
// keep the appliance from starting.
//
// A run that kills the process would kill it again at every start. So the
// worker that takes a recovered run counts the recovery on the run's
// record before it runs anything (see markRecovery), and a run that has
// been recovered ManagerOptions.MaxRecoveries times in a row is not run
// again: Recover ends it failed with ErrCrashLoop (and run.failed and its
// outcome, as any run that cannot be recovered). The count starts again
// when the run makes progress, which its record shows at once: its next
// commit of a step of its own graph, a pause for a person, or its end. A
// run stopped by Close, not a crash, is not counted, nor one that waited
// in the queue for a worker all along. Runs that a crash cut short along
// with the one that caused it are counted too, but they seldom go
// MaxRecoveries starts without committing a step.
func (m *Manager) Recover(ctx context.Context) (int, error) {
	if m.bad != nil {
		return 0, fmt.Errorf("recover: %w", m.bad)
	}
	n := 0
	var damaged *DamagedRunsError
	seen := map[string]bool{}
	onDamaged := func(key string, err error) {
		if seen[key] {
			return // each status's listing meets it again
		}
		seen[key] = true
		if damaged == nil {
			damaged = &DamagedRunsError{First: err}
		}
		damaged.Keys = append(damaged.Keys, key)
	}
	for _, st := range []RunStatus{StatusInterrupted, StatusQueued, StatusRunning} {
		after := ""
		for {
			runs, err := m.store.Runs(ctx, RunFilter{Status: st, After: after, Limit: 500, Damaged: onDamaged})
			if err != nil {
				return n, fmt.Errorf("recover: list %s runs: %w", st, err)
			}
			if len(runs) == 0 {
				break
			}
			after = runs[len(runs)-1].ID
			for _, run := range runs {
				resumed, err := m.recoverOne(ctx, run)
				if err != nil {
					return n, err
				}
				if resumed {
					n++
				}
			}
		}
	}
	if damaged != nil {
		return n, damaged
	}
	return n, nil
}

// recoverOne recovers one run the listing found: it registers a paused one,
// and resumes one left queued or running, or fails it when it cannot be
// (resumed says which). err is a store that failed to record the failure.
func (m *Manager) recoverOne(ctx context.Context, run *Run) (resumed bool, err error) {
	m.mu.Lock()
	if m.threads[run.Thread] != nil {
		m.mu.Unlock()
		return false, nil
	}
	a := &active{runID: run.ID, thread: run.Thread, done: make(chan struct{}), paused: run.Status == StatusInterrupted}
	m.threads[run.Thread] = a
	m.runs[run.ID] = a
	if !a.paused {
		m.queued++
	}
	m.mu.Unlock()
	if a.paused {
		return false, nil
	}
	fail := func(err error) (bool, error) {
		m.dequeue()
		run.Status, run.Error, run.EndedAt = StatusFailed, err.Error(), time.Now().UTC()
		ev := Event{Time: run.EndedAt, Type: EventRunFailed, Run: run.ID, Thread: run.Thread}
		ev.Data, _ = json.Marshal(map[string]any{"status": run.Status, "error": run.Error})
		c := &Commit{Run: run, Events: []Event{ev}, Sync: true}
		cerr := m.store.Commit(ctx, c)
		m.release(a, false)
		if cerr != nil {
			return false, fmt.Errorf("recover run %s: %w", run.ID, cerr)
		}
		if m.opts.Events != nil {
			m.opts.Events.Publish(c.Events...)
			m.opts.Events.Publish(c.Announce...)
		}
		return false, nil
	}
	n := 0
	if v, ok := run.Meta[MetaRecoveries]; ok {
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return fail(fmt.Errorf("recover run %s: its record's recovery count %q is not a count; not run again", run.ID, v))
		}
	}
	if limit := m.opts.MaxRecoveries; limit > 0 && n >= limit {
		m.stopCrashLoop(ctx, run)
		return fail(fmt.Errorf("%w: run %s was recovered %d times and crashed each time before it made progress; not run again (its thread is free: start a new run on it)", ErrCrashLoop, run.ID, n))
	}
	ag, err := m.resolve(run.Agent, run.Bundle)
	if err != nil {
		return fail(fmt.Errorf("recover: %w", err))
	}
	e, err := m.prepareResume(ctx, ag, run)
	if err != nil {
		return fail(err)
	}
	a.recovery = n + 1
	m.launch(a, e, nil)
	return true, nil
}

// stopCrashLoop puts the active time of a run that is not run again on its
// record, up to its newest commit, as its end would (see active.go). A
// thread head it cannot read leaves the time the record has.
func (m *Manager) stopCrashLoop(ctx context.Context, run *Run) {
	head, err := m.store.Checkpoint(ctx, run.Thread, "", "")
	if err != nil && !errors.Is(err, ErrCheckpointNotFound) {
		return
	}
	active, _ := run.activeUpTo(head)
	meta := maps.Clone(run.Meta)
	meta[MetaActive] = strconv.FormatInt(active.Milliseconds(), 10)
	delete(meta, MetaRunningSince)
	run.Meta = meta
}

// markRecovery is the crash-loop guard. A run whose step kills the process
// (out of memory, a hung host, a crashing bug) would be recovered at every
// start and kill it again, and the appliance would never serve anyone. So
// before a recovered run executes anything, the worker that takes it puts
// on its record how many times in a row it has been recovered, this time
// included (count, in MetaRecoveries), with its active time up to its
// newest commit and the time its new stretch begins (see active.go),
// committed with fsync; Recover stops a run whose count has reached
// MaxRecoveries. A run waiting in the queue is not counted: a crash then
// is not its doing. Its state is loaded before (at Recover), so a crash
// while loading it is not counted either; that state was in memory when
// its last step committed it.
//
// The execution's own record leaves the count out. It is written with the
// run's first commit, which only progress makes: a step of its own graph,
// a pause or its end (a subgraph's steps do not write it). That commit
// carries the record anyway, since its active time changed, so taking the
// count off costs no write of its own.
func (m *Manager) markRecovery(ctx context.Context, e *execution, count int) error {
	active, _ := e.run.activeUpTo(e.head)
	meta := maps.Clone(e.run.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaActive] = strconv.FormatInt(active.Milliseconds(), 10)
	meta[MetaRunningSince] = time.Now().UTC().Format(time.RFC3339Nano)
	meta[MetaRecoveries] = strconv.Itoa(count)
	rec := e.run.Clone()
	rec.Meta = meta
	if err := m.store.Commit(context.WithoutCancel(ctx), &Commit{Run: rec, Sync: true}); err != nil {
		return fmt.Errorf("recover run %s: record the recovery: %w", e.run.ID, err)
	}
	meta = maps.Clone(meta)
	delete(meta, MetaRecoveries)
	e.run.Meta = meta
	e.runChanged = true
	return nil
}

// takeBackRecovery takes the count of the recovery that markRecovery put
// on a run's record off again when the run stopped for a shutdown, not a
// crash, before it made progress: a restart is not the run's fault. A
// write that fails leaves the count on record, which errs on the safe
// side, and a store that fails it fails the next start's recovery too.
func (m *Manager) takeBackRecovery(runID string) {
	ctx := context.Background()
	run, err := m.store.Run(ctx, runID)
	if err != nil || run.Status.Terminal() || run.Status == StatusInterrupted {
		return
	}
	if _, ok := run.Meta[MetaRecoveries]; !ok {
		return // progress made: the count is gone already
	}
	meta := maps.Clone(run.Meta)
	delete(meta, MetaRecoveries)
	run.Meta = meta
	_ = m.store.Commit(ctx, &Commit{Run: run, Sync: true})
}

// Active reports how many runs are executing or queued.
func (m *Manager) Active() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, a := range m.runs {
		if !a.paused {
			n++
		}
	}
	return n
}

// Close stops accepting runs and waits for the executing ones to stop at
// their next safe point. They stay running in the store and are recovered
// at the next start.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.stop(errShutdown)
	m.wg.Wait()
}
