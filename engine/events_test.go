package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

func drain(s *engine.Subscription) []engine.Event {
	var out []engine.Event
	for {
		select {
		case e, ok := <-s.C():
			if !ok {
				return out
			}
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestBusOrderingAndFilter(t *testing.T) {
	bus := engine.NewBus()
	all := bus.Subscribe(200, nil)
	odd := bus.Subscribe(200, func(e engine.Event) bool { return e.Node == "odd" })
	for i := range 100 {
		node := "even"
		if i%2 == 1 {
			node = "odd"
		}
		bus.Publish(engine.Event{Type: "x", Node: node})
	}
	got := drain(all)
	require.Len(t, got, 100)
	for i, e := range got {
		require.Equal(t, uint64(i+1), e.Seq)
		require.False(t, e.Time.IsZero())
		require.JSONEq(t, `{}`, string(e.Data))
	}
	require.Len(t, drain(odd), 50)
	require.Equal(t, uint64(100), bus.Seq())

	odd.Close()
	odd.Close() // idempotent
	_, open := <-odd.C()
	require.False(t, open)
	bus.Close()
	_, open = <-all.C()
	require.False(t, open)
	late := bus.Subscribe(1, nil)
	_, open = <-late.C()
	require.False(t, open, "subscribing to a closed bus gives a closed subscription")
}

func TestSlowSubscriberIsToldWhatItLost(t *testing.T) {
	bus := engine.NewBus()
	slow := bus.Subscribe(4, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			bus.Publish(engine.Event{Type: "x"})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a slow subscriber")
	}
	first := drain(slow)
	require.Len(t, first, 4)
	for i, e := range first {
		require.Equal(t, uint64(i+1), e.Seq)
	}
	bus.Publish(engine.Event{Type: "y"})
	next := drain(slow)
	require.Len(t, next, 2)
	require.Equal(t, engine.EventLost, next[0].Type)
	var lost struct{ Lost int }
	require.NoError(t, json.Unmarshal(next[0].Data, &lost))
	require.Equal(t, 16, lost.Lost)
	require.Equal(t, "y", next[1].Type)
	require.Equal(t, uint64(21), next[1].Seq)
	// The notice's seq is unique in the stream and keeps it increasing: it
	// marks the end of the lost range (events 5 to 20).
	require.Equal(t, uint64(20), next[0].Seq)
	require.Greater(t, next[0].Seq, first[len(first)-1].Seq)
}

// committedSink checks, as events arrive, that each committed event was made
// durable before it was published.
type committedSink struct {
	bus       *engine.Bus
	mu        sync.Mutex
	committed int // non-live events handed to Commit so far
	published int // non-live events published so far
	problems  []string
}

func (s *committedSink) onCommit(c *engine.Commit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.published != s.committed {
		s.problems = append(s.problems, fmt.Sprintf("commit with %d new events: %d events were published before their commit", len(c.Events), s.published-s.committed))
	}
	for _, e := range c.Events {
		if e.Live {
			s.problems = append(s.problems, "a live event was committed: "+e.Type)
		}
	}
	s.committed += len(c.Events)
}

func (s *committedSink) Publish(events ...engine.Event) {
	s.mu.Lock()
	for _, e := range events {
		if e.Live {
			continue
		}
		s.published++
		if s.published > s.committed {
			s.problems = append(s.problems, "published before commit: "+e.Type)
		}
	}
	s.mu.Unlock()
	s.bus.Publish(events...)
}

func TestEventsPublishedOnlyAfterCommit(t *testing.T) {
	b := engine.NewGraph("ev")
	msgs := engine.Append[string](b, "messages")
	b.AddNode("think", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		for _, tok := range []string{"he", "ll", "o"} {
			engine.Emit(ctx, engine.EventModelToken, map[string]string{"token": tok})
		}
		return []engine.Write{engine.Push(msgs, "hello")}, nil
	})
	b.AddNode("ask", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		if _, err := engine.Interrupt(ctx, "ok?"); err != nil {
			return nil, err
		}
		return nil, nil
	})
	b.AddEdge(engine.Start, "think")
	b.AddEdge("think", "ask")
	g := mustCompile(t, b)

	bus := engine.NewBus()
	sub := bus.Subscribe(1000, nil)
	sink := &committedSink{bus: bus}
	store := newRecordingStore()
	store.onCommit = sink.onCommit
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: store, Events: sink}
	res, err := g.Invoke(ctx, cfg, engine.Push(msgs, "hi"))
	require.NoError(t, err)
	cfg.Run = res.Run
	res, err = g.Resume(ctx, cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	require.Empty(t, sink.problems)

	evs := drain(sub)
	var types []string
	for i, e := range evs {
		require.Equal(t, uint64(i+1), e.Seq)
		require.Equal(t, res.Run.ID, e.Run)
		require.Equal(t, "t", e.Thread)
		live := ""
		if e.Live {
			live = "~"
		}
		types = append(types, live+e.Type+"@"+e.Node)
	}
	require.Equal(t, []string{
		"run.started@",
		"~node.started@think",
		"~model.token@think", "~model.token@think", "~model.token@think",
		"node.completed@think",
		"checkpoint@",
		"~node.started@ask",
		"interrupt@ask",
		"run.resumed@",
		"~node.started@ask",
		"node.completed@ask",
		"checkpoint@",
		"run.completed@",
	}, types)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(evs[2].Data, &tok))
	require.Equal(t, "he", tok.Token)
}

