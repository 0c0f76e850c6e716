package crashtest

// Tool calls in subgraphs: the idempotency key of a call is made of run,
// step, task and call index (agent.ToolKey), and holds no namespace. The
// task ID is a hash of the checkpoint the task runs from, and checkpoint
// IDs are unique across a thread's namespaces, so a call that a subgraph's
// node makes has a key of its own even where the parent's node, or another
// instance of the subgraph, makes the same call at the same step and task
// position. These tests hold each of three such calls in turn, take the
// store file as a crash leaves it, and recover it.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// orderedTool records the key of each call it gets, in order. The call
// numbered holdAt (from 1) waits on release once it is made, its intent
// recorded and its result not yet: the moment a crash leaves an intent
// without a result.
type orderedTool struct {
	holdAt        int
	held, release chan struct{}

	mu   sync.Mutex
	keys []string
}

func (o *orderedTool) Call(_ context.Context, _ json.RawMessage, key string) (json.RawMessage, error) {
	o.mu.Lock()
	o.keys = append(o.keys, key)
	n := len(o.keys)
	o.mu.Unlock()
	if n == o.holdAt {
		o.held <- struct{}{}
		<-o.release
	}
	return json.RawMessage(`{"done":true}`), nil
}

func (o *orderedTool) calls() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.keys)
}

// nestedAgent runs intake and loop, then the subgraph of the same two
// nodes twice, as nodes a and b: three tool loops named loop, each at the
// second step of its graph, as its graph's only task, and each calling
// append_line (not idempotent) once with the same arguments. Each graph's
// conversation is its own, so that each loop's model calls the tool.
func nestedAgent(db *store.DB, tool agent.Tool) (*engine.Agent, error) {
	return nestedSpecAgent(db, nestedSpec(tool))
}

// nestedSpec is the loopSpec of nestedAgent's three loops.
func nestedSpec(tool agent.Tool) loopSpec {
	return loopSpec{name: "nested",
		tools:  []policy.Tool{{Name: "append_line", Kind: policy.KindWrite, Description: "append a line"}},
		script: oneCall("append_line"),
		impls:  map[string]agent.Tool{"append_line": tool},
		rules:  []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAllow}},
	}
}

// nestedSpecAgent is nestedAgent with each of its loops made by spec.
func nestedSpecAgent(db *store.DB, spec loopSpec) (*engine.Agent, error) {
	// intakeLoop adds intake and loop to b, on a conversation of its own
	// named conv, which starts with the shared input.
	intakeLoop := func(b *engine.Builder, conv string) (engine.Chan[string], engine.Chan[string], error) {
		input := engine.Replace[string](b, "input")
		messages := engine.Append[models.Message](b, conv)
		answer := engine.Replace[string](b, conv+"_answer")
		loop, err := loopNode(db, spec, messages, answer)
		if err != nil {
			return input, answer, err
		}
		b.AddNode("intake", func(_ context.Context, s engine.State) ([]engine.Write, error) {
			return []engine.Write{engine.Push(messages, models.Message{Role: models.RoleUser, Content: input.Get(s)})}, nil
		})
		b.AddNode("loop", loop)
		b.AddEdge(engine.Start, "intake").AddEdge("intake", "loop")
		return input, answer, nil
	}
	sb := engine.NewGraph("nested/care")
	if _, _, err := intakeLoop(sb, "care"); err != nil {
		return nil, err
	}
	sb.AddEdge("loop", engine.End)
	sub, err := sb.Compile()
	if err != nil {
		return nil, err
	}
	b := engine.NewGraph("nested")
	input, answer, err := intakeLoop(b, "messages")
	if err != nil {
		return nil, err
	}
	b.AddSubgraph("a", sub).AddSubgraph("b", sub)
	b.AddEdge("loop", "a").AddEdge("a", "b").AddEdge("b", engine.End)
	g, err := b.Compile()
	if err != nil {
		return nil, err
	}
	return &engine.Agent{Name: "nested", Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			return []engine.Write{input.Set(s)}, nil
		},
		Output: func(s engine.State) json.RawMessage {
			out, _ := json.Marshal(answer.Get(s))
			return out
		}}, nil
}

// A run whose parent graph and two instances of a subgraph each call the
// same tool with the same arguments, at the same step and task position,
// is cut short by a crash during each call in turn. Recovered, it asks a
// person about that call alone, by its own key; the calls made before it
// are not made again, and those after it are made once each, without
// asking: no call is taken for another one of the same position in
// another namespace. Rejected, the call is not made again. The three
// calls' keys differ only in their task part.
func TestCrashInASubgraphsToolCallIsTakenForNoOtherCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		holdAt int
	}{
		{"in the parent's call", 1},
		{"in the first subgraph's call", 2},
		{"in the second subgraph's call", 3},
	} {
		for _, d := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
			t.Run(tc.name+"/"+string(d), func(t *testing.T) { crashInNestedCall(t, tc.holdAt, d) })
		}
	}
}

