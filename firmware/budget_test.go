package firmware_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// budgetModel is the model the budget agents' lane allows.
const budgetModel = "budget-test"

// fixedModel answers every call with the same text and token counts. Its
// calls can be made to wait for one another, so that calls of one
// superstep are in flight together.
type fixedModel struct {
	prompt, completion int
	answer             string
	toolCall           string // when set, every answer calls this tool
	calls              atomic.Int32
	// together, when positive, holds each call until that many are in
	// flight (or a second has passed).
	together int
	mu       sync.Mutex
	waiting  int
	release  chan struct{}
	// fail, when set, is returned by call n (1-based) instead of answering;
	// stream is what the call streams first.
	fail func(n int) (stream string, err error)
	// caps are the answer caps the calls were sent with, in order.
	caps []int
}

func (p *fixedModel) Name() string { return "fixed" }

func (p *fixedModel) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	n := int(p.calls.Add(1))
	if p.together > 0 {
		p.mu.Lock()
		if p.release == nil {
			p.release = make(chan struct{})
		}
		p.waiting++
		if p.waiting == p.together {
			close(p.release)
		}
		ch := p.release
		p.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Second):
		}
	}
	p.mu.Lock()
	p.caps = append(p.caps, req.Options.MaxOutputTokens)
	p.mu.Unlock()
	if p.fail != nil {
		if text, err := p.fail(n); err != nil {
			if text != "" && stream != nil {
				_ = stream(models.Chunk{Content: text})
			}
			return nil, err
		}
	}
	msg := models.Message{Role: models.RoleAssistant, Content: p.answer}
	if p.toolCall != "" {
		msg.ToolCalls = []models.ToolCall{{Name: p.toolCall, Arguments: json.RawMessage(`{"query":"dose"}`)}}
	}
	if stream != nil {
		_ = stream(models.Chunk{Content: msg.Content})
	}
	return &models.Response{Provider: "fixed", Model: req.Model, Message: msg, PromptTokens: p.prompt,
		CompletionTokens: p.completion, DoneReason: "stop", RequestHash: models.HashRequest(req)}, nil
}

// budgetBundle is the patterns bundle with the given agents added (name ->
// graph JSON), each in a lane that allows budgetModel.
func budgetBundle(t *testing.T, rt *firmware.Runtime, agents map[string]string) *firmware.Bundle {
	t.Helper()
	dir := variant(t, 2, func(dir string) {
		var lanes []map[string]any
		for name, graph := range agents {
			writeFile(t, dir, "agents/"+name+".json", graph)
			lanes = append(lanes, map[string]any{"agent": name, "models": []string{budgetModel}})
		}
		raw, _ := json.Marshal(map[string]any{"lanes": lanes})
		writeFile(t, dir, "lanes.json", string(raw))
		editManifest(t, dir, func(m map[string]any) {
			as := m["agents"].(map[string]any)
			for name := range agents {
				as[name] = "agents/" + name + ".json"
			}
		})
	})
	b, err := firmware.LoadWithRuntime(dir, testKeyring(t), rt)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runTurn runs one turn of agent on thread and returns the run as it ended.
// budgetManager is a run manager over a memory store, for a bundle of
// agents built by budgetBundle with rt; it is closed when the test ends.
func budgetManager(t *testing.T, rt *firmware.Runtime, agents map[string]string) *engine.Manager {
	t.Helper()
	m := engine.NewManager(engine.NewMemoryStore(), firmware.BundleResolver(budgetBundle(t, rt, agents)), engine.ManagerOptions{})
	t.Cleanup(m.Close)
	return m
}

func runTurn(t *testing.T, m *engine.Manager, agent, thread, input string) *engine.Run {
	t.Helper()
	raw, _ := json.Marshal(input)
	r, err := m.Invoke(context.Background(), engine.RunRequest{Thread: thread, Agent: agent, Input: raw})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// eventSink keeps the events a manager publishes.
type eventSink struct {
	mu  sync.Mutex
	evs []engine.Event
}

func (s *eventSink) Publish(evs ...engine.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, evs...)
}

func (s *eventSink) count(typ string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func requireBudgetExceeded(t *testing.T, r *engine.Run, which string) {
	t.Helper()
	if r.Status != engine.StatusBudgetExceeded || !strings.Contains(r.Error, which+" budget exceeded") {
		t.Fatalf("run ended %s (%s), want budget_exceeded (%s)", r.Status, r.Error, which)
	}
}

// parallelGraph runs two model nodes in one superstep.
const parallelGraph = `{
  "name": "twin",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "a", "type": "string", "reducer": "replace"},
    {"name": "b", "type": "string", "reducer": "replace"},
    {"name": "tokens", "type": "int", "reducer": "sum"}
  ],
  "input": "input",
  "output": "a",
  "nodes": [
    {"name": "left", "kind": "model", "config": {"input": "input", "out": "a", "tokens": "tokens"}},
    {"name": "right", "kind": "model", "config": {"input": "input", "out": "b", "tokens": "tokens"}}
  ],
  "edges": [
    {"from": "START", "to": "left"}, {"from": "START", "to": "right"},
    {"from": "left", "to": "END"}, {"from": "right", "to": "END"}
  ]
}`

// Model tasks of one superstep each checked the token budget against the
// count the step started with, so together they spent past it and the run
// completed.
func TestTokenBudgetHoldsAcrossParallelModelTasks(t *testing.T) {
	p := &fixedModel{prompt: 40, completion: 20, answer: "ok", together: 2}
	rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: 100}}
	b := budgetBundle(t, rt, map[string]string{"twin": parallelGraph})
	events := &eventSink{}
	m := engine.NewManager(engine.NewMemoryStore(), firmware.BundleResolver(b), engine.ManagerOptions{Events: events})
	defer m.Close()
	r := runTurn(t, m, "twin", "t", "hello")
	requireBudgetExceeded(t, r, policy.BudgetTokens)
	if n := events.count(engine.EventBudgetExceeded); n != 1 {
		t.Fatalf("%d budget.exceeded events, want 1", n)
	}
}

