package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// errMessage returns the message of an error response.
func (r resp) errMessage(t *testing.T) string {
	t.Helper()
	r.errCode(t)
	return r.json(t)["error"].(map[string]any)["message"].(string)
}

// TestHistoryPagesWithAfter follows history's "next" with "after", as
// DESIGN gives lists, and with the older "before" alias: each way reads
// every checkpoint once, newest first, and ends.
func TestHistoryPagesWithAfter(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("hp", "hello", "20s")
	e.startRun("hp", "again", "20s")
	all := e.do("GET", "/api/v1/threads/hp/history", nil).json(t)["checkpoints"].([]any)
	var want []string
	for _, c := range all {
		want = append(want, c.(map[string]any)["id"].(string))
	}
	if len(want) < 4 {
		t.Fatalf("history: %v", want)
	}
	for _, param := range []string{"after", "before"} {
		t.Run(param, func(t *testing.T) {
			var got []string
			cursor := ""
			for pages := 0; ; pages++ {
				if pages > len(want) {
					t.Fatalf("paging does not end: %v", got)
				}
				path := "/api/v1/threads/hp/history?limit=3"
				if cursor != "" {
					path += "&" + param + "=" + cursor
				}
				r := e.do("GET", path, nil)
				if r.status != 200 {
					t.Fatalf("%s: %d %s", path, r.status, r.body)
				}
				m := r.json(t)
				for _, c := range m["checkpoints"].([]any) {
					got = append(got, c.(map[string]any)["id"].(string))
				}
				next, ok := m["next"].(string)
				if !ok {
					break
				}
				cursor = next
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("paged %v, want %v", got, want)
			}
		})
	}
	r := e.do("GET", "/api/v1/threads/hp/history?after="+want[1]+"&before="+want[2], nil)
	if r.status != 400 || r.errCode(t) != "bad_after" {
		t.Fatalf("after and before that differ: %d %s", r.status, r.body)
	}
}

// TestWrongMethod: a route that exists, asked with another method, gets
// 405 and an Allow header naming the methods it takes; a path no route
// takes is still 404.
func TestWrongMethod(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		method, path, allow string
	}{
		{"GET", "/api/v1/threads/t1/runs", "POST"},
		{"DELETE", "/api/v1/runs/run_18ed08696733bf49", "GET, HEAD"},
		{"GET", "/api/v1/runs/run_18ed08696733bf49/resume", "POST"},
		{"PUT", "/api/v1/runs", "GET, HEAD"},
		{"POST", "/api/v1/firmware", "GET, HEAD"},
		{"POST", "/api/v1/threads/t1/history", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"POST", "/metrics", "GET, HEAD"},
		{"POST", "/", "GET, HEAD"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := e.do(tc.method, tc.path, nil)
			if r.status != http.StatusMethodNotAllowed || r.errCode(t) != "method_not_allowed" {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Fatalf("Allow %q, want %q", got, tc.allow)
			}
			if msg := r.errMessage(t); strings.Contains(msg, "page") != (tc.path == "/") {
				t.Fatalf("message %q", msg)
			}
		})
	}
	for _, path := range []string{"/api/v1/nothing", "/api/v1/runs/x/y/z"} {
		if r := e.do("DELETE", path, nil); r.status != 404 || r.errCode(t) != "not_found" || r.header.Get("Allow") != "" {
			t.Fatalf("DELETE %s: %d %v %s", path, r.status, r.header, r.body)
		}
	}
}

