package audit

// Replays of runs whose subgraphs call a model and a tool. A call's key is
// made of run, step, task and call index, and a subgraph's task ids derive
// from the checkpoint ids of the subgraph's own namespace: the replay must
// give those checkpoints the ids the original gave them, instance by
// instance, or no recorded call of a subgraph is found again.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
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

// clinic is the graph under replay: plan fans out to two instances of the
// subgraph care at one step; care's tool loop calls record_dose, then care
// runs the subgraph check, nested in it, whose tool loop calls
// send_reminder. Each loop asks the model twice (for the call, then for
// the answer) and appends its answer to answers, which both subgraphs
// hand back. Every tool result is numbered by the order of the calls, so
// that each instance's answers are its own: a replay that served one
// instance the calls of another would end with other answers.
type clinic struct {
	// providers answer the loops, by the tool they call.
	providers map[string]models.Provider
	log       agent.CallLog
	blobs     engine.BlobStore
	tool      agent.Tool
	// careNode and checkNode name the subgraph nodes; a replay that
	// renames one runs its calls in another namespace.
	careNode, checkNode string
	// extraStep adds a step before check's loop: its calls are made at
	// another step, so under other keys.
	extraStep bool
	// instances is how many instances of care plan fans out to (two).
	instances int
	// prefix is put before the user's message in check's conversation,
	// which check does not hand back.
	prefix string
	// review has a person review check's answer before it is reported:
	// an interrupt in each instance of the nested subgraph.
	review bool
}

func (c clinic) graph(t *testing.T) *engine.Graph {
	t.Helper()
	check := c.conversation(t, "check", "send_reminder", c.extraStep, c.review, nil)
	care := c.conversation(t, "care", "record_dose", false, false, check)
	b := engine.NewGraph("clinic")
	engine.Replace[string](b, "input")
	engine.Append[string](b, "answers")
	b.AddNode("plan", func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil })
	b.AddSubgraph(c.careNode, care)
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(engine.State) []engine.Send {
		sends := make([]engine.Send, max(c.instances, 2))
		for i := range sends {
			sends[i] = engine.Send{Node: c.careNode, Input: i}
		}
		return sends
	}, c.careNode)
	b.AddEdge(c.careNode, engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	return g
}

// conversation is a graph that asks the model on a conversation of its
// own named name, whose answer is to call tool once, and appends the final
// answer to answers, after a person's review where review is set; then it
// runs sub, when given, as the node c.checkNode.
func (c clinic) conversation(t *testing.T, name, tool string, extraStep, review bool, sub *engine.Graph) *engine.Graph {
	t.Helper()
	b := engine.NewGraph("clinic/" + name)
	input := engine.Replace[string](b, "input")
	answers := engine.Append[string](b, "answers")
	messages := engine.Append[models.Message](b, name)
	answer := engine.Replace[string](b, name+"_answer")
	reg, err := policy.NewRegistry([]policy.Tool{{Name: tool, Kind: policy.KindWrite, Description: tool,
		Schema: json.RawMessage(`{"type":"object","properties":{"v":{"type":"string"}}}`)}})
	require.NoError(t, err)
	loop, err := agent.ToolLoop(agent.LoopConfig{
		Provider: c.providers[tool], Model: "scripted", Lane: policy.Lane{Agent: "clinic", Models: []string{"scripted"}},
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) {
			return policy.Resolve(reg, nil, nil, nil)
		},
		Impls: map[string]agent.Tool{tool: c.tool},
		Rules: []policy.ApprovalRule{{Tool: tool, Decision: policy.DecisionAllow}},
		Log:   c.log, Blobs: c.blobs, Messages: messages, Answer: answer,
	})
	require.NoError(t, err)
	prefix := ""
	if name == "check" {
		prefix = c.prefix
	}
	b.AddNode("intake", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{engine.Push(messages, models.Message{Role: models.RoleUser, Content: prefix + input.Get(s)})}, nil
	})
	b.AddNode("loop", loop)
	b.AddNode("report", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{engine.Push(answers, name+": "+answer.Get(s))}, nil
	})
	first := "intake"
	if extraStep {
		b.AddNode("pause", func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil })
		b.AddEdge("pause", "intake")
		first = "pause"
	}
	b.AddEdge(engine.Start, first).AddEdge("intake", "loop")
	if review {
		b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			d, err := engine.Interrupt(ctx, answer.Get(s))
			if err != nil || d.Kind != engine.Edit {
				return nil, err
			}
			var edited string
			if err := json.Unmarshal(d.Value, &edited); err != nil {
				return nil, err
			}
			return []engine.Write{answer.Set(edited)}, nil
		})
		b.AddEdge("loop", "review").AddEdge("review", "report")
	} else {
		b.AddEdge("loop", "report")
	}
	if sub != nil {
		b.AddSubgraph(c.checkNode, sub)
		b.AddEdge("report", c.checkNode).AddEdge(c.checkNode, engine.End)
	} else {
		b.AddEdge("report", engine.End)
	}
	g, err := b.Compile()
	require.NoError(t, err)
	return g
}

