package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// fanoutGraph sends n tasks to "work", each with its index as input.
func fanoutGraph(t *testing.T, n int, work engine.NodeFunc) (*engine.Graph, engine.Chan[[]int], engine.Chan[int]) {
	t.Helper()
	b := engine.NewGraph("fanout")
	done := engine.Append[int](b, "done")
	last := engine.Replace[int](b, "last")
	b.AddNode("plan", noop)
	b.AddNode("work", work)
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(engine.State) []engine.Send {
		sends := make([]engine.Send, n)
		for i := range sends {
			sends[i] = engine.Send{Node: "work", Input: i}
		}
		return sends
	}, "work")
	return mustCompile(t, b), done, last
}

func TestSuperstepConcurrencyBound(t *testing.T) {
	tests := []struct {
		name     string
		limit    int
		tasks    int
		wantPeak int64
	}{
		{"bounded to 3", 3, 8, 3},
		{"bounded to 1", 1, 4, 1},
		{"default bound runs all 8 at once", 0, 8, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var inflight, peak atomic.Int64
			var done engine.Chan[[]int]
			var g *engine.Graph
			g, done, _ = fanoutGraph(t, tt.tasks, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
				n := inflight.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				time.Sleep(30 * time.Millisecond)
				inflight.Add(-1)
				i, err := engine.InputOf[int](s)
				return []engine.Write{engine.Push(done, i)}, err
			})
			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", MaxConcurrency: tt.limit})
			require.NoError(t, err)
			require.Len(t, done.Get(res.State), tt.tasks)
			require.Equal(t, tt.wantPeak, peak.Load())
		})
	}
}

func TestWritesAppliedInTaskOrderNotFinishOrder(t *testing.T) {
	const n = 5
	var g *engine.Graph
	var done engine.Chan[[]int]
	var last engine.Chan[int]
	g, done, last = fanoutGraph(t, n, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		i, err := engine.InputOf[int](s)
		if err != nil {
			return nil, err
		}
		// The first task finishes last.
		time.Sleep(time.Duration(n-i) * 2 * time.Millisecond)
		return []engine.Write{engine.Push(done, i), last.Set(i)}, nil
	})
	for run := range 20 {
		res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: fmt.Sprint("t", run)})
		require.NoError(t, err)
		require.Equal(t, []int{0, 1, 2, 3, 4}, done.Get(res.State), "run %d", run)
		require.Equal(t, n-1, last.Get(res.State), "run %d", run)
	}
}

func loopingGraph(t *testing.T) (*engine.Graph, engine.Chan[int]) {
	b := engine.NewGraph("loop")
	n := engine.Sum[int](b, "n")
	b.AddNode("spin", writes(n.Set(1)))
	b.AddEdge(engine.Start, "spin")
	b.AddConditionalEdge("spin", func(engine.State) []string { return []string{"spin"} }, "spin", engine.End)
	return mustCompile(t, b), n
}

func TestStepLimit(t *testing.T) {
	tests := []struct {
		name  string
		limit int
		want  int
	}{
		{"default", 0, engine.DefaultStepLimit},
		{"configured", 7, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, n := loopingGraph(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			store := engine.NewMemoryStore()
			res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store, StepLimit: tt.limit})
			require.ErrorIs(t, err, engine.ErrStepLimit)
			require.NoError(t, ctx.Err(), "the run must end by itself")
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
			require.Equal(t, tt.want, res.Run.Steps)
			require.Equal(t, tt.want, n.Get(res.State))
			stored, err := store.Run(ctx, res.Run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusBudgetExceeded, stored.Status)
			require.Contains(t, stored.Error, "step limit")
		})
	}
}

func TestOneCheckpointPerSuperstepWithOnlyChangedChannels(t *testing.T) {
	b := engine.NewGraph("line")
	x := engine.Replace[string](b, "x")
	y := engine.Replace[string](b, "y")
	b.AddNode("a", writes(x.Set("a")))
	b.AddNode("b", writes(y.Set("b")))
	b.AddNode("c", noop)
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "b")
	b.AddEdge("b", "c")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store}, y.Set("input"))
	require.NoError(t, err)
	require.Equal(t, 3, res.Run.Steps)

	hist, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	require.Len(t, hist, 4, "input checkpoint plus one per superstep")
	type row struct {
		source   string
		nodes    []string
		channels []string
		next     []string
	}
	var got []row
	for i := len(hist) - 1; i >= 0; i-- {
		c := hist[i]
		r := row{source: c.Source, nodes: c.Nodes}
		for _, cv := range c.Channels {
			r.channels = append(r.channels, cv.Channel)
		}
		for _, n := range c.Next {
			r.next = append(r.next, n.Node)
		}
		got = append(got, r)
	}
	require.Equal(t, []row{
		{source: engine.SourceInput, channels: []string{"y"}, next: []string{"a"}},
		{source: engine.SourceLoop, nodes: []string{"a"}, channels: []string{"x"}, next: []string{"b"}},
		{source: engine.SourceLoop, nodes: []string{"b"}, channels: []string{"y"}, next: []string{"c"}},
		{source: engine.SourceLoop, nodes: []string{"c"}},
	}, got)
	for i, c := range hist {
		if i+1 < len(hist) {
			require.Equal(t, hist[i+1].ID, c.ParentID)
		}
	}
	require.Equal(t, hist[0].ID, res.Run.Checkpoint)
}

