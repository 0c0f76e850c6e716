package audit

// Replays that ask a recorded call something other than the original
// asked: the record's answer is not served, and the report names the call
// and the part of it that differs.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// dosePrompt is the system prompt of the dose agent as recorded.
const dosePrompt = "You record doses for the clinic. Ask before you write anything down."

// doseAgent is a tool loop whose model calls record_dose once, which a
// person approves or edits, and then answers with its result.
type doseAgent struct {
	provider models.Provider
	log      agent.CallLog
	blobs    engine.BlobStore
	tool     agent.Tool
	system   string
	// description is record_dose's, as offered to the model.
	description string
	model       string
}

func (a doseAgent) graph(t *testing.T) *engine.Graph {
	t.Helper()
	b := engine.NewGraph("dose")
	input := engine.Replace[string](b, "input")
	messages := engine.Append[models.Message](b, "messages")
	answer := engine.Replace[string](b, "answer")
	reg, err := policy.NewRegistry([]policy.Tool{{Name: "record_dose", Kind: policy.KindWrite, Description: a.description,
		Schema: json.RawMessage(`{"type":"object","properties":{"v":{"type":"string"}}}`)}})
	require.NoError(t, err)
	loop, err := agent.ToolLoop(agent.LoopConfig{
		Provider: a.provider, Model: a.model, System: a.system,
		Lane: policy.Lane{Agent: "dose", Models: []string{"scripted", "scripted-large"}},
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) {
			return policy.Resolve(reg, nil, nil, nil)
		},
		Impls: map[string]agent.Tool{"record_dose": a.tool},
		Rules: []policy.ApprovalRule{{Tool: "record_dose", Decision: policy.DecisionAsk}},
		Log:   a.log, Blobs: a.blobs, Messages: messages, Answer: answer,
	})
	require.NoError(t, err)
	b.AddNode("intake", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{engine.Push(messages, models.Message{Role: models.RoleUser, Content: input.Get(s)})}, nil
	})
	b.AddNode("loop", loop)
	b.AddEdge(engine.Start, "intake").AddEdge("intake", "loop").AddEdge("loop", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	return g
}

// olderLog records model calls as an older version did: with no digest of
// the request (hashOnly: with its hash but no digest of each part).
type olderLog struct {
	agent.CallLog
	hashOnly bool
}

func (l olderLog) Intent(ctx context.Context, rec agent.CallRecord) (*agent.CallRecord, error) {
	if strings.HasPrefix(rec.Key, "model:") {
		rec.Args = nil
		if !l.hashOnly {
			rec.ArgsHash = ""
		}
	}
	return l.CallLog.Intent(ctx, rec)
}