// TestErrorMessagesNameTheProblem: the messages say what is wrong, in the
// API's terms, not Go's.
func TestErrorMessagesNameTheProblem(t *testing.T) {
	e := newEnv(t, nil)
	_, paused := e.startRun("msg", "review it", "20s")
	for _, tc := range []struct {
		name, method, path, body, code string
		has                            []string
		hasNot                         []string
	}{
		{"unknown field", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","bogus":1}`, "unknown_field", []string{`"bogus"`}, []string{"json:"}},
		{"duplicate field", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","input":"y"}`, "duplicate_field", []string{`"input"`}, nil},
		{"array body", "POST", "/api/v1/threads/x/runs", `["review-test"]`, "bad_json", []string{"JSON object"}, []string{"console.", "Go"}},
		{"limit zero", "GET", "/api/v1/runs?limit=0", "", "bad_limit", []string{"1 to 1000"}, nil},
		{"history limit", "GET", "/api/v1/threads/msg/history?limit=abc", "", "bad_limit", []string{"1 to 1000"}, nil},
		{"edit without value", "POST", "/api/v1/runs/" + paused["id"].(string) + "/resume", `{"decision":"edit"}`, "value_required", []string{"edit", "value"}, []string{"must be approve"}},
		{"tool unknown to the agent", "POST", "/api/v1/threads/x/runs", `{"agent":"review-test","input":"x","tools":["kb_serch"]}`, "unknown_tool", []string{"kb_serch"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body any
			if tc.body != "" {
				body = tc.body
			}
			r := e.do(tc.method, tc.path, body)
			if r.status/100 != 4 || r.errCode(t) != tc.code {
				t.Fatalf("status %d, want code %s: %s", r.status, tc.code, r.body)
			}
			msg := r.errMessage(t)
			for _, s := range tc.has {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q does not say %q", msg, s)
				}
			}
			for _, s := range tc.hasNot {
				if strings.Contains(msg, s) {
					t.Errorf("message %q says %q", msg, s)
				}
			}
		})
	}
	// Over the maximum, limit reads as 1000 (DESIGN: "at most 1000").
	if r := e.do("GET", "/api/v1/runs?limit=1001", nil); r.status != 200 {
		t.Fatalf("limit=1001: %d %s", r.status, r.body)
	}
	// A printable correlation id of 200 characters is taken and echoed.
	corr := strings.Repeat("c", 200)
	r := e.do("POST", "/api/v1/threads/corr/runs", map[string]any{"agent": testAgent, "input": "x", "correlation_id": corr, "wait": "20s"})
	if r.status != 201 || r.json(t)["correlation_id"] != corr {
		t.Fatalf("a 200-character correlation id: %d %.300s", r.status, r.body)
	}
}

// TestToolOverrideFailsClosed: with a bundle agent, a tools override that
// names a tool outside the agent's registry, or one the appliance leaves
// out, is refused before anything is written; the tools it may have pass.
func TestToolOverrideFailsClosed(t *testing.T) {
	const agent = "medication-adherence-tools"
	b, err := firmware.ReferenceWithRuntime(&firmware.Runtime{Tools: []string{"kb_search", "current_time"}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *console.Config) {
		test := c.Resolve
		// The console checks the override against the agent it resolves;
		// the manager does not know this agent, so a request that passes
		// the check is then refused there as an unknown agent.
		c.Resolve = func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
			if name == agent {
				return b.Agent(name)
			}
			return test(name, pinned)
		}
	})
	for _, tc := range []struct {
		tools []string
		code  string
		names string
	}{
		{[]string{"no_such_tool"}, "unknown_tool", "no_such_tool"},
		{[]string{"kb_search", "kb_serch"}, "unknown_tool", "kb_serch"},
		{[]string{"record_note"}, "unknown_tool", "record_note"}, // in the registry, left out by the appliance
		{[]string{"kb_search"}, "unknown_agent", ""},
		{[]string{}, "unknown_agent", ""},
	} {
		t.Run(fmt.Sprint(tc.tools), func(t *testing.T) {
			before := e.snapshot()
			r := e.do("POST", "/api/v1/threads/tools/runs", map[string]any{"agent": agent, "input": "I forgot my metformin dose", "tools": tc.tools})
			if r.status != 422 || r.errCode(t) != tc.code {
				t.Fatalf("status %d, want code %s: %s", r.status, tc.code, r.body)
			}
			if tc.names != "" && !strings.Contains(r.errMessage(t), tc.names) {
				t.Fatalf("message does not name %s: %s", tc.names, r.body)
			}
			if e.snapshot() != before {
				t.Fatal("the refused request changed the store")
			}
		})
	}
}