// numberedTool answers each call with its number, from 1.
type numberedTool struct {
	mu sync.Mutex
	n  int
}

func (n *numberedTool) Call(context.Context, json.RawMessage, string) (json.RawMessage, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.n++
	return json.RawMessage(fmt.Sprintf(`{"call":%d}`, n.n)), nil
}

// refusedTool fails the test if the replay runs a tool.
type refusedTool struct{ t *testing.T }

func (r refusedTool) Call(context.Context, json.RawMessage, string) (json.RawMessage, error) {
	r.t.Error("the replay ran a tool")
	return nil, fmt.Errorf("a replay runs no tool")
}

// seenLog is a call log that notes the keys asked of it, and hides the
// records of one tool.
type seenLog struct {
	agent.CallLog
	hide string

	mu   sync.Mutex
	keys map[string]bool
}

func (l *seenLog) Get(ctx context.Context, key string) (*agent.CallRecord, error) {
	rec, err := l.CallLog.Get(ctx, key)
	if err == nil && l.hide != "" && rec.Tool == l.hide {
		return nil, fmt.Errorf("%w: %s", agent.ErrCallNotFound, key)
	}
	l.mu.Lock()
	l.keys[key] = true
	l.mu.Unlock()
	return rec, err
}

// oneCall is a model that calls tool once and then answers with its result.
func oneCall(t *testing.T, tool string) models.Provider {
	t.Helper()
	rules, err := scripted.ParseRules([]byte(fmt.Sprintf(`[
	 {"when_no_tool_result": true, "tool_calls": [{"name": %q, "arguments": {"v": "x"}}]},
	 {"when_tool_result": true, "respond": "done: {{context}}"}]`, tool)))
	require.NoError(t, err)
	p, err := scripted.New(rules)
	require.NoError(t, err)
	return p
}

// subgraphOriginal runs clinic twice on a thread of a bbolt store, and
// returns the store, its call log and the second run. With review, a
// person edits the first instance's answer and approves the second's.
func subgraphOriginal(t *testing.T, review bool) (*store.DB, agent.CallLog, *engine.Run) {
	t.Helper()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	log := wiring.CallLog(db, db)
	c := clinic{log: log, blobs: db, tool: &numberedTool{}, careNode: "care", checkNode: "check", review: review,
		providers: map[string]models.Provider{"record_dose": oneCall(t, "record_dose"), "send_reminder": oneCall(t, "send_reminder")}}
	g := c.graph(t)
	var run *engine.Run
	for _, text := range []string{"a missed dose", "another missed dose"} {
		res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: db}, engine.Write{Channel: "input", Value: text})
		require.NoError(t, err)
		if review {
			require.Equal(t, engine.StatusInterrupted, res.Run.Status, res.Run.Error)
			require.Len(t, res.Run.Interrupts, 2)
			res, err = g.Resume(context.Background(), engine.RunConfig{Thread: "t", Store: db, Run: res.Run}, map[string]engine.Decision{
				res.Run.Interrupts[0].ID: {Kind: engine.Edit, Value: json.RawMessage(`"call the pharmacy"`), By: "nurse"},
				res.Run.Interrupts[1].ID: {Kind: engine.Approve, By: "nurse"}})
			require.NoError(t, err)
		}
		require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
		run = res.Run
		// The run's four answers differ, each naming its tool call.
		v, _ := res.State.Value("answers")
		answers := v.([]string)
		require.GreaterOrEqual(t, len(answers), 4)
		turn := answers[len(answers)-4:]
		require.Len(t, slices.Compact(slices.Sorted(slices.Values(turn))), 4, "%q", turn)
		if review {
			require.Contains(t, turn, "check: call the pharmacy")
		}
	}
	return db, log, run
}

// replayed is clinic as a replay builds it, over log, with what change
// makes to it.
func replayed(t *testing.T, db *store.DB, log agent.CallLog, review bool, change func(*clinic)) *engine.Graph {
	c := clinic{review: review, log: ReplayLog{Original: log}, blobs: db, tool: refusedTool{t}, careNode: "care", checkNode: "check",
		providers: map[string]models.Provider{"record_dose": NoModel{}, "send_reminder": NoModel{}}}
	if change != nil {
		change(&c)
	}
	return c.graph(t)
}

func TestReplayOfSubgraphCalls(t *testing.T) {
	ctx := context.Background()
	db, log, run := subgraphOriginal(t, false)
	seen := &seenLog{CallLog: log, keys: map[string]bool{}}
	rep, err := Replay(ctx, replayed(t, db, seen, false, nil), db, run)
	require.NoError(t, err)
	require.True(t, rep.Same, "%v", rep.Diff)

	// Every call the original made was asked of the record again: two
	// model calls and one tool call in each of the four loops.
	calls, err := db.ToolCalls(ctx, "")
	require.NoError(t, err)
	var want []string
	for _, c := range calls {
		if strings.Contains(c.Key, run.ID) && !strings.Contains(c.Key, "#") {
			want = append(want, c.Key)
		}
	}
	require.Len(t, want, 12, "%v", want)
	var got []string
	for k := range seen.keys {
		got = append(got, k)
	}
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got)
}