// chainGraph runs two model nodes one after the other; the second one
// sends the first one's answer with the input. tokens, when not empty, is
// the "tokens" config of both.
func chainGraph(name string, retries int) string {
	return `{
  "name": "` + name + `",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "a", "type": "string", "reducer": "replace"},
    {"name": "b", "type": "string", "reducer": "replace"}
  ],
  "input": "input",
  "output": "b",
  "nodes": [
    {"name": "first", "kind": "model", "config": {"input": "input", "out": "a"}, "retries": ` + strconv.Itoa(retries) + `},
    {"name": "second", "kind": "model", "config": {"input": "input", "out": "b"}, "retries": ` + strconv.Itoa(retries) + `}
  ],
  "edges": [{"from": "START", "to": "first"}, {"from": "first", "to": "second"}, {"from": "second", "to": "END"}]
}`
}

// A graph whose model nodes declare no tokens channel got a fresh count at
// every node: the token budget bounded each call, not the run.
func TestTokenBudgetBoundsTheRunWithoutATokensChannel(t *testing.T) {
	p := &fixedModel{prompt: 40, completion: 20, answer: "ok"}
	rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: 100}}
	m := budgetManager(t, rt, map[string]string{"chain": chainGraph("chain", 0)})
	requireBudgetExceeded(t, runTurn(t, m, "chain", "t", "hello"), policy.BudgetTokens)
}

// The token budget is per run. A tokens channel that a thread keeps from
// turn to turn (the reference agents do) counted the thread's earlier
// runs against each new one, so a long conversation was refused.
func TestTokenBudgetIsPerRunNotPerThread(t *testing.T) {
	p := &fixedModel{prompt: 40, completion: 20, answer: "ok"}
	rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: 100}}
	one := `{
  "name": "one",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "a", "type": "string", "reducer": "replace"},
    {"name": "tokens", "type": "int", "reducer": "sum"}
  ],
  "input": "input",
  "output": "a",
  "nodes": [{"name": "left", "kind": "model", "config": {"input": "input", "out": "a", "tokens": "tokens"}}],
  "edges": [{"from": "START", "to": "left"}, {"from": "left", "to": "END"}]
}`
	m := budgetManager(t, rt, map[string]string{"one": one})
	for turn := range 3 {
		if r := runTurn(t, m, "one", "t", "hello"); r.Status != engine.StatusCompleted {
			t.Fatalf("turn %d ended %s (%s): each run spends 60 of its own 100 tokens", turn, r.Status, r.Error)
		}
	}
}

