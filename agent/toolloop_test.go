package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

func TestReadToolRoundTrip(t *testing.T) {
	e := newEnv(t)
	res := e.invoke("I forgot my metformin")
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	ans := e.answer.Get(res.State)
	require.Contains(t, ans, "From the notes:")
	require.Contains(t, ans, "doc-1")
	require.NotContains(t, ans, "<<<TOOL_RESULT", "the answer does not repeat the data markers")

	called, result := e.events.of(engine.EventToolCalled), e.events.of(engine.EventToolResult)
	require.Len(t, called, 1)
	require.Equal(t, "kb_search", called[0]["tool"])
	require.Equal(t, "allow", called[0]["decision"])
	require.Len(t, result, 1)
	require.NotEmpty(t, e.events.of(engine.EventModelToken), "tokens streamed as live events")

	recs := e.mem.Records(res.Run.ID)
	require.Len(t, recs, 1)
	require.Equal(t, agent.StatusDone, recs[0].Status)
	require.Equal(t, "rule:default", recs[0].DecidedBy)
	require.Len(t, e.mem.Records("model:"+res.Run.ID), 2, "both model responses recorded")
	require.Positive(t, e.tokens.Get(res.State))

	msgs := e.messages.Get(res.State)
	require.Equal(t, []string{"user", "assistant", "tool", "assistant"}, roles(msgs))
	require.True(t, strings.HasPrefix(msgs[2].Content, "<<<TOOL_RESULT id="), "the model got the result inside data markers: %q", msgs[2].Content)
}

func roles(ms []models.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Role)
	}
	return out
}