// TestLongThreadStorageIsLinear runs a 200-turn conversation and checks that the
// bytes stored for the message list grow with its length, not its square.
func TestLongThreadStorageIsLinear(t *testing.T) {
	b := engine.NewGraph("chat")
	msgs := engine.Append[string](b, "messages")
	b.AddNode("reply", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{engine.Push(msgs, fmt.Sprintf("reply to message %d", len(msgs.Get(s))))}, nil
	})
	b.AddEdge(engine.Start, "reply")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "long", Store: store, Cache: engine.NewStateCache(4, 0)}
	const turns = 200
	for i := range turns {
		_, err := g.Invoke(ctx, cfg, engine.Push(msgs, fmt.Sprintf("user turn %d", i)))
		require.NoError(t, err)
	}
	hist, err := g.History(ctx, store, "long", 0)
	require.NoError(t, err)
	require.Len(t, hist, 2*turns)
	var stored int
	for _, c := range hist {
		for _, cv := range c.Channels {
			require.True(t, cv.Delta, "append channels are stored as deltas")
			stored += len(cv.Value.Inline) + int(cv.Value.Blob.Len)
		}
	}
	// Reload without a cache: the deltas fold back into the whole list.
	snap, err := g.StateAt(ctx, engine.RunConfig{Thread: "long", Store: store}, "")
	require.NoError(t, err)
	final := msgs.Get(snap)
	require.Len(t, final, 2*turns)
	require.Equal(t, "reply to message 399", final[len(final)-1])
	whole, err := json.Marshal(final)
	require.NoError(t, err)
	// Each delta is one item plus a few bytes of brackets; a full copy per
	// checkpoint would be ~200 times the whole list.
	require.Less(t, stored, 2*len(whole), "stored %d bytes for a %d-byte list", stored, len(whole))
}

func TestLargeValuesGoToDeduplicatedBlobs(t *testing.T) {
	b := engine.NewGraph("big")
	doc := engine.Replace[string](b, "doc")
	small := engine.Replace[string](b, "small")
	big := strings.Repeat("0123456789", 100) // 1000 bytes, over BlobThreshold
	b.AddNode("a", writes(doc.Set(big), small.Set("tiny")))
	b.AddEdge(engine.Start, "a")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	for _, thread := range []string{"t1", "t1", "t2"} {
		_, err := g.Invoke(ctx, engine.RunConfig{Thread: thread, Store: store})
		require.NoError(t, err)
	}
	hist, err := g.History(ctx, store, "t1", 0)
	require.NoError(t, err)
	var refs []engine.BlobRef
	for _, c := range hist {
		for _, cv := range c.Channels {
			switch cv.Channel {
			case "doc":
				require.Nil(t, cv.Value.Inline, "a large value is never inlined")
				require.False(t, cv.Value.Blob.IsZero())
				refs = append(refs, cv.Value.Blob)
			case "small":
				require.NotNil(t, cv.Value.Inline)
				require.True(t, cv.Value.Blob.IsZero())
			}
		}
	}
	require.Len(t, refs, 2)
	require.Equal(t, refs[0], refs[1])
	enc, _ := json.Marshal(big)
	require.Equal(t, engine.RefOf(enc), refs[0])
	data, err := store.Blob(ctx, refs[0])
	require.NoError(t, err)
	require.Equal(t, enc, data)
	_, blobs, _ := store.Stats()
	require.Equal(t, 1, blobs, "the same bytes are stored once")

	snap, err := g.StateAt(ctx, engine.RunConfig{Thread: "t2", Store: store}, "")
	require.NoError(t, err)
	require.Equal(t, big, doc.Get(snap))
}

