package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/store"
)

// testAgent is "review-test": draft streams its words as model tokens;
// an input holding "review" pauses at review for a person; "deny" records
// a refused tool call; "block" holds the run until the test releases it.
// "verbose" streams 6,000 more tokens; "overspend" ends the run over
// budget at closing. The review refuses an edit that
// says "unsafe" (the API answers 422).
const testAgent = "review-test"

type env struct {
	t       *testing.T
	srv     *httptest.Server
	url     string
	token   string
	db      *store.DB
	bus     *engine.Bus
	mgr     *engine.Manager
	console *console.Server
	release chan struct{}
	once    sync.Once

	stop      func()
	closeOnce sync.Once
}

func (e *env) unblock() { e.once.Do(func() { close(e.release) }) }

// twoQuestionsAgent is a second agent of the test env's, not listed by
// the console, whose runs wait on two questions at once.
const twoQuestionsAgent = "two-questions"

// heldAgent names an agent whose pinned bundle the env's resolver reports
// unavailable (engine.ErrBundleUnavailable): a run of it that a crash left
// running is held at the env's start (engine.Manager.Held).
const heldAgent = "held-for-its-bundle"

// twoQuestionsGraph asks for a review of a draft in two parallel branches,
// "left" and "right", so that its run waits on two interrupts at once; its
// output is each branch's answer: the draft, the edited text, or
// "withheld".
func twoQuestionsGraph() (*engine.Agent, error) {
	b := engine.NewGraph(twoQuestionsAgent)
	input := engine.Replace[string](b, "input")
	got := engine.Merge[string, string](b, "got")
	for _, name := range []string{"left", "right"} {
		b.AddNode(name, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			text := "the " + name + " draft (" + input.Get(s) + ")"
			d, err := engine.Interrupt(ctx, map[string]any{"draft": text, "reason": "uncited"})
			if err != nil {
				return nil, err
			}
			switch d.Kind {
			case engine.Edit:
				if err := json.Unmarshal(d.Value, &text); err != nil {
					return nil, err
				}
			case engine.Reject:
				text = "withheld"
			}
			return []engine.Write{got.Set(map[string]string{name: text})}, nil
		})
		b.AddEdge(engine.Start, name)
	}
	g, err := b.Compile()
	if err != nil {
		return nil, err
	}
	return testBundleAgent(twoQuestionsAgent, g, input, func(s engine.State) any { return got.Get(s) }), nil
}

// testBundleAgent is an agent of the test bundle on graph g, whose input is
// a JSON string written to input and whose output is what output reads.
func testBundleAgent(name string, g *engine.Graph, input engine.Chan[string], output func(engine.State) any) *engine.Agent {
	return &engine.Agent{Name: name, Graph: g,
		Bundle: engine.BundleRef{Name: "test-bundle", Version: 3, Digest: "sha256:test"},
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("input must be a JSON string: %w", err)
			}
			return []engine.Write{input.Set(s)}, nil
		},
		Output: func(s engine.State) json.RawMessage {
			b, _ := json.Marshal(output(s))
			return b
		}}
}