// A failed model call was not counted, however much the model had spent:
// retries of a call that fails mid-answer went on past the budget.
func TestFailedModelCallsCountAgainstTheTokenBudget(t *testing.T) {
	long := strings.Repeat("word ", 80) // 400 bytes streamed before each failure
	p := &fixedModel{prompt: 10, completion: 10, answer: "ok", fail: func(n int) (string, error) {
		if n <= 2 {
			return long, &models.Error{Kind: models.Stream, Provider: "fixed", Model: budgetModel, Err: models.ErrDropped}
		}
		return "", nil
	}}
	rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: 150}}
	m := budgetManager(t, rt, map[string]string{"chain": chainGraph("chain", 3)})
	requireBudgetExceeded(t, runTurn(t, m, "chain", "t", "hello"), policy.BudgetTokens)
}

// ollamaServer answers every /api/chat with the NDJSON lines given.
func ollamaServer(t *testing.T, lines ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// An answer cut at the token limit (done_reason "length") failed the run
// as if it had cost nothing, though Ollama reported what it spent.
func TestTruncatedModelCallCountsAgainstTheTokenBudget(t *testing.T) {
	srv := ollamaServer(t,
		`{"model":"budget-test","message":{"role":"assistant","content":"If you"},"done":false}`,
		`{"model":"budget-test","message":{"role":"assistant","content":""},"done_reason":"length","done":true,"prompt_eval_count":500,"eval_count":300}`)
	rt := &firmware.Runtime{Provider: ollama.New(srv.URL, nil), Model: budgetModel, Budget: policy.Budget{Tokens: 500}}
	m := budgetManager(t, rt, map[string]string{"chain": chainGraph("chain", 0)})
	requireBudgetExceeded(t, runTurn(t, m, "chain", "t", "hello"), policy.BudgetTokens)
}

// Ollama leaves prompt_eval_count out for a prompt served from its cache;
// such a call counted only its answer's tokens.
func TestMissingPromptCountIsEstimated(t *testing.T) {
	srv := ollamaServer(t,
		`{"model":"budget-test","message":{"role":"assistant","content":"ok"},"done":false}`,
		`{"model":"budget-test","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"eval_count":10}`)
	rt := &firmware.Runtime{Provider: ollama.New(srv.URL, nil), Model: budgetModel, Budget: policy.Budget{Tokens: 1500}}
	m := budgetManager(t, rt, map[string]string{"chain": chainGraph("chain", 0)})
	// About 1000 tokens of prompt by any count: two calls do not fit in 1500.
	requireBudgetExceeded(t, runTurn(t, m, "chain", "t", strings.Repeat("dose ", 800)), policy.BudgetTokens)
}

// reviewedChain pauses for a person between its two model calls.
const reviewedChain = `{
  "name": "paused",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "flags", "type": "strings", "reducer": "replace"},
    {"name": "a", "type": "string", "reducer": "replace"},
    {"name": "b", "type": "string", "reducer": "replace"}
  ],
  "input": "input",
  "output": "b",
  "flags": "flags",
  "nodes": [
    {"name": "first", "kind": "model", "config": {"input": "input", "out": "a"}},
    {"name": "check", "kind": "review", "config": {"draft": "a", "always": true}},
    {"name": "second", "kind": "model", "config": {"input": "input", "out": "b"}}
  ],
  "edges": [{"from": "START", "to": "first"}, {"from": "first", "to": "check"},
    {"from": "check", "to": "second"}, {"from": "second", "to": "END"}]
}`

// A run resumed after a pause, in the same process or after a restart,
// goes on from the tokens it spent before, which the store's call log
// holds: neither gives it its token budget again.
func TestTokenBudgetHoldsAcrossResumeAndRestart(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "resume", true: "restart"}[restart], func(t *testing.T) {
			ctx := context.Background()
			db, err := store.OpenDir(t.TempDir(), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			open := func() *engine.Manager {
				p := &fixedModel{prompt: 40, completion: 20, answer: "ok [kb-01]"}
				rt := &firmware.Runtime{Provider: p, Model: budgetModel, Log: wiring.CallLog(db, db), Blobs: db, Runs: db,
					Budget: policy.Budget{Tokens: 100}}
				b := budgetBundle(t, rt, map[string]string{"paused": reviewedChain})
				return engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
			}
			m := open()
			r := runTurn(t, m, "paused", "t", "hello")
			if r.Status != engine.StatusInterrupted {
				t.Fatalf("run ended %s (%s), want interrupted at the review", r.Status, r.Error)
			}
			if restart {
				m.Close()
				m = open()
				if _, err := m.Recover(ctx); err != nil {
					t.Fatal(err)
				}
			}
			defer m.Close()
			if _, err := m.Resume(ctx, r.ID, map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve}}); err != nil {
				t.Fatal(err)
			}
			done, err := m.Wait(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			requireBudgetExceeded(t, done, policy.BudgetTokens)
		})
	}
}

