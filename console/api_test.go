package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/internal/fsync"
)

func TestAuthHostOrigin(t *testing.T) {
	e := newEnv(t, func(c *console.Config) { c.AllowHosts = []string{"outpost.clinic.local"} })
	for _, tc := range []struct {
		name    string
		path    string
		headers []string
		status  int
		code    string
	}{
		{"no token", "/api/v1/runs", []string{"Authorization", ""}, 401, "unauthorized"},
		{"bad token", "/api/v1/runs", []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"token in the wrong scheme", "/api/v1/runs", []string{"Authorization", "Basic " + e.token}, 401, "unauthorized"},
		{"metrics need the token", "/metrics", []string{"Authorization", ""}, 401, "unauthorized"},
		{"healthz with a wrong token", "/healthz", []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"rebinding host", "/api/v1/runs", []string{"Host", "evil.example:7070"}, 421, "bad_host"},
		{"rebinding host on the page", "/", []string{"Host", "evil.example"}, 421, "bad_host"},
		{"foreign origin", "/api/v1/runs", []string{"Origin", "http://evil.example"}, 403, "bad_origin"},
		{"unknown route", "/api/v1/nothing", nil, 404, "not_found"},
		{"good", "/api/v1/runs", nil, 200, ""},
		{"allowed extra host", "/api/v1/runs", []string{"Host", "outpost.clinic.local:7070"}, 200, ""},
		{"loopback origin", "/api/v1/runs", []string{"Origin", "http://localhost:7070"}, 200, ""},
		{"page needs no token", "/", []string{"Authorization", ""}, 200, ""},
		{"script needs no token", "/app.js", []string{"Authorization", ""}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("GET", tc.path, nil, tc.headers...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.code != "" {
				if got := r.errCode(t); got != tc.code {
					t.Fatalf("code %q, want %q", got, tc.code)
				}
			}
		})
	}
	// A probe with no token gets the overall state and nothing more; the
	// components take the token.
	r := e.do("GET", "/healthz", nil, "Authorization", "")
	if m := r.json(t); r.status != 200 || m["status"] != "ok" || len(m) != 1 {
		t.Fatalf("healthz without a token: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/healthz", nil)
	if m := r.json(t); r.status != 200 || m["components"] == nil {
		t.Fatalf("healthz with the token: %d %s", r.status, r.body)
	}
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	var synced []string
	defer fsync.Observe(func(d string) { synced = append(synced, d) })()
	tok, created, err := console.LoadOrCreateToken(dir)
	if err != nil || !created || len(tok) != 64 {
		t.Fatalf("first start: %q %v %v", tok, created, err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Fatalf("the new token file's folder was not fsynced: %q", synced)
	}
	synced = nil
	fi, err := os.Stat(filepath.Join(dir, console.TokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", fi.Mode(), err)
	}
	again, created, err := console.LoadOrCreateToken(dir)
	if err != nil || created || again != tok || len(synced) != 0 {
		t.Fatalf("second start: %q %v %v, folders fsynced %q", again, created, err, synced)
	}
	os.Chmod(filepath.Join(dir, console.TokenFile), 0o644)
	if got, err := console.ReadToken(dir); err != nil || got != tok {
		t.Fatalf("read: %q %v", got, err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, console.TokenFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("a readable token file was not tightened: %v", fi.Mode())
	}
	if _, err := console.ReadToken(t.TempDir()); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, console.ErrTokenFile) {
		t.Fatalf("missing token: %v", err)
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr string
		tls  bool
		ok   bool
	}{
		{"127.0.0.1:7070", false, true},
		{"localhost:7070", false, true},
		{"[::1]:7070", false, true},
		{"0.0.0.0:7070", false, false},
		{":7070", false, false},
		{"192.168.1.20:7070", false, false},
		{"0.0.0.0:7070", true, true},
		{"nonsense", false, false},
	} {
		err := console.CheckListen(tc.addr, tc.tls)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %v) = %v", tc.addr, tc.tls, err)
		}
		if !tc.ok && tc.addr != "nonsense" && !errors.Is(err, console.ErrNoTLS) {
			t.Errorf("CheckListen(%q): %v does not wrap ErrNoTLS", tc.addr, err)
		}
	}
}

func TestRunCompletesWithWait(t *testing.T) {
	e := newEnv(t, nil)
	status, run := e.startRun("t1", "I forgot my dose", "20s")
	if status != http.StatusCreated || run["status"] != "completed" {
		t.Fatalf("%d %v", status, run)
	}
	for _, k := range []string{"id", "thread", "agent", "status", "bundle", "correlation_id", "created_at", "ended_at", "output"} {
		if _, ok := run[k]; !ok {
			t.Errorf("run JSON lacks %q: %v", k, run)
		}
	}
	if b := run["bundle"].(map[string]any); b["name"] != "test-bundle" || b["version"] != 3.0 || b["digest"] != "sha256:test" {
		t.Errorf("bundle: %v", b)
	}
	if !strings.Contains(run["output"].(string), "Goodbye") {
		t.Errorf("output: %v", run["output"])
	}
	got := e.do("GET", "/api/v1/runs/"+run["id"].(string), nil)
	if got.status != 200 || got.json(t)["status"] != "completed" {
		t.Fatalf("get: %d %s", got.status, got.body)
	}
	// Without wait: 201 at once, with a correlation id of the caller's.
	r := e.do("POST", "/api/v1/threads/t2/runs", map[string]any{"agent": testAgent, "input": "x", "correlation_id": "corr-42", "tools": []string{}})
	if r.status != 201 || r.json(t)["correlation_id"] != "corr-42" {
		t.Fatalf("start without wait: %d %s", r.status, r.body)
	}
	e.waitStatus(r.json(t)["id"].(string), "completed")
}

func TestInterruptApproveThroughAPI(t *testing.T) {
	e := newEnv(t, nil)
	status, run := e.startRun("care-1", "please review this", "20s")
	if status != http.StatusCreated || run["status"] != "interrupted" {
		t.Fatalf("want 201 interrupted, got %d %v", status, run)
	}
	ins := run["interrupts"].([]any)
	in := ins[0].(map[string]any)
	if in["node"] != "review" || in["id"] == "" || in["payload"].(map[string]any)["reason"] != "uncited" {
		t.Fatalf("interrupt: %v", in)
	}
	id := run["id"].(string)
	// A second run on a thread that waits for review is refused.
	before := e.snapshot()
	busy := e.do("POST", "/api/v1/threads/care-1/runs", map[string]any{"agent": testAgent, "input": "again"})
	if busy.status != 409 || busy.errCode(t) != "thread_busy" || e.snapshot() != before {
		t.Fatalf("busy thread: %d %s", busy.status, busy.body)
	}
	r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve", "reason": "looks right", "wait": "20s"},
		"X-Operator", "Nurse Alice")
	if r.status != 200 {
		t.Fatalf("resume: %d %s", r.status, r.body)
	}
	done := r.json(t)
	if done["status"] != "completed" {
		t.Fatalf("after approve: %v", done)
	}
	ds := done["decisions"].([]any)
	d := ds[0].(map[string]any)
	if d["decision"] != "approve" || d["by"] != "Nurse Alice (console-token)" || d["reason"] != "looks right" || d["at"] == "" || d["interrupt"] != in["id"] {
		t.Fatalf("decision record: %v", d)
	}
	// The decision shows in the thread's history too.
	h := e.do("GET", "/api/v1/threads/care-1/history", nil).json(t)
	hd := h["decisions"].([]any)
	if len(hd) != 1 || hd[0].(map[string]any)["by"] != "Nurse Alice (console-token)" || hd[0].(map[string]any)["run"] != id {
		t.Fatalf("history decisions: %v", hd)
	}
	// Resuming again: 409, nothing changes.
	before = e.snapshot()
	again := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve"})
	if again.status != 409 || again.errCode(t) != "not_interrupted" || e.snapshot() != before {
		t.Fatalf("second resume: %d %s", again.status, again.body)
	}
}