func testGraph(release <-chan struct{}) (*engine.Agent, error) {
	b := engine.NewGraph(testAgent)
	input := engine.Replace[string](b, "input")
	draft := engine.Replace[string](b, "draft")
	final := engine.Replace[string](b, "final")
	b.AddNode("draft", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		in := input.Get(s)
		if strings.Contains(in, "block") {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if strings.Contains(in, "deny") {
			engine.Announce(ctx, engine.EventToolDenied, map[string]any{"tool": "delete_records", "reason": "not in the active tool set"})
		}
		words := []string{"Take", "your", "dose", "now."}
		if strings.Contains(in, "verbose") {
			for i := 0; i < 6000; i++ {
				words = append(words, fmt.Sprintf("w%d", i))
			}
		}
		for _, w := range words {
			engine.Emit(ctx, engine.EventModelToken, map[string]any{"content": w + " "})
		}
		return []engine.Write{draft.Set(strings.Join(words, " ") + " (" + in + ")")}, nil
	})
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		text := draft.Get(s)
		if !strings.Contains(input.Get(s), "review") {
			return []engine.Write{final.Set(text)}, nil
		}
		// "toolcall" asks about a tool call instead, as a tool loop does:
		// for approval, or ("uncertain") as a call a crash may have cut
		// short.
		if in := input.Get(s); strings.Contains(in, "toolcall") {
			reason, detail := "approval_required", "a follow-up commits staff time"
			if strings.Contains(in, "uncertain") {
				reason, detail = "uncertain_side_effect", "the call may or may not have run before a crash"
			}
			d, err := engine.Interrupt(ctx, map[string]any{"reason": reason, "tool": "schedule_followup",
				"args": map[string]any{"when": "Friday", "note": in}, "key": "k1", "detail": detail})
			if err != nil {
				return nil, err
			}
			return []engine.Write{final.Set(d.Kind + " " + string(d.Value))}, nil
		}
		d, err := engine.Interrupt(ctx, map[string]any{"draft": text, "reason": "uncited"})
		if err != nil {
			return nil, err
		}
		switch d.Kind {
		case engine.Edit:
			var v string
			if err := json.Unmarshal(d.Value, &v); err != nil {
				return nil, err
			}
			text = v
		case engine.Reject:
			text = "withheld by a reviewer"
		}
		return []engine.Write{final.Set(text)}, nil
	}, engine.CheckDecision(func(d engine.Decision) error {
		if d.Kind == engine.Edit && strings.Contains(string(d.Value), "unsafe") {
			return errors.New("the edited answer says unsafe")
		}
		return nil
	}))
	b.AddNode("closing", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		if strings.Contains(input.Get(s), "overspend") {
			return nil, fmt.Errorf("closing: token budget spent: %w", engine.ErrBudgetExceeded)
		}
		return []engine.Write{final.Set(final.Get(s) + " Goodbye.")}, nil
	})
	b.AddEdge(engine.Start, "draft")
	b.AddEdge("draft", "review")
	b.AddEdge("review", "closing")
	b.AddEdge("closing", engine.End)
	g, err := b.Compile()
	if err != nil {
		return nil, err
	}
	return testBundleAgent(testAgent, g, input, func(s engine.State) any { return final.Get(s) }), nil
}

func newEnv(t *testing.T, mod func(*console.Config)) *env {
	t.Helper()
	return newEnvIn(t, t.TempDir(), mod)
}

// newEnvIn is newEnv on the data folder dir, which may hold a store
// already. env.close stops it before the test ends, so that the store can
// be changed behind its back and opened again.
func newEnvIn(t *testing.T, dir string, mod func(*console.Config)) *env {
	t.Helper()
	return newEnvWith(t, dir, engine.ManagerOptions{}, mod)
}

// newEnvWith is newEnvIn with the run manager's options (its workers and
// events are the env's).
func newEnvWith(t *testing.T, dir string, opts engine.ManagerOptions, mod func(*console.Config)) *env {
	t.Helper()
	return newEnvWithStore(t, dir, opts, nil, mod)
}

// newEnvWithStore is newEnvWith with the run manager's store wrapped by
// wrap (when not nil), for a test that steps in between its calls.
func newEnvWithStore(t *testing.T, dir string, opts engine.ManagerOptions, wrap func(engine.Store) engine.Store, mod func(*console.Config)) *env {
	t.Helper()
	return newEnvWithAgents(t, dir, opts, wrap, mod)
}

