package firmware_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
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
	_, db := tempStore(t)
	rt := &firmware.Runtime{Tools: []string{"kb_search", "current_time"}, Log: wiring.CallLog(db, db), Blobs: db, Runs: db}
	b, err := firmware.ReferenceWithRuntime(rt)
	if err != nil {
		t.Fatal(err)
	}
	m := engine.NewManager(db, firmware.BundleResolver(b), engine.ManagerOptions{})
	defer m.Close()
	ask, _ := json.Marshal("I forgot my metformin dose")
	// The error says which layer leaves each name out.
	for _, tc := range []struct {
		tools            string
		names, appliance []string
		why              string
	}{
		{"kb_search,kb_serch", []string{"kb_serch"}, nil, "cannot have tool kb_serch here: it is not in its bundle's registry: "},
		{"record_note", []string{"record_note"}, []string{"record_note"}, "cannot have tool record_note here: this appliance does not allow it: "},
		{"record_note,kb_serch", []string{"kb_serch", "record_note"}, []string{"record_note"},
			"cannot have tool kb_serch, record_note here: its bundle's registry lacks kb_serch, and this appliance does not allow record_note: "},
	} {
		_, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: firmware.ReferenceToolsAgent, Input: ask,
			Meta: map[string]string{firmware.MetaTools: tc.tools}})
		var unknown *firmware.UnknownToolsError
		if !errors.As(err, &unknown) || !errors.Is(err, policy.ErrToolUnknown) {
			t.Fatalf("tools %q: got %v, want an UnknownToolsError", tc.tools, err)
		}
		if !slices.Equal(unknown.Names, tc.names) || !slices.Equal(unknown.Appliance, tc.appliance) {
			t.Fatalf("tools %q: names %v, appliance %v; want %v, %v", tc.tools, unknown.Names, unknown.Appliance, tc.names, tc.appliance)
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Fatalf("tools %q: %v, want it to say %q", tc.tools, err, tc.why)
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

// An appliance whose binary was rolled back below the min_appliance_version
// of a bundle that runs are pinned to does not run that bundle for them:
// at start a run left running ends failed, saying why and what to do, and
// a run waiting for a person is refused its resume and waits on, until the
// binary is upgraded again.
func TestPinnedRunsDoNotGoOnAfterARollback(t *testing.T) {
	ctx := context.Background()
	dir, db := tempStore(t)
	manager := func(version string) (*engine.Manager, error) {
		in, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		m := engine.NewManager(db, firmware.Resolver(in), engine.ManagerOptions{})
		_, err = m.Recover(ctx)
		return m, err
	}

	// On the release the bundle needs (0.1.0): two runs pause for review.
	in, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := in.Install(patternsDir, firmware.InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager("0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	input := json.RawMessage(`"I missed a dose"`)
	waiting, err := m.Invoke(ctx, engine.RunRequest{Thread: "waiting", Agent: "reviewed", Input: input})
	if err != nil || waiting.Status != engine.StatusInterrupted {
		t.Fatalf("run: %v %+v", err, waiting)
	}
	cut, err := m.Invoke(ctx, engine.RunRequest{Thread: "cut", Agent: "reviewed", Input: input})
	if err != nil || cut.Status != engine.StatusInterrupted {
		t.Fatalf("run: %v %+v", err, cut)
	}
	m.Close()
	// The second was running when the appliance stopped: its record says
	// so, as a crash leaves it, and the next start resumes it.
	cut.Status, cut.Interrupts = engine.StatusRunning, nil
	if err := db.Commit(ctx, &engine.Commit{Run: cut, Sync: true}); err != nil {
		t.Fatal(err)
	}

	// The binary is rolled back to 0.0.9.
	m, err = manager("0.0.9")
	if err != nil {
		t.Fatal(err)
	}
	failed, err := db.Run(ctx, cut.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"patterns v1 needs appliance 0.1.0 or later, this is 0.0.9", "upgrade the outpost binary to 0.1.0 or later"} {
		if failed.Status != engine.StatusFailed || !strings.Contains(failed.Error, want) {
			t.Fatalf("the run left running: %s %q, want failed, saying %q", failed.Status, failed.Error, want)
		}
	}
	if failed.Bundle != rec.Ref() {
		t.Fatalf("failed run pinned to %+v", failed.Bundle)
	}
	outcomes, err := db.Outcomes(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(outcomes, func(o *store.Outcome) bool { return o.Run == cut.ID && o.Status == engine.StatusFailed }) {
		t.Fatalf("the run left running left no failed outcome")
	}
	approve := map[string]engine.Decision{waiting.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}
	if _, err := m.Resume(ctx, waiting.ID, approve); !errors.Is(err, firmware.ErrMinVersion) || !strings.Contains(err.Error(), "this is 0.0.9") {
		t.Fatalf("resume on the rolled-back binary: %v, want ErrMinVersion", err)
	}
	if still, err := db.Run(ctx, waiting.ID); err != nil || still.Status != engine.StatusInterrupted {
		t.Fatalf("the run waiting for a person: %v %+v, want it waiting still", err, still)
	}
	m.Close()

	// Upgraded again, the waiting run goes on.
	m, err = manager("0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Resume(ctx, waiting.ID, approve); err != nil {
		t.Fatal(err)
	}
	if done, err := m.Wait(ctx, waiting.ID); err != nil || done.Status != engine.StatusCompleted {
		t.Fatalf("resumed after the upgrade: %v %+v", err, done)
	}
}

// tempStore is a new store in a folder of its own, closed when t ends.
func tempStore(t *testing.T) (dir string, db *store.DB) {
	t.Helper()
	dir = t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return dir, db
}
