package policy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTracker(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		budget Budget
		run    func(*Tracker) error
		which  string
		limit  int64
		used   int64
	}{
		{"steps", Budget{Steps: 2}, func(tr *Tracker) error {
			if err := tr.Step(); err != nil {
				return err
			}
			if err := tr.Step(); err != nil {
				return err
			}
			return tr.Step()
		}, BudgetSteps, 2, 3},
		{"tool iterations default to 5", Budget{}, func(tr *Tracker) error {
			for i := 0; i < 5; i++ {
				if err := tr.AddToolIteration(); err != nil {
					return err
				}
			}
			return tr.AddToolIteration()
		}, BudgetToolIterations, 5, 6},
		{"tokens", Budget{Tokens: 100}, func(tr *Tracker) error {
			if err := tr.AddTokens(60); err != nil {
				return err
			}
			return tr.AddTokens(41)
		}, BudgetTokens, 100, 101},
		{"wall time", Budget{WallTime: time.Second}, func(tr *Tracker) error {
			if err := tr.Check(start.Add(time.Second)); err != nil {
				return err
			}
			return tr.Check(start.Add(1500 * time.Millisecond))
		}, BudgetWallTime, 1000, 1500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(tt.budget, start)
			err := tt.run(tr)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBudgetExceeded)
			var be *BudgetError
			require.True(t, errors.As(err, &be))
			assert.Equal(t, BudgetError{Which: tt.which, Limit: tt.limit, Used: tt.used}, *be)

			// Sticky: nothing after an overrun passes.
			assert.ErrorIs(t, tr.Step(), ErrBudgetExceeded)
			assert.ErrorIs(t, tr.AddTokens(0), ErrBudgetExceeded)
			assert.ErrorIs(t, tr.Check(start), ErrBudgetExceeded)
		})
	}
}

func TestTrackerUnlimitedDimensionsAndDefaults(t *testing.T) {
	tr := NewTracker(Budget{}, time.Now())
	assert.NoError(t, tr.AddTokens(1<<30), "zero Tokens is no limit")
	assert.NoError(t, tr.Check(time.Now().Add(1000*time.Hour)), "zero WallTime is no limit")
	assert.Equal(t, DefaultSteps, tr.Budget().Steps)
	assert.Equal(t, DefaultToolIterations, tr.Budget().ToolIterations)
	assert.NoError(t, tr.AddTokens(-5), "negative token counts are ignored")
	assert.Equal(t, Usage{Tokens: 1 << 30}, tr.Usage())

	assert.NoError(t, Budget{}.Validate())
	assert.ErrorIs(t, Budget{Tokens: -1}.Validate(), ErrBadRule)
	assert.Equal(t, "tokens budget exceeded: used 101 of 100", (&BudgetError{Which: BudgetTokens, Limit: 100, Used: 101}).Error())
	assert.Equal(t, "wall_time budget exceeded: used 1500ms of 1000ms", (&BudgetError{Which: BudgetWallTime, Limit: 1000, Used: 1500}).Error())
}

func TestResumeTracker(t *testing.T) {
	start := time.Now()
	tr := ResumeTracker(Budget{Steps: 3}, start, Usage{Steps: 3, Tokens: 10})
	assert.NoError(t, tr.Check(start))
	assert.ErrorIs(t, tr.Step(), ErrBudgetExceeded)

	over := ResumeTracker(Budget{Tokens: 5}, start, Usage{Tokens: 10})
	assert.ErrorIs(t, over.Check(start), ErrBudgetExceeded, "a run recovered over budget stays over budget")
}

func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(Budget{Tokens: 1000, Steps: 1 << 20, ToolIterations: 1 << 20}, time.Now())
	var wg sync.WaitGroup
	var mu sync.Mutex
	failures := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				err := tr.AddTokens(1)
				_ = tr.Step()
				_ = tr.AddToolIteration()
				_ = tr.Check(time.Now())
				if err != nil {
					mu.Lock()
					failures++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1600, tr.Usage().Tokens)
	assert.Equal(t, 600, failures, "every call past the limit is refused, none silently")
}

