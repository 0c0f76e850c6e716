package crashtest

// Exit durability commits a run only when it ends, pauses or fails. A tool
// call's intent, though, is made durable before the tool runs, whatever the
// durability. These tests stop the process while a tool with a side effect
// is in flight, its intent recorded and its outcome not, and check that the
// restarted process still knows the run, resumes it, and asks a person
// about the call instead of forgetting the run or running the call again.

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// stallTool is a non-idempotent write. Its blockAt-th call does its effect,
// then hangs until its run is stopped: the process dies with the call's
// outcome unknown.
type stallTool struct {
	mu      sync.Mutex
	keys    []string // one per effect, in order
	blockAt int      // 0: never
	blocked chan struct{}
}

func (s *stallTool) Call(ctx context.Context, _ json.RawMessage, key string) (json.RawMessage, error) {
	s.mu.Lock()
	s.keys = append(s.keys, key)
	n := len(s.keys)
	s.mu.Unlock()
	if n == s.blockAt {
		close(s.blocked)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	return json.RawMessage(`{"appended":true}`), nil
}

func (s *stallTool) effects() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// writerLoop is a tool loop whose model calls append_line twice, then
// answers.
func writerLoop(t *testing.T, db *store.DB, tool agent.Tool, messages engine.Chan[[]models.Message], answer engine.Chan[string]) engine.NodeFunc {
	t.Helper()
	reg, err := policy.NewRegistry([]policy.Tool{{Name: "append_line", Kind: policy.KindWrite, Idempotent: false,
		Description: "append a line", Schema: json.RawMessage(`{"type":"object","properties":{"v":{"type":"string"}}}`)}})
	require.NoError(t, err)
	rules, err := scripted.ParseRules([]byte(`[
	 {"when_no_tool_result": true, "tool_calls": [
	   {"name": "append_line", "arguments": {"v": "{{input}}/1"}},
	   {"name": "append_line", "arguments": {"v": "{{input}}/2"}}]},
	 {"when_tool_result": true, "respond": "appended: {{context}}"}]`))
	require.NoError(t, err)
	provider, err := scripted.New(rules)
	require.NoError(t, err)
	node, err := agent.ToolLoop(agent.LoopConfig{
		Provider: provider, Model: "scripted", Lane: policy.Lane{Agent: "writer", Models: []string{"scripted"}},
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) { return policy.Resolve(reg, nil, nil) },
		Impls:       map[string]agent.Tool{"append_line": tool},
		Rules:       []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAllow}},
		Log:         wiring.CallLog(db, db), Blobs: db,
		Messages: messages, Answer: answer,
	})
	require.NoError(t, err)
	return node
}

// exitShapes are the graphs the tool loop runs in:
//   - "first step": the loop is the run's first step;
//   - "subgraph": the loop runs inside a subgraph node;
//   - "second tool step": a second loop runs after a first that called the
//     tool too, so the second's step starts from a checkpoint that no end
//     or pause has committed;
//   - "after a resume": the loop runs after a person approved a review: the
//     run is on record from its pause, but not the step the loop runs
//     from.
var exitShapes = map[string]int{"first step": 1, "subgraph": 1, "second tool step": 3, "after a resume": 1}

