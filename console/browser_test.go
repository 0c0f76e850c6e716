package console_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// findChromium returns Debian's chromium, or another Chromium-like browser.
func findChromium() string {
	if p := os.Getenv("OUTPOST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// cdp is a minimal DevTools protocol client over one page target.
type cdp struct {
	t      *testing.T
	conn   *websocket.Conn
	nextID atomic.Int64
	mu     sync.Mutex
	wait   map[int64]chan cdpReply
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (c *cdp) readLoop(ctx context.Context) {
	for {
		_, b, err := c.conn.Read(ctx)
		if err != nil {
			return
		}
		var m struct {
			ID int64 `json:"id"`
			cdpReply
		}
		if json.Unmarshal(b, &m) != nil || m.ID == 0 {
			continue // an event
		}
		c.mu.Lock()
		ch := c.wait[m.ID]
		delete(c.wait, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m.cdpReply
		}
	}
}

func (c *cdp) call(ctx context.Context, method string, params any, out any) {
	c.t.Helper()
	id := c.nextID.Add(1)
	ch := make(chan cdpReply, 1)
	c.mu.Lock()
	c.wait[id] = ch
	c.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("cdp %s: %v", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			c.t.Fatalf("cdp %s: %s", method, r.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				c.t.Fatalf("cdp %s: %v", method, err)
			}
		}
	case <-ctx.Done():
		c.t.Fatalf("cdp %s: %v", method, ctx.Err())
	}
}

// eval runs JavaScript in the page and returns its value.
func (c *cdp) eval(ctx context.Context, js string) any {
	c.t.Helper()
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	c.call(ctx, "Runtime.evaluate", map[string]any{"expression": js, "returnByValue": true, "awaitPromise": true}, &r)
	if r.ExceptionDetails != nil {
		c.t.Fatalf("page threw: %s %s\nin: %s", r.ExceptionDetails.Text, r.ExceptionDetails.Exception.Description, js)
	}
	return r.Result.Value
}

// until polls a JavaScript condition until it is true.
func (c *cdp) until(ctx context.Context, what, js string, shot func(string)) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if v, _ := c.eval(ctx, "!!("+js+")").(bool); v {
			return
		}
		if time.Now().After(deadline) {
			shot("timeout-" + strings.ReplaceAll(what, " ", "-"))
			body, _ := c.eval(ctx, "document.body.innerText").(string)
			dbg, _ := c.eval(ctx, "JSON.stringify([...state.log.values()].map(l => l.map(e => e.seq + ':' + e.type)))").(string)
			c.t.Logf("events seen by the page: %s", dbg)
			c.t.Fatalf("page never showed %s; it shows:\n%s", what, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openChromium starts a headless Chromium (the test is skipped without
// one) and returns a DevTools client on its page, the context to drive it
// with, and a function that saves a screenshot under a name.
func openChromium(t *testing.T) (*cdp, context.Context, func(string)) {
	t.Helper()
	bin := findChromium()
	if bin == "" {
		t.Skip("SKIPPING THE BROWSER TEST: no chromium found (apt-get install -y chromium; .ci/run installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)

	// Not t.TempDir: chromium's helper processes may still write to the
	// profile as the test ends, and its removal must not fail the test.
	profile, err := os.MkdirTemp("", "outpost-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--remote-debugging-port=0", "--user-data-dir="+profile, "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--window-size=1280,960", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		// The browser and its helpers share the process group we gave it.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		for i := 0; i < 20 && os.RemoveAll(profile) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	wsURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "DevTools listening on "); ok {
				wsURL <- u
			}
		}
	}()
	var browserURL string
	select {
	case browserURL = <-wsURL:
	case <-time.After(30 * time.Second):
		t.Fatal("chromium did not print its DevTools address")
	}
	// The page target's own endpoint, from the browser's HTTP listing.
	hostport := strings.SplitN(strings.TrimPrefix(browserURL, "ws://"), "/", 2)[0]
	var pageURL string
	for deadline := time.Now().Add(20 * time.Second); pageURL == ""; {
		res, err := http.Get("http://" + hostport + "/json/list")
		if err == nil {
			var targets []struct{ Type, WebSocketDebuggerURL string }
			json.NewDecoder(res.Body).Decode(&targets)
			res.Body.Close()
			for _, tg := range targets {
				if tg.Type == "page" {
					pageURL = tg.WebSocketDebuggerURL
				}
			}
		}
		if pageURL == "" {
			if time.Now().After(deadline) {
				t.Fatal("no page target in chromium")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	conn, _, err := websocket.Dial(ctx, pageURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(64 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	c := &cdp{t: t, conn: conn, wait: map[int64]chan cdpReply{}}
	go c.readLoop(ctx)

	dirs := []string{t.TempDir()}
	if d := os.Getenv("OUTPOST_ARTIFACTS"); d != "" {
		dirs = append(dirs, d)
	}
	shot := func(name string) {
		var r struct{ Data string }
		c.call(ctx, "Page.captureScreenshot", map[string]any{"format": "png"}, &r)
		png, err := base64.StdEncoding.DecodeString(r.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			os.MkdirAll(d, 0o755)
			p := filepath.Join(d, "console-"+name+".png")
			if err := os.WriteFile(p, png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot %s", p)
		}
	}

	return c, ctx, shot
}

// openPage opens the console page of e, at its sign-in form.
func openPage(ctx context.Context, c *cdp, e *env, shot func(string)) {
	c.t.Helper()
	c.call(ctx, "Page.enable", nil, nil)
	c.call(ctx, "Page.navigate", map[string]any{"url": e.url + "/"}, nil)
	c.until(ctx, "the sign-in form", `document.readyState === "complete" && document.getElementById("token")`, shot)
}

// signIn opens the console page of e and signs in with its token.
func signIn(ctx context.Context, t *testing.T, c *cdp, e *env, shot func(string)) {
	t.Helper()
	signInAs(ctx, t, c, e, shot, "Dr Test")
}

// signInAs signs in as signIn does, under the operator's name given.
func signInAs(ctx context.Context, t *testing.T, c *cdp, e *env, shot func(string), name string) {
	t.Helper()
	openPage(ctx, c, e, shot)
	shot("1-sign-in")
	c.eval(ctx, fmt.Sprintf(`document.getElementById("token").value = %s;
		document.getElementById("operator").value = %s;
		document.getElementById("login-btn").click(); true`, jsString(e.token), jsString(name)))
	c.until(ctx, "the console", `!document.getElementById("main").hidden && document.getElementById("stream").textContent.includes("live") &&
		document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
}

func jsString(s string) string { b, _ := json.Marshal(s); return string(b) }

// startFromPage starts a turn with the page's own form, as an operator does.
func startFromPage(ctx context.Context, c *cdp, thread, input string) {
	c.t.Helper()
	c.eval(ctx, fmt.Sprintf(`document.getElementById("thread").value = %s;
		document.getElementById("input").value = %s;
		document.getElementById("start").click(); true`, jsString(thread), jsString(input)))
}

func TestConsoleInChromium(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	shot0 := shot
	shot = func(name string) {
		shot0(name)
		if strings.HasPrefix(name, "timeout") {
			t.Logf("the API says: %s", e.do("GET", "/api/v1/runs?thread=browser", nil).body)
		}
	}
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the bundle and model", `document.getElementById("bundle").textContent.includes("test-bundle v3") && document.getElementById("uplink").textContent.includes("not configured")`, shot)
	shot("2-signed-in")

	startFromPage(ctx, c, "browser", "please review my dose")
	c.until(ctx, "the run waiting for review",
		`document.getElementById("run-status").dataset.status === "interrupted" && !document.getElementById("interrupt").hidden`, shot)
	c.until(ctx, "the streamed tokens", `document.getElementById("transcript").textContent.includes("Take your dose now.")`, shot)
	c.until(ctx, "the review node highlighted", `(document.querySelector("#graph rect.current") || {dataset: {}}).dataset.node === "review"`, shot)
	c.eval(ctx, `document.getElementById("filter-review").click(); true`)
	c.until(ctx, "the review filter", `document.querySelectorAll("#runs li").length === 1 && document.querySelector("#runs li .status").textContent === "waiting for review"`, shot)
	shot("3-waiting-for-review")

	c.eval(ctx, `document.getElementById("reason").value = "cited correctly"; document.getElementById("approve").click(); true`)
	c.until(ctx, "the run completed", `document.getElementById("run-status").dataset.status === "completed" &&
		document.getElementById("decisions").textContent.includes("approve by Dr Test") &&
		document.getElementById("output").textContent.includes("Goodbye")`, shot)
	c.eval(ctx, `document.getElementById("filter-review").click(); true`)
	c.until(ctx, "the completed run in the list", `[...document.querySelectorAll("#runs li .status")].some(s => s.textContent === "completed")`, shot)
	shot("4-approved-completed")

	// The API agrees: completed, decided by the person who clicked.
	runs := e.do("GET", "/api/v1/runs?thread=browser", nil).json(t)["runs"].([]any)
	run := runs[0].(map[string]any)
	d := run["decisions"].([]any)[0].(map[string]any)
	if run["status"] != "completed" || d["by"] != "Dr Test (console-token)" || d["decision"] != "approve" || d["reason"] != "cited correctly" {
		t.Fatalf("run after the click: %v", run)
	}
}

// TestReviewFormFollowsTheRun: the edit box and the reason belong to the
// review on screen. An operator who looks at one run waiting for review
// and then another must see the second run's draft, never carry the first
// run's draft (or reason) over into a decision on the second.
func TestReviewFormFollowsTheRun(t *testing.T) {
	e := newEnv(t, nil)
	_, a := e.startRun("form-a", "please review A", "10s")
	_, b := e.startRun("form-b", "please review B", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(a["id"].(string))+`); true`)
	c.until(ctx, "run A's draft in the edit box", `document.getElementById("edit-value").value.includes("review A")`, shot)
	c.eval(ctx, `document.getElementById("reason").value = "about A"; true`)
	c.eval(ctx, `select(`+jsString(b["id"].(string))+`); true`)
	c.until(ctx, "run B's review", `document.getElementById("interrupt-payload").textContent.includes("review B")`, shot)
	form, _ := c.eval(ctx, `document.getElementById("edit-value").value + " | " + document.getElementById("reason").value`).(string)
	if !strings.Contains(form, "review B") || strings.Contains(form, "review A") || strings.Contains(form, "about A") {
		shot("review-form-carried-over")
		t.Fatalf("run B's review form holds %q", form)
	}
	c.eval(ctx, `document.getElementById("edit").click(); true`)
	got := e.waitStatus(b["id"].(string), "completed")
	if out, _ := got["output"].(string); !strings.Contains(out, "review B") {
		t.Fatalf("run B's answer after an edit: %q", out)
	}
}

// openReview starts a run on thread that waits for review, signs a page
// in and opens the run's review on it.
func openReview(t *testing.T, thread, input string) (*env, *cdp, context.Context, func(string), string) {
	t.Helper()
	e := newEnv(t, nil)
	_, run := e.startRun(thread, input, "10s")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden &&
		document.getElementById("edit-value").value.includes(`+jsString(input)+`)`, shot)
	return e, c, ctx, shot, id
}

// TestReviewDecidedElsewhere: two operators decide the same review. The
// page that comes second, here with its event stream cut so that nothing
// told it, must say the review was already decided and by whom, show the
// run as it now is, and leave the first decision the only one.
func TestReviewDecidedElsewhere(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "twice", "please review this")
	// No reconnection: the page learns nothing from the stream.
	c.eval(ctx, `connect = () => {}; state.ws.close(); true`)
	c.until(ctx, "the stream cut", `state.ws.readyState === WebSocket.CLOSED`, shot)
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "reject", "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("first decision: %d %s", r.status, r.body)
	}
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	c.until(ctx, "the page saying the review was decided elsewhere",
		`document.getElementById("decide-error").offsetParent !== null &&
		 document.getElementById("decide-error").textContent.includes("already decided") &&
		 document.getElementById("decide-error").textContent.includes("Dr Other") &&
		 document.getElementById("interrupt").hidden &&
		 document.getElementById("run-status").dataset.status === "completed"`, shot)
	shot("decided-elsewhere")
	got := e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	if ds := got["decisions"].([]any); len(ds) != 1 || ds[0].(map[string]any)["decision"] != "reject" {
		t.Fatalf("decisions: %v", ds)
	}
}

// TestTokenNoLongerValid: the appliance restarts with a new token (the
// old one was removed) while the page is open. The page must take the
// operator back to the sign-in and say why, not go on reconnecting with
// the old token, showing a console where every action fails.
func TestTokenNoLongerValid(t *testing.T) {
	var cfg console.Config
	e := newEnv(t, func(c *console.Config) { cfg = *c })
	var h atomic.Pointer[console.Server]
	var dials atomic.Int64 // stream connections made
	h.Store(e.console)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/events" {
			dials.Add(1)
		}
		h.Load().Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	e.url = srv.URL
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)

	cfg.Token = "a-new-token-the-page-does-not-have"
	rotated := console.New(cfg)
	defer rotated.Close()
	h.Store(rotated)
	e.console.Close() // drops the page's stream, as a restart does
	c.until(ctx, "the sign-in, saying the token is no longer valid",
		`!document.getElementById("login").hidden && document.getElementById("main").hidden &&
		 document.getElementById("login-error").textContent.includes("no longer valid")`, shot)
	shot("token-no-longer-valid")
	// And it stays there: no reconnecting with the old token.
	n := dials.Load()
	time.Sleep(2500 * time.Millisecond)
	if v, _ := c.eval(ctx, `!document.getElementById("login").hidden`).(bool); !v || dials.Load() != n {
		t.Fatalf("the page left the sign-in (%v) or went on connecting (%d times more)", !v, dials.Load()-n)
	}
	// Signing in on the same page with the new token opens the console
	// again, on one stream.
	c.eval(ctx, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-btn").click(); true`, jsString(cfg.Token)))
	c.until(ctx, "the console again", `!document.getElementById("main").hidden && document.getElementById("stream").textContent.includes("live") &&
		document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
	time.Sleep(1500 * time.Millisecond)
	if d := dials.Load() - n; d != 1 {
		t.Fatalf("signing in again opened %d streams", d)
	}
}

// TestSignInShowsOnlySignIn: before sign-in the page shows the sign-in
// form alone. Every element the page hides with the hidden attribute must
// really be out of sight, whatever display the style sheet gives it.
func TestSignInShowsOnlySignIn(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	openPage(ctx, c, e, shot)
	shown, _ := c.eval(ctx, `[...document.querySelectorAll("[hidden]")].filter(el => getComputedStyle(el).display !== "none").map(el => el.id).join(",")`).(string)
	if shown != "" {
		shot("hidden-but-shown")
		t.Fatalf("hidden yet on screen before sign-in: %s", shown)
	}
}

// TestRunsListByKeyboard: an operator who works with the keyboard reaches
// a run in the list with Tab and opens it with Enter, as with any button.
func TestRunsListByKeyboard(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("keys", "please review by keyboard", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the run in the list", `document.querySelector("#runs li")`, shot)
	// Focus the control just before the list, then Tab into the list.
	c.eval(ctx, `document.getElementById("filter-flagged").focus(); true`)
	key := func(name, code string, vk int) {
		for _, typ := range []string{"keyDown", "keyUp"} {
			p := map[string]any{"type": typ, "key": name, "code": code, "windowsVirtualKeyCode": vk}
			if typ == "keyDown" && name == "Enter" {
				p["text"] = "\r" // the keypress that activates a button
			}
			c.call(ctx, "Input.dispatchKeyEvent", p, nil)
		}
	}
	key("Tab", "Tab", 9)
	c.until(ctx, "the run focused", `document.activeElement && document.activeElement.closest("#runs li")`, shot)
	key("Enter", "Enter", 13)
	c.until(ctx, "the run opened", `document.getElementById("run-id").textContent === `+jsString(run["id"].(string))+` && !document.getElementById("interrupt").hidden`, shot)
}

// TestOldReviewsStayListed: the list shows the newest runs, but a run
// still waiting for review is listed however old it is. A clinic whose
// appliance has run hundreds of turns since must not lose sight of a
// review (the "waiting for review only" filter reads the list).
func TestOldReviewsStayListed(t *testing.T) {
	e := newEnv(t, nil)
	_, old := e.startRun("old-review", "please review this old one", "10s")
	if old["status"] != "interrupted" {
		t.Fatalf("the old run: %v", old)
	}
	for i := 0; i < 505; i++ {
		body := map[string]any{"agent": testAgent, "input": "hello", "wait": "10s"}
		if r := e.do("POST", fmt.Sprintf("/api/v1/threads/later-%d/runs", i), body); r.status != http.StatusCreated {
			t.Fatalf("run %d: %d %s", i, r.status, r.body)
		}
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `document.getElementById("filter-review").click(); true`)
	c.until(ctx, "the old run waiting for review",
		`[...document.querySelectorAll("#runs li")].some(li => li.dataset.run === `+jsString(old["id"].(string))+`)`, shot)
}

// TestEditIsTheTextTyped: the edit box holds the edited answer as text.
// What the operator types is sent as that text, even when it reads as
// JSON (a bare number, say), and an empty box is refused on the page
// rather than sent as an empty answer.
func TestEditIsTheTextTyped(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "edit-text", "please review the dose")

	c.eval(ctx, `document.getElementById("edit-value").value = "  "; document.getElementById("edit").click(); true`)
	c.until(ctx, "the empty edit refused", `document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.includes("empty")`, shot)
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "interrupted" {
		t.Fatalf("after an empty edit the run is %v", got["status"])
	}

	c.eval(ctx, `document.getElementById("edit-value").value = "2"; document.getElementById("edit").click(); true`)
	c.until(ctx, "the run ended", `["completed", "failed"].includes(document.getElementById("run-status").dataset.status)`, shot)
	got := e.waitStatus(id, "completed")
	if got["output"] != "2 Goodbye." {
		t.Fatalf("answer after editing it to 2: %v", got["output"])
	}
}

// TestLongTextKeepsTheLayout: a long unbroken thread id, input or draft
// wraps inside its panel at a small window (1024x700), instead of
// widening the page so that the review and its buttons sit off screen.
func TestLongTextKeepsTheLayout(t *testing.T) {
	e := newEnv(t, nil)
	long := strings.Repeat("abcdefghij", 300)
	_, run := e.startRun(strings.Repeat("T", 150), "please review "+long, "10s")
	c, ctx, shot := openChromium(t)
	c.call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1024, "height": 700, "deviceScaleFactor": 1, "mobile": false}, nil)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(run["id"].(string))+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
	c.until(ctx, "the transcript", `document.getElementById("transcript").textContent.includes("draft")`, shot)
	if wide, _ := c.eval(ctx, `document.documentElement.scrollWidth > document.documentElement.clientWidth`).(bool); wide {
		shot("long-text-too-wide")
		t.Fatalf("the page is %v px wide in a %v px window", c.eval(ctx, `document.documentElement.scrollWidth`), c.eval(ctx, `document.documentElement.clientWidth`))
	}
}

// TestReconnectCatchesUp: a page that has seen no event yet loses its
// stream (the network between it and the appliance drops), and a run
// starts and waits for review meanwhile. When the stream is back the page
// must show that run: it resumes from where the stream stood when it
// first connected, not subscribe afresh from now.
func TestReconnectCatchesUp(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `window.reconnect = connect; connect = () => {}; state.ws.close(); true`)
	c.until(ctx, "the stream cut", `state.ws.readyState === WebSocket.CLOSED`, shot)
	_, run := e.startRun("while-away", "please review this", "10s")
	c.eval(ctx, `connect = window.reconnect; connect(); true`)
	c.until(ctx, "the run started while the stream was down",
		`[...document.querySelectorAll("#runs li")].some(li => li.dataset.run === `+jsString(run["id"].(string))+` &&
		 li.querySelector(".status").textContent === "waiting for review")`, shot)
}

// TestCancelFromThePage: an operator stops a run that hangs (a slow
// model, a stuck tool) from the page, as the API allows, and sees it
// cancelled; a run that has ended offers no cancel.
func TestCancelFromThePage(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	startFromPage(ctx, c, "stuck", "block until cancelled")
	c.until(ctx, "the run running with a cancel button", `["queued", "running"].includes(document.getElementById("run-status").dataset.status) &&
		document.getElementById("cancel") && document.getElementById("cancel").offsetParent !== null`, shot)
	id, _ := c.eval(ctx, `document.getElementById("run-id").textContent`).(string)

	// Cancel asks first, naming the run; keeping it changes nothing.
	c.eval(ctx, `document.getElementById("cancel").click(); true`)
	c.until(ctx, "the confirmation", `document.getElementById("cancel-confirm").open &&
		document.getElementById("cancel-confirm").textContent.includes(`+jsString(id)+`) &&
		document.activeElement === document.getElementById("cancel-no")`, shot)
	shot("cancel-confirm")
	time.Sleep(200 * time.Millisecond) // a cancel sent at the click would have landed
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "running" && got["status"] != "queued" {
		t.Fatalf("the run before the cancel is confirmed: %v", got["status"])
	}
	c.eval(ctx, `document.getElementById("cancel-no").click(); true`)
	c.until(ctx, "the confirmation gone", `!document.getElementById("cancel-confirm").open`, shot)
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "running" && got["status"] != "queued" {
		t.Fatalf("the run kept running: %v", got["status"])
	}

	c.eval(ctx, `document.getElementById("cancel").click(); true`)
	c.until(ctx, "the confirmation again", `document.getElementById("cancel-confirm").open`, shot)
	c.eval(ctx, `document.getElementById("cancel-yes").click(); true`)
	c.until(ctx, "the run cancelled, with no cancel button", `document.getElementById("run-status").dataset.status === "cancelled" &&
		document.getElementById("cancel").offsetParent === null && !document.getElementById("cancel-confirm").open`, shot)
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "cancelled" {
		t.Fatalf("run after cancel: %v", got["status"])
	}
	// The reason reads once, in the answer box and in the transcript.
	c.until(ctx, "the end in the transcript", `document.getElementById("transcript").textContent.includes("■ cancelled")`, shot)
	detail, _ := c.eval(ctx, `document.getElementById("detail").innerText`).(string)
	if strings.Count(detail, "cancelled: run cancelled") > 0 || strings.Count(detail, "run cancelled") != 1 ||
		strings.Contains(detail, "error:") || !strings.Contains(detail, "stopped: run cancelled") {
		shot("cancel-message")
		t.Fatalf("the cancelled run reads:\n%s", detail)
	}
}

// TestWindowExceededRefreshesTheOpenRun: the stream was down for longer
// than its replay window reaches back. The page reloads its list, and the
// run it has open must show as it now is too, not as a review still
// waiting that another operator has decided meanwhile.
func TestWindowExceededRefreshesTheOpenRun(t *testing.T) {
	e := newEnv(t, func(c *console.Config) { c.Events.Window = 3 })
	_, run := e.startRun("window-a", "please review this", "10s")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
	c.eval(ctx, `window.reconnect = connect; connect = () => {}; state.ws.close(); true`)
	c.until(ctx, "the stream cut", `state.ws.readyState === WebSocket.CLOSED`, shot)
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve", "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("decision: %d %s", r.status, r.body)
	}
	e.startRun("window-b", "hello", "10s") // pushes the decided run's events out of the window
	c.eval(ctx, `connect = window.reconnect; connect(); true`)
	c.until(ctx, "the open run as it now is", `document.getElementById("run-status").dataset.status === "completed" &&
		document.getElementById("interrupt").hidden`, shot)
}

// TestTranscriptNumbersFit: a transcript runs past ten lines, often past a
// hundred; its numbers must fit in the room the list gives them, not be
// cut to "0.", "1." at its left edge.
func TestTranscriptNumbersFit(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	fits, _ := c.eval(ctx, `(() => {
		const ol = document.getElementById("transcript"), cs = getComputedStyle(ol);
		const g = document.createElement("canvas").getContext("2d");
		g.font = cs.fontSize + " " + cs.fontFamily;
		return parseFloat(cs.paddingLeft) >= g.measureText("100. ").width;
	})()`).(bool)
	if !fits {
		t.Fatalf("the transcript's numbers do not fit: padding %v", c.eval(ctx, `getComputedStyle(document.getElementById("transcript")).paddingLeft`))
	}
}

// TestControlsHaveNames: every control an operator (or a screen reader)
// meets once signed in has a name of its own, not only a placeholder or a
// tooltip that is gone once something is typed.
func TestControlsHaveNames(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("names", "please review this", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `document.querySelector("#runs button.run").click(); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
	unnamed, _ := c.eval(ctx, `[...document.querySelectorAll("input, select, textarea, button")]
		.filter(el => el.offsetParent !== null)
		.filter(el => !(el.labels && el.labels.length) && !el.getAttribute("aria-label") && !(el.tagName === "BUTTON" && el.textContent.trim()))
		.map(el => el.id || el.outerHTML.slice(0, 60)).join(", ")`).(string)
	if unnamed != "" {
		t.Fatalf("controls without a label: %s", unnamed)
	}
}

// TestRefusedEditCanBeTriedAgain: the review refuses an edit (the API
// answers 422). The operator sees the node's reason, keeps the text to
// correct it, and a corrected edit goes through.
func TestRefusedEditCanBeTriedAgain(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "refused-edit", "please review this")
	c.eval(ctx, `document.getElementById("edit-value").value = "an unsafe answer"; document.getElementById("edit").click(); true`)
	c.until(ctx, "the node's reason", `document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.includes("the edited answer says unsafe") &&
		!document.getElementById("decide-error").textContent.includes("must be approve") &&
		!document.getElementById("interrupt").hidden && !document.getElementById("edit").disabled &&
		document.getElementById("edit-value").value === "an unsafe answer"`, shot)
	shot("edit-refused")
	c.eval(ctx, `document.getElementById("edit-value").value = "a safe answer"; document.getElementById("edit").click(); true`)
	if got := e.waitStatus(id, "completed"); got["output"] != "a safe answer Goodbye." {
		t.Fatalf("answer after the corrected edit: %v", got["output"])
	}
}

// TestLongTranscriptIsWhole: a run that streams thousands of tokens, then
// waits for review. Opened again after looking at another run, its
// transcript still ends with the last token and the review, not cut off
// where the page stopped keeping its events.
func TestLongTranscriptIsWhole(t *testing.T) {
	e := newEnv(t, nil)
	_, other := e.startRun("short", "hello", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	startFromPage(ctx, c, "verbose", "please review this verbose one")
	c.until(ctx, "the long run waiting for review", `document.getElementById("run-status").dataset.status === "interrupted" &&
		document.getElementById("transcript").textContent.includes("waiting for review")`, shot)
	id, _ := c.eval(ctx, `document.getElementById("run-id").textContent`).(string)
	c.eval(ctx, `select(`+jsString(other["id"].(string))+`); true`)
	c.until(ctx, "the other run", `document.getElementById("run-id").textContent === `+jsString(other["id"].(string)), shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the whole transcript again", `document.getElementById("run-id").textContent === `+jsString(id)+` &&
		document.getElementById("transcript").textContent.includes("w5999") &&
		document.getElementById("transcript").textContent.includes("waiting for review")`, shot)
}

// TestEndedRunHighlightsNoNode: a run that has ended, over budget as much
// as completed, failed or cancelled, is at no node: the graph must not go
// on marking the node it stopped at as the current one.
func TestEndedRunHighlightsNoNode(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	startFromPage(ctx, c, "budget", "overspend")
	c.until(ctx, "the run over budget", `document.getElementById("run-status").dataset.status === "budget_exceeded" &&
		document.getElementById("transcript").textContent.includes("budget exceeded") &&
		document.querySelectorAll("#graph rect").length > 0`, shot)
	time.Sleep(300 * time.Millisecond) // let late events land
	if cur, _ := c.eval(ctx, `(document.querySelector("#graph rect.current") || {dataset: {}}).dataset.node || ""`).(string); cur != "" {
		shot("budget-still-current")
		t.Fatalf("the graph marks %q as current on a run that has ended", cur)
	}
}

// TestRunStartedDuringSignIn: a run starts (and pauses for review) after
// the page has read the run list but before its stream is open. The page
// must still list it: the stream is open, and its position noted, before
// the list is read.
func TestRunStartedDuringSignIn(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	openPage(ctx, c, e, shot)
	// Right after the page's first read of the whole list, another
	// client starts a run that waits for review.
	c.eval(ctx, fmt.Sprintf(`const pageFetch = window.fetch;
		let done = false;
		window.fetch = async (path, opts) => {
			const res = await pageFetch(path, opts);
			if (!done && String(path).startsWith("/api/v1/runs?limit=1000") && !String(path).includes("status=")) {
				done = true;
				await pageFetch("/api/v1/threads/meanwhile/runs", { method: "POST",
					headers: { "Authorization": "Bearer " + %s, "Content-Type": "application/json" },
					body: JSON.stringify({ agent: %s, input: "please review this", wait: "10s" }) });
			}
			return res;
		}; true`, jsString(e.token), jsString(testAgent)))
	c.eval(ctx, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-btn").click(); true`, jsString(e.token)))
	c.until(ctx, "the run started during sign-in, waiting for review",
		`[...document.querySelectorAll("#runs li .status")].some(s => s.textContent === "waiting for review")`, shot)
}

// TestOpenRunMidStream: the operator opens a run the page did not see
// start (after a reload, say) while it is still going. Its past comes from
// the thread's history; the events that arrive while that is read must
// neither come before that past nor repeat what it already holds.
func TestOpenRunMidStream(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("midstream", "block, then finish", "")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the run in the list", `state.runs.has(`+jsString(id)+`)`, shot)
	// The history read waits until the test lets it go.
	c.eval(ctx, `const pageFetch = window.fetch;
		window.fetch = async (path, opts) => {
			if (String(path).includes("/history")) while (!window.letHistory) await new Promise((r) => setTimeout(r, 20));
			return pageFetch(path, opts);
		}; true`)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	e.unblock()
	e.waitStatus(id, "completed")
	c.until(ctx, "the run's end on the page", `(state.log.get(`+jsString(id)+`) || []).some((e) => e.type === "run.completed")`, shot)
	c.eval(ctx, `window.letHistory = true`)
	c.until(ctx, "the whole transcript", `document.getElementById("transcript").textContent.includes("completed") &&
		document.getElementById("transcript").textContent.includes("closing")`, shot)
	time.Sleep(300 * time.Millisecond)
	lines, _ := c.eval(ctx, `[...document.querySelectorAll("#transcript > li")].map((li) => li.textContent.split(" ")[0] + " " + li.textContent.split(" ")[1]).join("|")`).(string)
	if want := "draft: Take|✓ draft|✓ review|✓ closing|■ completed"; lines != want {
		shot("midstream-transcript")
		t.Fatalf("transcript lines %q, want %q", lines, want)
	}
}

// TestNewestRunsPastManyRuns: an appliance that has kept more than 20,000
// runs. The page lists the newest first, the run just started included,
// and reads one page for them instead of paging through every run from
// the oldest.
func TestNewestRunsPastManyRuns(t *testing.T) {
	if findChromium() == "" {
		t.Skip("SKIPPING THE BROWSER TEST: no chromium found (apt-get install -y chromium; .ci/run installs it)")
	}
	e := newEnv(t, nil)
	// Stored straight into the store, many commits sharing each group
	// commit: through the API this many turns would take minutes.
	const old, writers = 20_050, 50
	ids := make([]string, old)
	for i := range ids {
		ids[i] = engine.NewRunID()
	}
	created := time.Now().UTC().Add(-time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < old; i += writers {
				run := &engine.Run{ID: ids[i], Thread: fmt.Sprintf("old-%d", i), Agent: testAgent, Status: engine.StatusQueued,
					Bundle: engine.BundleRef{Name: "test-bundle", Version: 3, Digest: "sha256:test"}, Input: json.RawMessage(`"old turn"`),
					CreatedAt: created, Durability: engine.DurabilitySync}
				if err := e.db.Commit(context.Background(), &engine.Commit{Run: run, Sync: true}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	_, newest := e.startRun("newest", "the newest turn", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the newest run at the top of the list",
		`(document.querySelector("#runs li") || {dataset: {}}).dataset.run === `+jsString(newest["id"].(string)), shot)
	// Besides sign-in's check of the token (limit=1) and the list of runs
	// waiting for review.
	lists, _ := c.eval(ctx, `JSON.stringify(performance.getEntriesByType("resource").map((r) => new URL(r.name)).
		filter((u) => u.pathname === "/api/v1/runs" && u.searchParams.get("limit") !== "1" && !u.searchParams.has("status")).map((u) => u.search))`).(string)
	var pages []string
	json.Unmarshal([]byte(lists), &pages)
	if len(pages) != 1 {
		t.Fatalf("the page read %d pages of runs to list the newest: %v", len(pages), pages)
	}
}

// TestReviewButtonsInSight: at 1024x700, a run waiting for review shows
// its approve, edit and reject buttons without scrolling, whole and not
// covered, once its transcript is in: with a short draft and with a long
// one.
func TestReviewButtonsInSight(t *testing.T) {
	for _, tc := range []struct{ name, input string }{
		{"short", "please review my dose"},
		{"long", "please review " + strings.Repeat("a long question about doses ", 80)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			c, ctx, shot := openChromium(t)
			c.call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1024, "height": 700, "deviceScaleFactor": 1, "mobile": false}, nil)
			signIn(ctx, t, c, e, shot)
			// Started from the page, so that the transcript is drawn line by
			// line from the run's events, as an operator watching it sees it.
			startFromPage(ctx, c, "in-sight", tc.input)
			c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
			c.until(ctx, "the transcript", `document.getElementById("transcript").textContent.includes("waiting for review")`, shot)
			time.Sleep(100 * time.Millisecond) // any scrolling the transcript would cause
			shot("review-in-sight-" + tc.name)
			got, _ := c.eval(ctx, `JSON.stringify(["approve", "edit", "reject"].map((id) => {
				const b = document.getElementById(id), r = b.getBoundingClientRect();
				const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
				return {id, top: r.top, bottom: r.bottom, left: r.left, right: r.right,
					inside: r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth,
					covered: hit !== b};
			}).concat([{scrollY: scrollY, innerHeight: innerHeight, innerWidth: innerWidth}]))`).(string)
			var boxes []struct {
				ID      string  `json:"id"`
				Inside  bool    `json:"inside"`
				Covered bool    `json:"covered"`
				ScrollY float64 `json:"scrollY"`
			}
			if err := json.Unmarshal([]byte(got), &boxes); err != nil {
				t.Fatal(err)
			}
			for _, b := range boxes[:3] {
				if !b.Inside || b.Covered || boxes[3].ScrollY != 0 {
					shot("review-below-the-fold")
					t.Fatalf("at 1024x700 the %s button is not in sight without scrolling: %s", b.ID, got)
				}
			}
		})
	}
}

// TestTranscriptSignsHaveGlyphs: every sign the transcript draws (the
// pause of a review, the ticks, arrows and crosses) renders with the
// fonts the appliance has (Debian's defaults here), not as an empty box:
// each character is drawn on a canvas in the transcript's font and
// compared with one that no font has. The pause sign is drawn by the
// stylesheet, as two bars.
func TestTranscriptSignsHaveGlyphs(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	startFromPage(ctx, c, "glyphs", "please review deny")
	c.until(ctx, "the review in the transcript", `document.querySelector("#transcript .icon-pause") !== null ||
		document.getElementById("transcript").textContent.includes("waiting for review")`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	c.until(ctx, "the end in the transcript", `document.getElementById("transcript").textContent.includes("completed")`, shot)
	shot("glyphs")
	missing, _ := c.eval(ctx, `JSON.stringify((() => {
		const ol = document.getElementById("transcript");
		const cv = document.createElement("canvas");
		cv.width = cv.height = 40;
		const g = cv.getContext("2d", { willReadFrequently: true });
		g.font = "24px " + getComputedStyle(ol).fontFamily;
		const draw = (ch) => { g.clearRect(0, 0, 40, 40); g.fillText(ch, 4, 30); return g.getImageData(0, 0, 40, 40).data.join(","); };
		const none = draw("\u{10FFFD}");
		const chars = [...new Set([...ol.textContent].filter((ch) => ch.codePointAt(0) > 127))];
		return chars.filter((ch) => { const d = draw(ch); return d === none || !/[1-9]/.test(d); })
			.map((ch) => "U+" + ch.codePointAt(0).toString(16).toUpperCase() + " " + ch);
	})())`).(string)
	if missing != "[]" {
		t.Fatalf("the transcript draws characters no font here has: %s\n%s", missing, c.eval(ctx, `document.getElementById("transcript").innerText`))
	}
	bars, _ := c.eval(ctx, `(() => {
		const i = document.querySelector("#transcript .icon-pause");
		if (!i) return "no pause sign";
		const r = i.getBoundingClientRect(), cs = getComputedStyle(i);
		return r.width > 0 && r.height > 0 && parseFloat(cs.borderLeftWidth) > 0 && parseFloat(cs.borderRightWidth) > 0 &&
			i.getAttribute("role") === "img" && i.getAttribute("aria-label") ? "ok" : JSON.stringify(r);
	})()`).(string)
	if bars != "ok" {
		t.Fatalf("the pause sign: %s", bars)
	}
}

// TestLargeOutputIsWholeInTheDetail: a run list holds a preview of a large
// output (output_truncated); the run's detail shows it whole, read on its
// own.
func TestLargeOutputIsWholeInTheDetail(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("large-output", "verbose please", "20s")
	if run["status"] != "completed" {
		t.Fatalf("the run: %v", run["status"])
	}
	listed := e.do("GET", "/api/v1/runs?thread=large-output", nil).json(t)["runs"].([]any)[0].(map[string]any)
	if listed["output_truncated"] != true {
		t.Fatalf("the listed run's output is not a preview: %v", listed["output_truncated"])
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(run["id"].(string))+`); true`)
	c.until(ctx, "the whole output", `document.getElementById("output").textContent.includes("w5999") &&
		document.getElementById("output").textContent.includes("Goodbye.")`, shot)
}

// TestToolCallReviewInThePage: a run that waits for approval of a tool
// call. The page says in words why it asks and what each decision does,
// shows the arguments as text (markup in them is never run), and offers
// them in the edit box as JSON. An edit that is not valid JSON is refused
// on the page, and nothing is sent: it must not reach the run as a string
// in place of the arguments. A valid edit is sent as the arguments.
func TestToolCallReviewInThePage(t *testing.T) {
	const input = `please review toolcall <img src=x onerror="window.ran=1"><script>window.ran=2</script> für 你好`
	e := newEnv(t, nil)
	_, run := e.startRun("toolcall", input, "10s")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the tool call's review", `!document.getElementById("interrupt").hidden &&
		document.getElementById("interrupt-why").textContent.includes("The agent asks to call schedule_followup, which needs a person's approval (a follow-up commits staff time)") &&
		document.getElementById("edit-label").textContent === "Edited arguments of schedule_followup, as JSON (for edit)" &&
		JSON.parse(document.getElementById("edit-value").value).when === "Friday" &&
		JSON.parse(document.getElementById("edit-value").value).note === `+jsString(input)+` &&
		document.getElementById("interrupt-payload").textContent.includes("<script>window.ran=2</script> für 你好")`, shot)
	shot("tool-call-review")
	if ran := c.eval(ctx, `String(window.ran) + " " + document.querySelectorAll("#detail img, #detail script").length`); ran != "undefined 0" {
		t.Fatalf("markup in the arguments was run or drawn: %v", ran)
	}

	c.eval(ctx, `document.getElementById("edit-value").value = '{"when": "Monday"'; document.getElementById("edit").click(); true`)
	c.until(ctx, "the malformed edit refused", `document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.includes("The edited arguments are not valid JSON") &&
		document.getElementById("decide-error").textContent.includes("nothing was sent")`, shot)
	got := e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	if got["status"] != "interrupted" || got["decisions"] != nil {
		t.Fatalf("after a malformed edit the run is %v with decisions %v", got["status"], got["decisions"])
	}

	c.eval(ctx, `document.getElementById("edit-value").value = '{"when": "Monday", "note": "call back"}'; document.getElementById("edit").click(); true`)
	got = e.waitStatus(id, "completed")
	if got["output"] != `edit {"when":"Monday","note":"call back"} Goodbye.` {
		t.Fatalf("answer after the edit: %v", got["output"])
	}

	// A call that may already have run says so before anything else.
	_, run = e.startRun("toolcall-uncertain", "please review toolcall uncertain", "10s")
	c.eval(ctx, `select(`+jsString(run["id"].(string))+`); true`)
	c.until(ctx, "the uncertain call's review", `!document.getElementById("interrupt").hidden &&
		document.getElementById("interrupt-why").textContent.startsWith("The call to schedule_followup may already have run (the call may or may not have run before a crash). Find out")`, shot)
}

// TestDecisionWhileTheApplianceIsUnreachable: the appliance stops
// answering (stopped, restarting, the network down) while an operator
// looks at a review. The page says the stream is down; a decision then
// clicked gets a message that says the appliance could not be reached and
// that the decision may or may not have been recorded, not the browser's
// "Failed to fetch". Once the appliance answers again, the page is live
// and the decision can be made.
func TestDecisionWhileTheApplianceIsUnreachable(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("unreachable", "please review this", "10s")
	id := run["id"].(string)
	// The page reaches the appliance through a link the test can cut.
	link := newLink(t, e.srv.Listener.Addr().String())
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, &env{url: "http://" + link.addr, token: e.token}, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)

	link.cut()
	c.until(ctx, "the stream down", `document.getElementById("stream").textContent === "stream: reconnecting"`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	c.until(ctx, "the decision not sent", `document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.startsWith("Cannot reach the appliance (") &&
		document.getElementById("decide-error").textContent.includes("your approve may or may not have been recorded") &&
		!document.getElementById("approve").disabled`, shot)
	shot("unreachable")
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "interrupted" {
		t.Fatalf("the decision the page could not send changed the run: %v", got["status"])
	}

	link.restore()
	c.until(ctx, "the stream back", `document.getElementById("stream").textContent === "stream: live"`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	e.waitStatus(id, "completed")
}

// link is a TCP relay to an address, which a test cuts (every connection
// closed, nothing listening) and restores at the same address, as a
// network or an appliance goes down and comes back.
type link struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newLink(t *testing.T, target string) *link {
	l := &link{t: t, addr: "127.0.0.1:0", target: target}
	l.restore()
	l.addr = l.ln.Addr().String()
	t.Cleanup(l.cut)
	return l
}

func (l *link) restore() {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		l.t.Fatal(err)
	}
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", l.target)
			if err != nil {
				in.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, in, out)
			l.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
}

func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ln.Close()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// TestOperatorNameInAnyScript: an operator whose name is written in a
// script past Latin-1 signs in (fetch refuses such a header value as is),
// and the decision is recorded under the name as typed.
func TestOperatorNameInAnyScript(t *testing.T) {
	const name = "张医生 Müller"
	e := newEnv(t, nil)
	_, run := e.startRun("operator-name", "please review this", "10s")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signInAs(ctx, t, c, e, shot, name)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	c.until(ctx, "the decision under the name typed", `document.getElementById("decisions").textContent.includes(`+jsString("approve by "+name+" (console-token)")+`)`, shot)
	got := e.waitStatus(id, "completed")
	if by := got["decisions"].([]any)[0].(map[string]any)["by"]; by != name+" (console-token)" {
		t.Fatalf("decision recorded by %q", by)
	}
}

// TestTranscriptSaysWhenStepsCannotBeRead: a run opened while the
// appliance does not answer says that its steps could not be read, rather
// than show an empty transcript, which reads as a run that did nothing.
func TestTranscriptSaysWhenStepsCannotBeRead(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("unread", "hello", "10s")
	link := newLink(t, e.srv.Listener.Addr().String())
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, &env{url: "http://" + link.addr, token: e.token}, shot)
	link.cut()
	c.eval(ctx, `select(`+jsString(run["id"].(string))+`); true`)
	c.until(ctx, "the steps not read", `document.getElementById("transcript").textContent.startsWith("The run's steps could not be read: Cannot reach the appliance (")`, shot)
}

// TestTranscriptNamesTheToolCallAsked: the transcript's line for a run
// that stops to ask about a tool call names the call and the question in
// words, not the payload's code ("approval_required").
func TestTranscriptNamesTheToolCallAsked(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	for _, tc := range []struct{ input, says string }{
		{"please review toolcall", "waiting for review at review: a call to schedule_followup needs approval"},
		{"please review toolcall uncertain", "waiting for review at review: the call to schedule_followup may already have run"},
	} {
		startFromPage(ctx, c, strings.ReplaceAll(tc.input, " ", "-"), tc.input)
		c.until(ctx, "the question in the transcript", `[...document.querySelectorAll("#transcript li")].some(li => li.textContent.trim() === `+jsString(tc.says)+`)`, shot)
	}
}

// TestReviewErrorGoesWithTheReview: an operator's edit is refused, and
// another operator then decides the review. The page shows the run as it
// now is, without the refusal, which no longer says anything true about
// it.
func TestReviewErrorGoesWithTheReview(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "error-goes", "please review this")
	c.eval(ctx, `document.getElementById("edit-value").value = "an unsafe answer"; document.getElementById("edit").click(); true`)
	c.until(ctx, "the edit refused", `document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.includes("the edited answer says unsafe")`, shot)
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve", "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("the other operator's decision: %d %s", r.status, r.body)
	}
	c.until(ctx, "the run decided elsewhere, without the refusal", `document.getElementById("run-status").dataset.status === "completed" &&
		document.getElementById("decisions").textContent.includes("approve by Dr Other") &&
		document.getElementById("decide-error").hidden`, shot)
}

// TestSeveralQuestionsInThePage: a run waits on two questions at once (two
// parallel branches each asking), next to another run waiting on one. The
// review says which of the run's questions it shows and how many wait
// across the runs listed, the operator moves to the second, and the
// decision goes to the interrupt shown; the first then waits alone. A
// value longer than the Decisions list shows opens in full, as text.
func TestSeveralQuestionsInThePage(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("one-question", "please review this", "10s")
	id, asked := e.startTwoQuestions("two-questions")
	var qs [2]struct{ id, node string }
	for i, m := range asked {
		qs[i].id, qs[i].node = m["id"].(string), m["node"].(string)
	}

	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the list naming the two questions", `[...document.querySelectorAll("#runs li")].some(li =>
		li.dataset.run === `+jsString(id)+` && li.textContent.includes("waiting for review (2 questions)"))`, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the first of two questions", `!document.getElementById("interrupt").hidden &&
		document.getElementById("interrupt-count").textContent === "Question 1 of 2 waiting on this run; 3 questions wait across 2 runs" &&
		document.getElementById("interrupt-node").textContent === `+jsString(qs[0].node)+` &&
		document.getElementById("interrupt-prev").disabled && !document.getElementById("interrupt-next").disabled &&
		document.getElementById("edit-value").value === "the `+qs[0].node+` draft (hi)"`, shot)
	shot("first-of-two-questions")

	long := strings.Repeat("a checked answer, ", 6) + `<img src=x onerror="window.ran=1"> für 你好`
	c.eval(ctx, `document.getElementById("interrupt-next").click(); true`)
	c.until(ctx, "the second question", `document.getElementById("interrupt-count").textContent.startsWith("Question 2 of 2 waiting on this run") &&
		document.getElementById("interrupt-node").textContent === `+jsString(qs[1].node)+` &&
		document.getElementById("edit-value").value === "the `+qs[1].node+` draft (hi)"`, shot)
	c.eval(ctx, `document.getElementById("edit-value").value = `+jsString(long)+`; document.getElementById("edit").click(); true`)

	c.until(ctx, "the first question, waiting alone", `document.getElementById("run-status").dataset.status === "interrupted" &&
		document.getElementById("interrupt-count").textContent === "2 questions wait across 2 runs" &&
		document.getElementById("interrupt-node").textContent === `+jsString(qs[0].node)+` &&
		document.getElementById("interrupt-next").hidden`, shot)
	got := e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	ds, _ := got["decisions"].([]any)
	if len(ds) != 1 || ds[0].(map[string]any)["interrupt"] != qs[1].id || ds[0].(map[string]any)["value"] != long {
		t.Fatalf("the decision went elsewhere: %v", got["decisions"])
	}

	c.until(ctx, "the whole value, as text", `document.querySelector("#decisions details.value pre") !== null &&
		document.querySelector("#decisions details.value pre").textContent === `+jsString(long), shot)
	c.eval(ctx, `document.querySelector("#decisions details.value").open = true; true`)
	shot("the-whole-value")
	if ran := c.eval(ctx, `String(window.ran) + " " + document.querySelectorAll("#detail img").length`); ran != "undefined 0" {
		t.Fatalf("markup in the value was run or drawn: %v", ran)
	}

	c.eval(ctx, `document.getElementById("approve").click(); true`)
	got = e.waitStatus(id, "completed")
	ds, _ = got["decisions"].([]any)
	if len(ds) != 2 || ds[1].(map[string]any)["interrupt"] != qs[0].id {
		t.Fatalf("the second decision went elsewhere: %v", got["decisions"])
	}
	if want := map[string]any{qs[0].node: "the " + qs[0].node + " draft (hi)", qs[1].node: long}; !reflect.DeepEqual(got["output"], want) {
		t.Fatalf("output %v, want %v", got["output"], want)
	}
}

// typeInto replaces the text of the field with the given id as an operator
// does: it focuses it, selects what it holds and types over it.
func typeInto(ctx context.Context, c *cdp, id, s string) {
	c.t.Helper()
	c.eval(ctx, `document.getElementById(`+jsString(id)+`).focus(); document.getElementById(`+jsString(id)+`).select(); true`)
	c.call(ctx, "Input.insertText", map[string]any{"text": s}, nil)
}

// TestDraftsKeptPerQuestion: an operator types a reply to each of a run's
// two questions, moves between them and to another run and back: each
// question shows what was typed for it, and nothing else. Sending one
// question's reply leaves the other's draft; the other then answered
// from another console takes its draft away, and the page says so.
func TestDraftsKeptPerQuestion(t *testing.T) {
	e := newEnv(t, nil)
	_, other := e.startRun("one-question", "please review this", "10s")
	id, asked := e.startTwoQuestions("two-questions")
	first, second := asked[0], asked[1]

	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	form := func(node, edit, reason string) {
		t.Helper()
		what := fmt.Sprintf("the question at %s with the edit %q and the reason %q", node, edit, reason)
		c.until(ctx, what, `document.getElementById("interrupt-node").textContent === `+jsString(node)+` &&
			document.getElementById("edit-value").value === `+jsString(edit)+` &&
			document.getElementById("reason").value === `+jsString(reason), shot)
	}
	form(first["node"].(string), "the "+first["node"].(string)+" draft (hi)", "")
	typeInto(ctx, c, "edit-value", "first reply, typed")
	typeInto(ctx, c, "reason", "first reason")
	c.eval(ctx, `document.getElementById("interrupt-next").click(); true`)
	form(second["node"].(string), "the "+second["node"].(string)+" draft (hi)", "")
	typeInto(ctx, c, "edit-value", "second reply, typed")
	c.eval(ctx, `document.getElementById("interrupt-prev").click(); true`)
	form(first["node"].(string), "first reply, typed", "first reason")

	// Another run's review shows its own draft, and coming back shows the
	// question left on screen with what was typed for it.
	c.eval(ctx, `select(`+jsString(other["id"].(string))+`); true`)
	form("review", "Take your dose now. (please review this)", "")
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	form(first["node"].(string), "first reply, typed", "first reason")
	c.eval(ctx, `document.getElementById("interrupt-next").click(); true`)
	form(second["node"].(string), "second reply, typed", "")
	shot("draft-kept")

	c.eval(ctx, `document.getElementById("edit").click(); true`)
	form(first["node"].(string), "first reply, typed", "first reason")
	got := e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	if ds, _ := got["decisions"].([]any); len(ds) != 1 || ds[0].(map[string]any)["value"] != "second reply, typed" {
		t.Fatalf("decisions after the edit: %v", got["decisions"])
	}

	// The first question answered from another console.
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "reject", "interrupt": first["id"], "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("decision from elsewhere: %d %s", r.status, r.body)
	}
	c.until(ctx, "the page saying the draft was discarded", `document.getElementById("interrupt").hidden &&
		document.getElementById("draft-notice").offsetParent !== null &&
		document.getElementById("draft-notice").textContent.includes("reply to the question at `+first["node"].(string)+` was discarded") &&
		document.getElementById("draft-notice").textContent.includes("reject by Dr Other") &&
		state.drafts.size === 0`, shot)
	shot("draft-discarded")
}

// TestWaitingCountIsTheStores: the count of what waits for review is the
// appliance's, not that of the runs the page has read. The page here reads
// one run a page and one page of reviews, where it reads 1,000 and 20 of
// them, so that a few runs stand for a store with more reviews than it
// lists; it must still count every run waiting and every question.
func TestWaitingCountIsTheStores(t *testing.T) {
	e := newEnv(t, nil)
	e.startRun("done", "hello", "10s")
	for _, thread := range []string{"wait-a", "wait-b", "wait-c"} {
		e.startRun(thread, "please review this", "10s")
	}
	id, _ := e.startTwoQuestions("two-questions")

	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `state.pageSize = 1; state.reviewPages = 1; loadRuns().then(() => select(`+jsString(id)+`)).then(() => true)`)
	c.until(ctx, "the count of the store's reviews", `document.querySelectorAll("#runs li").length === 1 &&
		document.getElementById("interrupt-count").textContent === "Question 1 of 2 waiting on this run; 5 questions wait across 4 runs"`, shot)

	// An answer elsewhere changes the count the page shows.
	waiting := e.do("GET", "/api/v1/runs?status=interrupted&thread=wait-a", nil).json(t)["runs"].([]any)
	other := waiting[0].(map[string]any)["id"].(string)
	if r := e.do("POST", "/api/v1/runs/"+other+"/resume", map[string]any{"decision": "approve", "wait": "10s"}); r.status != 200 {
		t.Fatalf("decision: %d %s", r.status, r.body)
	}
	c.until(ctx, "the count after an answer elsewhere",
		`document.getElementById("interrupt-count").textContent === "Question 1 of 2 waiting on this run; 4 questions wait across 3 runs"`, shot)
}

// TestDecisionSentWhileAwayIsSettled: a decision the page could not send
// leaves the operator unsure whether it was recorded. Once the appliance
// answers again the page rereads the run and says what became of it:
// not recorded and still waiting, or decided (here, by another operator
// while the page was cut off).
func TestDecisionSentWhileAwayIsSettled(t *testing.T) {
	e := newEnv(t, nil)
	_, a := e.startRun("away-a", "please review A", "10s")
	_, b := e.startRun("away-b", "please review B", "10s")
	link := newLink(t, e.srv.Listener.Addr().String())
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, &env{url: "http://" + link.addr, token: e.token}, shot)
	away := func(id, kind string) {
		t.Helper()
		c.eval(ctx, `select(`+jsString(id)+`); true`)
		c.until(ctx, "the review", `!document.getElementById("interrupt").hidden && document.getElementById("run-id").textContent === `+jsString(id), shot)
		link.cut()
		c.until(ctx, "the stream down", `document.getElementById("stream").textContent === "stream: reconnecting"`, shot)
		c.eval(ctx, `document.getElementById(`+jsString(kind)+`).click(); true`)
		c.until(ctx, "the decision not sent", `document.getElementById("decide-error").textContent.includes("may or may not have been recorded")`, shot)
	}

	away(a["id"].(string), "approve")
	link.restore()
	c.until(ctx, "the page saying the approve was not recorded", `document.getElementById("stream").textContent === "stream: live" &&
		document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent === "The appliance answers again: your approve was not recorded, and the question still waits. Decide again."`, shot)
	shot("settled-not-recorded")

	away(b["id"].(string), "reject")
	if r := e.do("POST", "/api/v1/runs/"+b["id"].(string)+"/resume", map[string]any{"decision": "approve", "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("decision from elsewhere: %d %s", r.status, r.body)
	}
	link.restore()
	c.until(ctx, "the page saying who decided", `document.getElementById("stream").textContent === "stream: live" &&
		document.getElementById("interrupt").hidden && document.getElementById("decide-error").offsetParent !== null &&
		document.getElementById("decide-error").textContent.startsWith("The appliance answers again: this question was decided, approve by Dr Other") &&
		document.getElementById("decide-error").textContent.endsWith("The run is now completed.")`, shot)
	for id, want := range map[string]string{a["id"].(string): "interrupted", b["id"].(string): "completed"} {
		if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != want || (want == "completed" && len(got["decisions"].([]any)) != 1) {
			t.Fatalf("run %s: %v", id, got)
		}
	}
}

// TestFailedToolCallIsShown: the reference bundle's tools agent asks to
// schedule a follow-up, the operator approves, and the appliance's
// follow-up file cannot be written (here a folder stands at its path, as
// a full or read-only disk would refuse it too). The transcript must say
// that the call failed and why, not show it as a call that returned.
func TestFailedToolCallIsShown(t *testing.T) {
	const agentName = toolsAgent
	e := newFailingToolsEnv(t)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `document.getElementById("agent").value = `+jsString(agentName)+`; true`)
	startFromPage(ctx, c, "followup", "please schedule a follow-up call about my metformin")
	c.until(ctx, "the call waiting for approval", `!document.getElementById("interrupt").hidden &&
		document.getElementById("interrupt-why").textContent.includes("schedule_followup")`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	c.until(ctx, "the run ended", `document.getElementById("run-status").dataset.status === "completed"`, shot)
	c.until(ctx, "the failed call in the transcript", `[...document.querySelectorAll("#transcript li.tool")].some(li =>
		li.textContent.startsWith("← schedule_followup failed: tool error: ") && li.textContent.includes("is a directory"))`, shot)
	shot("failed-tool-call")
}

// TestStartOnABusyThreadSaysWhichTurn: a new turn on a thread whose last
// turn waits for review is refused. The page says so in its own words
// (waiting for review, not "interrupted ... resume"), offers to open that
// turn, and keeps the message the operator typed.
func TestStartOnABusyThreadSaysWhichTurn(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	// The turn waiting was started elsewhere: the page has not opened it.
	_, held := e.startRun("console", "please review this", "10s")
	id := held["id"].(string)
	startFromPage(ctx, c, "console", "I forgot my dose")
	c.until(ctx, "the refusal naming the turn waiting", `document.getElementById("start-error").offsetParent !== null &&
		document.getElementById("start-error").textContent.startsWith("Thread console already has a turn waiting for review (`+id+`).") &&
		document.getElementById("input").value === "I forgot my dose"`, shot)
	shot("thread-busy")
	c.eval(ctx, `document.querySelector("#start-error button").click(); true`)
	c.until(ctx, "the turn waiting, opened", `document.getElementById("run-id").textContent === `+jsString(id)+` &&
		!document.getElementById("interrupt").hidden`, shot)
	if got := e.do("GET", "/api/v1/runs?thread=console", nil).json(t)["runs"].([]any); len(got) != 1 {
		t.Fatalf("the refused turn changed the thread: %v", got)
	}
	// The turn goes to a new conversation instead, with the message typed.
	c.eval(ctx, `document.getElementById("new-thread").click(); true`)
	if v, _ := c.eval(ctx, `document.getElementById("input").value`).(string); v != "I forgot my dose" {
		t.Fatalf("a new conversation left the message box holding %q", v)
	}
	c.eval(ctx, `document.getElementById("start").click(); true`)
	c.until(ctx, "the turn on a new thread", `document.getElementById("run-id").textContent !== `+jsString(id)+` &&
		document.getElementById("output").textContent.includes("I forgot my dose")`, shot)
}

// TestFlagsAndToolCallsOfARunFromHistory: a run that ended before the
// page opened (its calls are told by no event the page saw) is opened
// from the list. The list shows its flags, compactly; its view shows
// them in full; and its transcript shows the tool call it made, failed,
// as the transcript of a run watched live does.
func TestFlagsAndToolCallsOfARunFromHistory(t *testing.T) {
	e := newFailingToolsEnv(t)
	id := e.failedToolRun("from-history")
	e.startRun("calm", "hello", "10s") // a run with no flags, for contrast
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	item := `document.querySelector('#runs li[data-run=` + jsString(id) + `]')`
	c.until(ctx, "the run's flags in the list", item+` && `+item+`.querySelector(".flags") &&
		`+item+`.querySelector(".flags").textContent.includes("tool_failed") &&
		[...document.querySelectorAll("#runs li")].filter(li => li.querySelector(".flags")).length === 1`, shot)
	c.eval(ctx, item+`.querySelector("button").click(); true`)
	c.until(ctx, "the run's flags in its view", `document.getElementById("run-id").textContent === `+jsString(id)+` &&
		document.getElementById("run-flags").offsetParent !== null &&
		document.getElementById("run-flags").textContent.includes("tool_failed")`, shot)
	c.until(ctx, "the failed call in the transcript", `[...document.querySelectorAll("#transcript li.tool")].some(li =>
		li.textContent.startsWith("→ tool schedule_followup")) &&
		[...document.querySelectorAll("#transcript li.tool.denied")].some(li =>
		li.textContent.startsWith("← schedule_followup failed: tool error: ") && li.textContent.includes("is a directory"))`, shot)
	// The call is drawn before the step its node completed in, once.
	order, _ := c.eval(ctx, `[...document.querySelectorAll("#transcript li")].map(li => li.textContent).join("\n")`).(string)
	called := strings.Index(order, "→ tool schedule_followup")
	if called < 0 || strings.Count(order, "→ tool schedule_followup") != 1 || strings.Count(order, "← schedule_followup failed") != 1 {
		t.Fatalf("the transcript:\n%s", order)
	}
	shot("flags-and-calls-from-history")
}

// TestSignOutDiscardsDrafts: an operator types a reply to a review and
// the token stops being valid before it is sent. The page signs out,
// says that the reply was discarded, and the next person to sign in on
// the tab finds the review as the appliance asks it, not the reply.
// Signing out by hand discards the same way.
func TestSignOutDiscardsDrafts(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "drafts", "please review this")
	typeInto(ctx, c, "edit-value", "a reply not sent")
	typeInto(ctx, c, "reason", "a reason not sent")
	c.until(ctx, "the draft kept", `state.drafts.size === 1`, shot)
	// A request with a token the appliance refuses, as after it made a
	// new one.
	c.eval(ctx, `state.token = "not-the-token"; loadRuns().catch(() => {}); true`)
	c.until(ctx, "the sign-in, saying the reply was discarded", `!document.getElementById("login").hidden &&
		document.getElementById("login-error").textContent.includes("no longer valid") &&
		document.getElementById("login-error").textContent.includes("Your unsent reply to a review question was discarded.")`, shot)
	shot("signed-out-draft-discarded")
	reopen := func() {
		t.Helper()
		c.eval(ctx, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-btn").click(); true`, jsString(e.token)))
		c.until(ctx, "the console again", `!document.getElementById("main").hidden && document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
		c.eval(ctx, `select(`+jsString(id)+`); true`)
		c.until(ctx, "the review as the appliance asks it", `!document.getElementById("interrupt").hidden &&
			document.getElementById("edit-value").value === "Take your dose now. (please review this)" &&
			document.getElementById("reason").value === ""`, shot)
	}
	reopen()
	typeInto(ctx, c, "edit-value", "another reply not sent")
	c.eval(ctx, `document.getElementById("logout").click(); true`)
	c.until(ctx, "the sign-in, saying the reply was discarded", `!document.getElementById("login").hidden &&
		document.getElementById("login-error").textContent === "You signed out. Your unsent reply to a review question was discarded."`, shot)
	reopen()
	// Nothing was sent meanwhile.
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "interrupted" || got["decisions"] != nil {
		t.Fatalf("the run after the sign-outs: %v", got)
	}
}

// TestNewConversationGetsItsOwnThread: turns started from the page do not
// all go to one thread. The page offers a fresh thread, shown and
// editable; a follow-up stays on it; "new conversation" begins another.
func TestNewConversationGetsItsOwnThread(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	first, _ := c.eval(ctx, `document.getElementById("thread").value`).(string)
	if !strings.HasPrefix(first, "conv-") {
		t.Fatalf("the thread offered is %q", first)
	}
	turn := func(input string) map[string]any {
		t.Helper()
		c.eval(ctx, `document.getElementById("input").value = `+jsString(input)+`; document.getElementById("start").click(); true`)
		c.until(ctx, "the turn completed", `document.getElementById("run-status").dataset.status === "completed" &&
			document.getElementById("output").textContent.includes(`+jsString(input)+`)`, shot)
		id, _ := c.eval(ctx, `document.getElementById("run-id").textContent`).(string)
		return e.do("GET", "/api/v1/runs/"+id, nil).json(t)
	}
	if r := turn("I forgot my dose"); r["thread"] != first {
		t.Fatalf("the first turn went to thread %v, the page offered %q", r["thread"], first)
	}
	if r := turn("and what now"); r["thread"] != first {
		t.Fatalf("the follow-up went to thread %v, not %q", r["thread"], first)
	}
	c.eval(ctx, `document.getElementById("new-thread").click(); true`)
	second, _ := c.eval(ctx, `document.getElementById("thread").value`).(string)
	if second == first || !strings.HasPrefix(second, "conv-") {
		t.Fatalf("a new conversation offers thread %q after %q", second, first)
	}
	if r := turn("a new patient"); r["thread"] != second {
		t.Fatalf("the new conversation's turn went to thread %v, not %q", r["thread"], second)
	}
	// The thread stays the operator's to choose.
	c.eval(ctx, `document.getElementById("thread").value = "ward-3"; true`)
	if r := turn("typed thread"); r["thread"] != "ward-3" {
		t.Fatalf("the turn went to thread %v, not the one typed", r["thread"])
	}
	if n := len(e.do("GET", "/api/v1/runs?thread="+first, nil).json(t)["runs"].([]any)); n != 2 {
		t.Fatalf("thread %s holds %d runs, want 2", first, n)
	}
}

// TestContinueAConversationFromItsRun: an operator opens a run from the
// list and goes on with its conversation: the next turn from the page
// goes to that run's thread, not to the one the start form held.
func TestContinueAConversationFromItsRun(t *testing.T) {
	e := newEnv(t, nil)
	_, old := e.startRun("ward-7", "hello", "10s")
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(old["id"].(string))+`); true`)
	c.until(ctx, "the run", `document.getElementById("run-id").textContent === `+jsString(old["id"].(string)), shot)
	c.eval(ctx, `document.getElementById("continue-thread").click(); true`)
	c.until(ctx, "the run's thread in the start form", `document.getElementById("thread").value === "ward-7"`, shot)
	c.eval(ctx, `document.getElementById("input").value = "a follow-up"; document.getElementById("start").click(); true`)
	c.until(ctx, "the follow-up completed", `document.getElementById("run-status").dataset.status === "completed" &&
		document.getElementById("output").textContent.includes("a follow-up")`, shot)
	if n := len(e.do("GET", "/api/v1/runs?thread=ward-7", nil).json(t)["runs"].([]any)); n != 2 {
		t.Fatalf("thread ward-7 holds %d runs, want 2", n)
	}
}

// TestSignOutForgetsTheName: an operator signs out by hand and leaves;
// the next person to sign in on the tab must not have their decisions
// recorded under the first one's name.
func TestSignOutForgetsTheName(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("names", "please review this", "10s")
	id := run["id"].(string)
	c, ctx, shot := openChromium(t)
	signInAs(ctx, t, c, e, shot, "Dr First")
	c.eval(ctx, `document.getElementById("logout").click(); true`)
	c.until(ctx, "the sign-in with no name", `!document.getElementById("login").hidden &&
		document.getElementById("operator").value === "" && sessionStorage.getItem("outpost.operator") === null`, shot)
	// The next person pastes the token and signs in without looking at
	// the name field.
	c.eval(ctx, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-btn").click(); true`, jsString(e.token)))
	c.until(ctx, "the console again", `!document.getElementById("main").hidden && document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the review", `!document.getElementById("interrupt").hidden`, shot)
	c.eval(ctx, `document.getElementById("approve").click(); true`)
	got := e.waitStatus(id, "completed")
	if d := got["decisions"].([]any)[0].(map[string]any); strings.Contains(d["by"].(string), "Dr First") {
		t.Fatalf("the next person's decision is recorded as %q", d["by"])
	}
}

// TestDecisionInTheTranscriptOfARunFromHistory: a run decided before the
// page opened it shows, in its transcript, where it was resumed and by
// whose decision, as a run watched live shows its resume.
func TestDecisionInTheTranscriptOfARunFromHistory(t *testing.T) {
	e := newEnv(t, nil)
	_, run := e.startRun("decided", "please review this", "10s")
	id := run["id"].(string)
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve", "reason": "cited", "wait": "10s"}, "X-Operator", "Dr Other"); r.status != 200 {
		t.Fatalf("decision: %d %s", r.status, r.body)
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the resume in the transcript", `[...document.querySelectorAll("#transcript li")].some(li =>
		li.textContent.startsWith("▶ resumed: approve by Dr Other") && li.textContent.endsWith("(cited)"))`, shot)
	order, _ := c.eval(ctx, `[...document.querySelectorAll("#transcript li")].map(li => li.textContent).join("\n")`).(string)
	if resumed, closing := strings.Index(order, "▶ resumed"), strings.Index(order, "✓ closing"); strings.Count(order, "▶ resumed") != 1 || closing < resumed {
		t.Fatalf("the transcript:\n%s", order)
	}
}

// TestSignOutWithTheCancelDialogOpen: the token is refused while the
// operator has the cancel dialog open. The sign-in must be usable: a
// modal dialog left open makes the rest of the page inert.
func TestSignOutWithTheCancelDialogOpen(t *testing.T) {
	e, c, ctx, shot, id := openReview(t, "dialog", "please review this")
	c.eval(ctx, `document.getElementById("cancel").click(); true`)
	c.until(ctx, "the cancel dialog", `document.getElementById("cancel-confirm").open`, shot)
	c.eval(ctx, `state.token = "not-the-token"; loadRuns().catch(() => {}); true`)
	c.until(ctx, "the sign-in", `!document.getElementById("login").hidden`, shot)
	typeInto(ctx, c, "token", e.token)
	c.until(ctx, "the token typed into the sign-in", `document.getElementById("token").value === `+jsString(e.token), shot)
	c.eval(ctx, `document.getElementById("login-btn").click(); true`)
	c.until(ctx, "the console again", `!document.getElementById("main").hidden && document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "interrupted" {
		t.Fatalf("the run: %v", got)
	}
}

// flaggingAgent raises two flags in its first step, then waits until hold
// closes: a run of it is flagged while it is still going.
const flaggingAgent = "flagging"

func flaggingGraph(hold <-chan struct{}) *engine.Agent {
	b := engine.NewGraph(flaggingAgent)
	input := engine.Replace[string](b, "input")
	flags := engine.Replace[[]string](b, "flags")
	b.AddNode("guard", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set([]string{"acute", "out_of_scope"})}, nil
	})
	b.AddNode("wait", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, nil
	})
	b.AddEdge(engine.Start, "guard")
	b.AddEdge("guard", "wait")
	b.AddEdge("wait", engine.End)
	g, err := b.Compile()
	if err != nil {
		panic(err)
	}
	return testBundleAgent(flaggingAgent, g, input, func(s engine.State) any { return "done" })
}

// TestFlagsOfALiveRun: a run raises flags and goes on. While it is still
// going, its transcript names the flags set, and its view and its line in
// the list show them, from the events the page receives.
func TestFlagsOfALiveRun(t *testing.T) {
	hold := make(chan struct{})
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, flaggingGraph(hold))
	t.Cleanup(func() { close(hold) })
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `document.getElementById("agent").value = `+jsString(flaggingAgent)+`; true`)
	startFromPage(ctx, c, "flagged-live", "my chest hurts")
	c.until(ctx, "the flags named as they are set", `[...document.querySelectorAll("#transcript li.flag")].some(li =>
		li.textContent === "⚑ guardrail flags set by guard: acute, out_of_scope")`, shot)
	c.until(ctx, "the flag line of the run and of its list item", `document.getElementById("run-flags").offsetParent !== null &&
		document.getElementById("run-flags").textContent === "⚑ Flags: acute, out_of_scope" &&
		document.querySelector("#runs li.selected .flags") &&
		document.querySelector("#runs li.selected .flags").textContent === "⚑ acute, out_of_scope"`, shot)
	id, _ := c.eval(ctx, `state.selected`).(string)
	if got := e.do("GET", "/api/v1/runs/"+id, nil).json(t); got["status"] != "running" {
		t.Fatalf("the run is no longer going (%v): the page may have shown its flags when it ended", got["status"])
	}
	shot("flags-of-a-live-run")
}