func TestSlowSubscriberNeverBlocksARun(t *testing.T) {
	b := engine.NewGraph("chatty")
	n := engine.Sum[int](b, "n")
	b.AddNode("spin", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		for i := range 50 {
			engine.Emit(ctx, "progress", i)
		}
		return []engine.Write{n.Set(1)}, nil
	})
	b.AddEdge(engine.Start, "spin")
	b.AddConditionalEdge("spin", func(s engine.State) []string {
		if n.Get(s) < 10 {
			return []string{"spin"}
		}
		return []string{engine.End}
	}, "spin", engine.End)
	g := mustCompile(t, b)
	bus := engine.NewBus()
	stuck := bus.Subscribe(1, nil) // never read during the run

	done := make(chan error, 1)
	go func() {
		_, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Events: bus})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a slow subscriber blocked the run")
	}
	got := drain(stuck)
	require.Len(t, got, 1)
	require.Equal(t, engine.EventRunStarted, got[0].Type)
	bus.Publish(engine.Event{Type: "after"})
	got = drain(stuck)
	require.Equal(t, engine.EventLost, got[0].Type)
	var lost struct{ Lost uint64 }
	require.NoError(t, json.Unmarshal(got[0].Data, &lost))
	require.Equal(t, bus.Seq()-2, lost.Lost, "every event but the first and the last was lost, and counted")
}

// In exit durability a step's checkpoint event names a marker, not a stored
// checkpoint, and says so; the checkpoint a run does commit (at its end, or
// at an interrupt) is announced as committed, and it can be loaded.
func TestExitDurabilityMarksItsCheckpointEvents(t *testing.T) {
	type ckptData struct {
		ID        string
		Step      int
		Committed *bool
	}
	run := func(t *testing.T, d engine.Durability, interrupt bool) (committed, markers []ckptData) {
		b := engine.NewGraph("marks")
		log := engine.Append[string](b, "log")
		b.AddNode("a", writes(engine.Push(log, "a")))
		b.AddNode("b", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			if interrupt {
				if _, err := engine.Interrupt(ctx, "go on?"); err != nil {
					return nil, err
				}
			}
			return []engine.Write{engine.Push(log, "b")}, nil
		})
		b.AddNode("c", writes(engine.Push(log, "c")))
		b.AddEdge(engine.Start, "a").AddEdge("a", "b").AddEdge("b", "c")
		g := mustCompile(t, b)
		bus := engine.NewBus()
		sub := bus.Subscribe(1000, nil)
		store := engine.NewMemoryStore()
		ctx := context.Background()
		_, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: store, Durability: d, Events: bus}, engine.Push(log, "in"))
		require.NoError(t, err)
		for _, e := range drain(sub) {
			if e.Type != engine.EventCheckpoint {
				continue
			}
			var c ckptData
			require.NoError(t, json.Unmarshal(e.Data, &c))
			_, err := store.Checkpoint(ctx, "t", "", c.ID)
			if c.Committed == nil {
				require.NoError(t, err, "checkpoint %s (step %d) was announced as committed", c.ID, c.Step)
				committed = append(committed, c)
			} else {
				require.False(t, *c.Committed)
				require.Error(t, err, "a marker's checkpoint %s is not stored", c.ID)
				markers = append(markers, c)
			}
		}
		return committed, markers
	}
	steps := func(cs []ckptData) (out []int) {
		for _, c := range cs {
			out = append(out, c.Step)
		}
		return out
	}

	committed, markers := run(t, engine.DurabilitySync, false)
	require.Equal(t, []int{2, 3, 4}, steps(committed)) // step 1 is the input's
	require.Empty(t, markers)

	committed, markers = run(t, engine.DurabilityExit, false)
	require.Equal(t, []int{4}, steps(committed), "only the run's end commits")
	require.Equal(t, []int{2, 3}, steps(markers))

	// The interrupt at b commits the checkpoint after a, which was
	// announced as a marker until then.
	committed, markers = run(t, engine.DurabilityExit, true)
	require.Equal(t, []int{2}, steps(committed))
	require.Empty(t, markers)
}