func TestTokenMeterReservesAndSettles(t *testing.T) {
	ctx := context.Background()
	m := NewTokenMeter(10)
	answer, err := m.Reserve(ctx, 20, 30, 100)
	require.NoError(t, err)
	assert.Equal(t, 30, answer, "the call's own cap, within the room")
	var be *BudgetError
	_, err = m.Reserve(ctx, 95, 0, 100)
	require.ErrorAs(t, err, &be, "the 10 spent leave no room for an answer after a prompt of 95")
	assert.Equal(t, BudgetTokens, be.Which)
	assert.Equal(t, int64(106), be.Used, "the tokens spent, the prompt and one token of answer")
	assert.ErrorIs(t, err, ErrBudgetExceeded)
	answer, err = m.Reserve(ctx, 30, 0, 100)
	require.NoError(t, err)
	assert.Equal(t, 10, answer, "no cap of its own: the answer may take the room left")
	require.NoError(t, m.Settle(50, 30, 100))
	assert.Equal(t, 40, m.Used())
	require.ErrorAs(t, m.Settle(40, 70, 100), &be, "the answer took the run past the limit")
	assert.Equal(t, int64(110), be.Used)
	_, err = m.Reserve(ctx, 0, 0, 100)
	require.Error(t, err, "a run over its budget starts no call")
	answer, err = m.Reserve(ctx, 1<<20, 0, 0)
	require.NoError(t, err, "0 is no limit")
	assert.Equal(t, 0, answer, "and no cap")
	answer, err = m.Reserve(ctx, 1<<20, 7, 0)
	require.NoError(t, err)
	assert.Equal(t, 7, answer, "the call's own cap still holds")
	require.NoError(t, m.Settle(1<<20, 5, 0))
}

// A call for which the calls in flight leave no room waits for them to
// settle, then gets the room they left; or it stops with its context.
func TestTokenMeterWaitsForCallsInFlight(t *testing.T) {
	ctx := context.Background()
	m := NewTokenMeter(0)
	answer, err := m.Reserve(ctx, 10, 0, 100)
	require.NoError(t, err)
	require.Equal(t, 90, answer)
	got := make(chan int, 1)
	go func() {
		a, err := m.Reserve(ctx, 10, 0, 100)
		assert.NoError(t, err)
		got <- a
	}()
	select {
	case a := <-got:
		t.Fatalf("a call went on with no room left (cap %d)", a)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, m.Settle(100, 30, 100))
	assert.Equal(t, 60, <-got, "100 less the 30 spent and its prompt")

	stopped, stop := context.WithCancelCause(ctx)
	time.AfterFunc(20*time.Millisecond, func() { stop(errors.New("run stopped")) })
	_, err = m.Reserve(stopped, 10, 0, 100)
	require.EqualError(t, err, "run stopped")
}

// Calls in flight at once each see the others' reservations: together
// they never set aside more than the limit, and what they spend never
// passes it. Calls that ask for no cap of their own take the room left,
// one at a time.
func TestTokenMeterConcurrent(t *testing.T) {
	for _, tc := range []struct {
		name                string
		answer, admitted, n int
	}{
		{"capped calls", 5, 10, 16},
		{"calls with no cap", 0, 1, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewTokenMeter(0)
			var wg sync.WaitGroup
			var admitted atomic.Int32
			for range tc.n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answer, err := m.Reserve(context.Background(), 5, tc.answer, 100)
					if err != nil {
						return
					}
					admitted.Add(1)
					_ = m.Settle(5+answer, 5+answer, 100) // each spends all it set aside
				}()
			}
			wg.Wait()
			assert.Equal(t, int32(tc.admitted), admitted.Load())
			assert.Equal(t, 100, m.Used())
		})
	}
}