// newEnvWithAgents is newEnvWithStore whose manager and page also run the
// agents given (a bundle's, say), listed after the test agent.
func newEnvWithAgents(t *testing.T, dir string, opts engine.ManagerOptions, wrap func(engine.Store) engine.Store, mod func(*console.Config), more ...*engine.Agent) *env {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, db: db, bus: engine.NewBus(), release: make(chan struct{})}
	ag, err := testGraph(e.release)
	if err != nil {
		t.Fatal(err)
	}
	two, err := twoQuestionsGraph()
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		switch name {
		case testAgent:
			return ag, nil
		case twoQuestionsAgent:
			return two, nil
		}
		for _, a := range more {
			if a.Name == name {
				return a, nil
			}
		}
		if name == heldAgent {
			return nil, fmt.Errorf("%w: its folder is gone: install the same bundle file again", engine.ErrBundleUnavailable)
		}
		return nil, fmt.Errorf("%w %q", engine.ErrUnknownAgent, name)
	}
	metrics := console.NewMetrics()
	opts.Workers, opts.Events, opts.EventValues = 4, e.bus, console.EventValues()
	st := console.InstrumentStore(db, metrics)
	if wrap != nil {
		st = wrap(st)
	}
	e.mgr = engine.NewManager(st, resolve, opts)
	// As serve does, before it serves: runs a test stores straight into
	// the store later are not a crash's to recover.
	if _, err := e.mgr.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	tok, _, err := console.LoadOrCreateToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	e.token = tok
	listed := []string{testAgent}
	for _, a := range more {
		listed = append(listed, a.Name)
	}
	cfg := console.Config{Manager: e.mgr, Bus: e.bus, Resolve: resolve, Agents: listed, Token: tok,
		Metrics: metrics, StoreSize: db.Size, CountRuns: db.CountRuns, Records: db, Logf: t.Logf,
		Bundles: func() []console.BundleInfo {
			return []console.BundleInfo{{Name: "test-bundle", Version: 3, Digest: "sha256:test", Agents: []string{testAgent}, Active: true, Source: "embedded"}}
		}}
	if mod != nil {
		mod(&cfg)
	}
	e.console = console.New(cfg)
	e.srv = httptest.NewServer(e.console.Handler())
	e.url = e.srv.URL
	e.stop = func() {
		e.unblock()
		e.srv.CloseClientConnections()
		e.srv.Close()
		e.console.Close()
		e.mgr.Close()
		e.bus.Close()
		db.Close()
	}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() { e.closeOnce.Do(e.stop) }

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d is not JSON: %v\n%s", r.status, err, r.body)
	}
	return m
}

func (r resp) errCode(t *testing.T) string {
	t.Helper()
	m := r.json(t)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("response %d has no error object: %s", r.status, r.body)
	}
	if e["message"] == "" {
		t.Fatalf("error without message: %s", r.body)
	}
	return e["code"].(string)
}

// do sends a request with the env's token unless headers override it.
func (e *env) do(method, path string, body any, headers ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.token)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// startRun starts a turn and returns the run's JSON.
func (e *env) startRun(thread, input string, wait string) (int, map[string]any) {
	e.t.Helper()
	body := map[string]any{"agent": testAgent, "input": input}
	if wait != "" {
		body["wait"] = wait
	}
	r := e.do("POST", "/api/v1/threads/"+thread+"/runs", body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("start run: %d %s", r.status, r.body)
	}
	return r.status, r.json(e.t)
}