// A replay that parts from the original inside a subgraph is reported as a
// divergence that names the call the original did not make, and never
// served another call's record.
func TestReplayOfSubgraphCallsThatDiverge(t *testing.T) {
	ctx := context.Background()
	db, log, run := subgraphOriginal(t, false)
	calls, err := db.ToolCalls(ctx, "")
	require.NoError(t, err)
	recorded := map[string]string{} // key: tool
	for _, c := range calls {
		recorded[c.Key] = c.Tool
	}
	key := regexp.MustCompile(`(?:model:)?` + run.ID + `:\d+:[0-9a-f]{16}:\d+`)
	for _, tc := range []struct {
		name   string
		hide   string // a tool whose records the log loses
		change func(*clinic)
		// want is in the difference's detail; recordedTool is the tool of
		// the call it names, "" for one the original did not make.
		want, recordedTool string
	}{
		{name: "a call missing from the record, in the nested subgraph", hide: "send_reminder",
			want: "(send_reminder) was not made by the original run", recordedTool: "send_reminder"},
		{name: "the nested subgraph's calls one step later", change: func(c *clinic) { c.extraStep = true },
			want: "a model call to scripted that the original run did not make"},
		{name: "the nested subgraph renamed", change: func(c *clinic) { c.checkNode = "verify" },
			want: `subgraph "verify"`},
		{name: "a third instance of the fan-out", change: func(c *clinic) { c.instances = 3 },
			want: "a model call to scripted that the original run did not make"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := &seenLog{CallLog: log, hide: tc.hide, keys: map[string]bool{}}
			rep, err := Replay(ctx, replayed(t, db, seen, false, tc.change), db, run)
			require.NoError(t, err)
			require.False(t, rep.Same)
			require.Contains(t, rep.Diff.Detail, tc.want)
			require.Contains(t, rep.Diff.Detail, ErrDiverged.Error())
			named := key.FindString(rep.Diff.Detail)
			require.NotEmpty(t, named, "the detail names no call: %s", rep.Diff.Detail)
			require.Equal(t, tc.recordedTool, recorded[named], "the call named: %s", named)
		})
	}
}

// The interrupts of a nested subgraph's instances are answered in the
// replay with the decisions the original recorded, by their ids, which
// name the namespace and checkpoint they were asked at.
func TestReplayOfSubgraphInterrupts(t *testing.T) {
	db, log, run := subgraphOriginal(t, true)
	require.Len(t, run.Decisions, 2)
	rep, err := Replay(context.Background(), replayed(t, db, log, true, nil), db, run)
	require.NoError(t, err)
	require.True(t, rep.Same, "%v", rep.Diff)
}

// A replay that parts only in a nested subgraph's own channel, which it
// does not hand back, leaves the root's checkpoints equal: it is found in
// the namespace of the subgraph instance where it parts.
func TestReplayOfSubgraphComparesItsNamespaces(t *testing.T) {
	ctx := context.Background()
	db, log, run := subgraphOriginal(t, false)
	rep, err := Replay(ctx, replayed(t, db, log, false, func(c *clinic) { c.prefix = "urgent: " }), db, run)
	require.NoError(t, err)
	require.False(t, rep.Same)
	d := rep.Diff
	require.Equal(t, "check", d.Channel)
	require.Equal(t, []string{"intake"}, d.Nodes)
	require.Contains(t, d.Replayed, "urgent: another missed dose")
	require.NotContains(t, d.Original, "urgent")
	require.Regexp(t, `^care:[0-9a-f]{16}/check:[0-9a-f]{16}$`, d.Namespace)
	require.Contains(t, d.Detail, "in subgraph "+d.Namespace)
	ck, err := db.Checkpoint(ctx, run.Thread, d.Namespace, d.Checkpoint)
	require.NoError(t, err, "the difference names the original's checkpoint")
	require.Equal(t, run.ID, ck.RunID)
}

// Two checkpoints of a run on one parent in one namespace leave no single
// original id for the replay's checkpoint there: refused, not guessed.
func TestSuccessorsRefusesAFork(t *testing.T) {
	m, err := successors("care:1", []*engine.Checkpoint{{ID: "a"}, {ID: "b", ParentID: "a"}})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"": "a", "a": "b"}, m)
	_, err = successors("care:1", []*engine.Checkpoint{{ID: "a"}, {ID: "b", ParentID: "a"}, {ID: "c", ParentID: "a"}})
	require.ErrorContains(t, err, `checkpoints b and c of namespace "care:1" both follow "a"`)
}