// TestRejectedToolCallInTheLiveTranscript: an operator rejects a tool
// call from the page. The live transcript says who decided, and that the
// call was not run, once, as the run from history says; the run opened
// again (from the page's events, then after a reload from its records)
// says it once too.
func TestRejectedToolCallInTheLiveTranscript(t *testing.T) {
	e := newFailingToolsEnv(t)
	c, ctx, shot := openChromium(t)
	signInAs(ctx, t, c, e, shot, "Dr Reject")
	c.eval(ctx, `document.getElementById("agent").value = `+jsString(toolsAgent)+`; true`)
	startFromPage(ctx, c, "rejected-live", "please schedule a follow-up call about my metformin")
	c.until(ctx, "the tool call's review", `!document.getElementById("interrupt").hidden &&
		document.getElementById("interrupt-why").textContent.includes("schedule_followup")`, shot)
	typeInto(ctx, c, "reason", "not needed")
	c.eval(ctx, `document.getElementById("reject").click(); true`)
	const notRun = "✗ not run: schedule_followup (rejected by Dr Reject (console-token): not needed)"
	transcript := `[...document.querySelectorAll("#transcript li")].map(li => li.textContent)`
	once := transcript + `.filter(s => s === ` + jsString(notRun) + `).length === 1 && ` +
		transcript + `.filter(s => s.startsWith("▶ resumed: reject by Dr Reject (console-token) at ")).length === 1 && ` +
		`document.getElementById("run-status").dataset.status === "completed"`
	c.until(ctx, "the rejected call in the live transcript", once, shot)
	id, _ := c.eval(ctx, `state.selected`).(string)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the rejected call once, the run opened again", once, shot)
	openPage(ctx, c, e, shot)
	c.until(ctx, "the console after a reload", `!document.getElementById("main").hidden &&
		document.getElementById("runs").getAttribute("aria-busy") === "false"`, shot)
	c.eval(ctx, `select(`+jsString(id)+`); true`)
	c.until(ctx, "the rejected call once, from history", once, shot)
	shot("rejected-tool-call-live")
}