func TestDeniedCalls(t *testing.T) {
	cases := []struct {
		name, input string
		opts        []envOption
		tool, layer string
		reply       string
	}{
		{name: "unknown tool", input: "unknown tool", tool: "nope", layer: policy.LayerRegistry,
			reply: `refused: tool "nope" is not available`},
		{name: "outside the request override", input: "echo please", opts: []envOption{withOverride("kb_search")},
			tool: "echo", layer: policy.LayerRequest, reply: `refused: tool "echo" is not available`},
		{name: "schema failure", input: "bad args", tool: "kb_search", layer: policy.LayerSchema,
			reply: `refused: the arguments for "kb_search" are invalid: $.query: want string, got number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts...)
			res := e.invoke(tc.input)
			require.Equal(t, engine.StatusCompleted, res.Run.Status, "the run continues: %s", res.Run.Error)
			denied := e.events.of(engine.EventToolDenied)
			require.Len(t, denied, 1)
			require.Equal(t, tc.tool, denied[0]["tool"])
			require.Equal(t, tc.layer, denied[0]["layer"])
			require.Equal(t, res.Run.ID, denied[0]["run"])
			require.Equal(t, "loop", denied[0]["node"])
			tm := e.toolMessages(res)
			require.Len(t, tm, 1)
			require.Equal(t, tc.reply, tm[0].Content)
			require.Empty(t, e.events.of(engine.EventToolCalled))
			for _, c := range e.tools {
				require.Zero(t, c.n())
			}
			recs := e.mem.Records(res.Run.ID)
			require.Len(t, recs, 1)
			require.Equal(t, "deny", recs[0].Decision)
			require.Equal(t, "policy:"+tc.layer, recs[0].DecidedBy)
		})
	}
}

func writeScript() *seqProvider {
	return &seqProvider{msgs: []models.Message{
		toolTurn(call("write_x", `{"v":"a"}`)),
		answerTurn("written"),
	}}
}

func TestWriteToolAsks(t *testing.T) {
	cases := []struct {
		name     string
		decision engine.Decision
		runs     int
		reply    string
		recorded string
	}{
		{"approve", engine.Decision{Kind: engine.Approve, By: "alice", Reason: "expected"}, 1, "ok", "approve"},
		{"edit", engine.Decision{Kind: engine.Edit, By: "alice", Value: json.RawMessage(`{"v":"b"}`)}, 1, "ok", "edit"},
		{"reject", engine.Decision{Kind: engine.Reject, By: "alice", Reason: "not today"}, 0,
			`refused: the call to "write_x" was not run (declined by the operator)`, "reject"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeScript()
			e := newEnv(t, withProvider(p), withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionAsk}))
			res := e.invoke("please write")
			ti := interruptOf(t, res)
			require.Equal(t, agent.ReasonApproval, ti.Reason)
			require.Equal(t, "write_x", ti.Tool)
			require.JSONEq(t, `{"v":"a"}`, string(ti.Args))
			require.Zero(t, e.tools["write_x"].n(), "nothing runs before the decision")

			res = e.resume(res, tc.decision)
			require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
			require.Equal(t, tc.runs, e.tools["write_x"].n())
			require.Contains(t, e.toolMessages(res)[0].Content, tc.reply)
			require.Equal(t, int32(2), p.calls.Load(), "the first model response was reused after the resume")

			recs := e.mem.Records(res.Run.ID)
			require.Len(t, recs, 1)
			require.Equal(t, tc.recorded, recs[0].Decision)
			require.Equal(t, "operator:alice", recs[0].DecidedBy)
			require.Equal(t, tc.decision.Reason, recs[0].Reason)
			if tc.name == "edit" {
				require.JSONEq(t, `{"v":"b"}`, string(recs[0].Args))
			}
		})
	}
}

func TestUntrustedResultMakesWritesAsk(t *testing.T) {
	p := &seqProvider{msgs: []models.Message{
		toolTurn(call("write_x", `{"v":"first"}`)),
		toolTurn(call("injector", `{}`)),
		toolTurn(call("write_x", `{"v":"second"}`)),
		answerTurn("done"),
	}}
	e := newEnv(t, withProvider(p), withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionAllow}))
	res := e.invoke("go")
	ti := interruptOf(t, res)
	require.Equal(t, agent.ReasonApproval, ti.Reason)
	require.JSONEq(t, `{"v":"second"}`, string(ti.Args), "the write before the hostile text ran without asking")
	require.Contains(t, ti.Detail, "untrusted")
	require.Equal(t, 1, e.tools["write_x"].n())
	res = e.resume(res, engine.Decision{Kind: engine.Approve, By: "bob"})
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, 2, e.tools["write_x"].n())
	require.Equal(t, 1, e.tools["injector"].n(), "the recorded result was reused on the re-run")
	flagged := e.events.of(engine.EventToolResult)
	require.Len(t, flagged, 3)
	require.NotEmpty(t, flagged[1]["flags"])
}

func TestBudgets(t *testing.T) {
	cases := []struct {
		name   string
		input  string
		budget policy.Budget
		which  string
	}{
		{"iterations (default 5)", "forever", policy.Budget{}, policy.BudgetToolIterations},
		{"iterations (2)", "forever", policy.Budget{ToolIterations: 2}, policy.BudgetToolIterations},
		{"tokens", "metformin", policy.Budget{Tokens: 5}, policy.BudgetTokens},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withBudget(tc.budget))
			res := e.invoke(tc.input)
			require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status, res.Run.Error)
			require.Contains(t, res.Run.Error, tc.which+" budget exceeded")
			require.Len(t, e.events.of(engine.EventBudgetExceeded), 1)
			if tc.which == policy.BudgetToolIterations {
				limit := max(tc.budget.ToolIterations, policy.DefaultToolIterations)
				if tc.budget.ToolIterations > 0 {
					limit = tc.budget.ToolIterations
				}
				require.Equal(t, limit, e.tools[agent.ToolCurrentTime].n())
			}
		})
	}
}

func TestLaneViolation(t *testing.T) {
	p := writeScript()
	e := newEnv(t, withProvider(p), func(c *agent.LoopConfig, _ *env) { c.Model = "llama3.2:3b" })
	res := e.invoke("hello")
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Contains(t, res.Run.Error, "model call refused")
	require.Contains(t, res.Run.Error, `may not use model "llama3.2:3b"`)
	require.Zero(t, p.calls.Load(), "the model is never called")
	refused := e.events.of(agent.EventModelRefused)
	require.Len(t, refused, 1)
	require.Equal(t, "llama3.2:3b", refused[0]["model"])
}

func TestTransientModelErrorRetried(t *testing.T) {
	f := &flaky{Provider: writeScript()}
	f.fails.Store(1)
	e := newEnv(t, withProvider(f), withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionAllow}))
	res := e.invoke("write")
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, int32(3), f.calls.Load(), "one failure, then two answers")
	require.Equal(t, 1, e.tools["write_x"].n())

	f2 := &flaky{Provider: writeScript()}
	f2.fails.Store(10)
	e = newEnv(t, withProvider(f2))
	res = e.invoke("write")
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Contains(t, res.Run.Error, "after 3 attempts (transient)")
}

func TestRecoveryOfAnIntentWithoutResult(t *testing.T) {
	allowAll := withRules(policy.ApprovalRule{Tool: "*", Decision: policy.DecisionAllow})

	t.Run("idempotent tool re-runs with the same key", func(t *testing.T) {
		p := &seqProvider{msgs: []models.Message{toolTurn(call("echo", `{}`), call("idem_w", `{}`)), answerTurn("ok")}}
		e := newEnvCrashingOn(t, p, allowAll, "idem_w")
		res := e.invoke("go")
		require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
		require.Equal(t, 1, e.tools["echo"].n(), "the recorded result of echo was reused")
		keys := e.tools["idem_w"].keys
		require.Len(t, keys, 2)
		require.Equal(t, keys[0], keys[1], "re-run with the same idempotency key")
		require.Equal(t, int32(2), p.calls.Load(), "recorded model responses were reused")
	})

	for _, tc := range []struct {
		name string
		d    engine.Decision
		runs int
	}{
		{"non-idempotent tool asks: approve", engine.Decision{Kind: engine.Approve, By: "carol", Reason: "checked"}, 2},
		{"non-idempotent tool asks: reject", engine.Decision{Kind: engine.Reject, By: "carol"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeScript()
			e := newEnvCrashingOn(t, p, allowAll, "write_x")
			res := e.invoke("go")
			ti := interruptOf(t, res)
			require.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason)
			require.Equal(t, "write_x", ti.Tool)
			require.JSONEq(t, `{"v":"a"}`, string(ti.Args))
			require.Equal(t, 1, e.tools["write_x"].n())
			require.Equal(t, ti.Key, e.tools["write_x"].keys[0])

			res = e.resume(res, tc.d)
			require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
			require.Equal(t, tc.runs, e.tools["write_x"].n())
			retry, err := e.mem.Get(context.Background(), ti.Key+"#retry1")
			require.NoError(t, err)
			require.Equal(t, tc.d.Kind, retry.Decision)
			require.Equal(t, "operator:carol", retry.DecidedBy)
			require.True(t, retry.Done())
			if tc.d.Kind == engine.Reject {
				require.Contains(t, e.toolMessages(res)[0].Content, "was not run again")
			}
		})
	}
}

// newEnvCrashingOn is newEnv with a log that fails the first Done of the
// named tool's call, as if the process died after the tool ran and before
// its result was recorded. The error is transient, so the node's retry
// policy re-executes the task in place, as recovery would.
func newEnvCrashingOn(t *testing.T, p models.Provider, rules envOption, tool string) *env {
	return newEnv(t, withProvider(p), rules, withLog(func(l agent.CallLog) agent.CallLog {
		return &crashOnTool{CallLog: l, tool: tool}
	}))
}

type crashOnTool struct {
	agent.CallLog
	tool    string
	crashed bool
}

func (c *crashOnTool) Done(ctx context.Context, key string, result json.RawMessage, errText string) error {
	if !c.crashed && !strings.HasPrefix(key, "model:") {
		if rec, err := c.CallLog.Get(ctx, key); err == nil && rec.Tool == c.tool {
			c.crashed = true
			return engine.MarkTransient(errors.New("simulated crash before the result was recorded"))
		}
	}
	return c.CallLog.Done(ctx, key, result, errText)
}

// A tool that returns its result while the run is being stopped (cancel,
// shutdown, a node's timeout) has run: its result is recorded, not left as
// an open intent that a recovery would have to ask a person about.
func TestResultRecordedWhenStoppedDuringTheCall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := 0
	stopping := agent.ToolFunc(func(_ context.Context, _ json.RawMessage, _ string) (json.RawMessage, error) {
		ran++
		cancel() // the run is stopped while the tool finishes its work
		return json.RawMessage(`{"booked":true}`), nil
	})
	e := newEnv(t, withProvider(writeScript()), withRules(policy.ApprovalRule{Tool: "*", Decision: policy.DecisionAllow}),
		withImpl("write_x", stopping))
	res, _ := e.graph.Invoke(ctx, e.config(), engine.Push(e.messages, models.Message{Role: models.RoleUser, Content: "go"}))
	require.NotNil(t, res)
	require.Equal(t, 1, ran)
	recs := e.mem.Records(res.Run.ID)
	require.Len(t, recs, 1)
	require.True(t, recs[0].Done(), "the call ran; its result must be kept: %+v", recs[0])
	require.JSONEq(t, `{"booked":true}`, string(recs[0].Result))
}

// Every refusal is evented as tool.unauthorized, not only those of the
// active set: a bundle rule that denies the tool, and a tool the active set
// allows that has no implementation here. Both were told to the model and
// recorded, but no event said so.
func TestEveryRefusalIsEvented(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []envOption
		layer string
		reply string
	}{
		{"denied by a rule", []envOption{withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionDeny})},
			"rule", `refused: the call to "write_x" was not run`},
		{"no implementation", []envOption{withRules(policy.ApprovalRule{Tool: "*", Decision: policy.DecisionAllow}), withImpl("write_x", nil)},
			"implementation", `refused: tool "write_x" is not available`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, append([]envOption{withProvider(writeScript())}, tc.opts...)...)
			res := e.invoke("please write")
			require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
			require.Equal(t, tc.reply, e.toolMessages(res)[0].Content)
			require.Zero(t, e.tools["write_x"].n())
			denied := e.events.of(engine.EventToolDenied)
			require.Len(t, denied, 1)
			require.Equal(t, "write_x", denied[0]["tool"])
			require.Equal(t, tc.layer, denied[0]["layer"])
			require.NotEmpty(t, denied[0]["reason"])
		})
	}
}

// An operator's edit of a write tool's arguments that the tool's schema
// refuses does not run the tool, and says so in a tool.unauthorized event
// (the resume itself was accepted).
func TestRefusedEditIsEvented(t *testing.T) {
	e := newEnv(t, withProvider(writeScript()), withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionAsk}))
	res := e.invoke("please write")
	interruptOf(t, res)
	res = e.resume(res, engine.Decision{Kind: engine.Edit, By: "alice", Value: json.RawMessage(`{"v":5}`)})
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Zero(t, e.tools["write_x"].n())
	require.Contains(t, e.toolMessages(res)[0].Content, `refused: the arguments for "write_x" are invalid`)
	denied := e.events.of(engine.EventToolDenied)
	require.Len(t, denied, 1)
	require.Equal(t, policy.LayerSchema, denied[0]["layer"])
	require.Contains(t, denied[0]["reason"], "operator's edit")
}

// The same for an edit given to re-run a call that may not have completed.
func TestRefusedEditOfAnUncertainCallIsEvented(t *testing.T) {
	e := newEnvCrashingOn(t, writeScript(), withRules(policy.ApprovalRule{Tool: "*", Decision: policy.DecisionAllow}), "write_x")
	res := e.invoke("go")
	require.Equal(t, agent.ReasonUncertainSideEffect, interruptOf(t, res).Reason)
	res = e.resume(res, engine.Decision{Kind: engine.Edit, By: "carol", Value: json.RawMessage(`{"v":5}`)})
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, 1, e.tools["write_x"].n(), "not run again")
	require.Contains(t, e.toolMessages(res)[0].Content, "was not run again")
	denied := e.events.of(engine.EventToolDenied)
	require.Len(t, denied, 1)
	require.Equal(t, policy.LayerSchema, denied[0]["layer"])
	require.Contains(t, denied[0]["reason"], "operator's edit")
}

// checkingLog runs check before each intent it records.
type checkingLog struct {
	agent.CallLog
	check func(rec agent.CallRecord)
}

func (c *checkingLog) Intent(ctx context.Context, rec agent.CallRecord) (*agent.CallRecord, error) {
	c.check(rec)
	return c.CallLog.Intent(ctx, rec)
}

// In exit durability nothing of a run is committed before it ends or
// pauses, but a tool call's intent is. It is recorded only once the run's
// record and the checkpoint the loop runs from are: a crash after it leaves
// a run that recovery resumes and a call it asks about. A run whose model
// calls no tool commits once, at its end, as before.
func TestToolIntentFollowsItsRunInExitDurability(t *testing.T) {
	ctx := context.Background()
	var e *env
	var seen []string
	e = newEnv(t, withLog(func(l agent.CallLog) agent.CallLog {
		return &checkingLog{CallLog: l, check: func(rec agent.CallRecord) {
			if strings.HasPrefix(rec.Key, "model:") {
				return
			}
			run, err := e.store.Run(ctx, rec.Run)
			if err != nil {
				seen = append(seen, rec.Tool+": "+err.Error())
				return
			}
			seen = append(seen, rec.Tool+": run on record, "+string(run.Status))
		}}
	}))
	cfg := e.config()
	cfg.Durability = engine.DurabilityExit
	res, err := e.graph.Invoke(ctx, cfg, engine.Push(e.messages, models.Message{Role: models.RoleUser, Content: "echo please"}))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, []string{"echo: run on record, running"}, seen)
	hist, err := e.store.History(ctx, e.thread, "", "", 0)
	require.NoError(t, err)
	require.Len(t, hist, 2, "the loop's step, before the call, and the end")

	e.thread = "th-2"
	cfg = e.config()
	cfg.Durability = engine.DurabilityExit
	res, err = e.graph.Invoke(ctx, cfg, engine.Push(e.messages, models.Message{Role: models.RoleUser, Content: "hello"}))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	hist, err = e.store.History(ctx, e.thread, "", "", 0)
	require.NoError(t, err)
	require.Len(t, hist, 1, "no tool called: only the end is committed")
}

// lostLog is a call log that may have lost the records of calls made from
// checkpoints up to through (agent.LostCalls), as a salvaged store's may.
type lostLog struct {
	agent.CallLog
	through string
}

func (l *lostLog) CallsLostThrough(context.Context, string) (string, error) { return l.through, nil }

// A call with no record, made from a checkpoint within the range whose
// records may be lost, of a tool not declared idempotent, is asked about
// (uncertain_side_effect) before it runs; the "#ask1" and "#retry1"
// markers of that question are not themselves taken for lost calls. A
// tool declared idempotent, a call from a newer checkpoint, and a log
// that lost nothing run the call as before.
func TestCallWhoseRecordMayBeLost(t *testing.T) {
	allowAll := withRules(policy.ApprovalRule{Tool: "*", Decision: policy.DecisionAllow})
	for _, tc := range []struct {
		name, tool, through string
		asks                bool
	}{
		{"not idempotent, within the range", "write_x", "~", true},
		{"idempotent, within the range", "idem_w", "~", false},
		{"not idempotent, from a newer checkpoint", "write_x", "0", false},
		{"not idempotent, in any step", "write_x", agent.CallsLostInAnyStep, true},
		{"not idempotent, nothing lost", "write_x", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &seqProvider{msgs: []models.Message{toolTurn(call(tc.tool, `{}`)), answerTurn("ok")}}
			e := newEnv(t, withProvider(p), allowAll, withLog(func(l agent.CallLog) agent.CallLog {
				return &lostLog{CallLog: l, through: tc.through}
			}))
			res := e.invoke("go")
			if !tc.asks {
				require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
				require.Equal(t, 1, e.tools[tc.tool].n())
				return
			}
			ti := interruptOf(t, res)
			require.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason)
			require.Contains(t, ti.Detail, "may have been lost when the store was salvaged")
			require.Zero(t, e.tools[tc.tool].n(), "the call ran before a person decided")

			res = e.resume(res, engine.Decision{Kind: engine.Approve, By: "carol"})
			require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
			require.Equal(t, []string{ti.Key}, e.tools[tc.tool].keys, "the approved call runs once, with its key")
			var keys []string
			for _, r := range e.mem.Records(res.Run.ID + ":") {
				keys = append(keys, r.Key)
			}
			require.Equal(t, []string{ti.Key, ti.Key + "#ask1", ti.Key + "#retry1"}, keys)
		})
	}
}

// TestFailedCallIsToldNeutrally: a tool that fails leaves its error in the
// call record and the tool.result event, for the operator, but the model
// is told only that the call did not succeed: the error may name a path
// or a host, and the model's answer goes to the user. The turn is marked
// (LoopConfig.Failed), also when the node runs again after an approval and
// the failure comes back from the record.
func TestFailedCallIsToldNeutrally(t *testing.T) {
	const secret = "open /srv/outpost/followups.jsonl: is a directory"
	broken := 0
	p := &seqProvider{msgs: []models.Message{
		toolTurn(call("echo", `{"text":"hi"}`)),
		toolTurn(call("write_x", `{"v":"a"}`)),
		answerTurn("done"),
	}}
	e := newEnv(t, withProvider(p), withFailed(), withRules(policy.ApprovalRule{Tool: "write_x", Decision: policy.DecisionAsk}),
		withImpl("echo", agent.ToolFunc(func(context.Context, json.RawMessage, string) (json.RawMessage, error) {
			broken++
			return nil, errors.New(secret)
		})))
	res := e.resume(e.invoke("please echo, then write"), engine.Decision{Kind: engine.Approve})
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, 1, broken, "the failed call is not made again when the node runs again")

	msgs := e.toolMessages(res)
	require.Len(t, msgs, 2)
	require.Equal(t, `failed: the call to "echo" did not succeed; the error was recorded for the operator`, msgs[0].Content)
	require.Equal(t, []string{"tool_failed"}, e.failed.Get(res.State))

	recs := e.mem.Records(res.Run.ID)
	require.Equal(t, "tool error: "+secret, recs[0].Error)
	results := e.events.of(engine.EventToolResult)
	require.Equal(t, "tool error: "+secret, results[0]["error"])
}
