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
	"sync/atomic"
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
	// EventValues is every run's RunConfig.EventValues: the channels whose
	// value node.completed events carry.
	EventValues []string
	CacheSize   int // materialized thread states kept; default 1024
	// CacheBytes bounds the kept states by what their values take encoded;
	// default DefaultCacheBytes, and negative for no bound.
	CacheBytes int64
	// MaxRecoveries bounds how many times in a row a run is recovered
	// after a crash without making progress in between; the next start
	// ends it failed with ErrCrashLoop instead of running it again. From
	// its second recovery in a row on, and at the recovery after which
	// one more crash would fail it, a run is a suspect and has a turn
	// alone, so that only its own crashes count (see Recover). Default
	// DefaultMaxRecoveries; negative for no bound.
	MaxRecoveries int
	// MaxAlone bounds a suspect's turn alone: once it has run alone that
	// long without making progress, the other runs get workers again
	// beside it (see Recover). Default DefaultMaxAlone; negative for no
	// bound.
	MaxAlone time.Duration
	// MaxSuspectWait bounds a suspect's wait for its turn, while the runs
	// that hold workers (the suspects before it, running on after their
	// turns) keep it from coming and no other run takes a worker: once it
	// has waited that long, it runs beside them as any run does (see
	// Recover). Zero means MaxAlone, as set or defaulted; negative for no
	// bound.
	MaxSuspectWait time.Duration

	// clock stands in for the wall clock in the runs' active time and
	// records (see RunConfig.clock); nil in use.
	clock func() time.Time
}

// DefaultMaxRecoveries is how many times in a row a run is recovered, by
// default, before it is taken for the cause of its crashes.
const DefaultMaxRecoveries = 3

// DefaultMaxAlone is how long, by default, a suspect of the crash-loop
// guard runs alone before the other runs get workers beside it: a slow
// model call or two, not an afternoon of the appliance held up.
const DefaultMaxAlone = 2 * time.Minute

// MetaRecoveries is the key of Run.Meta that counts the times a run has
// been recovered since it last made progress. It is on record only in
// between: the first commit that carries the run's record after a
// recovery (its next step or a subgraph's, a task's saved writes, a pause
// or its end) leaves it out.
const MetaRecoveries = "engine.recoveries"

// MetaAttempt is the key of Run.Meta that numbers the run's attempt: a
// run starts as attempt 0 (and leaves it out), and every recovery starts
// the next one, whether or not the run had made progress, and keeps the
// number on record from then on. In exit durability a crash takes back
// what a run did since its last commit, and the model calls it made then
// are not its own any more: the calls of the attempt that ends it are
// (see RunInfo.Attempt).
const MetaAttempt = "engine.attempt"

// RunAttempt is r's attempt as its record keeps it (MetaAttempt): 0 when
// it has none, or one that is not a count.
func RunAttempt(r *Run) int {
	n, err := strconv.Atoi(r.Meta[MetaAttempt])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

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
	// The crash-loop guard's suspects (see Recover) whose turn alone has
	// not ended (they have not yet made progress, paused, ended or run
	// alone for MaxAlone) are in waiting or alone. While there are any,
	// runs take their worker slots in turns (see takeTurn): waiting holds
	// the suspects waiting for their turn, in order; alone is the one
	// whose turn it is, holding every slot, and aloneEnd the timer that
	// ends its turn. head is the first suspect waiting while none runs alone, and
	// headEnd the timer that ends its wait. changed is closed, and made
	// anew, whenever the turns change, to wake the runs that wait on them.
	waiting  []*active
	alone    *active
	aloneEnd *time.Timer
	head     *active
	headEnd  *time.Timer
	changed  chan struct{}
	// recoveredSuspects is how many suspects the last Recover found.
	recoveredSuspects int

	// recovery is Recover's pass over the store, which a run that would
	// take a thread first waits for. pass is the one running, nil when
	// none is: the callers wait for it, each as long as its own context
	// lasts, while it goes on for the others.
	recovery struct {
		mu      sync.Mutex
		done    atomic.Bool
		pass    *recoveryPass
		resumed int
		err     error // a *DamagedRunsError, or nil
	}
}

// recoveryPass is one run of Recover's pass: done is closed when it ends,
// with what it found.
type recoveryPass struct {
	done    chan struct{}
	resumed int
	err     error
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
	// suspect: the run is one of the crash-loop guard's suspects and its
	// turn alone has not ended (see Recover). waitedOut: it was one, and
	// its wait for its turn ran out; it runs as any run, and the suspects
	// after it do not hold it back, until it pauses. slots is how many
	// worker slots the run holds: one, or all of them while a suspect runs
	// alone.
	suspect   bool
	waitedOut bool
	slots     int
	// held: Recover left the run as it is in the store, since its pinned
	// bundle is unavailable (see Held); it keeps its thread, and runs
	// nowhere until a later start finds the bundle back, or a Cancel
	// ends it.
	held *HeldRun
}

var errShutdown = errors.New("run manager shutting down")