// TestPendingWritesResume mirrors LangGraph's test_pending_writes_resume: one
// of three parallel tasks fails; resuming re-runs only that one.
func TestPendingWritesResume(t *testing.T) {
	calls := newCounter()
	var failOnce atomic.Bool
	failOnce.Store(true)
	b := engine.NewGraph("pending")
	got := engine.Merge[string, int](b, "got")
	for _, name := range []string{"one", "two", "three"} {
		b.AddNode(name, calls.counted(func(_ context.Context, s engine.State) ([]engine.Write, error) {
			if s.Node() == "two" && failOnce.Swap(false) {
				return nil, errors.New("boom")
			}
			return []engine.Write{got.Set(map[string]int{s.Node(): 1})}, nil
		}))
		b.AddEdge(engine.Start, name)
	}
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store}

	res, err := g.Invoke(ctx, cfg)
	var ne *engine.NodeError
	require.ErrorAs(t, err, &ne)
	require.Equal(t, "two", ne.Node)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, 1, calls.get("one"))
	require.Equal(t, 1, calls.get("two"))
	require.Equal(t, 1, calls.get("three"))

	// The finished tasks' writes are kept against the input checkpoint.
	ws, err := store.Writes(ctx, "t", "", res.Run.Checkpoint)
	require.NoError(t, err)
	var nodes []string
	for _, w := range ws {
		if w.Kind == engine.WriteKindWrites {
			nodes = append(nodes, w.Node)
		}
	}
	require.ElementsMatch(t, []string{"one", "three"}, nodes)

	res, err = g.Resume(ctx, cfg, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Equal(t, 1, calls.get("one"), "a task with saved writes is not re-run")
	require.Equal(t, 2, calls.get("two"))
	require.Equal(t, 1, calls.get("three"))
	require.Equal(t, map[string]int{"one": 1, "two": 1, "three": 1}, got.Get(res.State))
}

func TestExitDurabilityCommitsOnceAtTheEnd(t *testing.T) {
	b := engine.NewGraph("exit")
	n := engine.Sum[int](b, "n")
	log := engine.Append[string](b, "log")
	for _, name := range []string{"a", "b", "c"} {
		b.AddNode(name, writes(n.Set(1), engine.Push(log, name)))
	}
	b.AddEdge(engine.Start, "a")
	b.AddEdge("a", "b")
	b.AddEdge("b", "c")
	g := mustCompile(t, b)
	store := engine.NewMemoryStore()
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store, Durability: engine.DurabilityExit}
	res, err := g.Invoke(ctx, cfg, engine.Push(log, "in"))
	require.NoError(t, err)
	require.Equal(t, 3, n.Get(res.State))
	ckpts, _, commits := store.Stats()
	require.Equal(t, 1, ckpts)
	require.Equal(t, 1, commits)
	snap, err := g.StateAt(ctx, cfg, "")
	require.NoError(t, err)
	require.Equal(t, 3, n.Get(snap))
	require.Equal(t, []string{"in", "a", "b", "c"}, log.Get(snap))

	// A second turn in exit mode builds on the first.
	res, err = g.Invoke(ctx, cfg, engine.Push(log, "in2"))
	require.NoError(t, err)
	snap, err = g.StateAt(ctx, cfg, "")
	require.NoError(t, err)
	require.Equal(t, []string{"in", "a", "b", "c", "in2", "a", "b", "c"}, log.Get(snap))
	require.Equal(t, 6, n.Get(snap))
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
}

func TestFanoutInputSurvivesRestart(t *testing.T) {
	type job struct {
		Name string
		Size int
	}
	b := engine.NewGraph("fan")
	out := engine.Merge[string, int](b, "out")
	b.AddNode("plan", noop)
	b.AddNode("work", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		j, err := engine.InputOf[job](s)
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(map[string]int{j.Name: j.Size})}, nil
	})
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(engine.State) []engine.Send {
		return []engine.Send{{Node: "work", Input: job{"a", 1}}, {Node: "work", Input: job{"b", 2}}}
	}, "work")
	g := mustCompile(t, b)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t"})
	require.NoError(t, err)
	require.Equal(t, map[string]int{"a": 1, "b": 2}, out.Get(res.State))
}

// Graph.Resume on a thread whose run ended over budget ran that run's
// unfinished step on under a new run, with every budget fresh: resuming
// again and again went on without end. It is refused.
func TestResumeRefusesARunThatEndedOverBudget(t *testing.T) {
	g, n := loopingGraph(t)
	ctx := context.Background()
	store := engine.NewMemoryStore()
	cfg := engine.RunConfig{Thread: "t", Store: store, StepLimit: 3}
	res, err := g.Invoke(ctx, cfg)
	require.ErrorIs(t, err, engine.ErrStepLimit)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
	over := res.Run.ID

	res, err = g.Resume(ctx, cfg, nil)
	require.ErrorIs(t, err, engine.ErrBudgetExceeded)
	require.Contains(t, err.Error(), over)
	require.Equal(t, 3, n.Get(res.State), "no step ran")
	stored, err := store.Run(ctx, over)
	require.NoError(t, err)
	require.Equal(t, engine.StatusBudgetExceeded, stored.Status, "the run's record is left as it ended")

	// Handing the run back is refused too.
	_, err = g.Resume(ctx, engine.RunConfig{Thread: "t", Store: store, StepLimit: 3, Run: stored}, nil)
	require.ErrorIs(t, err, engine.ErrBudgetExceeded)

	// A new turn on the thread is a new run, with its own budget.
	res, err = g.Invoke(ctx, cfg)
	require.ErrorIs(t, err, engine.ErrStepLimit)
	require.NotEqual(t, over, res.Run.ID)
}