// TestOperatorNameIsRecordedWhole: the name that X-Operator gives is
// recorded with the decision as written, whatever its script: as UTF-8,
// and as Latin-1 bytes, which is what a browser sends for a name written
// into a header as is; a long one is cut between two letters.
func TestOperatorNameIsRecordedWhole(t *testing.T) {
	e := newEnv(t, nil)
	for i, tc := range []struct{ header, by string }{
		{"Dr M\xfcller", "Dr Müller (console-token)"},
		{"张医生 Müller", "张医生 Müller (console-token)"},
		{strings.Repeat("é", 70), strings.Repeat("é", 64) + " (console-token)"},
	} {
		_, run := e.startRun(fmt.Sprintf("operator-%d", i), "please review this", "10s")
		r := e.do("POST", "/api/v1/runs/"+run["id"].(string)+"/resume", map[string]any{"decision": "approve", "wait": "10s"},
			"X-Operator", tc.header)
		if r.status != 200 {
			t.Fatalf("resume with X-Operator %q: %d %s", tc.header, r.status, r.body)
		}
		d := r.json(t)["decisions"].([]any)[0].(map[string]any)
		if d["by"] != tc.by {
			t.Errorf("X-Operator %q is recorded as %q, want %q", tc.header, d["by"], tc.by)
		}
	}
}