// A tool_loop node's max_iterations replaced the appliance's iteration
// budget, so a bundle could raise it: it may only narrow it.
func TestToolLoopIterationsNeverExceedTheAppliancesBudget(t *testing.T) {
	loop := `{
  "name": "looping",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "messages", "type": "messages", "reducer": "append"},
    {"name": "answer", "type": "string", "reducer": "replace"}
  ],
  "input": "input",
  "history": "messages",
  "output": "answer",
  "nodes": [{"name": "loop", "kind": "tool_loop", "config": {"messages": "messages", "answer": "answer", "max_iterations": %d}}],
  "edges": [{"from": "START", "to": "loop"}, {"from": "loop", "to": "END"}]
}`
	for _, tc := range []struct {
		appliance, node, want int
	}{
		{2, 10, 2}, // the node may not raise the appliance's
		{4, 3, 3},  // it may narrow it
		{0, 7, 7},  // with none from the appliance, the node's holds
	} {
		t.Run(fmt.Sprintf("appliance %d node %d", tc.appliance, tc.node), func(t *testing.T) {
			p := &fixedModel{prompt: 1, completion: 1, answer: "again", toolCall: "lookup_schedule"}
			rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{ToolIterations: tc.appliance}}
			m := budgetManager(t, rt, map[string]string{"looping": fmt.Sprintf(loop, tc.node)})
			requireBudgetExceeded(t, runTurn(t, m, "looping", "t", "hello"), policy.BudgetToolIterations)
			if got := int(p.calls.Load()) - 1; got != tc.want {
				t.Fatalf("%d tool iterations ran, want %d", got, tc.want)
			}
		})
	}
}

// An agent narrows the appliance's token and wall-time budgets with
// max_tokens and max_run_time; it cannot widen them.
func TestAgentNarrowsTheAppliancesBudgets(t *testing.T) {
	with := func(fields string) string {
		return strings.Replace(parallelGraph, `"output": "a",`, `"output": "a", `+fields, 1)
	}
	for _, tc := range []struct {
		name, fields string
		appliance    policy.Budget
		which        string // "" for a run that completes
	}{
		{"tokens narrowed", `"max_tokens": 100,`, policy.Budget{Tokens: 1000}, policy.BudgetTokens},
		{"tokens not widened", `"max_tokens": 1000,`, policy.Budget{Tokens: 100}, policy.BudgetTokens},
		{"tokens within both", `"max_tokens": 1000,`, policy.Budget{Tokens: 500}, ""},
		{"run time narrowed", `"max_run_time": "1ns",`, policy.Budget{WallTime: time.Hour}, "wall-time"},
		{"run time not widened", `"max_run_time": "1h",`, policy.Budget{WallTime: time.Nanosecond}, "wall-time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fixedModel{prompt: 40, completion: 20, answer: "ok"}
			rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: tc.appliance}
			m := budgetManager(t, rt, map[string]string{"twin": with(tc.fields)})
			r := runTurn(t, m, "twin", "t", "hello")
			if tc.which == "" {
				if r.Status != engine.StatusCompleted {
					t.Fatalf("run ended %s (%s), want completed", r.Status, r.Error)
				}
				return
			}
			requireBudgetExceeded(t, r, tc.which)
		})
	}
}