// waitStatus polls the run until it has status want.
func (e *env) waitStatus(id string, want string) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.do("GET", "/api/v1/runs/"+id, nil)
		m := r.json(e.t)
		if m["status"] == want {
			return m
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s is %v, want %s: %s", id, m["status"], want, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// snapshot is everything a refused request must leave as it was.
func (e *env) snapshot() string {
	e.t.Helper()
	runs, err := e.db.Runs(context.Background(), engine.RunFilter{})
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range runs {
		fmt.Fprintf(&b, "%s %s %s %d %d|", r.ID, r.Thread, r.Status, len(r.Decisions), len(r.Interrupts))
		hist, err := e.db.History(context.Background(), r.Thread, "", "", 0)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, c := range hist {
			b.WriteString(c.ID + ",")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// head returns the ID of thread's newest checkpoint.
func (e *env) head(thread string) string {
	e.t.Helper()
	cps, err := e.db.History(context.Background(), thread, "", "", 1)
	if err != nil || len(cps) == 0 {
		e.t.Fatalf("history of %s: %v %v", thread, cps, err)
	}
	return cps[0].ID
}

// startTwoQuestions starts a run of twoQuestionsAgent on thread, with
// input "hi", and returns it once it waits on its two questions.
func (e *env) startTwoQuestions(thread string) (id string, asked []map[string]any) {
	e.t.Helper()
	r := e.do("POST", "/api/v1/threads/"+thread+"/runs", map[string]any{"agent": twoQuestionsAgent, "input": "hi", "wait": "10s"})
	if r.status != http.StatusCreated {
		e.t.Fatalf("start run: %d %s", r.status, r.body)
	}
	run := r.json(e.t)
	list, _ := run["interrupts"].([]any)
	for _, a := range list {
		asked = append(asked, a.(map[string]any))
	}
	if run["status"] != "interrupted" || len(asked) != 2 {
		e.t.Fatalf("the run is %v, waiting on %d interrupts", run["status"], len(asked))
	}
	return run["id"].(string), asked
}

// toolsAgent is the reference bundle's agent that asks to schedule a
// follow-up, a call that needs a person's approval.
const toolsAgent = "medication-adherence-tools"

// newFailingToolsEnv is newEnv that also runs toolsAgent, whose follow-up
// file cannot be written (a folder stands at its path, as a full or
// read-only disk would refuse it too): an approved call fails, and the
// run raises the flag tool_failed.
func newFailingToolsEnv(t *testing.T) *env {
	t.Helper()
	blocked := filepath.Join(t.TempDir(), "followups.jsonl")
	if err := os.Mkdir(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	rt := &firmware.Runtime{Followups: &agent.FileFollowups{Path: blocked}}
	b, err := firmware.ReferenceWithRuntime(rt)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := b.Agent(toolsAgent)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, tools)
	// Its calls are recorded in the store, as serve records them.
	rt.Log, rt.Blobs, rt.Runs = wiring.CallLog(e.db, e.db), e.db, e.db
	return e
}

// failedToolRun runs a turn of toolsAgent on thread through the API, and
// approves its call, which fails; it returns the run's ID once it ends.
func (e *env) failedToolRun(thread string) string {
	e.t.Helper()
	r := e.do("POST", "/api/v1/threads/"+thread+"/runs", map[string]any{"agent": toolsAgent,
		"input": "please schedule a follow-up call about my metformin", "wait": "20s"})
	run := r.json(e.t)
	if r.status != http.StatusCreated || run["status"] != "interrupted" {
		e.t.Fatalf("start run: %d %s", r.status, r.body)
	}
	id := run["id"].(string)
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve", "wait": "20s"}); r.status != http.StatusOK {
		e.t.Fatalf("approve: %d %s", r.status, r.body)
	}
	e.waitStatus(id, "completed")
	return id
}

// twoGuardsAgent sets its flags twice, in two steps, as a run's guardrails
// before and after its draft do: "acute" first, then "acute" and
// "uncited".
const twoGuardsAgent = "two-guards"

func twoGuardsGraph() *engine.Agent {
	b := engine.NewGraph(twoGuardsAgent)
	input := engine.Replace[string](b, "input")
	flags := engine.Replace[[]string](b, "flags")
	draft := engine.Replace[string](b, "draft")
	b.AddNode("guard_pre", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set([]string{"acute"})}, nil
	})
	b.AddNode("draft", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{draft.Set("call your doctor")}, nil
	})
	b.AddNode("guard_post", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set(append(flags.Get(s), "uncited"))}, nil
	})
	g := compileChain(b, "guard_pre", "draft", "guard_post")
	return testBundleAgent(twoGuardsAgent, g, input, func(s engine.State) any { return draft.Get(s) })
}