func exitToolAgent(t *testing.T, db *store.DB, tool agent.Tool, shape string) *engine.Agent {
	t.Helper()
	b := engine.NewGraph("writer")
	messages := engine.Append[models.Message](b, "messages")
	answer := engine.Replace[string](b, "answer")
	inputs := []engine.Chan[[]models.Message]{messages}
	switch shape {
	case "first step":
		b.AddNode("loop", writerLoop(t, db, tool, messages, answer))
		b.AddEdge(engine.Start, "loop")
	case "subgraph":
		sb := engine.NewGraph("inner")
		sm := engine.Append[models.Message](sb, "messages")
		sa := engine.Replace[string](sb, "answer")
		sb.AddNode("loop", writerLoop(t, db, tool, sm, sa))
		sb.AddEdge(engine.Start, "loop")
		inner, err := sb.Compile()
		require.NoError(t, err)
		b.AddSubgraph("sub", inner)
		b.AddEdge(engine.Start, "sub")
	case "second tool step":
		messages2 := engine.Append[models.Message](b, "messages2")
		answer2 := engine.Replace[string](b, "answer2")
		inputs = append(inputs, messages2)
		b.AddNode("loop", writerLoop(t, db, tool, messages, answer))
		b.AddNode("loop2", writerLoop(t, db, tool, messages2, answer2))
		b.AddEdge(engine.Start, "loop")
		b.AddEdge("loop", "loop2")
	case "after a resume":
		b.AddNode("review", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
			_, err := engine.Interrupt(ctx, "go ahead?")
			return nil, err
		})
		b.AddNode("loop", writerLoop(t, db, tool, messages, answer))
		b.AddEdge(engine.Start, "review")
		b.AddEdge("review", "loop")
	default:
		t.Fatalf("unknown shape %q", shape)
	}
	g, err := b.Compile()
	require.NoError(t, err)
	return &engine.Agent{Name: "writer", Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			var ws []engine.Write
			for _, c := range inputs {
				ws = append(ws, engine.Push(c, models.Message{Role: models.RoleUser, Content: s}))
			}
			return ws, nil
		},
		Output: func(s engine.State) json.RawMessage {
			out, _ := json.Marshal(answer.Get(s))
			return out
		}}
}

// TestExitDurabilityCrashDuringToolCall stops the process while a tool call
// of a run in exit durability is in flight. The restarted process must find
// the run, resume it, and ask a person about the call, without running it
// again on its own; approving it runs it once more.
func TestExitDurabilityCrashDuringToolCall(t *testing.T) {
	for shape, blockAt := range exitShapes {
		t.Run(shape, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			opts := engine.ManagerOptions{Durability: engine.DurabilityExit, Workers: 2}

			db, err := store.OpenDir(dir, store.Options{})
			require.NoError(t, err)
			before := &stallTool{blockAt: blockAt, blocked: make(chan struct{})}
			ag := exitToolAgent(t, db, before, shape)
			m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, opts)
			run, err := m.Start(ctx, engine.RunRequest{Thread: "t1", Agent: "writer", Input: json.RawMessage(`"x"`)})
			require.NoError(t, err)
			if shape == "after a resume" {
				paused, err := m.Wait(ctx, run.ID)
				require.NoError(t, err)
				require.Equal(t, engine.StatusInterrupted, paused.Status, paused.Error)
				_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve}})
				require.NoError(t, err)
			}
			<-before.blocked
			// The process dies: nothing more is written for the run.
			m.Close()
			require.NoError(t, db.Close())
			effects := before.effects()
			require.Len(t, effects, blockAt)
			uncertain := effects[blockAt-1]

			db, err = store.OpenDir(dir, store.Options{})
			require.NoError(t, err)
			defer db.Close()
			after := &stallTool{}
			ag = exitToolAgent(t, db, after, shape)
			m = engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, opts)
			defer m.Close()
			n, err := m.Recover(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n, "the run whose tool call's outcome is unknown is found and resumed")

			paused, err := m.Wait(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusInterrupted, paused.Status, paused.Error)
			require.Len(t, paused.Interrupts, 1)
			var ti agent.ToolInterrupt
			require.NoError(t, json.Unmarshal(paused.Interrupts[0].Payload, &ti))
			require.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason)
			require.Equal(t, uncertain, ti.Key, "the person is asked about the call in flight")
			require.Empty(t, after.effects(), "no call ran again without a person's decision")

			_, err = m.Resume(ctx, run.ID, map[string]engine.Decision{paused.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}})
			require.NoError(t, err)
			done, err := m.Wait(ctx, run.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, done.Status, done.Error)
			// The approved call runs again under its key; a call after it
			// in the same turn runs for the first time.
			require.Equal(t, uncertain, after.effects()[0])
			for _, k := range after.effects()[1:] {
				require.NotContains(t, effects, k, "call %s ran before the crash and again after it", k)
			}

			rep, err := db.Check(ctx)
			require.NoError(t, err)
			require.True(t, rep.OK(), "db check: %v", rep.Problems)
		})
	}
}
