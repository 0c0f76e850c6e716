package wiring_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/agenttest"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

func TestStoreCallLog(t *testing.T) {
	agenttest.CallLog(t, func(t *testing.T) agent.CallLog {
		db := openStore(t)
		return wiring.CallLog(db, db)
	})
}

// openStore opens a fresh store, closed when the test ends.
func openStore(t *testing.T) *store.DB {
	t.Helper()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// answerModel answers every call with "ok".
type answerModel struct{}

func (answerModel) Name() string { return "answer" }

func (answerModel) Chat(_ context.Context, req models.Request, _ func(models.Chunk) error) (*models.Response, error) {
	return &models.Response{Provider: "answer", Model: req.Model, DoneReason: "stop", PromptTokens: 40, CompletionTokens: 1,
		Message: models.Message{Role: models.RoleAssistant, Content: "ok"}, RequestHash: models.HashRequest(req)}, nil
}

// longRequest is a tool loop's request some turns in: ten messages, three
// tools offered. Its digest is past engine.BlobThreshold.
func longRequest() models.Request {
	req := models.Request{Model: "llama3.2:3b", Messages: []models.Message{{Role: models.RoleSystem,
		Content: strings.Repeat("You answer questions about doses. ", 30)}}}
	for i := range 3 {
		n := strconv.Itoa(i)
		req.Messages = append(req.Messages,
			models.Message{Role: models.RoleUser, Content: "When do I take dose " + n + "?"},
			models.Message{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{ID: n, Name: "kb_search", Arguments: json.RawMessage(`{"q":"` + n + `"}`)}}},
			models.Message{Role: models.RoleTool, ToolName: "kb_search", Content: strings.Repeat("Take it with a meal. ", 10)})
	}
	for _, name := range []string{"kb_search", "current_time", "record_dose"} {
		req.Tools = append(req.Tools, models.ToolDef{Name: name, Description: "the " + name + " tool", Parameters: json.RawMessage(`{"type":"object"}`)})
	}
	return req
}

// A model call costs three commits, whatever its request: its answer (a
// blob), its intent and its result. The intent's digest of a long request
// goes to a blob, stored in the intent's own commit.
func TestModelCallCommitsWithALongRequest(t *testing.T) {
	ctx := context.Background()
	db := openStore(t)
	log := wiring.CallLog(db, db)
	req := longRequest()
	require.Len(t, req.Messages, 10)

	mc := &agent.ModelCall{Provider: answerModel{}, Lane: &policy.Lane{Agent: "dose-reminder", Models: []string{"llama3.2:3b"}}, Log: log, Blobs: db}
	var commits int
	b := engine.NewGraph("a")
	b.AddNode("gen", func(ctx context.Context, _ engine.State) ([]engine.Write, error) {
		before := db.Stats().Commits
		_, err := mc.Call(ctx, req, 0)
		commits = int(db.Stats().Commits - before)
		return nil, err
	})
	b.AddEdge(engine.Start, "gen").AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(ctx, engine.RunConfig{Thread: "t", Store: db})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, 3, commits, "commits of one model call: answer, intent, result")

	recs, err := wiring.Records(ctx, log, agent.ModelKeyPrefix(res.Run.ID))
	require.NoError(t, err)
	require.Len(t, recs, 1)
	stored, err := db.ToolCall(ctx, recs[0].Key)
	require.NoError(t, err)
	require.False(t, stored.Args.Blob.IsZero(), "the test's request is too short: its record's digest is inline (%d bytes)", len(stored.Args.Inline))
	var kept models.RequestDigest
	require.NoError(t, json.Unmarshal(recs[0].Args, &kept))
	require.Nil(t, kept.Diff(models.DigestRequest(req)), "the record keeps the request's digest")
}

// A tool's long result is stored in its record's commit too.
func TestToolCallLongResultCommitsOnce(t *testing.T) {
	ctx := context.Background()
	db := openStore(t)
	log := wiring.CallLog(db, db)
	rec := agent.CallRecord{Key: "run_1:1:task:0", Run: "run_1", Node: "loop", Tool: "kb_search",
		ArgsHash: agent.HashArgs(json.RawMessage(`{"q":"a"}`)), Args: json.RawMessage(`{"q":"a"}`)}
	_, err := log.Intent(ctx, rec)
	require.NoError(t, err)
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("dose ", engine.BlobThreshold)})
	require.NoError(t, err)
	before := db.Stats().Commits
	require.NoError(t, log.Done(ctx, rec.Key, result, ""))
	require.Equal(t, 1, int(db.Stats().Commits-before), "commits of a long result")
	got, err := log.Get(ctx, rec.Key)
	require.NoError(t, err)
	require.JSONEq(t, string(result), string(got.Result))
}
