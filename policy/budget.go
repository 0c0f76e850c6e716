package policy

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Budget defaults.
const (
	// DefaultToolIterations bounds model → tool → model round trips in one
	// tool loop: enough for a lookup and a follow-up, short of a model
	// stuck calling the same tool forever.
	DefaultToolIterations = 5
	// DefaultSteps matches LangGraph's default recursion limit.
	DefaultSteps = 25
)

// Budget limits one run. Zero Steps and ToolIterations take their defaults;
// zero Tokens and WallTime mean no limit on that dimension (set them: a
// run's cost is otherwise bounded only by its steps). Negative values are
// invalid.
type Budget struct {
	Steps          int
	ToolIterations int
	Tokens         int
	WallTime       time.Duration
}

// WithDefaults fills the zero fields that have defaults.
func (b Budget) WithDefaults() Budget {
	if b.Steps == 0 {
		b.Steps = DefaultSteps
	}
	if b.ToolIterations == 0 {
		b.ToolIterations = DefaultToolIterations
	}
	return b
}

// Validate rejects negative limits.
func (b Budget) Validate() error {
	if b.Steps < 0 || b.ToolIterations < 0 || b.Tokens < 0 || b.WallTime < 0 {
		return fmt.Errorf("%w: budget: limits must not be negative: %+v", ErrBadRule, b)
	}
	return nil
}

// Budget dimensions, as named in BudgetError.Which and budget.exceeded
// events.
const (
	BudgetSteps          = "steps"
	BudgetToolIterations = "tool_iterations"
	BudgetTokens         = "tokens"
	BudgetWallTime       = "wall_time"
)

// BudgetError says which budget a run exceeded. It wraps ErrBudgetExceeded.
// For wall time, Limit and Used are in milliseconds.
type BudgetError struct {
	Which string
	Limit int64
	Used  int64
}

func (e *BudgetError) Error() string {
	unit := ""
	if e.Which == BudgetWallTime {
		unit = "ms"
	}
	return fmt.Sprintf("%s budget exceeded: used %d%s of %d%s", e.Which, e.Used, unit, e.Limit, unit)
}

func (e *BudgetError) Unwrap() error { return ErrBudgetExceeded }

// Usage is what a run has consumed so far.
type Usage struct {
	Steps          int `json:"steps"`
	ToolIterations int `json:"tool_iterations"`
	Tokens         int `json:"tokens"`
}

// Tracker counts a run's consumption against its budget. It is safe for
// concurrent use (nodes of one superstep report tokens in parallel). Once a
// budget is exceeded every later call returns the same error, so that a
// caller that missed it once cannot carry on.
type Tracker struct {
	mu       sync.Mutex
	budget   Budget
	start    time.Time
	used     Usage
	exceeded *BudgetError
}

// NewTracker starts tracking a run that began at start. Zero limits take
// their defaults (see Budget).
func NewTracker(b Budget, start time.Time) *Tracker {
	return &Tracker{budget: b.WithDefaults(), start: start}
}

// ResumeTracker continues tracking a run recovered after a restart, from
// the usage recorded with its last checkpoint. start is the run's original
// start: wall time keeps counting across the restart.
func ResumeTracker(b Budget, start time.Time, used Usage) *Tracker {
	t := NewTracker(b, start)
	t.used = used
	t.exceeded = t.overLocked()
	return t
}

// Step counts a superstep about to run; call it before the step, so the
// step after the last allowed one never starts.
func (t *Tracker) Step() error {
	return t.add(func(u *Usage) { u.Steps++ })
}

// AddToolIteration counts a model → tool → model round trip about to start.
func (t *Tracker) AddToolIteration() error {
	return t.add(func(u *Usage) { u.ToolIterations++ })
}

// AddTokens counts tokens a model call used. Tokens are known only after
// the call, so the error reports the overrun instead of preventing it.
func (t *Tracker) AddTokens(n int) error {
	if n < 0 {
		n = 0
	}
	return t.add(func(u *Usage) { u.Tokens += n })
}

// Check reports whether the run is over any budget at now, wall time
// included.
func (t *Tracker) Check(now time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exceeded != nil {
		return t.exceeded
	}
	if w := t.budget.WallTime; w > 0 {
		if used := now.Sub(t.start); used > w {
			t.exceeded = &BudgetError{Which: BudgetWallTime, Limit: w.Milliseconds(), Used: used.Milliseconds()}
			return t.exceeded
		}
	}
	return nil
}