// A subgraph's model calls count with its parent's: the run, not each
// graph, has the token budget, and a subgraph's overrun ends the whole
// run budget_exceeded.
func TestTokenBudgetCountsSubgraphModelCalls(t *testing.T) {
	inner := `{
  "name": "inner",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "b", "type": "string", "reducer": "replace"}
  ],
  "input": "input",
  "output": "b",
  "nodes": [{"name": "deep", "kind": "model", "config": {"input": "input", "out": "b"}}],
  "edges": [{"from": "START", "to": "deep"}, {"from": "deep", "to": "END"}]
}`
	outer := `{
  "name": "outer",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "a", "type": "string", "reducer": "replace"},
    {"name": "b", "type": "string", "reducer": "replace"}
  ],
  "input": "input",
  "output": "b",
  "nodes": [
    {"name": "first", "kind": "model", "config": {"input": "input", "out": "a", "lane": "inner"}},
    {"name": "team", "kind": "subgraph", "config": {"graph": "agents/inner.json"}}
  ],
  "edges": [{"from": "START", "to": "first"}, {"from": "first", "to": "team"}, {"from": "team", "to": "END"}]
}`
	p := &fixedModel{prompt: 40, completion: 20, answer: "ok"}
	rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: 100}}
	b := budgetBundle(t, rt, map[string]string{"inner": inner, "outer": outer})
	events := &eventSink{}
	m := engine.NewManager(engine.NewMemoryStore(), firmware.BundleResolver(b), engine.ManagerOptions{Events: events})
	defer m.Close()
	requireBudgetExceeded(t, runTurn(t, m, "outer", "t", "hello"), policy.BudgetTokens)
	if n := events.count(engine.EventBudgetExceeded); n != 1 {
		t.Fatalf("%d budget.exceeded events, want 1", n)
	}
	if n := p.calls.Load(); n != 2 {
		t.Fatalf("%d model calls, want 2", n)
	}
}

// A model node's num_predict is its answers' cap; the run's token budget
// narrows it, never widens it, and a negative one is refused at load.
func TestModelNodeNumPredictCapsItsAnswers(t *testing.T) {
	graph := strings.Replace(chainGraph("chain", 0), `"config": {"input": "input", "out": "a"}`,
		`"config": {"input": "input", "out": "a", "num_predict": %d}`, 1)
	for _, tc := range []struct {
		name         string
		numPredict   int
		budget, want int // want: the first call's cap
	}{
		{"no budget", 30, 0, 30},
		{"within the budget", 30, 1000, 30},
		{"the budget is smaller", 30, 20, 20 - 6}, // 6: the estimate of the prompt, one message of "hello"
		{"none: the budget's", 0, 1000, 1000 - 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fixedModel{prompt: 1, completion: 1, answer: "ok"}
			rt := &firmware.Runtime{Provider: p, Model: budgetModel, Budget: policy.Budget{Tokens: tc.budget}}
			m := budgetManager(t, rt, map[string]string{"chain": fmt.Sprintf(graph, tc.numPredict)})
			runTurn(t, m, "chain", "t", "hello")
			if len(p.caps) == 0 || p.caps[0] != tc.want {
				t.Fatalf("answer caps sent %v, want %d first", p.caps, tc.want)
			}
		})
	}

	dir := variant(t, 2, func(dir string) {
		writeFile(t, dir, "agents/chain.json", fmt.Sprintf(graph, -1))
		editManifest(t, dir, func(m map[string]any) { m["agents"].(map[string]any)["chain"] = "agents/chain.json" })
	})
	_, err := firmware.Load(dir, testKeyring(t))
	if err == nil || !strings.Contains(err.Error(), "num_predict must not be negative") {
		t.Fatalf("a negative num_predict loaded: %v", err)
	}
}
