package firmware_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

func newInstaller(t testing.TB, data string) *firmware.Installer {
	t.Helper()
	in, err := firmware.NewInstaller(data, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// withDraft returns an edit that changes the reviewed agent's draft text,
// so that versions differ in what they answer.
func withDraft(text string) func(dir string) {
	return func(dir string) {
		p := filepath.Join(dir, "agents", "reviewed.json")
		data, _ := os.ReadFile(p)
		os.WriteFile(p, []byte(strings.Replace(string(data), "Version one says: take it with food.", text, 1)), 0o644)
	}
}

func TestInstallActivateList(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	v1, err := in.Install(patternsDir, firmware.InstallOptions{By: "ops", Reason: "initial"})
	if err != nil {
		t.Fatal(err)
	}
	if !v1.Active || v1.Version != 1 || !strings.HasPrefix(v1.Digest, "sha256:") || v1.InstalledBy != "ops" {
		t.Fatalf("first install %+v", v1)
	}
	if _, err := os.Stat(filepath.Join(data, "firmware", "patterns", "1", "manifest.json")); err != nil {
		t.Fatal(err)
	}
	// Installing the same bytes again changes nothing.
	if again, err := in.Install(tarOf(t, patternsDir, ""), firmware.InstallOptions{}); err != nil || again.Digest != v1.Digest {
		t.Fatalf("reinstall: %+v, %v", again, err)
	}
	// The same version with other contents is refused.
	if _, err := in.Install(variant(t, 1, withDraft("other")), firmware.InstallOptions{}); !errors.Is(err, firmware.ErrVersionInstalled) {
		t.Fatalf("same version, other contents: %v", err)
	}
	v2, err := in.Install(variant(t, 2, withDraft("v2")), firmware.InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v2.Active {
		t.Fatal("a later install activated itself without Activate")
	}
	if a, _ := in.Active("patterns"); a.Version != 1 {
		t.Fatalf("active %d, want 1", a.Version)
	}
	if err := in.Activate("patterns", 2); err != nil {
		t.Fatal(err)
	}
	if err := in.Activate("patterns", 7); !errors.Is(err, firmware.ErrNotInstalled) {
		t.Fatalf("activate missing version: %v", err)
	}
	// Going back below the active version is a downgrade: refused unless
	// allowed, and then recorded with who and why.
	if err := in.Activate("patterns", 1); !errors.Is(err, firmware.ErrDowngrade) {
		t.Fatalf("activate an older version: %v", err)
	}
	if a, _ := in.Active("patterns"); a.Version != 2 {
		t.Fatalf("a refused rollback changed the active version to %d", a.Version)
	}
	if err := in.Activate("patterns", 1, firmware.ActivateOptions{AllowDowngrade: true, By: "ops", Reason: "v2 misroutes"}); err != nil {
		t.Fatal(err)
	}
	if log := in.Log(); log[len(log)-1].By != "ops" || log[len(log)-1].Reason != "v2 misroutes" || log[len(log)-1].Version != 1 {
		t.Fatalf("the rollback's record: %+v", log[len(log)-1])
	}
	if err := in.Activate("patterns", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Active("nothing"); !errors.Is(err, firmware.ErrNoActive) {
		t.Fatalf("active of unknown name: %v", err)
	}

	// The index survives a restart.
	in2 := newInstaller(t, data)
	list := in2.List()
	if len(list) != 2 || list[0].Version != 1 || list[0].Active || list[1].Version != 2 || !list[1].Active {
		t.Fatalf("list after reopen: %+v", list)
	}
	b, err := in2.Open("patterns", 2)
	if err != nil {
		t.Fatal(err)
	}
	if b.Digest != v2.Digest || b.Manifest.Version != 2 || len(b.Docs) != 3 || b.Rules == nil || b.Registry == nil ||
		len(b.Golden) != 2 || b.Prompts["answer"] == "" || b.Lanes["sequential"].Agent != "sequential" || b.Redactor == nil {
		t.Fatalf("opened bundle incomplete: %+v", b)
	}
}

func TestDowngrade(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if _, err := in.Install(variant(t, 3, nil), firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	v2 := variant(t, 2, nil)
	if _, err := in.Install(v2, firmware.InstallOptions{}); !errors.Is(err, firmware.ErrDowngrade) {
		t.Fatalf("downgrade without permission: %v", err)
	}
	rec, err := in.Install(v2, firmware.InstallOptions{AllowDowngrade: true, Activate: true, By: "alice", Reason: "v3 breaks refills"})
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Downgrade || !rec.Active || rec.InstalledBy != "alice" || rec.Reason != "v3 breaks refills" {
		t.Fatalf("downgrade record %+v", rec)
	}
	var found bool
	for _, e := range newInstaller(t, data).Log() {
		if e.Action == "downgrade" && e.Version == 2 && e.By == "alice" && e.Reason == "v3 breaks refills" && !e.At.IsZero() {
			found = true
		}
	}
	if !found {
		t.Fatalf("downgrade not in the log: %+v", in.Log())
	}

	// Removing v3 does not lower the bar: v1 is still a downgrade.
	if err := in.Remove("patterns", 3, nil, firmware.RemoveOptions{By: "alice", Reason: "v3 breaks refills"}); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Install(variant(t, 1, nil), firmware.InstallOptions{}); !errors.Is(err, firmware.ErrDowngrade) {
		t.Fatalf("downgrade after removing the highest: %v", err)
	}
}

func TestRemove(t *testing.T) {
	in := newInstaller(t, t.TempDir())
	v1, err := in.Install(patternsDir, firmware.InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Install(variant(t, 2, nil), firmware.InstallOptions{Activate: true}); err != nil {
		t.Fatal(err)
	}
	why := firmware.RemoveOptions{By: "alice", Reason: "superseded"}
	if err := in.Remove("patterns", 2, nil, why); !errors.Is(err, firmware.ErrInUse) {
		t.Fatalf("remove the active version: %v", err)
	}
	pinned := func(ref engine.BundleRef) bool { return ref == v1.Ref() }
	if err := in.Remove("patterns", 1, pinned, why); !errors.Is(err, firmware.ErrInUse) {
		t.Fatalf("remove a version a run is pinned to: %v", err)
	}
	// Who and why are required, as firmware remove's --by and --reason
	// are: refused, with nothing changed.
	for _, o := range []firmware.RemoveOptions{{}, {By: "alice"}, {Reason: "superseded"}} {
		err := in.Remove("patterns", 1, func(engine.BundleRef) bool { return false }, o)
		if !errors.Is(err, firmware.ErrUnexplained) || !strings.Contains(err.Error(), "RemoveOptions.By and RemoveOptions.Reason are required") {
			t.Fatalf("remove with %+v: %v", o, err)
		}
		if _, err := in.Open("patterns", 1); err != nil {
			t.Fatalf("an unexplained removal changed something: %v", err)
		}
	}
	if err := in.Remove("patterns", 1, func(engine.BundleRef) bool { return false }, why); err != nil {
		t.Fatal(err)
	}
	var logged bool
	for _, e := range in.Log() {
		logged = logged || e.Action == "remove" && e.Version == 1 && e.By == "alice" && e.Reason == "superseded"
	}
	if !logged {
		t.Fatalf("removal not in the log with who and why: %+v", in.Log())
	}
	if _, err := os.Stat(filepath.Join(in.Dir(), "patterns", "1")); !os.IsNotExist(err) {
		t.Fatalf("version directory still there: %v", err)
	}
	if _, err := in.Open("patterns", 1); !errors.Is(err, firmware.ErrNotInstalled) {
		t.Fatalf("open removed: %v", err)
	}
}

// An installed bundle is verified again when opened: a file changed on disk
// after install is refused.
func TestOpenReverifies(t *testing.T) {
	in := newInstaller(t, t.TempDir())
	if _, err := in.Install(patternsDir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(in.Dir(), "patterns", "1"), "rules.json", `{"red_flags": [], "scope": {"keywords": []}}`)
	if _, err := newInstaller(t, filepath.Dir(in.Dir())).Open("patterns", 1); !errors.Is(err, firmware.ErrHashMismatch) {
		t.Fatalf("tampered install: %v", err)
	}
}

// TestInstallAgainRepairs damages an installed copy: Verify names the
// damage, and installing the same bundle again rewrites the copy, records
// the repair, and leaves a version that opens.
func TestInstallAgainRepairs(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if _, err := in.Install(patternsDir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := in.Verify("patterns", 1); err != nil {
		t.Fatalf("a fresh install: %v", err)
	}
	writeFile(t, filepath.Join(in.Dir(), "patterns", "1"), "rules.json", `{"red_flags": [], "scope": {"keywords": []}}`)
	in = newInstaller(t, data)
	if err := in.Verify("patterns", 1); !errors.Is(err, firmware.ErrHashMismatch) {
		t.Fatalf("tampered install: %v", err)
	}
	if err := in.Verify("patterns", 2); !errors.Is(err, firmware.ErrNotInstalled) {
		t.Fatalf("a version never installed: %v", err)
	}
	if _, err := in.Install(patternsDir, firmware.InstallOptions{By: "ops", Reason: "disk check"}); err != nil {
		t.Fatal(err)
	}
	if err := in.Verify("patterns", 1); err != nil {
		t.Fatalf("after the repair: %v", err)
	}
	if _, err := newInstaller(t, data).Open("patterns", 1); err != nil {
		t.Fatalf("after the repair, reopened: %v", err)
	}
	log := in.Log()
	if last := log[len(log)-1]; last.Action != "repair" || last.Version != 1 || last.By != "ops" {
		t.Fatalf("last log entry %+v, want the repair", last)
	}
	// A sound copy installed again is left as it is, and not logged.
	if _, err := in.Install(patternsDir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(in.Log()); n != len(log) {
		t.Fatalf("log grew from %d to %d entries on a sound reinstall", len(log), n)
	}
	if left, _ := filepath.Glob(filepath.Join(in.Dir(), "patterns", ".*")); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestPinnedRunResumesOnItsVersion starts a run on v1 that pauses for
// review, installs and activates v2, and resumes: the run finishes on v1,
// while a new run gets v2.
func TestPinnedRunResumesOnItsVersion(t *testing.T) {
	in := newInstaller(t, t.TempDir())
	v1, err := in.Install(patternsDir, firmware.InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	resolve := firmware.Resolver(in)
	store := engine.NewMemoryStore()
	m := engine.NewManager(store, resolve, engine.ManagerOptions{Workers: 2})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	input := json.RawMessage(`"I missed a dose"`)
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "patient-1", Agent: "reviewed", Input: input})
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != engine.StatusInterrupted || len(run.Interrupts) != 1 || run.Interrupts[0].Node != "review" {
		t.Fatalf("run %s: %+v", run.Status, run.Interrupts)
	}
	if run.Bundle != v1.Ref() {
		t.Fatalf("pinned to %+v, want %+v", run.Bundle, v1.Ref())
	}
	var req firmware.ReviewRequest
	if err := json.Unmarshal(run.Interrupts[0].Payload, &req); err != nil || req.Draft != "Version one says: take it with food." || join(req.Reasons) != "cites nothing" {
		t.Fatalf("review payload %s (%v)", run.Interrupts[0].Payload, err)
	}

	v2, err := in.Install(variant(t, 2, withDraft("Version two says: see [kb-01].")), firmware.InstallOptions{Activate: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Remove("patterns", 1, func(ref engine.BundleRef) bool {
		runs, _ := store.Runs(ctx, engine.RunFilter{Status: engine.StatusInterrupted})
		for _, r := range runs {
			if r.Bundle == ref {
				return true
			}
		}
		return false
	}, firmware.RemoveOptions{By: "nurse", Reason: "v2 replaces it"}); !errors.Is(err, firmware.ErrInUse) {
		t.Fatalf("removing the version a paused run is pinned to: %v", err)
	}

	if _, err := m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}); err != nil {
		t.Fatal(err)
	}
	done, err := m.Wait(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != engine.StatusCompleted || string(done.Output) != `"Version one says: take it with food. (reviewed)"` || done.Bundle != v1.Ref() {
		t.Fatalf("resumed run: %s %s %+v (%s)", done.Status, done.Output, done.Bundle, done.Error)
	}
	o := observe(t, store, resolve, done)
	if join(o.path) != "lookup,generate,review,closing" || join(o.strs("flags")) != firmware.FlagReviewApproved {
		t.Fatalf("path %v flags %v", o.path, o.strs("flags"))
	}

	// A new run on the same thread gets v2, whose draft cites what it
	// retrieved and so needs no review.
	next, err := m.Invoke(ctx, engine.RunRequest{Thread: "patient-1", Agent: "reviewed", Input: input})
	if err != nil {
		t.Fatal(err)
	}
	if next.Status != engine.StatusCompleted || next.Bundle != v2.Ref() || string(next.Output) != `"Version two says: see [kb-01]. (reviewed)"` {
		t.Fatalf("new run: %s %+v %s (%s)", next.Status, next.Bundle, next.Output, next.Error)
	}

	// A run pinned to a digest that is no longer what is installed fails
	// to resolve rather than running on something else.
	bad := v1.Ref()
	bad.Digest = "sha256:0000"
	if _, err := resolve("reviewed", bad); !errors.Is(err, firmware.ErrPinnedMismatch) {
		t.Fatalf("changed digest: %v", err)
	}
	for _, resolve := range []engine.Resolver{resolve, firmware.BundleResolver(loadPatterns(t))} {
		if _, err := resolve("nobody", engine.BundleRef{}); !errors.Is(err, engine.ErrUnknownAgent) || !errors.Is(err, firmware.ErrUnknownAgent) ||
			strings.Count(err.Error(), "unknown agent") != 1 || !strings.Contains(err.Error(), `"nobody"`) {
			t.Fatalf("unknown agent: %v, want it to say \"unknown agent\" once and name the agent", err)
		}
	}
}

func TestReviewDecisions(t *testing.T) {
	b := loadPatterns(t)
	for _, c := range []struct {
		decision engine.Decision
		output   string
		flag     string
	}{
		{engine.Decision{Kind: engine.Approve}, "Version one says: take it with food. (reviewed)", firmware.FlagReviewApproved},
		{engine.Decision{Kind: engine.Edit, Value: json.RawMessage(`"Take it with food [kb-03]."`)}, "Take it with food [kb-03]. (reviewed)", firmware.FlagReviewEdited},
		{engine.Decision{Kind: engine.Reject, Reason: "unsafe"}, "A reviewer withheld this answer. Please contact the clinic directly. (reviewed)", firmware.FlagReviewRejected},
	} {
		t.Run(c.decision.Kind, func(t *testing.T) {
			store := engine.NewMemoryStore()
			resolve := firmware.BundleResolver(b)
			m := engine.NewManager(store, resolve, engine.ManagerOptions{Workers: 1})
			defer m.Close()
			ctx := context.Background()
			run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "reviewed", Input: json.RawMessage(`"missed dose"`)})
			if err != nil || run.Status != engine.StatusInterrupted {
				t.Fatalf("%v %v", run, err)
			}
			if _, err := m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: c.decision}); err != nil {
				t.Fatal(err)
			}
			done, _ := m.Wait(ctx, run.ID)
			want, _ := json.Marshal(c.output)
			if done.Status != engine.StatusCompleted || string(done.Output) != string(want) {
				t.Fatalf("%s: %s", done.Status, done.Output)
			}
			if o := observe(t, store, resolve, done); join(o.strs("flags")) != c.flag {
				t.Fatalf("flags %v", o.strs("flags"))
			}
		})
	}
}

// A draft that proposes a write tool is reviewed even when it cites well.
func TestReviewWriteTool(t *testing.T) {
	b := loadPatterns(t)
	ag, err := b.Agent("reviewed")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore()}
	res, err := ag.Graph.Invoke(ctx, cfg,
		engine.Write{Channel: "input", Value: "missed dose"},
		engine.Write{Channel: "proposed", Value: []string{"lookup_schedule", "send_reminder"}})
	if err != nil {
		t.Fatal(err)
	}
	var req firmware.ReviewRequest
	json.Unmarshal(res.Run.Interrupts[0].Payload, &req)
	if join(req.Tools) != "send_reminder" || !strings.Contains(join(req.Reasons), "proposes write tool send_reminder") {
		t.Fatalf("review request %+v", req)
	}
}

// A lost index.json beside installed bundle folders is refused: the
// appliance must not fall back to the embedded bundle as if nothing were
// installed.
func TestLostIndexIsRefused(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if _, err := in.Install(tarOf(t, patternsDir, ""), firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(data, "firmware", "index.json")); err != nil {
		t.Fatal(err)
	}
	_, err := firmware.NewInstaller(data, nil, firmware.InstallerOptions{})
	if err == nil || !strings.Contains(err.Error(), "index.json is missing but") || !strings.Contains(err.Error(), "patterns/") {
		t.Fatalf("lost index: %v", err)
	}
	// An empty firmware folder is simply nothing installed.
	empty := t.TempDir()
	if _, err := firmware.NewInstaller(empty, nil, firmware.InstallerOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A bundle whose names do not meet (an approval for a tool outside its
// registry, a model node whose lane the lanes file lacks) is refused by
// Load and Install, naming the file, the line and column, the node and
// the field; the installer is left as it was. A lane for no agent, left
// over from one taken out, is no harm and is taken.
func TestBundleNamesMeet(t *testing.T) {
	const rules = `{
  "red_flags": [{"name": "chest-pain", "pattern": "chest pain", "flag": "acute", "template": "Call your local emergency number now."}],
  "citations": {"pattern": "\\[(kb-[0-9]+)\\]"},
  "approvals": [
    {"tool": "send_reminder", "decision": "ask", "reason": "it writes"},
    {"tool": "lookup_schedul", "decision": "deny", "reason": "misspelt"}
  ]
}`
	solo := func(lane string) string {
		return `{"name": "solo", "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "answer", "type": "string", "reducer": "replace"}],
  "input": "input", "output": "answer",
  "nodes": [{"name": "ask", "kind": "model", "config": {"input": "input", "out": "answer"` + lane + `}}],
  "edges": [{"from": "START", "to": "ask"}, {"from": "ask", "to": "END"}]}`
	}
	withSolo := func(dir, graph, lanes string) {
		writeFile(t, dir, "agents/solo.json", graph)
		writeFile(t, dir, "lanes.json", lanes)
		editManifest(t, dir, func(m map[string]any) { m["agents"].(map[string]any)["solo"] = "agents/solo.json" })
	}
	for _, tc := range []struct {
		name, file, text, bad, node, field string
		edit                               func(dir string)
	}{
		{name: "approval for an unknown tool", file: "rules.json", text: rules, bad: `{"tool": "lookup_schedul"`,
			field: `approvals.1.tool: "lookup_schedul" is not a tool`, edit: func(dir string) { writeFile(t, dir, "rules.json", rules) }},
		{name: "lane under a misspelt agent", file: "agents/solo.json", text: solo(""), bad: `{"name": "ask"`, node: "ask",
			field: `its lane, "solo" (the graph's name`, edit: func(dir string) {
				withSolo(dir, solo(""), `{"lanes": [{"agent": "sollo", "models": ["llama3.2:*"]}]}`)
			}},
		{name: "lane a node names", file: "agents/solo.json", text: solo(`, "lane": "shared"`), bad: `{"name": "ask"`, node: "ask",
			field: `config.lane: "shared" is not in lanes.json`, edit: func(dir string) {
				withSolo(dir, solo(`, "lane": "shared"`), `{"lanes": [{"agent": "solo", "models": ["llama3.2:*"]}]}`)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := variant(t, 2, tc.edit)
			off := strings.Index(tc.text, tc.bad)
			line := strings.Count(tc.text[:off], "\n") + 1
			col := off - strings.LastIndex(tc.text[:off], "\n")

			requireRefusedAt(t, dir, tc.file, line, col, tc.node, tc.field)
		})
	}

	// The names meet: the approval names a tool of the registry, the
	// node's lane is in the lanes file, and a lane left over for no agent
	// does no harm.
	dir := variant(t, 2, func(dir string) {
		writeFile(t, dir, "rules.json", strings.Replace(rules, "lookup_schedul", "lookup_schedule", 1))
		withSolo(dir, solo(`, "lane": "shared"`), `{"lanes": [{"agent": "shared", "models": ["llama3.2:*"]}, {"agent": "gone", "models": ["llama3.2:*"]}]}`)
	})
	if _, err := firmware.Load(dir, testKeyring(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := newInstaller(t, t.TempDir()).Install(dir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
}

// requireRefusedAt fails t unless Load (what verify runs) and Install both
// refuse the bundle at dir with a *FileError wrapping ErrMalformed at
// file:line:col and node, whose text holds field, and nothing is installed.
func requireRefusedAt(t *testing.T, dir, file string, line, col int, node, field string) {
	t.Helper()
	_, loadErr := firmware.Load(dir, testKeyring(t))
	in := newInstaller(t, t.TempDir())
	_, installErr := in.Install(dir, firmware.InstallOptions{})
	for what, err := range map[string]error{"load": loadErr, "install": installErr} {
		var fe *firmware.FileError
		if !errors.Is(err, firmware.ErrMalformed) || !errors.As(err, &fe) {
			t.Fatalf("%s: %v, want a *FileError wrapping ErrMalformed", what, err)
		}
		if fe.File != file || fe.Line != line || fe.Column != col || fe.Node != node || !strings.Contains(err.Error(), field) {
			t.Fatalf("%s: %v, want it at %s:%d:%d, node %q, naming %s", what, err, file, line, col, node, field)
		}
	}
	if list := in.List(); len(list) != 0 {
		t.Fatalf("a refused install left %+v", list)
	}
}

// A mistake in an item of a policy file (a tool, a red flag, an approval,
// a redaction detector) is reported at that item's line and column, as a
// mistake in a graph file is, so that the hint to fix the file at the line
// and column given has one to give.
func TestPolicyFileMistakesSayWhere(t *testing.T) {
	for _, tc := range []struct {
		name, file, text, bad, says string
	}{
		{name: "tool kind", file: "tools.json", bad: `{"name": "send_reminder"`, says: `kind must be "read" or "write", got "reed"`,
			text: `{"tools": [
  {"name": "lookup_schedule", "kind": "read"},
  {"name": "send_reminder", "kind": "reed"}
]}`},
		{name: "red flag pattern", file: "rules.json", bad: `{"name": "open"`, says: "missing closing )",
			text: `{"red_flags": [
    {"name": "chest-pain", "pattern": "chest pain", "flag": "acute", "template": "Call now."},
    {"name": "open", "pattern": "(unclosed", "flag": "acute", "template": "Call now."}
  ]}`},
		{name: "approval decision", file: "rules.json", bad: `{"tool": "send_reminder"`, says: `decision must be allow, ask or deny, got "maybe"`,
			text: `{"approvals": [
    {"tool": "lookup_schedule", "decision": "allow"},
    {"tool": "send_reminder", "decision": "maybe"}
  ]}`},
		{name: "redaction detector", file: "redaction.json", bad: `["email", "iban"]`, says: `unknown detector "iban"`,
			text: `{"fields": ["status"],
  "detectors": ["email", "iban"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := variant(t, 2, func(dir string) { writeFile(t, dir, tc.file, tc.text) })
			off := strings.Index(tc.text, tc.bad)
			line := strings.Count(tc.text[:off], "\n") + 1
			col := off - strings.LastIndex(tc.text[:off], "\n")
			_, err := firmware.Load(dir, testKeyring(t))
			var fe *firmware.FileError
			if !errors.Is(err, firmware.ErrMalformed) || !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%v, want a *FileError wrapping ErrMalformed that says %s", err, tc.says)
			}
			if fe.File != tc.file || fe.Line != line || fe.Column != col {
				t.Fatalf("%v: at %s:%d:%d, want %s:%d:%d", err, fe.File, fe.Line, fe.Column, tc.file, line, col)
			}
		})
	}
}

// A redaction field that no outcome has keeps nothing, so that what it
// meant to send would stay on the appliance unseen: Load and Install refuse
// it at its line and column, naming the field and the fields an outcome
// has. A member of
// a real field, and "*", pass. A bundle checked no more than that before,
// such as the copy kept of an earlier binary's embedded bundle, still
// serves the runs pinned to it: opening it does not check.
func TestRedactionFieldsNameOutcomeFields(t *testing.T) {
	bad := `{"fields": ["status", "output.final",
  "created_at"], "detectors": []}`
	dir := variant(t, 2, func(dir string) { writeFile(t, dir, "redaction.json", bad) })
	requireRefusedAt(t, dir, "redaction.json", 2, 3, "",
		`field "created_at" keeps nothing: an outcome record has no field "created_at" (its fields: appliance_id, seq, outcome_id, correlation_id, `)

	for _, good := range []string{`{"fields": ["status", "output.final", "*.name", "flags"]}`, `{"fields": ["*"]}`} {
		ok := variant(t, 3, func(dir string) { writeFile(t, dir, "redaction.json", good) })
		if _, err := firmware.Load(ok, testKeyring(t)); err != nil {
			t.Fatalf("%s: %v", good, err)
		}
		if _, err := newInstaller(t, t.TempDir()).Install(ok, firmware.InstallOptions{}); err != nil {
			t.Fatalf("%s: %v", good, err)
		}
	}

	data := t.TempDir()
	manifest, err := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	pinned := engine.BundleRef{Name: "patterns", Version: 2, Digest: firmware.Digest(manifest)}
	kept := filepath.Join(data, "firmware", ".embedded", pinned.Name, "2-"+strings.TrimPrefix(pinned.Digest, "sha256:"))
	if err := os.CopyFS(kept, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	a, err := firmware.Resolver(newInstaller(t, data))("sequential", pinned)
	if err != nil || a.Bundle != pinned {
		t.Fatalf("a run pinned to the kept copy: %+v, %v", a, err)
	}
}

// An installed version is read and verified at its first Open; opened
// again, or for another Runtime once SetRuntime changes it, it is loaded
// from what was verified. The embedded bundle is verified at its first
// load in a process.
func TestBundlesAreVerifiedOnceAProcess(t *testing.T) {
	in := newInstaller(t, t.TempDir())
	if _, err := in.Install(variant(t, 2, nil), firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	before := firmware.Verifications()
	plain, err := in.Open("patterns", 2)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := in.Open("patterns", 2); err != nil || again != plain {
		t.Fatalf("open again: %p, %v; want the bundle opened first, %p", again, err, plain)
	}
	rt := &firmware.Runtime{}
	in.SetRuntime(rt)
	forRT, err := in.Open("patterns", 2)
	if err != nil {
		t.Fatal(err)
	}
	if forRT.Runtime() != rt || plain.Runtime() != nil || forRT.Digest != plain.Digest {
		t.Fatalf("opened for the runtime: %p (digest %s), want a bundle for %p (digest %s)", forRT.Runtime(), forRT.Digest, rt, plain.Digest)
	}
	if n := firmware.Verifications() - before; n != 1 {
		t.Fatalf("the installed version was verified %d times, want once", n)
	}

	if _, err := firmware.Reference(); err != nil {
		t.Fatal(err)
	}
	before = firmware.Verifications()
	if b, err := firmware.ReferenceWithRuntime(rt); err != nil || b.Runtime() != rt {
		t.Fatalf("reference for a runtime: %v", err)
	}
	if n := firmware.Verifications() - before; n != 0 {
		t.Fatalf("the embedded bundle was verified %d more times", n)
	}
}
