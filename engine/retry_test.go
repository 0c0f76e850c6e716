package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

var errFlaky = errors.New("connection reset")

// oneNode compiles a graph of one node with the given options.
func oneNode(t *testing.T, fn engine.NodeFunc, opts ...engine.NodeOption) *engine.Graph {
	b := engine.NewGraph("one")
	b.AddNode("work", fn, opts...)
	b.AddEdge(engine.Start, "work")
	return mustCompile(t, b)
}

func TestRetries(t *testing.T) {
	fast := engine.RetryPolicy{MaxAttempts: 3, Initial: time.Millisecond, Max: 2 * time.Millisecond}
	tests := []struct {
		name      string
		policy    engine.RetryPolicy
		failures  int // calls that fail before one succeeds
		err       error
		wantCalls int32
		wantKind  engine.ErrorKind // when the run fails
		wantOK    bool
	}{
		{"transient is retried", fast, 2, engine.MarkTransient(errFlaky), 3, 0, true},
		{"transient exhausts attempts", fast, 5, engine.MarkTransient(errFlaky), 3, engine.Transient, false},
		{"permanent is not retried", fast, 5, engine.MarkPermanent(errFlaky), 1, engine.Permanent, false},
		{"unclassified is permanent", fast, 5, errFlaky, 1, engine.Permanent, false},
		{"no policy means one attempt", engine.RetryPolicy{}, 5, engine.MarkTransient(errFlaky), 1, engine.Transient, false},
		{"classifier overrides", engine.RetryPolicy{MaxAttempts: 4, Initial: time.Millisecond, Classify: func(err error) engine.ErrorKind {
			if errors.Is(err, errFlaky) {
				return engine.Transient
			}
			return engine.Permanent
		}}, 3, errFlaky, 4, 0, true},
		{"jittered backoff still retries", engine.RetryPolicy{MaxAttempts: 3, Initial: time.Millisecond, Jitter: true}, 2, engine.MarkTransient(errFlaky), 3, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			g := oneNode(t, func(context.Context, engine.State) ([]engine.Write, error) {
				if int(calls.Add(1)) <= tt.failures {
					return nil, tt.err
				}
				return nil, nil
			}, engine.WithRetry(tt.policy))
			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
			require.Equal(t, tt.wantCalls, calls.Load())
			if tt.wantOK {
				require.NoError(t, err)
				require.Equal(t, engine.StatusCompleted, res.Run.Status)
				return
			}
			require.Equal(t, engine.StatusFailed, res.Run.Status)
			require.ErrorIs(t, err, errFlaky)
			var ne *engine.NodeError
			require.ErrorAs(t, err, &ne)
			require.Equal(t, "work", ne.Node)
			require.Equal(t, int(tt.wantCalls), ne.Attempts)
			require.Equal(t, tt.wantKind, ne.Kind)
			require.Contains(t, res.Run.Error, `node "work"`)
			if ne.Attempts > 1 {
				require.Contains(t, res.Run.Error, "after 3 attempts")
			}
		})
	}
}

func TestNodeTimeout(t *testing.T) {
	block := func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t.Run("exhausted", func(t *testing.T) {
		var calls atomic.Int32
		g := oneNode(t, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			calls.Add(1)
			return block(ctx, s)
		}, engine.WithTimeout(10*time.Millisecond), engine.WithRetry(engine.RetryPolicy{MaxAttempts: 2, Initial: time.Millisecond}))
		res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
		require.Equal(t, int32(2), calls.Load(), "timeouts are retried")
		var ne *engine.NodeError
		require.ErrorAs(t, err, &ne)
		require.Equal(t, engine.Timeout, ne.Kind)
		require.Equal(t, engine.Timeout, engine.KindOf(err))
		require.Equal(t, 2, ne.Attempts)
		require.ErrorContains(t, err, `node "work" timed out after 10ms`)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, engine.StatusFailed, res.Run.Status)
	})
	t.Run("second attempt in time", func(t *testing.T) {
		var calls atomic.Int32
		g := oneNode(t, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			if calls.Add(1) == 1 {
				return block(ctx, s)
			}
			return nil, nil
		}, engine.WithTimeout(10*time.Millisecond), engine.WithRetry(engine.RetryPolicy{MaxAttempts: 2, Initial: time.Millisecond}))
		res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
		require.Equal(t, int32(2), calls.Load())
	})
}