func TestEditAndReject(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		body map[string]any
		want string
		by   string
	}{
		{map[string]any{"decision": "edit", "value": "Call the clinic.", "wait": 20}, "Call the clinic. Goodbye.", "console-token"},
		{map[string]any{"decision": "reject", "reason": "unsafe", "wait": "20s"}, "withheld by a reviewer Goodbye.", "console-token"},
	} {
		_, run := e.startRun("t-"+tc.body["decision"].(string), "review me", "20s")
		r := e.do("POST", "/api/v1/runs/"+run["id"].(string)+"/resume", tc.body)
		m := r.json(t)
		if r.status != 200 || m["output"] != tc.want {
			t.Fatalf("%v: %d %s", tc.body, r.status, r.body)
		}
		d := m["decisions"].([]any)[0].(map[string]any)
		if d["by"] != tc.by || d["decision"] != tc.body["decision"] {
			t.Fatalf("decision: %v", d)
		}
		if tc.body["decision"] == "edit" && d["value"] != "Call the clinic." {
			t.Fatalf("edit value not recorded: %v", d)
		}
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	e := newEnv(t, nil)
	_, done := e.startRun("done", "hello", "20s")
	_, paused := e.startRun("paused", "review it", "20s")
	pausedID := paused["id"].(string)
	big := `{"agent":"` + testAgent + `","input":"` + strings.Repeat("a", 1<<20+10) + `"}`
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   string
	}{
		{"malformed JSON", "POST", "/api/v1/threads/x/runs", `{"agent":`, 400, "bad_json"},
		{"trailing data", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test"} {}`, 400, "bad_json"},
		{"unknown field", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","inptu":"x"}`, 400, "unknown_field"},
		{"field in another case", "POST", "/api/v1/threads/x/runs", `{"AGENT":"review-test","input":"x"}`, 400, "unknown_field"},
		{"duplicate field", "POST", "/api/v1/threads/x/runs", `{"agent":"nope","agent":"review-test","input":"x"}`, 400, "duplicate_field"},
		{"array body", "POST", "/api/v1/threads/x/runs", `[{"agent":"review-test","input":"x"}]`, 400, "bad_json"},
		{"no input", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test"}`, 422, "input_required"},
		{"null input", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":null}`, 422, "input_required"},
		{"empty input", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":""}`, 422, "input_required"},
		{"correlation id too long", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","correlation_id":"` + strings.Repeat("c", 201) + `"}`, 400, "bad_correlation_id"},
		{"correlation id with NUL", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","correlation_id":"a\nb\u0000"}`, 400, "bad_correlation_id"},
		{"tool the agent has not", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","tools":["kb_search"]}`, 422, "unknown_tool"},
		{"tool named twice", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","tools":["a","a"]}`, 400, "bad_tools"},
		{"body too large", "POST", "/api/v1/threads/x/runs", big, 413, "body_too_large"},
		{"no agent", "POST", "/api/v1/threads/x/runs", `{"input":"x"}`, 422, "agent_required"},
		{"unknown agent", "POST", "/api/v1/threads/x/runs", `{"agent":"nope","input":"x"}`, 422, "unknown_agent"},
		{"bad input", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":42}`, 422, "bad_input"},
		{"bad wait", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","wait":"soon"}`, 400, "bad_wait"},
		{"unknown run", "GET", "/api/v1/runs/run_0000000000000000", nil, 404, "run_not_found"},
		{"resume unknown run", "POST", "/api/v1/runs/run_0000000000000000/resume", `{"decision":"approve"}`, 404, "run_not_found"},
		{"cancel unknown run", "POST", "/api/v1/runs/nope/cancel", nil, 404, "run_not_found"},
		{"resume a completed run", "POST", "/api/v1/runs/" + done["id"].(string) + "/resume", `{"decision":"approve"}`, 409, "not_interrupted"},
		{"cancel a completed run", "POST", "/api/v1/runs/" + done["id"].(string) + "/cancel", nil, 409, "run_ended"},
		{"bad decision", "POST", "/api/v1/runs/" + pausedID + "/resume", `{"decision":"maybe"}`, 422, "bad_decision"},
		{"edit without value", "POST", "/api/v1/runs/" + pausedID + "/resume", `{"decision":"edit"}`, 422, "value_required"},
		{"edit with a null value", "POST", "/api/v1/runs/" + pausedID + "/resume", `{"decision":"edit","value":null}`, 422, "value_required"},
		{"resume field in another case", "POST", "/api/v1/runs/" + pausedID + "/resume", `{"Decision":"approve"}`, 400, "unknown_field"},
		{"unknown interrupt", "POST", "/api/v1/runs/" + pausedID + "/resume", `{"decision":"approve","interrupt":"int_x"}`, 422, "unknown_interrupt"},
		{"malformed resume", "POST", "/api/v1/runs/" + pausedID + "/resume", `decision=approve`, 400, "bad_json"},
		{"bad status filter", "GET", "/api/v1/runs?status=happy", nil, 400, "bad_status"},
		{"bad limit", "GET", "/api/v1/runs?limit=-3", nil, 400, "bad_limit"},
		{"list after garbage", "GET", "/api/v1/runs?after=garbage", nil, 400, "bad_after"},
		{"list after a malformed run id", "GET", "/api/v1/runs?after=run_zzzzzzzzzzzzzzzz", nil, 400, "bad_after"},
		{"list after an upper-case run id", "GET", "/api/v1/runs?after=" + strings.ToUpper(done["id"].(string)), nil, 400, "bad_after"},
		{"history after garbage", "GET", "/api/v1/threads/done/history?after=garbage", nil, 400, "bad_after"},
		{"history before garbage", "GET", "/api/v1/threads/done/history?before=garbage", nil, 400, "bad_after"},
		{"history after another thread's checkpoint", "GET", "/api/v1/threads/done/history?after=" + e.head("paused"), nil, 400, "bad_after"},
		{"history of an unknown thread", "GET", "/api/v1/threads/nobody/history", nil, 404, "thread_not_found"},
		{"fork an unknown thread", "POST", "/api/v1/threads/nobody/fork", `{"checkpoint":"x"}`, 404, "thread_not_found"},
		{"fork a paused thread", "POST", "/api/v1/threads/paused/fork", `{"checkpoint":"x"}`, 409, "thread_busy"},
		{"fork an unknown checkpoint", "POST", "/api/v1/threads/done/fork", `{"checkpoint":"0000000000000001"}`, 404, "checkpoint_not_found"},
		{"fork without checkpoint", "POST", "/api/v1/threads/done/fork", `{}`, 422, "checkpoint_required"},
		{"graph of an unknown agent", "GET", "/api/v1/agents/nope/graph", nil, 404, "unknown_agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot()
			r := e.do(tc.method, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %.300s", r.status, tc.status, r.body)
			}
			if got := r.errCode(t); got != tc.code {
				t.Fatalf("code %q, want %q", got, tc.code)
			}
			if after := e.snapshot(); after != before {
				t.Fatalf("the refused request changed the store:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	// The paused run is still answerable after all that.
	r := e.do("POST", "/api/v1/runs/"+pausedID+"/resume", map[string]any{"decision": "approve", "wait": "20s"})
	if r.status != 200 || r.json(t)["status"] != "completed" {
		t.Fatalf("resume after refusals: %d %s", r.status, r.body)
	}
}

func TestConcurrentRunOnThreadAndCancel(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("busy", "block here", "")
	id := run["id"].(string)
	e.waitStatus(id, "running")
	// wait runs out: 201 all the same, reported running, never a failure.
	r := e.do("POST", "/api/v1/threads/other/runs", map[string]any{"agent": testAgent, "input": "block too", "wait": "200ms"})
	if r.status != http.StatusCreated || r.json(t)["status"] != "running" {
		t.Fatalf("wait ran out: %d %s", r.status, r.body)
	}
	before := e.snapshot()
	busy := e.do("POST", "/api/v1/threads/busy/runs", map[string]any{"agent": testAgent, "input": "again"})
	if busy.status != 409 || busy.errCode(t) != "thread_busy" {
		t.Fatalf("second run: %d %s", busy.status, busy.body)
	}
	if e.snapshot() != before {
		t.Fatal("the refused run changed the store")
	}
	list := e.do("GET", "/api/v1/runs?status=running", nil).json(t)
	if n := len(list["runs"].([]any)); n != 2 {
		t.Fatalf("running runs: %d: %v", n, list)
	}
	c := e.do("POST", "/api/v1/runs/"+id+"/cancel", nil)
	if c.status != 200 {
		t.Fatalf("cancel: %d %s", c.status, c.body)
	}
	e.waitStatus(id, "cancelled")
	e.unblock()
}

func TestListPaging(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for _, th := range []string{"a", "b", "c", "d", "e"} {
		_, run := e.startRun("page-"+th, "hi", "20s")
		ids = append(ids, run["id"].(string))
	}
	var got []string
	after := ""
	pages := 0
	for {
		m := e.do("GET", "/api/v1/runs?limit=2&agent="+testAgent+"&after="+after, nil).json(t)
		for _, r := range m["runs"].([]any) {
			got = append(got, r.(map[string]any)["id"].(string))
		}
		pages++
		next, ok := m["next"].(string)
		if !ok {
			break
		}
		after = next
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") || pages != 3 {
		t.Fatalf("paged %v in %d pages, want %v", got, pages, ids)
	}
	m := e.do("GET", "/api/v1/runs?thread=page-c", nil).json(t)
	if rs := m["runs"].([]any); len(rs) != 1 || rs[0].(map[string]any)["id"] != ids[2] {
		t.Fatalf("thread filter: %v", m)
	}
	m = e.do("GET", "/api/v1/runs?status=interrupted", nil).json(t)
	if rs := m["runs"].([]any); len(rs) != 0 {
		t.Fatalf("status filter: %v", m)
	}
}

// TestListCountsWhatWaits: the first page of a listing of interrupted runs
// counts every run waiting for review that the filter matches, and the
// questions they wait on, however small the page; a later page, and a
// listing of another status, leave the count out.
func TestListCountsWhatWaits(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("count-done", "hello", "20s")
	for _, th := range []string{"a", "b"} {
		e.startRun("count-"+th, "please review this", "20s")
	}
	e.startTwoQuestions("count-two")
	for _, c := range []struct {
		query string
		want  any
	}{
		{"?status=interrupted&limit=1", map[string]any{"runs": 3.0, "questions": 4.0}},
		{"?status=interrupted&limit=1&order=desc", map[string]any{"runs": 3.0, "questions": 4.0}},
		{"?status=interrupted&thread=count-two", map[string]any{"runs": 1.0, "questions": 2.0}},
		{"?status=interrupted&agent=" + testAgent, map[string]any{"runs": 2.0, "questions": 2.0}},
		{"?status=interrupted&thread=count-done", map[string]any{"runs": 0.0, "questions": 0.0}},
		{"?status=completed", nil},
		{"", nil},
	} {
		m := e.do("GET", "/api/v1/runs"+c.query, nil).json(t)
		if !reflect.DeepEqual(m["waiting"], c.want) {
			t.Errorf("%s: waiting %v, want %v", c.query, m["waiting"], c.want)
		}
	}
	first := e.do("GET", "/api/v1/runs?status=interrupted&limit=1", nil).json(t)
	later := e.do("GET", "/api/v1/runs?status=interrupted&limit=1&after="+first["next"].(string), nil).json(t)
	if _, ok := later["waiting"]; ok || len(later["runs"].([]any)) != 1 {
		t.Errorf("a later page: %v", later)
	}
}

// TestListNewestFirst: order=desc lists the newest runs first, and its
// "next" pages on towards older ones; the default order stays oldest
// first. A status read from two stored statuses (running: the store's
// queued and running) keeps the order too.
func TestListNewestFirst(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for _, th := range []string{"a", "b", "c", "d", "e"} {
		_, run := e.startRun("desc-"+th, "hi", "20s")
		ids = append(ids, run["id"].(string))
	}
	page := func(query string) (got []string, next string) {
		t.Helper()
		r := e.do("GET", "/api/v1/runs?"+query, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET /api/v1/runs?%s: %d %s", query, r.status, r.body)
		}
		m := r.json(t)
		for _, run := range m["runs"].([]any) {
			got = append(got, run.(map[string]any)["id"].(string))
		}
		next, _ = m["next"].(string)
		return got, next
	}
	var got []string
	after, pages := "", 0
	for {
		ps, next := page("order=desc&limit=2&after=" + after)
		got = append(got, ps...)
		pages++
		if next == "" {
			break
		}
		after = next
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if strings.Join(got, ",") != strings.Join(want, ",") || pages != 3 {
		t.Fatalf("newest first: paged %v in %d pages, want %v", got, pages, want)
	}
	if got, _ := page("limit=2"); strings.Join(got, ",") != strings.Join(ids[:2], ",") {
		t.Fatalf("the default order: %v, want %v", got, ids[:2])
	}
	if got, _ := page("order=asc&limit=2"); strings.Join(got, ",") != strings.Join(ids[:2], ",") {
		t.Fatalf("order=asc: %v, want %v", got, ids[:2])
	}
	if got, _ := page("order=desc&thread=desc-c"); strings.Join(got, ",") != ids[2] {
		t.Fatalf("newest first on one thread: %v", got)
	}

	// Two runs held running, listed newest first from both stored statuses.
	_, r1 := e.startRun("desc-block-1", "block", "")
	_, r2 := e.startRun("desc-block-2", "block", "")
	for _, id := range []string{r1["id"].(string), r2["id"].(string)} {
		e.waitStatus(id, "running")
	}
	if got, _ := page("order=desc&status=running"); strings.Join(got, ",") != r2["id"].(string)+","+r1["id"].(string) {
		t.Fatalf("running runs newest first: %v, want %v then %v", got, r2["id"], r1["id"])
	}
	e.unblock()

	if r := e.do("GET", "/api/v1/runs?order=newest", nil); r.status != http.StatusBadRequest || r.errCode(t) != "bad_order" {
		t.Fatalf("order=newest: %d %s", r.status, r.body)
	}
}

func TestHistoryAndFork(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("h", "hello", "20s")
	h := e.do("GET", "/api/v1/threads/h/history", nil)
	if h.status != 200 {
		t.Fatalf("history: %d %s", h.status, h.body)
	}
	cps := h.json(t)["checkpoints"].([]any)
	if len(cps) < 3 {
		t.Fatalf("checkpoints: %v", cps)
	}
	newest, oldest := cps[0].(map[string]any), cps[len(cps)-1].(map[string]any)
	if newest["id"].(string) <= oldest["id"].(string) {
		t.Fatalf("history is not newest first: %v", cps)
	}
	f := e.do("POST", "/api/v1/threads/h/fork", map[string]any{"checkpoint": oldest["id"]})
	if f.status != 201 || f.json(t)["parent"] != oldest["id"] {
		t.Fatalf("fork: %d %s", f.status, f.body)
	}
	h2 := e.do("GET", "/api/v1/threads/h/history?limit=1", nil).json(t)
	head := h2["checkpoints"].([]any)[0].(map[string]any)
	if head["source"] != "fork" || head["parent_id"] != oldest["id"] || h2["next"] == nil {
		t.Fatalf("after fork: %v", h2)
	}

	// A checkpoint that is not there is said in a line, under the same code.
	f = e.do("POST", "/api/v1/threads/h/fork", map[string]any{"checkpoint": "0000000000000001"})
	want := `thread "h" has no checkpoint "0000000000000001" (GET /api/v1/threads/h/history lists them)`
	if f.status != http.StatusNotFound || f.errCode(t) != "checkpoint_not_found" || f.json(t)["error"].(map[string]any)["message"] != want {
		t.Fatalf("fork an unknown checkpoint: %d %s, want 404 checkpoint_not_found %q", f.status, f.body, want)
	}
}

func TestFirmwareUplinkHealthMetricsGraph(t *testing.T) {
	e := newEnv(t, func(c *console.Config) {
		c.Health = []console.HealthCheck{{Name: "model", Check: func(ctx context.Context) console.Health {
			return console.Health{State: console.StateDegraded, Detail: "no Ollama reachable at http://127.0.0.1:11434: using the scripted model"}
		}}}
	})
	fw := e.do("GET", "/api/v1/firmware", nil).json(t)
	if b := fw["bundles"].([]any)[0].(map[string]any); b["name"] != "test-bundle" || b["active"] != true {
		t.Fatalf("firmware: %v", fw)
	}
	up := e.do("GET", "/api/v1/uplink", nil).json(t)
	if up["configured"] != false || up["backlog"] != 0.0 || up["note"] == "" {
		t.Fatalf("uplink: %v", up)
	}
	hz := e.do("GET", "/healthz", nil)
	m := hz.json(t)
	if hz.status != 200 || m["status"] != "degraded" || len(m["degraded"].([]any)) != 1 || m["degraded"].([]any)[0] != "model" {
		t.Fatalf("healthz: %d %s", hz.status, hz.body)
	}
	comps := m["components"].(map[string]any)
	for _, c := range []string{"store", "model", "bundle", "uplink"} {
		if _, ok := comps[c]; !ok {
			t.Errorf("healthz lacks %s: %v", c, comps)
		}
	}
	if comps["uplink"].(map[string]any)["state"] != "not_configured" || comps["store"].(map[string]any)["state"] != "ok" {
		t.Errorf("components: %v", comps)
	}

	e.startRun("m1", "deny this", "20s")
	e.startRun("m2", "review", "20s")
	// The denial is counted from the event stream: poll until it lands.
	deadline := time.Now().Add(20 * time.Second)
	var text string
	for {
		r := e.do("GET", "/metrics", nil)
		text = string(r.body)
		if strings.Contains(text, "outpost_tool_denied_total 1\n") || time.Now().After(deadline) {
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Fatalf("metrics content type %q", ct)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		"outpost_tool_denied_total 1\n",
		`outpost_runs{status="completed"} 1`,
		`outpost_runs{status="interrupted"} 1`,
		"# TYPE outpost_step_duration_seconds histogram",
		"outpost_commit_duration_seconds_count ",
		"outpost_blob_bytes_written_total ",
		"outpost_uplink_backlog 0\n",
		"outpost_store_bytes ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "outpost_step_duration_seconds_count 0\n") || strings.Contains(text, "outpost_commit_duration_seconds_count 0\n") {
		t.Errorf("latencies not observed:\n%s", text)
	}

	g := e.do("GET", "/api/v1/agents/"+testAgent+"/graph", nil).json(t)
	if strings.Join(toStrings(g["nodes"]), ",") != "draft,review,closing" || !strings.Contains(g["mermaid"].(string), "review") {
		t.Fatalf("graph: %v", g)
	}
	ag := e.do("GET", "/api/v1/agents", nil).json(t)
	if strings.Join(toStrings(ag["agents"]), ",") != testAgent {
		t.Fatalf("agents: %v", ag)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// A store that takes no more writes is down in /healthz, whatever its
// reads say.
func TestHealthReportsAStoreThatTakesNoWrites(t *testing.T) {
	var writeErr atomic.Pointer[error]
	e := newEnv(t, func(c *console.Config) {
		c.StoreWrites = func() error {
			if p := writeErr.Load(); p != nil {
				return *p
			}
			return nil
		}
	})
	hz := e.do("GET", "/healthz", nil)
	if hz.status != 200 {
		t.Fatalf("healthz: %d %s", hz.status, hz.body)
	}
	eio := errors.New("a write to the store file failed; the store takes no more writes until outpost restarts: fdatasync: input/output error")
	writeErr.Store(&eio)
	hz = e.do("GET", "/healthz", nil)
	m := hz.json(t)
	store := m["components"].(map[string]any)["store"].(map[string]any)
	if hz.status != http.StatusServiceUnavailable || m["status"] != "down" || store["state"] != "down" ||
		!strings.Contains(store["detail"].(string), "input/output error") || !strings.Contains(store["detail"].(string), "restart") {
		t.Fatalf("healthz: %d %s", hz.status, hz.body)
	}
}

// A resume without wait answers with the run as it now stands, queued with
// its interrupt answered, not with the interrupted record from before.
func TestResumeWithoutWaitReportsTheRunQueued(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("care-q", "please review this", "20s")
	id := run["id"].(string)
	r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve"})
	m := r.json(t)
	if r.status != http.StatusOK || m["status"] == "interrupted" || m["interrupts"] != nil {
		t.Fatalf("resume without wait: %d %s", r.status, r.body)
	}
	e.waitStatus(id, "completed")
}

// /metrics gives the ledger's backlog as GET /api/v1/uplink does, with an
// uplink configured or not.
func TestMetricsBacklogMatchesTheAPI(t *testing.T) {
	e := newEnv(t, func(c *console.Config) {
		c.Uplink = func(context.Context) (*console.UplinkStatus, error) {
			return &console.UplinkStatus{LastSeq: 39, Backlog: 39, Note: "no uplink configured"}, nil
		}
	})
	r := e.do("GET", "/api/v1/uplink", nil)
	if r.json(t)["backlog"] != float64(39) {
		t.Fatalf("uplink: %s", r.body)
	}
	text := string(e.do("GET", "/metrics", nil).body)
	for _, want := range []string{"outpost_uplink_backlog 39\n", "outpost_uplink_configured 0\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// /metrics counts a run by the status GET /api/v1/runs/{id} gives it: one
// that a worker executes is running, one that waits for a worker queued.
// Before, every run the manager held that was not paused counted as
// running, the ones waiting for a worker too.
func TestMetricsCountRunsWaitingForAWorkerAsQueued(t *testing.T) {
	e := newEnv(t, nil) // 4 workers
	const runs = 6
	var ids []string
	for i := range runs {
		_, run := e.startRun(fmt.Sprintf("w%d", i), "block", "")
		ids = append(ids, run["id"].(string))
	}
	statuses := func() map[string]int {
		n := map[string]int{}
		for _, id := range ids {
			n[e.do("GET", "/api/v1/runs/"+id, nil).json(t)["status"].(string)]++
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for got := statuses(); got["running"] != 4; got = statuses() {
		if time.Now().After(deadline) {
			t.Fatalf("the API never showed 4 runs running: %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := statuses()
	if want["queued"] != runs-4 {
		t.Fatalf("the API shows %v, not 4 running and %d queued", want, runs-4)
	}
	text := string(e.do("GET", "/metrics", nil).body)
	for st, n := range want {
		if line := fmt.Sprintf("outpost_runs{status=%q} %d\n", st, n); !strings.Contains(text, line) {
			t.Errorf("metrics lack %q, as the API counts the runs (%v):\n%s", line, want, text)
		}
	}
	e.unblock()
	for _, id := range ids {
		e.waitStatus(id, "completed")
	}
}

// TestRunFlagsAndToolCalls: a run's flags are in the list and in the run;
// a run's tool calls are in the run, a failed one with its error. A run
// with no flags has none.
func TestRunFlagsAndToolCalls(t *testing.T) {
	e := newFailingToolsEnv(t)
	id := e.failedToolRun("flagged")
	_, calm := e.startRun("calm", "hello", "10s")
	got := e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	if flags, _ := got["flags"].([]any); !slices.Contains(flags, any("tool_failed")) {
		t.Fatalf("the run's flags: %v", got["flags"])
	}
	calls, _ := got["tool_calls"].([]any)
	var failed map[string]any
	for _, c := range calls {
		if m := c.(map[string]any); m["tool"] == "schedule_followup" && m["status"] == "done" && m["decision"] == "approve" {
			failed = m
		}
	}
	if failed == nil || !strings.Contains(failed["error"].(string), "is a directory") || failed["args"] == nil {
		t.Fatalf("the run's tool calls: %v", calls)
	}
	list := e.do("GET", "/api/v1/runs", nil).json(t)["runs"].([]any)
	for _, r := range list {
		m := r.(map[string]any)
		flags, _ := m["flags"].([]any)
		switch m["id"] {
		case id:
			if !slices.Contains(flags, any("tool_failed")) {
				t.Fatalf("the listed run's flags: %v", m)
			}
		case calm["id"]:
			if _, ok := m["flags"]; ok {
				t.Fatalf("a run with no flags lists %v", m["flags"])
			}
		}
		if _, ok := m["tool_calls"]; ok {
			t.Fatalf("a listed run carries its tool calls: %v", m)
		}
	}
}

// GET /api/v1/agents gives each agent's allowlist where its active bundle
// says it: a list ([] for none), or null for an agent that names no tools.
// An agent of an inactive bundle's list is not taken for one offered.
func TestAgentsAllowlists(t *testing.T) {
	e := newEnv(t, func(c *console.Config) {
		c.Agents = []string{testAgent, "open", "unknown"}
		c.Bundles = func() []console.BundleInfo {
			return []console.BundleInfo{
				{Name: "old", Version: 1, Active: false, Agents: []string{"unknown"}, Allowlists: map[string][]string{"unknown": {"shell"}}},
				{Name: "test-bundle", Version: 3, Active: true, Agents: []string{testAgent, "open"},
					Allowlists: map[string][]string{testAgent: {"kb_search"}, "open": nil}},
			}
		}
	})
	r := e.do("GET", "/api/v1/agents", nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	want := `{"agents":["` + testAgent + `","open","unknown"],"allowlists":{"open":null,"` + testAgent + `":["kb_search"]}}`
	var got, exp any
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(want), &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("agents: %s, want %s", r.body, want)
	}
}