// manyFlagsAgent's guardrails set many flags: guard_pre more than a
// checkpoint keeps inline (engine.BlobThreshold), guard_post more than a
// node.completed event carries (engine.EventValuesLimit).
const manyFlagsAgent = "many-flags"

// manyFlags returns n flags of about 20 bytes each.
func manyFlags(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("drug_interaction_%03d", i)
	}
	return out
}

func manyFlagsGraph() *engine.Agent {
	b := engine.NewGraph(manyFlagsAgent)
	input := engine.Replace[string](b, "input")
	flags := engine.Replace[[]string](b, "flags")
	b.AddNode("guard_pre", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set(manyFlags(40))}, nil
	})
	b.AddNode("guard_post", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set(manyFlags(engine.EventValuesLimit / 20))}, nil
	})
	g := compileChain(b, "guard_pre", "guard_post")
	return testBundleAgent(manyFlagsAgent, g, input, func(s engine.State) any { return len(flags.Get(s)) })
}

// compileChain compiles b with its nodes run one after the other, in the
// order given.
func compileChain(b *engine.Builder, nodes ...string) *engine.Graph {
	from := engine.Start
	for _, n := range nodes {
		b.AddEdge(from, n)
		from = n
	}
	b.AddEdge(from, engine.End)
	g, err := b.Compile()
	if err != nil {
		panic(err)
	}
	return g
}

// delegatingAgent hands its research to a subgraph whose node calls a
// tool, recorded in log as a tool loop records its calls, between an
// intake step and a closing step of its own.
const delegatingAgent = "delegating"

func delegatingGraph(log agent.CallLog) *engine.Agent {
	sb := engine.NewGraph("research")
	subNotes := engine.Replace[string](sb, "notes")
	sb.AddNode("lookup", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		info, _ := engine.InfoFrom(ctx)
		key := agent.ToolKey(info, 0)
		args := json.RawMessage(`{"q":"metformin"}`)
		if _, err := log.Intent(ctx, agent.CallRecord{Key: key, Run: info.Run, Node: info.Node, Tool: "search_kb",
			ArgsHash: agent.HashArgs(args), Args: args}); err != nil {
			return nil, err
		}
		if err := log.Done(ctx, key, json.RawMessage(`"take it with food"`), ""); err != nil {
			return nil, err
		}
		return []engine.Write{subNotes.Set("take it with food")}, nil
	})
	sub := compileChain(sb, "lookup")
	b := engine.NewGraph(delegatingAgent)
	input := engine.Replace[string](b, "input")
	notes := engine.Replace[string](b, "notes")
	answer := engine.Replace[string](b, "answer")
	b.AddNode("intake", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{answer.Set("")}, nil
	})
	b.AddSubgraph("research", sub)
	b.AddNode("closing", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{answer.Set(notes.Get(s))}, nil
	})
	g := compileChain(b, "intake", "research", "closing")
	return testBundleAgent(delegatingAgent, g, input, func(s engine.State) any { return answer.Get(s) })
}

// newDelegatingEnv is an env whose delegatingAgent records its calls in
// the store, as serve records them.
func newDelegatingEnv(t *testing.T) *env {
	t.Helper()
	var log agent.CallLog
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, delegatingGraph(deferredLog{&log}))
	log = wiring.CallLog(e.db, e.db)
	return e
}

// deferredLog is a CallLog set once the store it records in is open.
type deferredLog struct{ log *agent.CallLog }

func (d deferredLog) Intent(ctx context.Context, rec agent.CallRecord) (*agent.CallRecord, error) {
	return (*d.log).Intent(ctx, rec)
}
func (d deferredLog) Done(ctx context.Context, key string, result json.RawMessage, errText string) error {
	return (*d.log).Done(ctx, key, result, errText)
}
func (d deferredLog) Get(ctx context.Context, key string) (*agent.CallRecord, error) {
	return (*d.log).Get(ctx, key)
}