// crashInNestedCall runs nestedAgent in durability d, takes the store file
// while the call numbered holdAt holds, recovers it and checks what
// TestCrashInASubgraphsToolCallIsTakenForNoOtherCall says.
func crashInNestedCall(t *testing.T, holdAt int, d engine.Durability) {
	opts := engine.ManagerOptions{Workers: 1, Durability: d}
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	tool := &orderedTool{holdAt: holdAt, held: make(chan struct{}), release: make(chan struct{})}
	ag, err := nestedAgent(db, tool)
	require.NoError(t, err)
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, opts)
	input, _ := json.Marshal("the note")
	started, image := imageWhileHeld(t, dir, db, m, engine.RunRequest{Thread: "n", Agent: "nested", Input: input}, tool.held,
		func() { close(tool.release) })
	sameStepAndPosition(t, started.ID, tool.calls())
	// The calls are made one after another: those the file knows of are
	// the first holdAt.
	before := tool.calls()[:holdAt]

	crashed := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(crashed, store.FileName), image, 0o600))
	db, err = store.OpenDir(crashed, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	again := &orderedTool{}
	ag, err = nestedAgent(db, again)
	require.NoError(t, err)
	m = engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, opts)
	defer m.Close()
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	run, err := m.Wait(ctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, run.Status, "%s %s", run.Status, run.Error)
	require.Len(t, run.Interrupts, 1)
	var ti agent.ToolInterrupt
	require.NoError(t, json.Unmarshal(run.Interrupts[0].Payload, &ti))
	assert.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason)
	assert.Equal(t, before[holdAt-1], ti.Key, "asked about another call than the one the crash cut short")
	assert.Equal(t, nestedPaths[holdAt-1], ti.Node, "the question names another node than the held call's")
	assert.Equal(t, nestedPaths[holdAt-1], run.Interrupts[0].Path(), "the interrupt's node")
	assert.Empty(t, again.calls(), "a call was made again before the person decided")

	run, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Reject, By: "nurse"}})
	require.NoError(t, err)
	run, err = m.Wait(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status, "%s %s: asked again", run.Status, run.Error)
	after := again.calls()
	assert.Len(t, after, 3-holdAt, "the calls after the one cut short: %v, before: %v", after, before)
	for _, k := range after {
		assert.NotContains(t, before, k, "a call after the crash has the key of one made before it")
	}

	var calls []string
	for _, k := range recordsOfDB(t, db, started.ID) {
		if !strings.Contains(k, "#") { // not a question's markers
			calls = append(calls, k)
		}
	}
	assert.ElementsMatch(t, append(before, after...), calls, "the run's call records")
	sameStepAndPosition(t, started.ID, calls)

	// The calls were made in the order of nestedPaths.
	want := map[string]string{}
	for i, k := range append(before, after...) {
		want[k] = nestedPaths[i]
	}
	assert.Equal(t, want, callNodesOfDB(t, db, started.ID), "the nodes the store's records name")
	assert.Equal(t, want, callNodesOverHTTP(t, m, db, started.ID), "the nodes the console's tool calls name")
}

// nestedPaths are the paths of nestedAgent's three tool loops, in the
// order they call: the parent's, then those of subgraph nodes a and b.
var nestedPaths = []string{"loop", "a/loop", "b/loop"}

// callNodesOfDB maps the key of each of run's tool calls in db (not a
// question's markers) to the node its record names.
func callNodesOfDB(t *testing.T, db *store.DB, run string) map[string]string {
	t.Helper()
	calls, err := db.ToolCalls(context.Background(), run+":")
	require.NoError(t, err)
	out := map[string]string{}
	for _, c := range calls {
		if !strings.Contains(c.Key, "#") {
			out[c.Key] = c.Node
		}
	}
	return out
}

// callNodesOverHTTP is callNodesOfDB as a console over HTTP reads it
// (GET /api/v1/runs/{id}, its tool_calls).
func callNodesOverHTTP(t *testing.T, m *engine.Manager, db *store.DB, run string) map[string]string {
	t.Helper()
	var view struct {
		ToolCalls []struct {
			Key  string `json:"key"`
			Node string `json:"node"`
		} `json:"tool_calls"`
		ToolCallsError string `json:"tool_calls_error"`
	}
	getOverHTTP(t, m, db, "/api/v1/runs/"+run, &view)
	require.Empty(t, view.ToolCallsError)
	out := map[string]string{}
	for _, c := range view.ToolCalls {
		if !strings.Contains(c.Key, "#") {
			out[c.Key] = c.Node
		}
	}
	return out
}

// getOverHTTP decodes into v what a console of m and db, served over HTTP
// on loopback, answers to GET path.
func getOverHTTP(t *testing.T, m *engine.Manager, db *store.DB, path string, v any) {
	t.Helper()
	c := console.New(console.Config{Manager: m, Bus: engine.NewBus(), Token: "secret", Records: db})
	defer c.Close()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// sameStepAndPosition checks that keys are three of run's tool-call keys
// (run:step:task:call) that share step, and call index, and differ in
// their task alone.
func sameStepAndPosition(t *testing.T, run string, keys []string) {
	t.Helper()
	require.Len(t, keys, 3, "%v", keys)
	tasks := map[string]bool{}
	for _, k := range keys {
		parts := strings.Split(k, ":")
		require.Len(t, parts, 4, k)
		first := strings.Split(keys[0], ":")
		assert.Equal(t, []string{run, first[1], first[3]}, []string{parts[0], parts[1], parts[3]}, k)
		tasks[parts[2]] = true
	}
	assert.Len(t, tasks, 3, "keys share a task: %v", keys)
}

// recordsOfDB lists the keys of the tool-call records of run in db.
func recordsOfDB(t *testing.T, db *store.DB, run string) []string {
	t.Helper()
	calls, err := db.ToolCalls(context.Background(), run+":")
	require.NoError(t, err)
	var keys []string
	for _, c := range calls {
		keys = append(keys, c.Key)
	}
	return keys
}