func TestPanicBecomesError(t *testing.T) {
	var calls atomic.Int32
	g := oneNode(t, func(context.Context, engine.State) ([]engine.Write, error) {
		calls.Add(1)
		panic("kaboom")
	}, engine.WithRetry(engine.RetryPolicy{MaxAttempts: 3, Initial: time.Millisecond}))
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
	var ne *engine.NodeError
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "work", ne.Node)
	require.Equal(t, engine.Permanent, ne.Kind)
	require.ErrorContains(t, err, "panic: kaboom")
	require.Equal(t, int32(1), calls.Load(), "a panic is not retried")
	require.Equal(t, engine.StatusFailed, res.Run.Status)
}

func TestCancelledContextCancelsRun(t *testing.T) {
	started := make(chan struct{})
	g := oneNode(t, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}, engine.WithRetry(engine.RetryPolicy{MaxAttempts: 5, Initial: time.Millisecond}))
	store := engine.NewMemoryStore()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store})
	require.ErrorIs(t, err, engine.ErrCancelled)
	require.Equal(t, engine.StatusCancelled, res.Run.Status)
	stored, err := store.Run(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, stored.Status)
	require.False(t, stored.EndedAt.IsZero())
}

func TestCancelDuringBackoff(t *testing.T) {
	var calls atomic.Int32
	g := oneNode(t, func(context.Context, engine.State) ([]engine.Write, error) {
		calls.Add(1)
		return nil, engine.MarkTransient(errFlaky)
	}, engine.WithRetry(engine.RetryPolicy{MaxAttempts: 5, Initial: time.Hour}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t"})
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, engine.ErrCancelled)
	require.Equal(t, engine.StatusCancelled, res.Run.Status)
	require.Equal(t, int32(1), calls.Load())
}

func TestMaxDurationBudget(t *testing.T) {
	g := oneNode(t, func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", MaxDuration: 10 * time.Millisecond})
	require.ErrorIs(t, err, engine.ErrDeadline)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
}

func TestBackoff(t *testing.T) {
	p := engine.RetryPolicy{Initial: 10 * time.Millisecond, Factor: 3, Max: 100 * time.Millisecond}
	for attempt, want := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 30 * time.Millisecond, 3: 90 * time.Millisecond, 4: 100 * time.Millisecond, 9: 100 * time.Millisecond} {
		require.Equal(t, want, engine.Backoff(p, attempt), "attempt %d", attempt)
	}
	require.Equal(t, 200*time.Millisecond, engine.Backoff(engine.RetryPolicy{}, 2), "defaults: 100ms doubling")

	p.Jitter = true
	seen := map[time.Duration]bool{}
	for range 50 {
		d := engine.Backoff(p, 2)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, 30*time.Millisecond)
		seen[d] = true
	}
	require.Greater(t, len(seen), 10, "jitter spreads the delays")
}

func TestKindOf(t *testing.T) {
	require.Equal(t, engine.Permanent, engine.KindOf(errFlaky))
	require.Equal(t, engine.Transient, engine.KindOf(engine.MarkTransient(errFlaky)))
	require.Equal(t, engine.Permanent, engine.KindOf(engine.MarkPermanent(errFlaky)))
	require.Nil(t, engine.MarkTransient(nil))
	require.Equal(t, "transient", engine.Transient.String())
	require.Equal(t, "timeout", engine.Timeout.String())
	require.Equal(t, "permanent", engine.Permanent.String())
}