// NewManager returns a manager over store. It recovers the runs that a
// crash left in store before it takes a run of its own (see Recover); call
// Close when done.
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
	if opts.MaxAlone == 0 {
		opts.MaxAlone = DefaultMaxAlone
	}
	if opts.MaxSuspectWait == 0 {
		opts.MaxSuspectWait = opts.MaxAlone
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
		Events: m.opts.Events, EventValues: m.opts.EventValues, Cache: m.cache, Output: a.Output, clock: m.opts.clock}
}

// now is the time by the manager's clock (see ManagerOptions.clock).
func (m *Manager) now() time.Time {
	if m.opts.clock != nil {
		return m.opts.clock()
	}
	return time.Now()
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
		if cur.paused || cur.held != nil || !wait {
			state := "running"
			switch {
			case cur.paused:
				state = "interrupted (resume or cancel it first)"
			case cur.held != nil:
				state = "left waiting for its pinned bundle (put the bundle back and restart, or cancel it first)"
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
		// Nor is it being recovered: a pause is progress, and a Resume
		// resumes it, counting no recovery (see markRecovery).
		a.recovery = 0
		// Nor a suspect whose wait ran out: that let the execution that
		// paused run beside the suspects, and a Resume waits for their
		// turns as any run does (see takeTurn).
		a.waitedOut = false
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
	if err := m.recoverFirst(ctx); err != nil {
		return nil, nil, fmt.Errorf("start run: %w", err)
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
	now := m.now().UTC()
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
	slots := m.takeWorker(ctx, a)
	m.dequeue()
	m.mu.Lock()
	a.working = true
	m.mu.Unlock()
	var err error
	marked := false
	// Close cancels the runs one by one: the slot of a run it stopped
	// may come free before it reaches this one's context, which must not
	// begin a step meanwhile.
	cause := context.Cause(ctx)
	if cause == nil {
		cause = context.Cause(m.ctx)
	}
	if slots > 0 && cause == nil {
		if a.recovery > 0 {
			marked, err = m.startRecovered(ctx, a, e)
		}
		if err == nil {
			err = e.loop(ctx, decisions)
		}
	} else {
		if a.recovery > 0 && !errors.Is(cause, errShutdown) {
			m.recountSteps(ctx, e) // it ends now, its state not loaded
		}
		err = e.stopped(ctx, cause)
	}
	m.freeWorker(a)
	if marked && errors.Is(err, errShutdown) {
		m.takeBackRecovery(e.run.ID, a.recovery)
	}
	m.release(a, e.run.Status == StatusInterrupted)
}

// takeWorker waits for a worker slot for a's run, or for ctx to end, and
// returns how many slots it took: none when ctx ended. While the crash-loop
// guard has suspects, the runs take their slots in turns (see takeTurn).
// a.slots counts them from the moment they are taken, under m.mu, as the
// timer that ends a turn alone gives back all but one (see clearSuspect).
func (m *Manager) takeWorker(ctx context.Context, a *active) int {
	for {
		m.mu.Lock()
		if !m.suspectsLeft() {
			m.mu.Unlock()
			select {
			case m.sem <- struct{}{}:
				m.mu.Lock()
				a.slots = 1
				m.mu.Unlock()
				return 1
			case <-ctx.Done():
				return 0
			}
		}
		n, changed := m.takeTurn(a), m.changed
		a.slots = n
		m.mu.Unlock()
		if n > 0 {
			return n
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0
		}
	}
}

// takeTurn takes what a's run may take of the worker slots now, while the
// crash-loop guard has suspects (see Recover), and returns how many slots
// it took. While a suspect runs alone it holds every slot, and no other
// run takes one. While suspects wait for their turns, no other run takes
// a slot either: the first one waiting takes every slot once no run holds
// one, which at start is at once, and after its turn the next one waits
// for the runs that hold slots (the suspects before it, going on beside
// each other once their turns ended) to end or pause. Its wait is bounded
// (see headChanged): once it runs out, the suspect runs as any run does,
// beside the runs that hold slots, and the next suspect waits in its
// place; the other runs take slots once no suspect waits. The caller
// holds m.mu.
func (m *Manager) takeTurn(a *active) int {
	if m.alone != nil {
		return 0
	}
	if a.suspect {
		if m.waiting[0] != a || len(m.sem) > 0 {
			return 0
		}
		m.stopHead()
		for range cap(m.sem) {
			m.sem <- struct{}{}
		}
		m.waiting = m.waiting[1:]
		m.alone = a
		if d := m.opts.MaxAlone; d > 0 {
			m.aloneEnd = time.AfterFunc(d, func() {
				m.mu.Lock()
				defer m.mu.Unlock()
				if m.alone == a {
					m.clearSuspect(a)
				}
			})
		}
		return cap(m.sem)
	}
	if len(m.waiting) > 0 && !a.waitedOut {
		return 0 // the suspects' turns
	}
	select {
	case m.sem <- struct{}{}:
		return 1
	default:
		return 0
	}
}

// freeWorker gives back the worker slots a's run holds, as its worker is
// done with it, and clears it if it is a suspect.
func (m *Manager) freeWorker(a *active) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearSuspect(a)
	for ; a.slots > 0; a.slots-- {
		<-m.sem
	}
	if m.changed != nil {
		m.turnsChanged()
	}
}

// clearSuspect ends a's time as a suspect, if it is one: its turn alone,
// keeping one worker slot of those it holds, or its wait for the turn. The
// others may run again. The caller holds m.mu.
func (m *Manager) clearSuspect(a *active) {
	if !a.suspect {
		return
	}
	a.suspect = false
	if m.alone == a {
		m.alone = nil
		if m.aloneEnd != nil {
			m.aloneEnd.Stop()
			m.aloneEnd = nil
		}
		for ; a.slots > 1; a.slots-- {
			<-m.sem
		}
	} else {
		m.waiting = slices.DeleteFunc(m.waiting, func(w *active) bool { return w == a })
	}
	m.headChanged()
	m.turnsChanged()
}

// headChanged starts the wait of the first suspect waiting, when none runs
// alone and it has not begun to wait already. The other runs take no
// worker slots meanwhile (see takeTurn), so that the runs that hold them
// end or pause and its turn comes. After MaxSuspectWait, with its turn
// still not come, the suspect waits no longer: it runs as any run does, beside the
// others, and a crash counts against every run it cuts short. So a slow
// run holds a suspect back, and a suspect holds the others up, for a
// bounded time. A wait that runs out while no run holds a slot, which
// the suspect's worker is about to take, starts again. The caller holds
// m.mu.
func (m *Manager) headChanged() {
	var head *active
	if m.alone == nil && len(m.waiting) > 0 {
		head = m.waiting[0]
	}
	if head == m.head {
		return
	}
	m.stopHead()
	d := m.opts.MaxSuspectWait
	if head == nil || d <= 0 {
		return
	}
	m.head = head
	m.headEnd = time.AfterFunc(d, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.head != head || m.alone != nil {
			return
		}
		if len(m.sem) == 0 {
			m.headEnd.Reset(d)
			return
		}
		head.waitedOut = true
		m.clearSuspect(head)
	})
}

// suspectsLeft says whether a suspect's turn alone has not ended: one
// waits for it, or runs alone. The caller holds m.mu.
func (m *Manager) suspectsLeft() bool { return m.alone != nil || len(m.waiting) > 0 }

// stopHead ends the wait headChanged started. The caller holds m.mu.
func (m *Manager) stopHead() {
	if m.headEnd != nil {
		m.headEnd.Stop()
	}
	m.head, m.headEnd = nil, nil
}

// turnsChanged wakes the runs waiting for their turn (see takeTurn). The
// caller holds m.mu.
func (m *Manager) turnsChanged() {
	close(m.changed)
	m.changed = nil
	if m.suspectsLeft() {
		m.changed = make(chan struct{})
	}
}

// Wait blocks until the run is no longer executing (it ended or paused at an
// interrupt) or ctx ends, and returns the run as Run reports it: a run that
// outlives ctx is reported running (or queued), also in exit durability,
// where the store has no record of it yet. A run held for its bundle (see
// Held) is not executing: Wait returns it at once.
func (m *Manager) Wait(ctx context.Context, runID string) (*Run, error) {
	m.mu.Lock()
	a := m.runs[runID]
	var done chan struct{}
	if a != nil && !a.paused && a.held == nil {
		done = a.done
	}
	m.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return m.Run(context.WithoutCancel(ctx), runID)
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
		a.setLive(opened)
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
	m.runs[runID].setLive(r)
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

// SetLive sets r, as a store listed it, to what it is now: its status to
// the live one (a record still queued that a worker executes is running),
// and its Held to why the manager holds it (see Held), or nil. Unlike
// Run, it reads nothing from the store, so a listing of many runs costs
// no more for it.
func (m *Manager) SetLive(r *Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runs[r.ID].setLive(r)
}

// setLive is SetLive of a's run; a may be nil. The caller holds m.mu.
func (a *active) setLive(r *Run) {
	r.Status, r.Held = a.liveStatus(r.Status), nil
	if a != nil && a.held != nil {
		r.Held = &Hold{Reason: a.held.Err.Error(), Bundle: a.held.Bundle}
	}
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
	if err := m.recoverFirst(ctx); err != nil {
		return nil, fmt.Errorf("resume run %s: %w", runID, err)
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
	if err == nil && (e.head == nil || e.head.RunID != "" && e.head.RunID != run.ID) {
		// A run pauses at a checkpoint of its own, which holds the
		// questions the decisions answer, and no other run takes the
		// thread while it waits (a checkpoint that names no run predates
		// the field, and is taken as the run's). A thread without it (a store salvaged
		// after damage lost it) would have the run go on from an earlier
		// state, or an empty one, and end with an outcome it never
		// reached.
		err = fmt.Errorf("resume run %s: %w: the checkpoint it paused at is not in the store (thread %q), "+
			"so it cannot go on from where it stopped; cancel it and start a new run", runID, ErrCheckpointNotFound, run.Thread)
	}
	if err != nil {
		m.dequeue()
		m.release(a, true)
		return nil, err
	}
	m.launch(a, e, decisions)
	return run, nil
}

func (m *Manager) prepareResume(ctx context.Context, ag *Agent, run *Run) (*execution, error) {
	e, err := m.resumeExecution(ag, run)
	if err != nil {
		return nil, err
	}
	if err := m.loadResume(ctx, e); err != nil {
		return nil, err
	}
	return e, nil
}

// resumeExecution is the execution that resumes run, its state not loaded
// yet (see loadResume).
func (m *Manager) resumeExecution(ag *Agent, run *Run) (*execution, error) {
	// The run goes on in the manager's durability, but a recorded one that
	// is neither sync nor exit says the record cannot be trusted as to how
	// it ran so far.
	if err := run.Durability.check(); err != nil {
		return nil, fmt.Errorf("resume run %s: recorded durability: %w", run.ID, err)
	}
	return ag.Graph.newExecution(m.config(ag, run))
}

// loadResume loads the state that e resumes its run from, and counts the
// steps the run has taken.
func (m *Manager) loadResume(ctx context.Context, e *execution) error {
	if err := e.load(ctx, ""); err != nil {
		return fmt.Errorf("resume run %s: %w", e.run.ID, err)
	}
	steps, err := countSteps(ctx, m.store, e.g, e.head, e.run.ID)
	if err != nil {
		return fmt.Errorf("resume run %s: %w", e.run.ID, err)
	}
	// In exit durability only the checkpoint the run paused at is stored,
	// so the steps before it are not there to be counted; the record
	// written at the pause holds them.
	e.run.Steps = max(steps, e.run.Steps)
	return nil
}

// recountSteps counts the steps of a recovered run that ends before its
// state is loaded (it is cancelled while it waits for a worker), so that
// its last record holds them. A count that fails leaves the record's.
func (m *Manager) recountSteps(ctx context.Context, e *execution) {
	ctx = context.WithoutCancel(ctx)
	head, err := m.threadHead(ctx, e.run.Thread)
	if err != nil {
		return
	}
	if steps, err := countSteps(ctx, m.store, e.g, head, e.run.ID); err == nil {
		e.run.Steps = max(steps, e.run.Steps)
	}
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

// RunSteps counts the supersteps that run runID has committed on thread,
// from its checkpoints alone, as recovery does (see countSteps), for a
// reader that has no graph: every task's subgraph namespace is looked up,
// and one that holds nothing counts nothing. It costs a read per
// checkpoint and task of the run, so it is for a run or a few, such as
// those a stop left unfinished, whose records hold no step count yet.
func RunSteps(ctx context.Context, store Checkpointer, thread, runID string) (int, error) {
	head, err := store.Checkpoint(ctx, thread, "", "")
	if errors.Is(err, ErrCheckpointNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("count steps: %w", err)
	}
	return countSteps(ctx, store, nil, head, runID)
}

// countSubgraphSteps counts the supersteps of the subgraphs that c's tasks
// ran (or began) in the run. With no graph g, every task's namespace is
// looked up.
func countSubgraphSteps(ctx context.Context, store Checkpointer, g *Graph, c *Checkpoint, runID string) (int, error) {
	n := 0
	for i, t := range c.Next {
		var sub *Graph
		if g != nil {
			nd := g.nodes[t.Node]
			if nd == nil || nd.subgraph == nil {
				continue
			}
			sub = nd.subgraph
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
		k, err := countSteps(ctx, store, sub, head, runID)
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
	// A run a crash left is the manager's once recovery has registered it.
	if err := m.recoverFirst(ctx); err != nil {
		return fmt.Errorf("cancel run %s: %w", runID, err)
	}
	m.mu.Lock()
	a := m.runs[runID]
	var stop context.CancelCauseFunc
	paused := a != nil && a.paused
	var held *HeldRun
	switch {
	case paused:
		// Claimed, as Resume claims it: a Resume that comes meanwhile
		// finds the run not paused, so it is not both resumed and
		// recorded as cancelled.
		a.paused = false
	case a != nil && a.held != nil:
		// Held for its bundle, it runs nowhere: it ends here, as a
		// paused one does. Claimed likewise, for a Cancel meanwhile.
		held, a.held = a.held, nil
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
	if !paused && held == nil {
		if stop != nil {
			stop(ErrCancelled)
		}
		return nil
	}
	// giveBack leaves the run as it was, paused or held, when its end
	// is not stored.
	giveBack := func() {
		if held == nil {
			m.release(a, true)
			return
		}
		m.mu.Lock()
		a.held = held
		m.mu.Unlock()
	}
	run, err := m.store.Run(ctx, runID)
	if err != nil {
		giveBack()
		return err
	}
	run.Status = StatusCancelled
	run.Error = ErrCancelled.Error()
	run.EndedAt = m.now().UTC()
	run.Interrupts = nil
	ev := Event{Time: run.EndedAt, Type: EventRunFailed, Run: run.ID, Thread: run.Thread,
		Data: json.RawMessage(`{"status":"cancelled"}`)}
	c := &Commit{Run: run, Events: []Event{ev}, Sync: true}
	if err := m.store.Commit(ctx, c); err != nil {
		giveBack()
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
// number of runs it resumes: it hands them to workers, which load their
// state. A run record that cannot be read does not stop the others:
// Recover leaves it out and returns a *DamagedRunsError after recovering
// the rest. One damaged record of a finished run should not keep the
// appliance from starting. A run whose pinned bundle the resolver reports
// unavailable (ErrBundleUnavailable) is neither resumed nor failed: it is
// left as it is, holding its thread, for a later start (see Held).
//
// A run that kills the process would kill it again at every start. So the
// worker that takes a recovered run counts the recovery on the run's
// record before it loads or runs anything (see markRecovery), and a run
// that has been recovered ManagerOptions.MaxRecoveries times in a row is
// not run again: Recover ends it failed with ErrCrashLoop (and run.failed
// and its outcome, as any run that cannot be recovered). The count starts
// again when the run makes progress, which its record shows at once: its
// next commit of a step (of its own graph or of a subgraph) or of a task's
// writes saved while its step is unfinished, a pause for a person, or its
// end. A run stopped by Close, not a crash, is not counted,
// nor one that waited for a worker all along.
//
// A crash cuts short every run that was running, not only the one that
// caused it, so a count in company is no proof. A recovered run is a
// suspect when its record holds a count already (the process died again
// under it before it made progress), or when one more crash without
// progress would fail it (with MaxRecoveries 1, at its first recovery), so
// that no run is failed before it has had a turn alone. Suspects have a
// turn alone each, one at a time: while one runs alone, no other run
// executes, recovered or new; and no run but a suspect takes a worker
// before every suspect has had its turn. The first suspect's turn begins
// at once, as no run executes yet. Each of the next ones takes its turn
// once no run holds a worker: the suspects before it may run on after
// their turns, and it waits for them to end or pause, for MaxSuspectWait
// at most; if its turn has still not come by then, it runs beside them as
// any run, counted as any run, and the next suspect waits in its place
// (with no bound on the wait, it waits until its turn comes). The turn
// ends when the suspect makes progress (in exit durability it commits its
// steps until one does, see markRecovery), pauses or ends, or once it has
// run alone for
// ManagerOptions.MaxAlone: from then on it runs beside the others, as any
// run. A crash while a suspect runs alone counts against it only, and a
// run that was cut short beside the guilty one makes progress when it
// runs alone, which clears its count. A crash after a turn alone ran out counts
// against every run it cuts short, the suspect and the runs beside it
// alike, as it would without the guard: a suspect whose step is only slow
// holds the others up no longer than MaxAlone, and pays for it with a
// turn alone that no longer proves it innocent. Other runs recovered for
// the first time run together, as new runs do.
//
// Recover runs once per manager, before any run of the manager's own:
// Start, Invoke, Resume and Cancel call it first when it has not run, and wait
// while it runs, so that a new run never takes the thread of a run that a
// crash left unfinished (it would leave that run to the next start). Once
// the manager is closed they no longer do, and fail with ErrManagerClosed:
// the runs a crash left stay as they are, for the next start. A
// later call returns what that one pass found (the runs it resumed, a
// *DamagedRunsError) and recovers nothing again. Call it at start to learn
// that, or to start recovering before the first request. A pass that
// fails (the store cannot be listed) is not done: the next call, or the
// next Start, tries again, and Start, Invoke, Resume and Cancel fail
// meanwhile. It hands no run to a worker, and takes back the runs it
// registered, so that the manager holds none it does not resume (ThreadRun
// and Active do not report them) and gives up the memory their executions
// took: the pass that succeeds finds them all anew, with their suspects
// first. A call whose ctx ends while
// the pass runs returns ctx's error at once: the pass goes on, on the
// manager's own context, for the calls that wait for it, until it ends or
// Close stops it (Close waits for it). Once the manager is closed, a call
// that finds no pass done fails with ErrManagerClosed.
func (m *Manager) Recover(ctx context.Context) (resumed int, err error) {
	if m.bad != nil {
		return 0, fmt.Errorf("recover: %w", m.bad)
	}
	m.recovery.mu.Lock()
	if m.recovery.done.Load() {
		m.recovery.mu.Unlock()
		return m.recovery.resumed, m.recovery.err
	}
	pass := m.recovery.pass
	if pass == nil {
		var err error
		if pass, err = m.startRecovery(); err != nil {
			m.recovery.mu.Unlock()
			return 0, err
		}
	}
	m.recovery.mu.Unlock()
	select {
	case <-pass.done:
		return pass.resumed, pass.err
	case <-ctx.Done():
		return 0, fmt.Errorf("recover: %w", context.Cause(ctx))
	}
}

// startRecovery starts Recover's pass on a goroutine of its own, with the
// manager's context: the end of one caller's context does not cut it
// short for the others, and Close stops it and waits for it, as it does
// for the runs the pass hands to workers. The caller holds m.recovery.mu.
func (m *Manager) startRecovery() (*recoveryPass, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrManagerClosed
	}
	pass := &recoveryPass{done: make(chan struct{})}
	m.recovery.pass = pass
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		resumed, err := m.recoverAll(m.ctx)
		m.recovery.mu.Lock()
		var dmg *DamagedRunsError
		if err == nil || errors.As(err, &dmg) {
			m.recovery.resumed, m.recovery.err = resumed, err
			m.recovery.done.Store(true)
		}
		pass.resumed, pass.err = resumed, err
		m.recovery.pass = nil
		m.recovery.mu.Unlock()
		close(pass.done)
	}()
	return pass, nil
}

// recoverFirst makes sure Recover has run, as a run that takes a thread
// needs: a damaged record it left out does not stop the run.
func (m *Manager) recoverFirst(ctx context.Context) error {
	if m.recovery.done.Load() {
		return nil
	}
	_, err := m.Recover(ctx) // ErrManagerClosed once closed (startRecovery)
	var dmg *DamagedRunsError
	if errors.As(err, &dmg) {
		return nil
	}
	return err
}

// recoverAll is Recover's pass over the store.
func (m *Manager) recoverAll(ctx context.Context) (resumed int, err error) {
	// The runs go to workers once all are registered, suspects first, so
	// that no other run takes a worker before the suspects' turns (see
	// takeTurn). A pass that fails part-way hands none to workers, and
	// takes back what it registered: the manager holds no run it does not
	// resume, and the pass tried again (the next Recover, Start, Invoke,
	// Resume or Cancel, or the next start) finds them all anew, suspects
	// first. This also counts them: the returns below leave resumed to it.
	var suspects, others []recovered
	var paused []*active
	defer func() {
		var dmg *DamagedRunsError
		if err != nil && !errors.As(err, &dmg) {
			m.unregister(suspects, others, paused)
			return
		}
		resumed = len(suspects) + len(others)
		m.mu.Lock()
		m.recoveredSuspects = len(suspects)
		// The first suspect's wait for its turn begins now, not while
		// the pass goes on: it takes the workers before any other run.
		m.headChanged()
		m.mu.Unlock()
		for _, r := range append(suspects, others...) {
			m.launch(r.a, r.e, nil)
		}
	}()
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
				return 0, fmt.Errorf("recover: list %s runs: %w", st, err)
			}
			if len(runs) == 0 {
				break
			}
			after = runs[len(runs)-1].ID
			for _, run := range runs {
				r, err := m.recoverOne(ctx, run)
				switch {
				case err != nil:
					return 0, err
				case r.a == nil:
				case r.e == nil:
					paused = append(paused, r.a)
				case r.suspect:
					suspects = append(suspects, r)
				default:
					others = append(others, r)
				}
			}
		}
	}
	if damaged != nil {
		return 0, damaged
	}
	return 0, nil
}

// unregister takes back the runs a recovery pass that failed registered:
// those for workers to resume, and the paused ones.
func (m *Manager) unregister(suspects, others []recovered, paused []*active) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range append(suspects, others...) {
		m.queued--
		if r.a.suspect {
			r.a.suspect = false
			m.waiting = slices.DeleteFunc(m.waiting, func(w *active) bool { return w == r.a })
		}
		paused = append(paused, r.a)
	}
	for _, a := range paused {
		delete(m.threads, a.thread)
		delete(m.runs, a.runID)
	}
}

// recovered is a run that Recover hands to a worker to resume (e is nil
// for a paused run it registered).
type recovered struct {
	a       *active
	e       *execution
	suspect bool
}

// recoverOne recovers one run the listing found: it registers a paused one,
// and one left queued or running for a worker to resume, which it returns,
// or fails it when it cannot be resumed. err is a store that failed to
// record the failure.
func (m *Manager) recoverOne(ctx context.Context, run *Run) (recovered, error) {
	m.mu.Lock()
	// A thread holds one run at most: a second unfinished run on it
	// (which no start makes) is not registered beside the first.
	if m.threads[run.Thread] != nil {
		m.mu.Unlock()
		return recovered{}, nil
	}
	a := &active{runID: run.ID, thread: run.Thread, done: make(chan struct{}), paused: run.Status == StatusInterrupted}
	m.threads[run.Thread] = a
	m.runs[run.ID] = a
	if !a.paused {
		m.queued++
	}
	m.mu.Unlock()
	if a.paused {
		return recovered{a: a}, nil
	}
	fail := func(err error) (recovered, error) {
		m.dequeue()
		run.Status, run.Error, run.EndedAt = StatusFailed, err.Error(), m.now().UTC()
		ev := Event{Time: run.EndedAt, Type: EventRunFailed, Run: run.ID, Thread: run.Thread}
		ev.Data, _ = json.Marshal(map[string]any{"status": run.Status, "error": run.Error})
		c := &Commit{Run: run, Events: []Event{ev}, Sync: true}
		cerr := m.store.Commit(ctx, c)
		m.release(a, false)
		if cerr != nil {
			return recovered{}, fmt.Errorf("recover run %s: %w", run.ID, cerr)
		}
		if m.opts.Events != nil {
			m.opts.Events.Publish(c.Events...)
			m.opts.Events.Publish(c.Announce...)
		}
		return recovered{}, nil
	}
	n := 0
	if v, ok := run.Meta[MetaRecoveries]; ok {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return fail(fmt.Errorf("recover run %s: its record's recovery count %q is not a count; not run again", run.ID, v))
		}
	}
	limit := m.opts.MaxRecoveries
	if limit > 0 && n >= limit {
		m.stopCrashLoop(ctx, run)
		return fail(fmt.Errorf("%w: run %s was recovered %d times and crashed each time before it made progress; not run again (its thread is free: start a new run on it)", ErrCrashLoop, run.ID, n))
	}
	ag, err := m.resolve(run.Agent, run.Bundle)
	if errors.Is(err, ErrBundleUnavailable) {
		// Not the run's doing, and put right by putting the bundle
		// back: failing it would end it for good. It stays as it is in
		// the store, holding its thread, for a later start.
		m.mu.Lock()
		m.queued--
		a.held = &HeldRun{ID: run.ID, Thread: run.Thread, Agent: run.Agent, Status: run.Status, Bundle: run.Bundle, Err: err}
		m.mu.Unlock()
		return recovered{a: a}, nil
	}
	if err != nil {
		return fail(fmt.Errorf("recover: %w", err))
	}
	e, err := m.resumeExecution(ag, run)
	if err != nil {
		return fail(err)
	}
	a.recovery = n + 1
	// Crashed in company before, or one crash short of being failed:
	// either way it runs alone, so that only its own crash counts.
	suspect := n > 0 || limit > 0 && n+1 >= limit
	if suspect {
		m.mu.Lock()
		a.suspect = true
		if m.changed == nil {
			m.changed = make(chan struct{})
		}
		m.waiting = append(m.waiting, a)
		m.mu.Unlock()
	}
	return recovered{a, e, suspect}, nil
}

// stopCrashLoop puts the active time of a run that is not run again on its
// record, up to its newest commit, as its end would (see active.go). A
// thread head it cannot read leaves the time the record has.
func (m *Manager) stopCrashLoop(ctx context.Context, run *Run) {
	head, err := m.threadHead(ctx, run.Thread)
	if err != nil {
		return
	}
	active, _ := run.activeUpTo(head)
	meta := maps.Clone(run.Meta)
	meta[MetaActive] = strconv.FormatInt(active.Milliseconds(), 10)
	delete(meta, MetaRunningSince)
	run.Meta = meta
}

// threadHead is thread's newest checkpoint, nil when it has none.
func (m *Manager) threadHead(ctx context.Context, thread string) (*Checkpoint, error) {
	head, err := m.store.Checkpoint(ctx, thread, "", "")
	if errors.Is(err, ErrCheckpointNotFound) {
		return nil, nil
	}
	return head, err
}

// startRecovered is what the worker that takes a recovered run does before
// it runs it: it counts the recovery on the run's record (see
// markRecovery), then loads the run's state. marked says the count is on
// record. A run whose state cannot be loaded ends failed; one whose
// context ends meanwhile (a shutdown, a cancel, its wall time) ends as
// the loop ends it then, since the load failed for that and not for the
// state: a shutdown leaves it for the next start.
func (m *Manager) startRecovered(ctx context.Context, a *active, e *execution) (marked bool, err error) {
	head, err := m.threadHead(ctx, e.run.Thread)
	if err != nil {
		return false, e.failUnlessStopped(ctx, fmt.Errorf("recover run %s: %w", e.run.ID, err))
	}
	if err := m.markRecovery(ctx, a, e, head); err != nil {
		// Not run: it stays as it is in the store, whose failed write
		// stops all writes.
		return false, err
	}
	if err := m.loadResume(ctx, e); err != nil {
		return true, e.failUnlessStopped(ctx, err)
	}
	return true, nil
}

// markRecovery is the crash-loop guard. A run whose step kills the process
// (out of memory, a hung host, a crashing bug) would be recovered at every
// start and kill it again, and the appliance would never serve anyone. So
// before a recovered run loads its state or executes anything, the worker
// that takes it puts on its record how many times in a row it has been
// recovered, this time included (a.recovery, in MetaRecoveries), with its
// active time up to its newest commit (head) and the time its new stretch
// begins (see active.go), committed with fsync; Recover stops a run whose
// count has reached MaxRecoveries, and makes a suspect of one whose count
// is not 0 or would reach it with one more crash (see Recover).
// A run waiting in the queue is not counted: a crash then is not its
// doing. Loading its state is counted, as a crash while loading it (too
// large a state, say) would come again at every start; only the head's
// checkpoint is read before, for the active time. A run that is not
// recovered costs the guard nothing.
//
// The execution's own record leaves the count out. It is written with the
// run's first commit that only progress makes: a step of its own graph or
// of a subgraph, a task's writes saved while its step is unfinished (a
// fan-out's partial results, which are not run again), a pause or its end
// (see execution.countOnRecord). That commit carries the record anyway,
// since its active time changed, or shares the subgraph step's or the
// saved writes' fsync, so taking the count off costs no write of its own.
// It clears a suspect too: the others may run again.
//
// In exit durability a step commits nothing, so a suspect would run alone
// until it paused, ended or called a tool, and its steps would be no
// progress: a crash after them would count against it though it had moved
// on. So a suspect in exit durability commits its steps as sync would
// until one has taken the count off: its first step, in one fsync more,
// or the first step of a subgraph that its first step runs, so that a
// long subgraph that a crash cuts short does not start again from its
// beginning after every recovery, and never make progress.
// The run goes on in exit durability from then on, and its record and
// outcome are those of any exit run; its history holds that checkpoint
// too, as it would had a node of that step called EnsureDurable.
func (m *Manager) markRecovery(ctx context.Context, a *active, e *execution, head *Checkpoint) error {
	active, _ := e.run.activeUpTo(head)
	meta := maps.Clone(e.run.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaActive] = strconv.FormatInt(active.Milliseconds(), 10)
	meta[MetaRunningSince] = m.now().UTC().Format(time.RFC3339Nano)
	meta[MetaRecoveries] = strconv.Itoa(a.recovery)
	attempt := RunAttempt(e.run) + 1
	meta[MetaAttempt] = strconv.Itoa(attempt)
	rec := e.run.Clone()
	rec.Meta = meta
	if err := m.store.Commit(context.WithoutCancel(ctx), &Commit{Run: rec, Sync: true}); err != nil {
		return fmt.Errorf("recover run %s: record the recovery: %w", e.run.ID, err)
	}
	meta = maps.Clone(meta)
	delete(meta, MetaRecoveries)
	e.run.Meta = meta
	e.attempt = attempt
	e.runChanged = true
	e.progressed = func() {
		m.mu.Lock()
		m.clearSuspect(a)
		m.mu.Unlock()
	}
	e.countOnRecord.Store(true)
	m.mu.Lock()
	e.commitUntilProgress = a.suspect
	m.mu.Unlock()
	return nil
}

// takeBackRecovery takes the recovery that markRecovery counted on a
// run's record (recovery, its number in a row) back when the run stopped
// for a shutdown, not a crash, before it made progress: a restart is not
// the run's fault. The record is left with the count it had before, so
// the crashes before this start still count (and a suspect stays one),
// or none when there were none. A write that fails leaves the count on
// record, which errs on the safe side, and a store that fails it fails
// the next start's recovery too.
func (m *Manager) takeBackRecovery(runID string, recovery int) {
	ctx := context.Background()
	run, err := m.store.Run(ctx, runID)
	if err != nil || run.Status.Terminal() || run.Status == StatusInterrupted {
		return
	}
	if run.Meta[MetaRecoveries] != strconv.Itoa(recovery) {
		return // progress made: the count is gone already
	}
	meta := maps.Clone(run.Meta)
	if recovery > 1 {
		meta[MetaRecoveries] = strconv.Itoa(recovery - 1)
	} else {
		delete(meta, MetaRecoveries)
	}
	run.Meta = meta
	_ = m.store.Commit(ctx, &Commit{Run: run, Sync: true})
}

// HeldRun is a run that Recover found left running, or queued, and left
// as it is, since the bundle it is pinned to is unavailable: Err, the
// resolver's, wraps ErrBundleUnavailable and says what is missing.
type HeldRun struct {
	ID, Thread, Agent string
	Status            RunStatus // as stored, and as it stays
	Bundle            BundleRef
	Err               error
}

// Held returns the runs that Recover left as they are in the store, not
// resumed and not failed, since the bundles they are pinned to are
// unavailable (ErrBundleUnavailable), by ID. Each keeps its status and its
// thread: no new run takes the thread, and the next Recover (at a later
// start), finding the bundle back, resumes the run from its last
// checkpoint, as it resumes any run a crash left. Cancel ends one.
func (m *Manager) Held() []HeldRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	var held []HeldRun
	for _, a := range m.runs {
		if a.held != nil {
			held = append(held, *a.held)
		}
	}
	slices.SortFunc(held, func(a, b HeldRun) int { return strings.Compare(a.ID, b.ID) })
	return held
}

// Suspects reports how many of the runs the last Recover resumed are the
// crash-loop guard's suspects: cut short by crashes at two starts in a row
// without progress, or at one start when one more such crash would fail
// them, they run first, one at a time and alone (see Recover).
func (m *Manager) Suspects() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recoveredSuspects
}

// Executing returns the runs that a worker is executing now, by ID; the
// runs queued for a worker are not among them.
func (m *Manager) Executing() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id, a := range m.runs {
		if a.working {
			ids = append(ids, id)
		}
	}
	return ids
}

// Active reports how many runs are executing or queued.
func (m *Manager) Active() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, a := range m.runs {
		if !a.paused && a.held == nil {
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
