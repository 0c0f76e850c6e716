package engine_test

import (
	"context"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// twoSteps runs first and then second on a fresh thread and returns the final
// state, reloaded from the store so decoding is exercised too.
func twoSteps(t *testing.T, b *engine.Builder, first, second []engine.Write) *engine.Snapshot {
	t.Helper()
	b.AddNode("first", writes(first...))
	b.AddNode("second", writes(second...))
	b.AddEdge(engine.Start, "first")
	b.AddEdge("first", "second")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	snap, err := g.StateAt(context.Background(), cfg, "")
	require.NoError(t, err)
	return snap
}

func TestReducers(t *testing.T) {
	t.Run("replace", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Replace[string](b, "c")
		s := twoSteps(t, b, []engine.Write{c.Set("one")}, []engine.Write{c.Set("two")})
		require.Equal(t, "two", c.Get(s))
	})
	t.Run("append", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Append[string](b, "c")
		s := twoSteps(t, b, []engine.Write{engine.Push(c, "a", "b")}, []engine.Write{engine.Push(c, "c"), c.Set([]string{"d"})})
		require.Equal(t, []string{"a", "b", "c", "d"}, c.Get(s))
	})
	t.Run("merge", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Merge[string, int](b, "c")
		s := twoSteps(t, b, []engine.Write{c.Set(map[string]int{"x": 1, "y": 2})}, []engine.Write{c.Set(map[string]int{"y": 20, "z": 30})})
		require.Equal(t, map[string]int{"x": 1, "y": 20, "z": 30}, c.Get(s))
	})
	t.Run("sum int", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Sum[int](b, "c")
		s := twoSteps(t, b, []engine.Write{c.Set(2), c.Set(3)}, []engine.Write{c.Set(-1)})
		require.Equal(t, 4, c.Get(s))
	})
	t.Run("sum float", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Sum[float64](b, "c")
		s := twoSteps(t, b, []engine.Write{c.Set(0.5)}, []engine.Write{c.Set(0.25)})
		require.InDelta(t, 0.75, c.Get(s), 1e-9)
	})
	t.Run("custom max", func(t *testing.T) {
		b := engine.NewGraph("g")
		c := engine.Custom(b, "c", "max", func(old, upd int) int { return max(old, upd) })
		s := twoSteps(t, b, []engine.Write{c.Set(7), c.Set(3)}, []engine.Write{c.Set(5)})
		require.Equal(t, 7, c.Get(s))
	})
	t.Run("custom struct", func(t *testing.T) {
		type stats struct {
			Count int
			Last  string
		}
		b := engine.NewGraph("g")
		c := engine.Custom(b, "c", "stats", func(old, upd stats) stats {
			return stats{Count: old.Count + upd.Count, Last: upd.Last}
		})
		s := twoSteps(t, b, []engine.Write{c.Set(stats{1, "a"})}, []engine.Write{c.Set(stats{2, "b"})})
		require.Equal(t, stats{3, "b"}, c.Get(s))
	})
}

func TestChanGetUnsetIsZero(t *testing.T) {
	b := engine.NewGraph("g")
	set := engine.Replace[string](b, "set")
	unset := engine.Merge[string, int](b, "unset")
	s := twoSteps(t, b, []engine.Write{set.Set("x")}, nil)
	require.Nil(t, unset.Get(s))
	require.Equal(t, "unset", unset.Name())
	require.Equal(t, []string{"set"}, s.Channels())
}

func TestInvalidWritesFailNamingNode(t *testing.T) {
	tests := []struct {
		name  string
		write engine.Write
		want  error
	}{
		{"wrong type", engine.Write{Channel: "count", Value: "three"}, engine.ErrWrongType},
		{"nil value", engine.Write{Channel: "count", Value: nil}, engine.ErrWrongType},
		{"unknown channel", engine.Write{Channel: "nope", Value: 1}, engine.ErrUnknownChannel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := engine.NewGraph("g")
			engine.Sum[int](b, "count")
			b.AddNode("writer", writes(tt.write), engine.WithRetry(engine.RetryPolicy{MaxAttempts: 3}))
			b.AddEdge(engine.Start, "writer")
			g := mustCompile(t, b)
			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
			require.ErrorIs(t, err, tt.want)
			var ne *engine.NodeError
			require.ErrorAs(t, err, &ne)
			require.Equal(t, "writer", ne.Node)
			require.Equal(t, 1, ne.Attempts, "a bad write is permanent, never retried")
			require.ErrorContains(t, err, `"writer"`)
			require.Equal(t, engine.StatusFailed, res.Run.Status)
		})
	}
}

