package crashtest

// Where a run names a node of a subgraph, it names it by its path through
// the subgraphs ("a/loop"), as events do: nestedAgent's three tool loops
// share the bare name loop.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// runNested runs nestedSpecAgent(spec) once to its first pause or its
// end, on a store of its own, with events going to sink (nil for none).
func runNested(t *testing.T, spec loopSpec, sink engine.EventSink) (*engine.Manager, *store.DB, *engine.Run) {
	t.Helper()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	ag, err := nestedSpecAgent(db, spec)
	require.NoError(t, err)
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil },
		engine.ManagerOptions{Workers: 1, Events: sink})
	t.Cleanup(m.Close)
	input, _ := json.Marshal("the note")
	started, err := m.Start(context.Background(), engine.RunRequest{Thread: "n", Agent: "nested", Input: input})
	require.NoError(t, err)
	run, err := m.Wait(context.Background(), started.ID)
	require.NoError(t, err)
	return m, db, run
}

// The API's run names the node a run waits in twice: "node", its bare
// name (DESIGN.md), and "path", its path through the subgraphs. The
// parent's question and a subgraph's have the same bare name; their paths
// tell them apart, in the run and in the list of runs.
func TestAPIInterruptsNameTheNodesPath(t *testing.T) {
	spec := nestedSpec(&orderedTool{})
	spec.rules = []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAsk}}
	m, db, run := runNested(t, spec, nil)
	type interrupt struct {
		ID   string `json:"id"`
		Node string `json:"node"`
		Path string `json:"path"`
	}
	for _, want := range nestedPaths {
		require.Equal(t, engine.StatusInterrupted, run.Status, "%s %s", run.Status, run.Error)
		require.Len(t, run.Interrupts, 1)
		var one struct {
			Interrupts []interrupt `json:"interrupts"`
		}
		getOverHTTP(t, m, db, "/api/v1/runs/"+run.ID, &one)
		assert.Equal(t, []interrupt{{ID: run.Interrupts[0].ID, Node: "loop", Path: want}}, one.Interrupts, "GET /api/v1/runs/{id}")
		var list struct {
			Runs []struct {
				Interrupts []interrupt `json:"interrupts"`
			} `json:"runs"`
		}
		getOverHTTP(t, m, db, "/api/v1/runs?status=interrupted", &list)
		require.Len(t, list.Runs, 1)
		assert.Equal(t, one.Interrupts, list.Runs[0].Interrupts, "GET /api/v1/runs")

		_, err := m.Resume(context.Background(), run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}})
		require.NoError(t, err)
		run, err = m.Wait(context.Background(), run.ID)
		require.NoError(t, err)
	}
	assert.Equal(t, engine.StatusCompleted, run.Status, "%s %s", run.Status, run.Error)
}

// eventLog keeps the events published to it.
type eventLog struct {
	mu     sync.Mutex
	events []engine.Event
}

func (l *eventLog) Publish(events ...engine.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, events...)
}

func (l *eventLog) ofType(typ string) []engine.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []engine.Event
	for _, e := range l.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// A call to a tool outside the active set, refused in each of the three
// loops, is evented with the node's bare name as "node" in its data, as
// before, and its path as "path", which the event's own node holds.
func TestUnauthorizedCallNamesTheNodesPath(t *testing.T) {
	tool := &orderedTool{}
	spec := nestedSpec(tool)
	spec.tools = append(spec.tools, policy.Tool{Name: "erase_line", Kind: policy.KindWrite, Description: "erase a line"})
	spec.impls["erase_line"] = tool
	spec.allow = []string{"append_line"}
	spec.script = oneCall("erase_line")
	events := &eventLog{}
	_, _, run := runNested(t, spec, events)
	require.Equal(t, engine.StatusCompleted, run.Status, "%s %s", run.Status, run.Error)
	assert.Empty(t, tool.calls(), "a refused call ran")

	type data struct{ Node, Path, Tool string }
	var got, envelopes []string
	for _, e := range events.ofType(engine.EventToolDenied) {
		var d data
		require.NoError(t, json.Unmarshal(e.Data, &d))
		assert.Equal(t, data{Node: "loop", Path: e.Node, Tool: "erase_line"}, d)
		got, envelopes = append(got, d.Path), append(envelopes, e.Node)
	}
	assert.Equal(t, nestedPaths, got, "the paths the data names")
	assert.Equal(t, nestedPaths, envelopes, "the paths the events' envelopes name")
}

// failInB fails the first model call that subgraph node b's loop makes,
// after the provider has taken the request (its tokens are spent).
type failInB struct {
	models.Provider
	mu     sync.Mutex
	failed bool
}

func (f *failInB) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	info, _ := engine.InfoFrom(ctx)
	f.mu.Lock()
	fail := !f.failed && strings.HasPrefix(info.NS, "b:")
	f.failed = f.failed || fail
	f.mu.Unlock()
	if fail {
		return nil, errors.New("the connection dropped mid-answer")
	}
	return f.Provider.Chat(ctx, req, stream)
}

// The records of model calls name their node by its path, as those of
// tool calls do: an answer's record, and that of the tokens a failed call
// spent.
func TestModelCallRecordsNameTheNodesPath(t *testing.T) {
	spec := nestedSpec(&orderedTool{})
	spec.provider = func(p models.Provider) models.Provider { return &failInB{Provider: p} }
	_, db, run := runNested(t, spec, nil)
	require.Equal(t, engine.StatusFailed, run.Status, "the failed call did not end the run: %s", run.Error)
	calls, err := db.ToolCalls(context.Background(), agent.ModelKeyPrefix(run.ID))
	require.NoError(t, err)
	answered, spent := map[string]int{}, map[string]int{}
	for _, c := range calls {
		if strings.Contains(c.Key, "#spent") {
			spent[c.Node]++
		} else {
			answered[c.Node]++
		}
	}
	// The parent's loop and a's ask twice each (for the call, then for
	// the answer); b's first call fails, and the run with it.
	assert.Equal(t, map[string]int{"loop": 2, "a/loop": 2}, answered, "the nodes the answers' records name")
	assert.Equal(t, map[string]int{"b/loop": 1}, spent, "the node the spent tokens' record names")
}