// Usage returns the consumption so far, for the checkpoint and the outcome.
func (t *Tracker) Usage() Usage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

// Budget returns the budget in force, defaults applied.
func (t *Tracker) Budget() Budget { return t.budget }

func (t *Tracker) add(f func(*Usage)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Usage keeps counting after an overrun, so the record shows the
	// attempt that was refused.
	f(&t.used)
	if t.exceeded != nil {
		return t.exceeded
	}
	t.exceeded = t.overLocked()
	if t.exceeded != nil {
		return t.exceeded
	}
	return nil
}

func (t *Tracker) overLocked() *BudgetError {
	b, u := t.budget, t.used
	switch {
	case u.Steps > b.Steps:
		return &BudgetError{Which: BudgetSteps, Limit: int64(b.Steps), Used: int64(u.Steps)}
	case u.ToolIterations > b.ToolIterations:
		return &BudgetError{Which: BudgetToolIterations, Limit: int64(b.ToolIterations), Used: int64(u.ToolIterations)}
	case b.Tokens > 0 && u.Tokens > b.Tokens:
		return &BudgetError{Which: BudgetTokens, Limit: int64(b.Tokens), Used: int64(u.Tokens)}
	}
	return nil
}

// TokenMeter counts the tokens of one run's model calls, wherever they
// are made: the calls of one superstep run concurrently, and each must see
// what the others have spent and have set aside. A call reserves the most
// it may spend before it starts (Reserve): its prompt's expected cost and
// the cap on its answer; it settles with what it actually spent when it
// ends (Settle), which reports the run over budget. The limit is given at
// each call, so nodes of one run may hold different limits without
// splitting the count. It is safe for concurrent use.
type TokenMeter struct {
	mu       sync.Mutex
	used     int
	reserved int
	// settled is closed, and cleared, when a call settles: Reserve calls
	// that wait for room wait on it.
	settled chan struct{}
}

// NewTokenMeter starts a meter at the tokens the run has already spent.
func NewTokenMeter(used int) *TokenMeter {
	return &TokenMeter{used: max(used, 0)}
}

// Reserve sets aside what a call about to start may spend: prompt tokens
// for its prompt and the cap on its answer, which it returns. The cap is
// what limit leaves after the tokens spent, those set aside for calls in
// flight and the prompt, or answer when that is smaller; answer 0 asks for
// no cap of the call's own, and limit 0 means no limit (the cap is then
// answer).
//
// When the calls in flight leave no room for a single token of answer,
// Reserve waits for them to settle, since their unspent reservations
// come back, or for ctx to end (its cause is returned). It refuses the
// call (a *BudgetError) when the tokens spent leave no room, whatever the
// calls in flight spend. Every Reserve that succeeds must be settled,
// with prompt plus the cap as reserved.
func (m *TokenMeter) Reserve(ctx context.Context, prompt, answer, limit int) (int, error) {
	prompt, answer = max(prompt, 0), max(answer, 0)
	for {
		m.mu.Lock()
		room := limit - m.used - m.reserved - prompt
		if limit <= 0 || room >= 1 {
			if limit > 0 && (answer == 0 || answer > room) {
				answer = room
			}
			m.reserved += prompt + answer
			m.mu.Unlock()
			return answer, nil
		}
		if m.reserved == 0 || limit-m.used-prompt < 1 {
			m.mu.Unlock()
			// Used is the least the call would take: its prompt and one
			// token of answer.
			return 0, &BudgetError{Which: BudgetTokens, Limit: int64(limit), Used: int64(m.used + prompt + 1)}
		}
		if m.settled == nil {
			m.settled = make(chan struct{})
		}
		settled := m.settled
		m.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
}

// Settle ends a call that reserved tokens: it releases the reservation
// and counts the tokens the call spent. It returns a *BudgetError when the
// run has now spent more than limit (0: no limit): the overrun of the
// call's answer is known only once it has been given.
func (m *TokenMeter) Settle(reserved, spent, limit int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved = max(m.reserved-max(reserved, 0), 0)
	m.used += max(spent, 0)
	if m.settled != nil {
		close(m.settled)
		m.settled = nil
	}
	if limit > 0 && m.used > limit {
		return &BudgetError{Which: BudgetTokens, Limit: int64(limit), Used: int64(m.used)}
	}
	return nil
}

// Used returns the tokens counted so far (reservations left out).
func (m *TokenMeter) Used() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}