// TestWaitOutlivedIsNotAFailure: DESIGN's accept/poll, in exit durability
// too, where the store has no record of the run until it pauses or ends: a
// run that outlives the request's "wait" is answered 201 and "running",
// not as a failure.
func TestWaitOutlivedIsNotAFailure(t *testing.T) {
	e := newEnvWith(t, t.TempDir(), engine.ManagerOptions{Durability: engine.DurabilityExit}, nil)
	r := e.do("POST", "/api/v1/threads/slow/runs", map[string]any{"agent": testAgent, "input": "block me", "wait": "300ms"})
	if r.status != http.StatusCreated || r.json(t)["status"] != "running" {
		t.Fatalf("a run that outlives its wait: %d %s, want 201 and status running", r.status, r.body)
	}
	e.unblock()
	e.waitStatus(r.json(t)["id"].(string), "completed")
}

// TestCancelChecksItsBodyHoweverSent: a malformed body gets a 4xx and
// changes nothing, whether it comes with a Content-Length or chunked,
// without one; an empty body, or {}, cancels.
func TestCancelChecksItsBodyHoweverSent(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("cancel-body", "block me", "")
	id := run["id"].(string)
	e.waitStatus(id, "running")
	cancel := func(body string, chunked bool) resp {
		t.Helper()
		var rd io.Reader = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // no length known: sent chunked
		}
		ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
		defer stop()
		req, err := http.NewRequestWithContext(ctx, "POST", e.url+"/api/v1/runs/"+id+"/cancel", rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+e.token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp{status: res.StatusCode, header: res.Header, body: b}
	}
	for _, tc := range []struct {
		body    string
		chunked bool
		code    string
	}{
		{"not json", false, "bad_json"},
		{"not json", true, "bad_json"},
		{`{"reason": "x"}`, true, "unknown_field"},
	} {
		if r := cancel(tc.body, tc.chunked); r.status != http.StatusBadRequest || r.errCode(t) != tc.code {
			t.Fatalf("cancel with body %q (chunked %v): %d %s, want 400 %s", tc.body, tc.chunked, r.status, r.body, tc.code)
		}
		if m := e.do("GET", "/api/v1/runs/"+id, nil).json(t); m["status"] != "running" {
			t.Fatalf("a refused cancel changed the run: %v", m["status"])
		}
	}
	if r := cancel("", true); r.status != http.StatusOK || r.json(t)["status"] != "cancelled" {
		t.Fatalf("cancel with an empty chunked body: %d %s", r.status, r.body)
	}
}

// TestRunStatusesAsDesignNamesThem: the run list's status filter takes
// each status DESIGN names, spelled as it spells them, and refuses others.
func TestRunStatusesAsDesignNamesThem(t *testing.T) {
	e := newEnv(t, nil)
	for _, status := range []string{"queued", "running", "interrupted", "completed", "failed", "cancelled", "budget_exceeded"} {
		if r := e.do("GET", "/api/v1/runs?status="+status, nil); r.status != http.StatusOK {
			t.Errorf("status=%s: %d %s", status, r.status, r.body)
		}
	}
	for _, status := range []string{"canceled", "budget-exceeded", "done"} {
		if r := e.do("GET", "/api/v1/runs?status="+status, nil); r.status != http.StatusBadRequest || r.errCode(t) != "bad_status" {
			t.Errorf("status=%s: %d %s, want 400 bad_status", status, r.status, r.body)
		}
	}
}

// TestUplinkStatusAsDesignNamesIt: GET /api/v1/uplink is {"configured",
// "acked_seq", "last_seq", "backlog", "last_error"?, "last_success_at"?}.
func TestUplinkStatusAsDesignNamesIt(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, func(c *console.Config) {
		c.Uplink = func(context.Context) (*console.UplinkStatus, error) {
			return &console.UplinkStatus{Configured: true, AckedSeq: 7, LastSeq: 9, Backlog: 2,
				LastError: "collector answered 503", LastSuccessAt: &at}, nil
		}
	})
	r := e.do("GET", "/api/v1/uplink", nil)
	if r.status != http.StatusOK {
		t.Fatalf("uplink: %d %s", r.status, r.body)
	}
	m := r.json(t)
	for k, want := range map[string]any{"configured": true, "acked_seq": 7.0, "last_seq": 9.0, "backlog": 2.0,
		"last_error": "collector answered 503", "last_success_at": "2026-03-01T12:00:00Z"} {
		if m[k] != want {
			t.Errorf("%s is %#v, want %#v: %s", k, m[k], want, r.body)
		}
	}
}