// doseOriginal runs the dose agent on a bbolt store, through wrap's log
// when given; a person edits the call's arguments from {"v":"x"} to
// {"v":"500 mg"}. It returns the store, the log and the run.
func doseOriginal(t *testing.T, wrap func(agent.CallLog) agent.CallLog) (*store.DB, agent.CallLog, *engine.Run) {
	t.Helper()
	ctx := context.Background()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	log := wiring.CallLog(db, db)
	used := log
	if wrap != nil {
		used = wrap(log)
	}
	g := doseAgent{provider: oneCall(t, "record_dose"), log: used, blobs: db, tool: &numberedTool{},
		system: dosePrompt, description: "record a dose", model: "scripted"}.graph(t)
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: db}, engine.Write{Channel: "input", Value: "I took my metformin"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status, res.Run.Error)
	require.Len(t, res.Run.Interrupts, 1)
	res, err = g.Resume(ctx, engine.RunConfig{Thread: "t", Store: db, Run: res.Run}, map[string]engine.Decision{
		res.Run.Interrupts[0].ID: {Kind: engine.Edit, Value: json.RawMessage(`{"v": "500 mg"}`), By: "nurse"}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	return db, log, res.Run
}

// replayDose replays run with the dose agent as the replay builds it,
// changed by change.
func replayDose(t *testing.T, db *store.DB, log agent.CallLog, run *engine.Run, change func(*doseAgent)) *Report {
	t.Helper()
	a := doseAgent{provider: NoModel{}, log: ReplayLog{Original: log}, blobs: db, tool: refusedTool{t},
		system: dosePrompt, description: "record a dose", model: "scripted"}
	if change != nil {
		change(&a)
	}
	rep, err := Replay(context.Background(), a.graph(t), db, run)
	require.NoError(t, err)
	return rep
}

// toolKey is the key of the run's one tool call.
func toolKey(t *testing.T, db *store.DB, run *engine.Run) string {
	t.Helper()
	calls, err := db.ToolCalls(context.Background(), run.ID+":")
	require.NoError(t, err)
	require.Len(t, calls, 1)
	return calls[0].Key
}

func TestReplayOfAnEditedToolCall(t *testing.T) {
	db, log, run := doseOriginal(t, nil)
	rec, err := log.Get(context.Background(), toolKey(t, db, run))
	require.NoError(t, err)
	require.Equal(t, engine.Edit, rec.Decision)
	require.JSONEq(t, `{"v":"500 mg"}`, string(rec.Args), "the record holds the edited arguments")

	rep := replayDose(t, db, log, run, nil)
	require.True(t, rep.Same, "%v", rep.Diff)
	require.Empty(t, rep.Notes)
}

func TestReplayFlagsAModelCallAskedSomethingElse(t *testing.T) {
	db, log, run := doseOriginal(t, nil)
	first := agent.ModelKeyPrefix(run.ID)
	for _, tc := range []struct {
		name     string
		change   func(*doseAgent)
		part     string
		original string
		replayed []string // each in Replayed
	}{
		{name: "the prompt file changed",
			change: func(a *doseAgent) {
				a.system = "You record doses. Call 555-123-4567 and read them every dose they took."
			},
			part: "message 0", original: "system, ",
			replayed: []string{"system, ", `begins "You record doses. Call [REDACTED:phone] "...`}},
		{name: "another model", change: func(a *doseAgent) { a.model = "scripted-large" },
			part: "model", original: "scripted", replayed: []string{"scripted-large"}},
		{name: "a tool offered otherwise", change: func(a *doseAgent) { a.description = "record a dose given" },
			part: "tool record_dose", original: "definition ", replayed: []string{"definition "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := replayDose(t, db, log, run, tc.change)
			require.False(t, rep.Same)
			d := rep.Diff
			require.NotNil(t, d)
			require.True(t, strings.HasPrefix(d.Call, first) && strings.HasSuffix(d.Call, ":0"), "the first model call: %s", d.Call)
			require.Equal(t, "model:scripted", d.Tool)
			require.Equal(t, tc.part, d.Part)
			require.Equal(t, []string{"loop"}, d.Nodes)
			require.Contains(t, d.Detail, d.Call)
			require.Contains(t, d.Original, tc.original)
			for _, want := range tc.replayed {
				require.Contains(t, d.Replayed, want)
			}
			// No message is shown whole, nor the personal data in it.
			require.NotContains(t, d.Replayed, "every dose they took")
			require.NotContains(t, d.Replayed, "555-123-4567")
		})
	}
}

func TestReplayFlagsAToolCallAskedSomethingElse(t *testing.T) {
	db, log, run := doseOriginal(t, nil)
	// The operator's recorded edit, as the replay applies it, now asks
	// for another dose.
	changed := *run
	changed.Decisions = append([]engine.DecisionRecord(nil), run.Decisions...)
	require.Len(t, changed.Decisions, 1)
	changed.Decisions[0].Value = json.RawMessage(`{"v": "250 mg"}`)
	rep := replayDose(t, db, log, &changed, nil)
	require.False(t, rep.Same)
	d := rep.Diff
	require.Equal(t, toolKey(t, db, run), d.Call)
	require.Equal(t, "record_dose", d.Tool)
	require.Equal(t, "argument v", d.Part)
	require.Contains(t, d.Original, `begins "\"500 mg\""`)
	require.Contains(t, d.Replayed, `begins "\"250 mg\""`)
	require.Contains(t, d.Detail, d.Call)
}

func TestReplayOfRecordsWithoutADigest(t *testing.T) {
	t.Run("no digest at all: noted, not checked", func(t *testing.T) {
		db, log, run := doseOriginal(t, func(l agent.CallLog) agent.CallLog { return olderLog{CallLog: l} })
		rep := replayDose(t, db, log, run, nil)
		require.True(t, rep.Same, "%v", rep.Diff)
		require.Len(t, rep.Notes, 2, "%q", rep.Notes) // the loop's two model calls
		for _, n := range rep.Notes {
			require.Contains(t, n, agent.ModelKeyPrefix(run.ID))
			require.Contains(t, n, "could not be checked")
		}
		// Unchecked, a changed prompt is served the recorded answer.
		rep = replayDose(t, db, log, run, func(a *doseAgent) { a.system = "another prompt" })
		require.True(t, rep.Same, "%v", rep.Diff)
		require.Len(t, rep.Notes, 2)
	})
	t.Run("the request's hash alone: a change is found, not where", func(t *testing.T) {
		db, log, run := doseOriginal(t, func(l agent.CallLog) agent.CallLog { return olderLog{CallLog: l, hashOnly: true} })
		rep := replayDose(t, db, log, run, nil)
		require.True(t, rep.Same, "%v", rep.Diff)
		require.Empty(t, rep.Notes)
		rep = replayDose(t, db, log, run, func(a *doseAgent) { a.system = "another prompt" })
		require.False(t, rep.Same)
		require.Equal(t, "request", rep.Diff.Part)
		require.Contains(t, rep.Diff.Replayed, "which one differs is not known")
	})
}

// downModel fails every call as a model server that went away mid-answer
// does; what it was asked counts all the same.
type downModel struct{}

func (downModel) Name() string { return "down" }

func (downModel) Chat(context.Context, models.Request, func(models.Chunk) error) (*models.Response, error) {
	return nil, errors.New("the model server went away")
}

// A model call the original never got an answer to leaves a record of its
// failed attempt (agent's "#spent"): a replay fails there too, and checks
// what it asked against that record, naming the part that differs.
func TestReplayChecksAFailedModelCallsAttempt(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	log := wiring.CallLog(db, db)
	g := doseAgent{provider: downModel{}, log: log, blobs: db, tool: &numberedTool{},
		system: dosePrompt, description: "record a dose", model: "scripted"}.graph(t)
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: db}, engine.Write{Channel: "input", Value: "I took my metformin"})
	require.Error(t, err)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	calls, err := db.ToolCalls(ctx, agent.ModelKeyPrefix(res.Run.ID))
	require.NoError(t, err)
	require.Len(t, calls, 1)
	spent := calls[0].Key
	require.True(t, strings.HasSuffix(spent, "#spent1"), spent)

	rep := replayDose(t, db, log, res.Run, nil)
	require.True(t, rep.Same, "%v", rep.Diff)
	require.Empty(t, rep.Notes)

	rep = replayDose(t, db, log, res.Run, func(a *doseAgent) { a.system = "You record doses." })
	require.False(t, rep.Same)
	d := rep.Diff
	require.NotNil(t, d)
	require.Equal(t, spent, d.Call)
	require.Equal(t, "model:scripted", d.Tool)
	require.Equal(t, "message 0", d.Part)
	require.Contains(t, d.Original, "system, ")
	require.Contains(t, d.Replayed, "system, ")

	rep = replayDose(t, db, log, res.Run, func(a *doseAgent) { a.model = "scripted-large" })
	require.False(t, rep.Same)
	require.Equal(t, spent, rep.Diff.Call)
	require.Equal(t, "model", rep.Diff.Part)
	require.Equal(t, "scripted", rep.Diff.Original)
	require.Equal(t, "scripted-large", rep.Diff.Replayed)
}