// StartAfter sets where the numbers begin, and never takes them back.
func TestBusStartAfter(t *testing.T) {
	bus := engine.NewBus()
	sub := bus.Subscribe(10, nil)
	bus.StartAfter(7 << 32)
	bus.Publish(engine.Event{Type: engine.EventRunStarted})
	bus.StartAfter(5) // too late, and lower: nothing changes
	bus.Publish(engine.Event{Type: engine.EventRunCompleted})
	evs := drain(sub)
	if len(evs) != 2 || evs[0].Seq != 7<<32+1 || evs[1].Seq != 7<<32+2 {
		t.Fatalf("seqs: %+v", evs)
	}
}

// A node.completed event carries the channels of RunConfig.EventValues its
// node wrote, each whole as the step left it (an append channel's earlier
// items included), in exit durability too, where the step is announced
// only when the run commits. Flags past BlobThreshold, which a checkpoint
// keeps as a blob, are carried all the same; a value that does not fit in
// EventValuesLimit is named by the ref of a blob that is stored by the time
// the event is published. Before, any value over BlobThreshold was left out
// of the event in silence.
func TestNodeCompletedCarriesEventValues(t *testing.T) {
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("guardrail_flag_%02d", i))
	}
	bigValue := strings.Repeat("x", engine.EventValuesLimit)
	bigJSON, _ := json.Marshal(bigValue)
	manyJSON, _ := json.Marshal(many)
	require.Greater(t, len(manyJSON), engine.BlobThreshold)
	for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		b := engine.NewGraph("values")
		flags := engine.Append[string](b, "flags")
		big := engine.Replace[string](b, "big")
		note := engine.Replace[string](b, "note")
		b.AddNode("a", writes(engine.Push(flags, many...)))
		b.AddNode("b", writes(engine.Push(flags, "uncited"), big.Set(bigValue)))
		b.AddNode("c", writes(note.Set("done")))
		b.AddEdge(engine.Start, "a").AddEdge("a", "b").AddEdge("b", "c")
		g := mustCompile(t, b)
		store := engine.NewMemoryStore()
		sink := &blobCheckingSink{bus: engine.NewBus(), store: store}
		sub := sink.bus.Subscribe(1000, nil)
		_, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store, Durability: d,
			Events: sink, EventValues: []string{"flags", "big", "note", "undeclared"}}, note.Set("in"))
		require.NoError(t, err)
		require.Empty(t, sink.missing, "durability %s: events named blobs not yet stored", d)
		got, refs := map[string]string{}, map[string]map[string]string{}
		for _, e := range drain(sub) {
			if e.Type != engine.EventNodeCompleted {
				continue
			}
			var data struct {
				Values    json.RawMessage
				ValueRefs map[string]string `json:"value_refs"`
			}
			require.NoError(t, json.Unmarshal(e.Data, &data))
			got[e.Node] = string(data.Values)
			if data.ValueRefs != nil {
				refs[e.Node] = data.ValueRefs
			}
		}
		withUncited, _ := json.Marshal(append(many, "uncited"))
		require.Equal(t, map[string]string{"a": `{"flags":` + string(manyJSON) + `}`, "b": `{"flags":` + string(withUncited) + `}`,
			"c": `{"note":"done"}`}, got, "durability %s", d)
		ref := engine.RefOf(bigJSON)
		require.Equal(t, map[string]map[string]string{"b": {"big": ref.String()}}, refs, "durability %s", d)
		stored, err := store.Blob(context.Background(), ref)
		require.NoError(t, err)
		require.Equal(t, string(bigJSON), string(stored))
	}
}

// blobCheckingSink publishes to bus, after it has checked that each blob
// a node.completed event names in value_refs is in store already.
type blobCheckingSink struct {
	bus     *engine.Bus
	store   *engine.MemoryStore
	missing []string
}

func (s *blobCheckingSink) Publish(events ...engine.Event) {
	for _, e := range events {
		var data struct {
			ValueRefs map[string]string `json:"value_refs"`
		}
		if e.Type != engine.EventNodeCompleted || json.Unmarshal(e.Data, &data) != nil {
			continue
		}
		for _, r := range data.ValueRefs {
			ref, err := engine.ParseBlobRef(r)
			if err == nil {
				_, err = s.store.Blob(context.Background(), ref)
			}
			if err != nil {
				s.missing = append(s.missing, r+": "+err.Error())
			}
		}
	}
	s.bus.Publish(events...)
}
