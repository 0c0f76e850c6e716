package firmware_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/store"
)

// refHarness runs the reference bundle on one store.
type refHarness struct {
	t       *testing.T
	store   engine.Store
	resolve engine.Resolver
	m       *engine.Manager
	bus     *engine.Bus
	events  *engine.Subscription
	rt      *firmware.Runtime
	bundle  *firmware.Bundle
	db      *store.DB // the bbolt store, nil on the memory one
}

type storeKind string

const (
	memoryStore storeKind = "memory"
	boltStore   storeKind = "bbolt"
)

func newRefHarness(t *testing.T, kind storeKind, rt *firmware.Runtime) *refHarness {
	t.Helper()
	var st engine.Store
	var log agent.CallLog
	var bolt *store.DB
	switch kind {
	case memoryStore:
		ms := engine.NewMemoryStore()
		st, log = ms, agent.NewMemoryCallLog()
	case boltStore:
		db, err := store.OpenDir(t.TempDir(), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, log, bolt = db, wiring.CallLog(db, db), db
	}
	if rt == nil {
		rt = &firmware.Runtime{}
	}
	rt.Log, rt.Blobs, rt.Runs = log, st, st
	b, err := firmware.ReferenceWithRuntime(rt)
	if err != nil {
		t.Fatal(err)
	}
	h := &refHarness{t: t, store: st, resolve: firmware.BundleResolver(b), bus: engine.NewBus(), rt: rt, bundle: b, db: bolt}
	h.events = h.bus.Subscribe(4096, nil)
	h.m = engine.NewManager(st, h.resolve, engine.ManagerOptions{Workers: 2, Events: h.bus})
	t.Cleanup(func() { h.m.Close(); h.bus.Close() })
	return h
}

func (h *refHarness) invoke(thread, input string, meta map[string]string) outcome {
	h.t.Helper()
	raw, _ := json.Marshal(input)
	run, err := h.m.Invoke(context.Background(), engine.RunRequest{Thread: thread, Agent: firmware.ReferenceAgent, Input: raw, Meta: meta})
	if err != nil {
		h.t.Fatalf("invoke: %v", err)
	}
	return h.observe(run)
}

// observe reads the final state and the path of run (its own checkpoints
// only, so earlier turns on the thread do not count).
func (h *refHarness) observe(run *engine.Run) outcome {
	h.t.Helper()
	ctx := context.Background()
	ag, err := h.resolve(run.Agent, run.Bundle)
	if err != nil {
		h.t.Fatal(err)
	}
	snap, err := ag.Graph.StateAt(ctx, engine.RunConfig{Thread: run.Thread, Store: h.store}, "")
	if err != nil {
		h.t.Fatal(err)
	}
	hist, err := ag.Graph.History(ctx, h.store, run.Thread, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var path []string
	for i := len(hist) - 1; i >= 0; i-- {
		if c := hist[i]; c.Source == engine.SourceLoop && c.RunID == run.ID {
			path = append(path, c.Nodes...)
		}
	}
	return outcome{run: run, state: snap, path: path}
}

func output(o outcome) string {
	var s string
	json.Unmarshal(o.run.Output, &s)
	return s
}

var citeRE = regexp.MustCompile(`\[(kb-\d+)\]`)

const (
	pathNormal    = "intake,guardrail_pre,retrieve_context,generate_response,guardrail_post,closing"
	pathReviewed  = "intake,guardrail_pre,retrieve_context,generate_response,review_response,guardrail_post,closing"
	pathShortCirc = "intake,guardrail_pre,closing"
	emergencyText = "This may be an emergency. Call your local emergency number (911 in the US) now"
)

func TestReferenceAgent(t *testing.T) {
	for _, kind := range []storeKind{memoryStore, boltStore} {
		t.Run(string(kind), func(t *testing.T) {
			h := newRefHarness(t, kind, nil)
			t.Run("missed dose", func(t *testing.T) {
				o := h.invoke("dose", "I forgot my metformin dose this morning", nil)
				if o.run.Status != engine.StatusCompleted {
					t.Fatalf("status %s (%s)", o.run.Status, o.run.Error)
				}
				if join(o.path) != pathNormal {
					t.Errorf("path = %v", o.path)
				}
				out := output(o)
				if !strings.HasPrefix(out, "If you missed a dose of metformin, take it as soon as you remember") {
					t.Errorf("answer = %q", out)
				}
				ctxIDs := map[string]bool{}
				v, _ := o.state.Value("context")
				for _, d := range v.([]firmware.Doc) {
					ctxIDs[d.ID] = true
				}
				if !ctxIDs["kb-01"] {
					t.Errorf("context %v lacks kb-01 (Metformin: missed dose)", ctxIDs)
				}
				cites := citeRE.FindAllStringSubmatch(out, -1)
				if len(cites) != 3 || cites[0][1] != "kb-01" {
					t.Errorf("citations %v in %q", cites, out)
				}
				for _, c := range cites {
					if !ctxIDs[c[1]] {
						t.Errorf("cites %s, not retrieved", c[1])
					}
				}
				if f := o.strs("flags"); len(f) != 0 {
					t.Errorf("flags = %v", f)
				}
				if join(o.strs("cited")) != "kb-01,kb-33,kb-04" {
					t.Errorf("cited = %v", o.strs("cited"))
				}
				if o.run.Bundle.Name != firmware.ReferenceName || o.run.Bundle != h.bundle.Ref() {
					t.Errorf("bundle %+v", o.run.Bundle)
				}
			})
			t.Run("acute red flag", func(t *testing.T) {
				o := h.invoke("acute", "I took my amlodipine and now I have chest pain", nil)
				if o.run.Status != engine.StatusCompleted || join(o.path) != pathShortCirc {
					t.Fatalf("status %s path %v", o.run.Status, o.path)
				}
				if !strings.HasPrefix(output(o), emergencyText) || join(o.strs("flags")) != "acute" {
					t.Errorf("answer %q flags %v", output(o), o.strs("flags"))
				}
				if v, _ := o.state.Value("context"); len(v.([]firmware.Doc)) != 0 {
					t.Errorf("retrieval ran: %v", v)
				}
			})
			t.Run("out of scope", func(t *testing.T) {
				o := h.invoke("scope", "What is the weather tomorrow?", nil)
				if o.run.Status != engine.StatusCompleted || join(o.path) != pathShortCirc {
					t.Fatalf("status %s path %v", o.run.Status, o.path)
				}
				if !strings.HasPrefix(output(o), "I can only help with questions about your medications") || join(o.strs("flags")) != "out_of_scope" {
					t.Errorf("answer %q flags %v", output(o), o.strs("flags"))
				}
			})
			t.Run("turns reset per-turn state", func(t *testing.T) {
				h.invoke("multi", "What is the weather tomorrow?", nil)
				o := h.invoke("multi", "When should I take levothyroxine?", nil)
				if o.run.Status != engine.StatusCompleted || join(o.path) != pathNormal || len(o.strs("flags")) != 0 {
					t.Fatalf("status %s path %v flags %v", o.run.Status, o.path, o.strs("flags"))
				}
				if !strings.HasPrefix(output(o), "Take levothyroxine as your prescription label says") {
					t.Errorf("answer %q", output(o))
				}
				v, _ := o.state.Value("messages")
				if msgs := v.([]models.Message); len(msgs) != 2 || msgs[0].Content != "What is the weather tomorrow?" {
					t.Errorf("history %+v", msgs)
				}
			})
			for _, c := range []struct {
				name, input, flag, reason string
			}{
				{"uncited", "Can I stop taking lisinopril?", firmware.FlagUncited, "cites nothing"},
				{"foreign citation", "Should I double my losartan dose tonight?", firmware.FlagForeignCitation, "cites kb-99, which was not retrieved"},
				{"write tool", "Please schedule a follow-up call about my atorvastatin", firmware.FlagWriteTool, "proposes write tool schedule_followup"},
			} {
				t.Run("review/"+c.name, func(t *testing.T) {
					for _, d := range []engine.Decision{
						{Kind: engine.Approve, By: "nurse"},
						{Kind: engine.Edit, By: "nurse", Value: json.RawMessage(`"Please call the clinic about this [kb-05]."`)},
						{Kind: engine.Reject, By: "nurse", Reason: "unsafe"},
					} {
						thread := "review-" + c.name + "-" + d.Kind
						o := h.invoke(thread, c.input, nil)
						if o.run.Status != engine.StatusInterrupted || len(o.run.Interrupts) != 1 || o.run.Interrupts[0].Node != "review_response" {
							t.Fatalf("%s: status %s interrupts %+v", d.Kind, o.run.Status, o.run.Interrupts)
						}
						var req firmware.ReviewRequest
						json.Unmarshal(o.run.Interrupts[0].Payload, &req)
						if !strings.Contains(join(req.Reasons), c.reason) || !contains(o.strs("flags"), c.flag) {
							t.Fatalf("reasons %v flags %v", req.Reasons, o.strs("flags"))
						}
						ctx := context.Background()
						if _, err := h.m.Resume(ctx, o.run.ID, map[string]engine.Decision{o.run.Interrupts[0].ID: d}); err != nil {
							t.Fatal(err)
						}
						done, err := h.m.Wait(ctx, o.run.ID)
						if err != nil || done.Status != engine.StatusCompleted {
							t.Fatalf("%s: %v %+v", d.Kind, err, done)
						}
						after := h.observe(done)
						if join(after.path) != pathReviewed {
							t.Errorf("%s: path %v", d.Kind, after.path)
						}
						out := output(after)
						switch d.Kind {
						case engine.Approve:
							if out != req.Draft || !contains(after.strs("flags"), firmware.FlagReviewApproved) {
								t.Errorf("approve: %q flags %v", out, after.strs("flags"))
							}
						case engine.Edit:
							if out != "Please call the clinic about this [kb-05]." || !contains(after.strs("flags"), firmware.FlagReviewEdited) {
								t.Errorf("edit: %q flags %v", out, after.strs("flags"))
							}
						case engine.Reject:
							if !strings.HasPrefix(out, "A clinician reviewed this answer and withheld it.") || !contains(after.strs("flags"), firmware.FlagReviewRejected) {
								t.Errorf("reject: %q flags %v", out, after.strs("flags"))
							}
						}
					}
				})
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A model outside the agent's lane is refused: the run fails, and the
// refusal is evented.
func TestReferenceLaneRefusal(t *testing.T) {
	p, err := scripted.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newRefHarness(t, memoryStore, &firmware.Runtime{Provider: p, Model: "gpt-4o"})
	o := h.invoke("lane", "I forgot my metformin dose", nil)
	if o.run.Status != engine.StatusFailed || !strings.Contains(o.run.Error, `may not use model "gpt-4o"`) {
		t.Fatalf("status %s error %q", o.run.Status, o.run.Error)
	}
	h.m.Close()
	h.bus.Close()
	refused := false
	for e := range h.events.C() {
		if e.Type == agent.EventModelRefused && e.Run == o.run.ID {
			refused = true
		}
	}
	if !refused {
		t.Fatal("no model.refused event")
	}

	// A model in the lane ("qwen2.5:*") is allowed.
	h = newRefHarness(t, memoryStore, &firmware.Runtime{Provider: p, Model: "qwen2.5:0.5b"})
	if o := h.invoke("lane", "I forgot my metformin dose", nil); o.run.Status != engine.StatusInterrupted {
		// The bare scripted provider falls back to an uncited answer,
		// which goes to review: the lane let the call through.
		t.Fatalf("status %s error %q", o.run.Status, o.run.Error)
	}
}

// The tool-loop variant: kb_search and current_time run, record_note runs
// under the bundle's standing approval, schedule_followup asks a person,
// and the request's tool override narrows the pinned set.
func TestReferenceToolLoop(t *testing.T) {
	ctx := context.Background()
	notes := t.TempDir()
	nf, err := agent.OpenFileNotes(filepath.Join(notes, "notes.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	fu := &agent.MemoryFollowups{}
	h := newRefHarness(t, boltStore, &firmware.Runtime{Notes: nf, Followups: fu})
	run := func(thread, input string, meta map[string]string) *engine.Run {
		raw, _ := json.Marshal(input)
		r, err := h.m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: firmware.ReferenceToolsAgent, Input: raw, Meta: meta})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := run("search", "How should I store omeprazole?", nil)
	if r.Status != engine.StatusCompleted || !strings.Contains(string(r.Output), "kb-24") {
		t.Fatalf("search: %s %s %s", r.Status, r.Output, r.Error)
	}
	r = run("note", "Please tell my doctor the metformin upsets my stomach", nil)
	if r.Status != engine.StatusCompleted || !strings.Contains(string(r.Output), "I left a note") {
		t.Fatalf("note: %s %s %s", r.Status, r.Output, r.Error)
	}
	data, _ := os.ReadFile(filepath.Join(notes, "notes.jsonl"))
	if !strings.Contains(string(data), "upsets my stomach") {
		t.Fatalf("notes file: %s", data)
	}
	r = run("followup", "Can someone call me back to schedule a medication review for my losartan?", nil)
	if r.Status != engine.StatusInterrupted || len(r.Interrupts) != 1 {
		t.Fatalf("followup: %s %+v", r.Status, r.Interrupts)
	}
	if _, err := h.m.Resume(ctx, r.ID, map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}); err != nil {
		t.Fatal(err)
	}
	if r, _ = h.m.Wait(ctx, r.ID); r.Status != engine.StatusCompleted || len(fu.List()) != 1 {
		t.Fatalf("after approval: %s %s, %d follow-ups", r.Status, r.Output, len(fu.List()))
	}
	// The request narrows the set to kb_search: record_note is refused
	// (neutrally, to the model) and evented as tool.unauthorized.
	r = run("narrow", "Please tell my doctor the lisinopril makes me cough", map[string]string{firmware.MetaTools: "kb_search"})
	if r.Status != engine.StatusCompleted {
		t.Fatalf("narrow: %s %s", r.Status, r.Error)
	}
	if out := string(r.Output); strings.Contains(out, "I left a note") || !strings.Contains(out, "could not leave a note") {
		t.Fatalf("narrow: the answer must not claim the refused note: %s", out)
	}
	if strings.Count(string(data), "\n") != 1 {
		t.Fatalf("notes: %s", data)
	}
	if data, _ = os.ReadFile(filepath.Join(notes, "notes.jsonl")); strings.Contains(string(data), "cough") {
		t.Fatalf("a narrowed-away tool ran: %s", data)
	}
	set, err := h.rt.ActiveTools(ctx, h.bundle.Registry, nil, r.ID)
	if err != nil || join(set.Names()) != "kb_search" {
		t.Fatalf("pinned set %v %v", set, err)
	}
}

func TestReferenceExportVerifies(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ref")
	if err := firmware.Export(dir); err != nil {
		t.Fatal(err)
	}
	keys, err := firmware.DevKeyring()
	if err != nil {
		t.Fatal(err)
	}
	m, err := firmware.Verify(dir, keys)
	if err != nil || m.Name != firmware.ReferenceName {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := firmware.Verify(dir, testKeyring(t)); !errors.Is(err, firmware.ErrUnknownKey) {
		t.Fatalf("verified with another key: %v", err)
	}
	if err := firmware.Export(dir); err == nil {
		t.Fatal("exported over a non-empty folder")
	}
	b, err := firmware.Reference()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Docs) < 30 || b.Lanes[firmware.ReferenceAgent].Allow("llama3.2:3b") != nil || b.Lanes[firmware.ReferenceAgent].Allow("gpt-4o") == nil {
		t.Fatalf("docs %d lanes %+v", len(b.Docs), b.Lanes)
	}
}

// An edit a review cannot use is refused before the review is spent: the
// run stays interrupted on the same interrupt, and a usable edit then
// finishes it. Before, the node failed on it and the run failed for good.
func TestReviewRefusesAnUnusableEditUpFront(t *testing.T) {
	h := newRefHarness(t, boltStore, nil)
	ctx := context.Background()
	o := h.invoke("edit", "remind me to refill my metformin", nil)
	if o.run.Status != engine.StatusInterrupted || len(o.run.Interrupts) != 1 || o.run.Interrupts[0].Node != "review_response" {
		t.Fatalf("want a review: %s %+v", o.run.Status, o.run.Interrupts)
	}
	in := o.run.Interrupts[0].ID
	// An empty edit would send the patient an empty answer.
	const want = `: an edit's value is the answer to send, as a JSON string or as {"text": "..."}`
	for _, tc := range []struct{ bad, why string }{
		{`{"foo":1,"Bar":2}`, `"value" has no "text" field (its fields: "Bar", "foo")` + want},
		{`{}`, `"value" is an empty object` + want},
		{`12345`, `"value" is a number` + want},
		{`["a"]`, `"value" is an array` + want},
		{`true`, `"value" is a boolean` + want},
		{`{"text":5}`, `"value.text" is a number, not a string` + want},
		{`{"text":null}`, `"value.text" is null, not a string` + want},
		{`{"text":""}`, `"value.text" is empty: write the answer, or approve or reject the draft`},
		{`""`, `"value" is empty: write the answer`}, {`" \n "`, `"value" is empty`}, {`{"text":"  "}`, `"value.text" is empty`}} {
		bad := tc.bad
		_, err := h.m.Resume(ctx, o.run.ID, map[string]engine.Decision{in: {Kind: engine.Edit, Value: json.RawMessage(bad), By: "nurse"}})
		if !errors.Is(err, engine.ErrBadDecision) || !strings.Contains(err.Error(), tc.why) {
			t.Fatalf("edit %s: %v", bad, err)
		}
		r, err := h.store.Run(ctx, o.run.ID)
		if err != nil || r.Status != engine.StatusInterrupted || len(r.Interrupts) != 1 || r.Interrupts[0].ID != in || len(r.Decisions) != 0 {
			t.Fatalf("after edit %s the review must stand: %v %+v", bad, err, r)
		}
	}
	if _, err := h.m.Resume(ctx, o.run.ID, map[string]engine.Decision{in: {Kind: engine.Edit, Value: json.RawMessage(`"Please call the pharmacy."`), By: "nurse"}}); err != nil {
		t.Fatal(err)
	}
	r, err := h.m.Wait(ctx, o.run.ID)
	if err != nil || r.Status != engine.StatusCompleted || !strings.Contains(string(r.Output), "Please call the pharmacy.") {
		t.Fatalf("after a usable edit: %v %s %s %s", err, r.Status, r.Output, r.Error)
	}
}

// The reference agents name their tools: the plain assistant none, the
// tool-loop one exactly the tools its scripted rules call; so the bundle
// loads without a warning.
func TestReferenceAllowlists(t *testing.T) {
	b, err := firmware.Reference()
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Allowlist(firmware.ReferenceAgent); got == nil || len(got) != 0 {
		t.Fatalf("%s allowlist %#v, want []", firmware.ReferenceAgent, got)
	}
	raw, err := os.ReadFile(filepath.Join(referenceDir, "scripted", firmware.ReferenceToolsAgent+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []struct {
		ToolCalls []struct{ Name string } `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	var called []string
	for _, r := range rules {
		for _, c := range r.ToolCalls {
			if !contains(called, c.Name) {
				called = append(called, c.Name)
			}
		}
	}
	got := b.Allowlist(firmware.ReferenceToolsAgent)
	slices.Sort(got)
	slices.Sort(called)
	if join(got) != join(called) {
		t.Fatalf("%s allowlist %v, its rules call %v", firmware.ReferenceToolsAgent, got, called)
	}
	if w := b.Warnings(); len(w) != 0 {
		t.Fatalf("warnings %v", w)
	}
}