// TestFlaggedOnly: an operator triaging ticks "flagged only": the list
// keeps the flagged runs alone. When the store holds older runs than the
// page has read, the page says that the list is of those it read.
func TestFlaggedOnly(t *testing.T) {
	e := newFailingToolsEnv(t)
	flagged := e.failedToolRun("flagged-only")
	for _, th := range []string{"calm-1", "calm-2", "calm-3"} {
		e.startRun(th, "hello", "10s")
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	listed := `[...document.querySelectorAll("#runs li")].map(li => li.dataset.run)`
	c.until(ctx, "the four runs listed", listed+`.length === 4`, shot)
	c.eval(ctx, `document.getElementById("filter-flagged").click(); true`)
	c.until(ctx, "the flagged run alone", listed+`.join() === `+jsString(flagged)+` &&
		document.getElementById("runs-flagged-note").hidden`, shot)
	// The page reads fewer runs than the store holds: the flagged one is
	// older than those read.
	c.eval(ctx, `state.listed = 2; loadRuns(); true`)
	c.until(ctx, "the list said to be of the runs read", listed+`.length === 0 &&
		document.getElementById("runs-flagged-note").offsetParent !== null &&
		document.getElementById("runs-flagged-note").textContent.startsWith("Flagged runs among the 2 newest runs")`, shot)
	c.eval(ctx, `document.getElementById("filter-flagged").click(); true`)
	c.until(ctx, "every run read, the filter off", listed+`.length === 2 && document.getElementById("runs-flagged-note").hidden`, shot)
	shot("flagged-only")
}

// TestFlagsNamedAsOfTheirStep: each guardrail's line names the flags as
// its own step left them, even when the page reads the run after a later
// step changed them: here the page catches up on a run that ended while
// its stream was down. It named the final flags on the first line too.
func TestFlagsNamedAsOfTheirStep(t *testing.T) {
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, twoGuardsGraph())
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.eval(ctx, `window.reconnect = connect; connect = () => {}; state.ws.close(); true`)
	c.until(ctx, "the stream cut", `state.ws.readyState === WebSocket.CLOSED`, shot)
	r := e.do("POST", "/api/v1/threads/two-guards/runs", map[string]any{"agent": twoGuardsAgent, "input": "my chest hurts", "wait": "20s"})
	run := r.json(t)
	if r.status != http.StatusCreated || run["status"] != "completed" {
		t.Fatalf("start run: %d %s", r.status, r.body)
	}
	id := run["id"].(string)
	c.eval(ctx, `connect = window.reconnect; connect(); true`)
	c.until(ctx, "the run's events caught up", `(state.log.get(`+jsString(id)+`) || []).some(e => e.type === "run.completed")`, shot)
	// The read of the run that its run.started event asked for may not be
	// in yet when the run is opened: the page must read it then, not
	// leave the transcript empty. Forgotten here, so that it never is.
	c.eval(ctx, `state.runs.delete(`+jsString(id)+`); select(`+jsString(id)+`); true`)
	flagLines := `[...document.querySelectorAll("#transcript li.flag")].map(li => li.textContent)`
	c.until(ctx, "each guardrail's flags as of its step", flagLines+`.join("\n") === `+jsString(
		"⚑ guardrail flags set by guard_pre: acute\n⚑ guardrail flags set by guard_post: acute, uncited")+` &&
		document.getElementById("run-flags").textContent === "⚑ Flags: acute, uncited"`, shot)
	// The lines stay so once every read of the run the page makes is in.
	c.until(ctx, "no read of the run pending", `!state.follow.has(`+jsString(id)+`)`, shot)
	if got, _ := c.eval(ctx, flagLines+`.join("\n")`).(string); got != "⚑ guardrail flags set by guard_pre: acute\n⚑ guardrail flags set by guard_post: acute, uncited" {
		t.Fatalf("the flag lines became %q", got)
	}
	shot("flags-named-as-of-their-step")
}