func TestInvalidInputFails(t *testing.T) {
	b := engine.NewGraph("g")
	engine.Sum[int](b, "count")
	b.AddNode("a", noop)
	b.AddEdge(engine.Start, "a")
	g := mustCompile(t, b)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"}, engine.Write{Channel: "count", Value: 1.5})
	require.ErrorIs(t, err, engine.ErrWrongType)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	_, err = g.Invoke(context.Background(), engine.RunConfig{Thread: "t"}, engine.Write{Channel: "other", Value: 1})
	require.ErrorIs(t, err, engine.ErrUnknownChannel)
}

func TestParallelReplaceLastInTaskOrderWins(t *testing.T) {
	b := engine.NewGraph("g")
	c := engine.Replace[string](b, "c")
	b.AddNode("a", writes(c.Set("a")))
	b.AddNode("b", writes(c.Set("b")))
	// Declared a then b, added to Start in the other order: task order
	// follows declaration.
	b.AddEdge(engine.Start, "b")
	b.AddEdge(engine.Start, "a")
	g := mustCompile(t, b)
	for range 5 {
		res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
		require.NoError(t, err)
		require.Equal(t, "b", c.Get(res.State))
	}
}

// TestAppendValuesAreNotAliased has nodes append to the lists they read, as Go
// code naturally does; that must never leak into the state or into each
// other's views, however the runtime grows its arrays.
func TestAppendValuesAreNotAliased(t *testing.T) {
	b := engine.NewGraph("alias")
	msgs := engine.Append[string](b, "messages")
	seen := engine.Merge[string, string](b, "seen")
	for _, name := range []string{"left", "right"} {
		b.AddNode(name, func(_ context.Context, s engine.State) ([]engine.Write, error) {
			mine := append(msgs.Get(s), "scribble by "+s.Node())
			return []engine.Write{engine.Push(msgs, s.Node()), seen.Set(map[string]string{s.Node(): mine[len(mine)-1]})}, nil
		})
	}
	b.AddNode("join", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		_ = append(msgs.Get(s), "junk")
		return []engine.Write{engine.Push(msgs, "join")}, nil
	})
	b.AddEdge(engine.Start, "left")
	b.AddEdge(engine.Start, "right")
	b.AddEdge("left", "join")
	b.AddEdge("right", "join")
	g := mustCompile(t, b)
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore(), Cache: engine.NewStateCache(8, 0)}
	var prev []string
	for turn := range 5 {
		res, err := g.Invoke(ctx, cfg, engine.Push(msgs, "in"))
		require.NoError(t, err)
		got := msgs.Get(res.State)
		want := append(append([]string(nil), prev...), "in", "left", "right", "join")
		require.Equal(t, want, got, "turn %d", turn)
		require.Equal(t, map[string]string{"left": "scribble by left", "right": "scribble by right"}, seen.Get(res.State))
		// The caller scribbles on the result too.
		_ = append(got, "caller junk")
		prev = want
	}
	snap, err := g.StateAt(ctx, engine.RunConfig{Thread: "t", Store: cfg.Store}, "")
	require.NoError(t, err)
	require.Equal(t, prev, msgs.Get(snap))
}

// A step's writes are applied in place once the execution owns its state,
// so a state the cache or an earlier result still holds must be copied
// first: a result's state never changes when its thread runs on.
func TestResultStateDoesNotChangeWhenTheThreadRunsOn(t *testing.T) {
	b := engine.NewGraph("g")
	in := engine.Replace[string](b, "in")
	echo := engine.Replace[string](b, "echo")
	b.AddNode("echo", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{echo.Set("echo " + in.Get(s))}, nil
	})
	b.AddEdge(engine.Start, "echo")
	g := mustCompile(t, b)
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore(), Cache: engine.NewStateCache(8, 0)}
	var results []*engine.Result
	for _, s := range []string{"a", "b", "c"} {
		res, err := g.Invoke(ctx, cfg, in.Set(s))
		require.NoError(t, err)
		results = append(results, res)
	}
	for i, s := range []string{"a", "b", "c"} {
		require.Equal(t, s, in.Get(results[i].State), "turn %d", i)
		require.Equal(t, "echo "+s, echo.Get(results[i].State), "turn %d", i)
	}
}
