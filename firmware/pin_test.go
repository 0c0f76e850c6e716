package firmware_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// The active tool set is resolved as a run opens and stored on it: a run
// paused before a restart keeps its set even when the appliance's tool
// restriction changes meanwhile, and new runs get the new one.
func TestActiveToolSetIsPinnedAcrossRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func(restrict []string) (*store.DB, *engine.Manager, *agent.MemoryFollowups) {
		db, err := store.OpenDir(dir, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fu := &agent.MemoryFollowups{}
		notes, err := agent.OpenFileNotes(filepath.Join(dir, "notes.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		rt := &firmware.Runtime{Tools: restrict, Log: wiring.CallLog(db, db), Blobs: db, Runs: db, Notes: notes, Followups: fu}
		b, err := firmware.ReferenceWithRuntime(rt)
		if err != nil {
			t.Fatal(err)
		}
		m := engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
		if _, err := m.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		return db, m, fu
	}
	ask, _ := json.Marshal("Can someone call me back to schedule a medication review for my losartan?")

	db, m, _ := open(nil) // every tool of the bundle
	r, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceToolsAgent, Input: ask})
	if err != nil || r.Status != engine.StatusInterrupted {
		t.Fatalf("first run: %v %s %s", err, r.Status, r.Error)
	}
	pinned := r.Meta[firmware.MetaActiveTools]
	if pinned == "" {
		t.Fatal("the run record carries no pinned tool set")
	}
	m.Close()
	db.Close()

	// The appliance now allows kb_search only.
	db, m, fu := open([]string{"kb_search"})
	defer db.Close()
	defer m.Close()
	if _, err := m.Resume(ctx, r.ID, map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}); err != nil {
		t.Fatal(err)
	}
	done, err := m.Wait(ctx, r.ID)
	if err != nil || done.Status != engine.StatusCompleted {
		t.Fatalf("resumed run: %v %s %s", err, done.Status, done.Error)
	}
	if n := len(fu.List()); n != 1 {
		t.Fatalf("the pinned set allowed schedule_followup, yet %d follow-ups were made", n)
	}
	if done.Meta[firmware.MetaActiveTools] != pinned {
		t.Fatal("the pinned set changed")
	}
	// A new run gets the narrowed set: the follow-up tool is refused.
	r2, err := m.Invoke(ctx, engine.RunRequest{Thread: "u", Agent: firmware.ReferenceToolsAgent, Input: ask})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Status == engine.StatusInterrupted || len(fu.List()) != 1 {
		t.Fatalf("a new run under the narrowed set: %s, %d follow-ups", r2.Status, len(fu.List()))
	}
}

// A run's narrower tool set that names a tool the run could never have (a
// typo, or a tool the appliance leaves out) is refused when the run opens,
// whoever starts it (the CLI, a Go program), and nothing is stored; it used
// to be dropped, and the run went ahead without it.
func TestUnknownToolInNarrowerSetRefusedAtStart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rt := &firmware.Runtime{Tools: []string{"kb_search", "current_time"}, Log: wiring.CallLog(db, db), Blobs: db, Runs: db}
	b, err := firmware.ReferenceWithRuntime(rt)
	if err != nil {
		t.Fatal(err)
	}
	m := engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
	defer m.Close()
	ask, _ := json.Marshal("I forgot my metformin dose")
	for _, tools := range []string{"kb_search,kb_serch", "record_note"} {
		_, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceToolsAgent, Input: ask,
			Meta: map[string]string{firmware.MetaTools: tools}})
		var unknown *firmware.UnknownToolsError
		if !errors.As(err, &unknown) || !errors.Is(err, policy.ErrToolUnknown) {
			t.Fatalf("tools %q: got %v, want an UnknownToolsError", tools, err)
		}
		if want := strings.Split(tools, ",")[len(strings.Split(tools, ","))-1]; len(unknown.Names) != 1 || unknown.Names[0] != want {
			t.Fatalf("tools %q: names %v, want [%s]", tools, unknown.Names, want)
		}
	}
	runs, err := db.Runs(ctx, engine.RunFilter{})
	if err != nil || len(runs) != 0 {
		t.Fatalf("refused starts stored %d runs (%v)", len(runs), err)
	}
	// A narrower set of known tools opens as before.
	r, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceToolsAgent, Input: ask,
		Meta: map[string]string{firmware.MetaTools: "kb_search"}})
	if err != nil || r.Status != engine.StatusCompleted {
		t.Fatalf("known tools: %v %v", err, r)
	}
}

// The reference agent without a tool loop drafts a follow-up and its review
// pauses for the write tool the draft proposes; the review runs no tool, so
// approving books nothing. The person is told so in the question, so that
// the approval is not taken for a booking.
func TestReviewOfProposedWriteToolSaysItIsNotRun(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenDir(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fu := &agent.MemoryFollowups{}
	rt := &firmware.Runtime{Log: wiring.CallLog(db, db), Blobs: db, Runs: db, Followups: fu}
	b, err := firmware.ReferenceWithRuntime(rt)
	if err != nil {
		t.Fatal(err)
	}
	m := engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
	defer m.Close()
	ask, _ := json.Marshal("Can someone call me back to schedule a medication review for my losartan?")
	r, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceAgent, Input: ask})
	if err != nil || r.Status != engine.StatusInterrupted {
		t.Fatalf("run: %v %+v", err, r)
	}
	var req firmware.ReviewRequest
	if err := json.Unmarshal(r.Interrupts[0].Payload, &req); err != nil {
		t.Fatal(err)
	}
	const says = "proposes write tool schedule_followup, which this review does not run: approving sends the draft alone"
	if !strings.Contains(strings.Join(req.Reasons, "; "), says) {
		t.Fatalf("the review does not say that approving runs no tool: %q", req.Reasons)
	}
	if _, err := m.Resume(ctx, r.ID, map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}); err != nil {
		t.Fatal(err)
	}
	done, err := m.Wait(ctx, r.ID)
	if err != nil || done.Status != engine.StatusCompleted {
		t.Fatalf("resumed: %v %+v", err, done)
	}
	if n := len(fu.List()); n != 0 {
		t.Fatalf("%d follow-ups booked by a review", n)
	}
}

// The runtime's step and wall-time budgets bound the bundle's runs; they
// were accepted and not applied, so a run went on past them.
func TestRuntimeStepAndWallTimeBudgetsApply(t *testing.T) {
	ctx := context.Background()
	ask, _ := json.Marshal("I forgot my metformin dose")
	for _, tc := range []struct {
		name   string
		budget policy.Budget
		want   error
	}{
		{"steps", policy.Budget{Steps: 2}, engine.ErrStepLimit},
		{"wall time", policy.Budget{WallTime: time.Nanosecond}, engine.ErrDeadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := store.OpenDir(t.TempDir(), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			rt := &firmware.Runtime{Log: wiring.CallLog(db, db), Blobs: db, Runs: db, Budget: tc.budget}
			b, err := firmware.ReferenceWithRuntime(rt)
			if err != nil {
				t.Fatal(err)
			}
			m := engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
			defer m.Close()
			r, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceAgent, Input: ask})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != engine.StatusBudgetExceeded || !strings.Contains(r.Error, tc.want.Error()) {
				t.Fatalf("status %s (%s), want budget_exceeded: %v", r.Status, r.Error, tc.want)
			}
		})
	}
}