// TestToolCallInASubgraphFromHistory: a run opened from the list (its
// transcript drawn from its checkpoints and records) shows a tool call
// made inside a subgraph at the step of the parent graph that ran the
// subgraph. It was drawn after the run's last step.
func TestToolCallInASubgraphFromHistory(t *testing.T) {
	e := newDelegatingEnv(t)
	r := e.do("POST", "/api/v1/threads/delegated/runs", map[string]any{"agent": delegatingAgent, "input": "about metformin", "wait": "20s"})
	run := r.json(t)
	if r.status != http.StatusCreated || run["status"] != "completed" {
		t.Fatalf("start run: %d %s", r.status, r.body)
	}
	calls, _ := e.do("GET", "/api/v1/runs/"+run["id"].(string), nil).json(t)["tool_calls"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["node"] != "lookup" {
		t.Fatalf("the run's tool calls: %v", calls)
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the run listed", `state.runs.has(`+jsString(run["id"].(string))+`)`, shot)
	c.eval(ctx, `select(`+jsString(run["id"].(string))+`); true`)
	lines := `[...document.querySelectorAll("#transcript li")].map(li => li.textContent)`
	want := []string{"✓ intake  (wrote answer)", `→ tool search_kb {"q":"metformin"}`, "← search_kb returned 19 bytes",
		"✓ research  (wrote notes)", "✓ closing  (wrote answer)"}
	wantJSON, _ := json.Marshal(want)
	c.until(ctx, "the call at the step that ran the subgraph", `JSON.stringify(`+lines+`) === `+jsString(string(wantJSON)), shot)
	shot("tool-call-in-a-subgraph")
}

// TestHeldRunSaysWhy: a run that a crash left running, and whose pinned
// bundle is unavailable at the next start, is held there: it keeps its
// status, and the page says, in the list and in its view, that it waits
// for its bundle, why, and how to put the bundle back.
func TestHeldRunSaysWhy(t *testing.T) {
	if findChromium() == "" {
		t.Skip("SKIPPING THE BROWSER TEST: no chromium found (apt-get install -y chromium; .ci/run installs it)")
	}
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	run := &engine.Run{ID: engine.NewRunID(), Thread: "held", Agent: heldAgent, Status: engine.StatusRunning,
		Bundle: engine.BundleRef{Name: "gone-bundle", Version: 2, Digest: "sha256:gone"}, Input: json.RawMessage(`"before the crash"`),
		CreatedAt: time.Now().UTC(), Durability: engine.DurabilitySync}
	if err := db.Commit(context.Background(), &engine.Commit{Run: run, Sync: true}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	e := newEnvIn(t, dir, nil) // recovers, as serve does at start
	if got := e.do("GET", "/api/v1/runs/"+run.ID, nil).json(t); got["status"] != "running" || got["held"] == nil {
		t.Fatalf("the run through the API: %v", got)
	}
	c, ctx, shot := openChromium(t)
	signIn(ctx, t, c, e, shot)
	id := jsString(run.ID)
	c.until(ctx, "the run listed as held", `[...document.querySelectorAll("#runs li")].some(li => li.dataset.run === `+id+` &&
		li.querySelector(".status").textContent === "held")`, shot)
	c.eval(ctx, `select(`+id+`); true`)
	c.until(ctx, "the run's view saying what it waits for, and why", `document.getElementById("run-status").textContent === "held" &&
		document.getElementById("run-held").offsetParent !== null &&
		document.getElementById("run-held").textContent.includes("waits for its bundle gone-bundle v2") &&
		document.getElementById("run-held").textContent.includes("its folder is gone") &&
		document.getElementById("run-held").textContent.includes("outpost firmware install")`, shot)
}
