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
	"fmt"
	"os"
	"strings"
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
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) {
			return policy.Resolve(reg, nil, nil, nil)
		},
		Impls: map[string]agent.Tool{"append_line": tool},
		Rules: []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAllow}},
		Log:   wiring.CallLog(db, db), Blobs: db,
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
	return conversationAgent("writer", g, inputs, answer, nil)
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

// The child of TestExitDurabilityOutcomeCountsTheCallsOfTheFinalAttempt
// runs from init, as the other crash tests' do: OUTPOST_EXITCALLS_CHILD
// names its store, OUTPOST_EXITCALLS_START asks it to start the run, which
// kills the process after its model call, and OUTPOST_EXITCALLS_SAME_STEP
// has the model called in the step that makes the run durable (see
// genAgent).
func init() {
	if dir := os.Getenv("OUTPOST_EXITCALLS_CHILD"); dir != "" {
		sameStep := os.Getenv("OUTPOST_EXITCALLS_SAME_STEP") != ""
		if err := exitCallsChild(dir, os.Getenv("OUTPOST_EXITCALLS_START") != "", sameStep); err != nil {
			fmt.Fprintf(os.Stderr, "exit calls child: %v\n", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
}

// exitCallsChild opens the store in dir with a manager in exit
// durability, recovers what a start before left running and waits for it,
// and, at the first start, runs genAgent, which kills the process.
func exitCallsChild(dir string, start, sameStep bool) error {
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	ag, err := genAgent(db, start, sameStep)
	if err != nil {
		return err
	}
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil },
		engine.ManagerOptions{Durability: engine.DurabilityExit})
	defer m.Close()
	if _, err := m.Recover(ctx); err != nil {
		return err
	}
	if start {
		_, err := m.Invoke(ctx, engine.RunRequest{Thread: "t1", Agent: "gen"})
		return err
	}
	return waitUnfinished(ctx, db, m, "")
}

// genAgent runs "first", which makes the run durable (as a tool call
// would), then "gen", which calls the model, then "hold", which kills the
// process when kill is set. With sameStep, "first" calls the model itself
// once the run is durable, as a tool loop does after a tool call, and
// "gen" does nothing.
func genAgent(db *store.DB, kill, sameStep bool) (*engine.Agent, error) {
	rules, err := scripted.ParseRules([]byte(`[{"respond": "noted: {{input}}"}]`))
	if err != nil {
		return nil, err
	}
	provider, err := scripted.New(rules)
	if err != nil {
		return nil, err
	}
	mc := &agent.ModelCall{Provider: provider, Lane: &policy.Lane{Agent: "gen", Models: []string{"scripted"}},
		Log: wiring.CallLog(db, db), Blobs: db, TokenLimit: 100_000}
	b := engine.NewGraph("gen")
	answer := engine.Replace[string](b, "answer")
	call := func(ctx context.Context) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "scripted", Messages: []models.Message{{Role: models.RoleUser, Content: "a dose"}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{answer.Set(resp.Message.Content)}, nil
	}
	b.AddNode("first", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		if err := engine.EnsureDurable(ctx); err != nil || !sameStep {
			return nil, err
		}
		return call(ctx)
	})
	b.AddNode("gen", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		if sameStep {
			return nil, nil
		}
		return call(ctx)
	})
	b.AddNode("hold", func(context.Context, engine.State) ([]engine.Write, error) {
		if kill {
			return nil, killSelf()
		}
		return nil, nil
	})
	b.AddEdge(engine.Start, "first")
	b.AddEdge("first", "gen")
	b.AddEdge("gen", "hold")
	g, err := b.Compile()
	if err != nil {
		return nil, err
	}
	return &engine.Agent{Name: "gen", Graph: g, Output: func(s engine.State) json.RawMessage {
		out, _ := json.Marshal(answer.Get(s))
		return out
	}}, nil
}

// A run in exit durability whose process is killed after a model call,
// past its last commit, is recovered from that commit and calls the model
// again. Its outcome counts the model calls of the path it ended on, one,
// not the one the crash took back as well; its tokens are all it spent,
// as its budget counted them. A call made by a task of the step that the
// last commit starts (same step) is not made again: the recovered run
// reuses its answer, and it counts once, in model calls and in tokens.
func TestExitDurabilityOutcomeCountsTheCallsOfTheFinalAttempt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameStep bool
		calls    int // model calls made, in the two starts
	}{
		{"a step after the last commit", false, 2},
		{"the step the last commit starts", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"OUTPOST_EXITCALLS_CHILD=" + t.TempDir()}
			if tc.sameStep {
				env = append(env, "OUTPOST_EXITCALLS_SAME_STEP=1")
			}
			requireOutcomeOfFinalAttempt(t, env, tc.calls)
		})
	}
}

// requireOutcomeOfFinalAttempt starts the child with env twice, the first
// time to crash, and checks the outcome of its run, which made calls model
// calls in all.
func requireOutcomeOfFinalAttempt(t *testing.T, env []string, calls int) {
	dir := strings.TrimPrefix(env[0], "OUTPOST_EXITCALLS_CHILD=")
	ctx := context.Background()
	err := startChild(t, append(env, "OUTPOST_EXITCALLS_START=1")...)
	require.True(t, killed(err), "the first start kills itself after the model call: %v", err)

	spentBy := func() (string, int) {
		db, err := store.OpenDir(dir, store.Options{})
		require.NoError(t, err)
		defer db.Close()
		runs, err := db.Runs(ctx, engine.RunFilter{Thread: "t1"})
		require.NoError(t, err)
		require.Len(t, runs, 1, "the run is on record from its first step")
		spent, err := wiring.CallLog(db, db).(agent.TokenCounter).ModelTokens(ctx, runs[0].ID)
		require.NoError(t, err)
		return runs[0].ID, spent
	}
	run, before := spentBy()
	require.Positive(t, before, "the model call was recorded before the crash")

	require.NoError(t, startChild(t, env...), "the next start recovers the run and ends it")
	_, spent := spentBy()
	require.Equal(t, calls*before, spent, "the budget counts every call made")

	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	runs, err := db.Runs(ctx, engine.RunFilter{Thread: "t1"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, runs[0].Status, runs[0].Error)
	outcomes, err := db.Outcomes(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, outcomes, 1)
	o := outcomes[0]
	require.Equal(t, run, o.Run)
	require.Equal(t, 1, o.ModelCalls, "the outcome counts the call of the path the run ended on")
	require.Equal(t, spent, o.Tokens, "and every token the run spent")
	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "db check: %v", rep.Problems)
}
