package console_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
)

type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
}

func (e *env) dial(ctx context.Context, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error) {
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.url, "http")+"/api/v1/events", opts)
}

// connect dials and authenticates with the first message.
func (e *env) connect(ctx context.Context) *wsClient {
	e.t.Helper()
	conn, _, err := e.dial(ctx, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.CloseNow() })
	c := &wsClient{t: e.t, conn: conn}
	c.send(ctx, map[string]any{"type": "auth", "token": e.token})
	if m := c.next(ctx); m["type"] != "ready" {
		e.t.Fatalf("want ready, got %v", m)
	}
	return c
}

func (c *wsClient) send(ctx context.Context, v any) {
	c.t.Helper()
	b, _ := json.Marshal(v)
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wsClient) next(ctx context.Context) map[string]any {
	c.t.Helper()
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatal(err)
	}
	return m
}

// until reads messages until one satisfies stop, returning all read.
func (c *wsClient) until(ctx context.Context, stop func(map[string]any) bool) []map[string]any {
	c.t.Helper()
	var out []map[string]any
	for {
		m := c.next(ctx)
		out = append(out, m)
		if stop(m) {
			return out
		}
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestWebsocketAuth(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	e.connect(ctx) // first-message auth

	conn, _, err := e.dial(ctx, &websocket.DialOptions{Subprotocols: []string{"outpost.bearer." + e.token}})
	if err != nil {
		t.Fatalf("subprotocol auth: %v", err)
	}
	if conn.Subprotocol() != "outpost.bearer."+e.token {
		t.Fatalf("subprotocol not echoed: %q", conn.Subprotocol())
	}
	c := &wsClient{t: t, conn: conn}
	if m := c.next(ctx); m["type"] != "ready" {
		t.Fatalf("ready: %v", m)
	}
	conn.Close(websocket.StatusNormalClosure, "")

	_, res, err := e.dial(ctx, &websocket.DialOptions{Subprotocols: []string{"outpost.bearer.wrong"}})
	if err == nil || res == nil || res.StatusCode != 401 {
		t.Fatalf("bad subprotocol token: %v %v", err, res)
	}
	// A bearer header authenticates the upgrade, and a wrong one is refused
	// there, before any websocket.
	conn, _, err = e.dial(ctx, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.token}}})
	if err != nil {
		t.Fatalf("bearer header: %v", err)
	}
	if m := (&wsClient{t: t, conn: conn}).next(ctx); m["type"] != "ready" {
		t.Fatalf("ready after a bearer header: %v", m)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	_, res, err = e.dial(ctx, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer wrong"}}})
	if err == nil || res == nil || res.StatusCode != 401 {
		t.Fatalf("bad bearer header: %v %v", err, res)
	}
	_, res, err = e.dial(ctx, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://evil.example"}}})
	if err == nil || res == nil || res.StatusCode != 403 {
		t.Fatalf("bad origin: %v %v", err, res)
	}
	_, res, err = e.dial(ctx, &websocket.DialOptions{Host: "evil.example"})
	if err == nil || res == nil || res.StatusCode != 421 {
		t.Fatalf("bad host: %v %v", err, res)
	}

	// A wrong token in the first message: closed with 1008.
	conn, _, err = e.dial(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(ctx, websocket.MessageText, []byte(`{"type":"auth","token":"wrong"}`))
	_, _, err = conn.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("bad first-message token: %v", err)
	}
	// No auth message at all within the time allowed: closed too.
	e2 := newEnv(t, func(c *console.Config) { c.Events.AuthTimeout = 200 * time.Millisecond })
	conn, _, err = e2.dial(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = conn.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("silent client: %v", err)
	}
}

func TestWebsocketSubscribeAndResume(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "subscribe", "thread": "mine"})
	if m := c.next(ctx); m["type"] != "subscribed" || m["thread"] != "mine" {
		t.Fatalf("subscribed: %v", m)
	}
	e.startRun("theirs", "hello", "20s")
	_, run := e.startRun("mine", "hello", "20s")
	// A run's last event is the announcement of its outcome, after its
	// run.completed.
	evs := c.until(ctx, func(m map[string]any) bool { return m["type"] == engine.EventOutcomeAppended })
	var types []string
	var seqs []float64
	tokens := 0
	for _, m := range evs {
		if m["thread"] != "mine" || m["run"] != run["id"] {
			t.Fatalf("event of another thread: %v", m)
		}
		if m["type"] == engine.EventModelToken {
			tokens++
			if m["node"] != "draft" {
				t.Errorf("token from %v", m["node"])
			}
		}
		types = append(types, m["type"].(string))
		seqs = append(seqs, m["seq"].(float64))
	}
	if tokens != 4 {
		t.Errorf("model tokens streamed: %d, want 4 (%v)", tokens, types)
	}
	if types[0] != engine.EventRunStarted {
		t.Errorf("first event %s", types[0])
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("seqs not increasing: %v", seqs)
		}
	}
	// Tokens stream while the node runs: before its node.completed.
	firstToken, draftDone := -1, -1
	for i, m := range evs {
		if m["type"] == engine.EventModelToken && firstToken < 0 {
			firstToken = i
		}
		if m["type"] == engine.EventNodeCompleted && m["node"] == "draft" {
			draftDone = i
		}
	}
	if firstToken < 0 || draftDone < firstToken {
		t.Errorf("tokens at %d, draft completed at %d", firstToken, draftDone)
	}

	// A new connection resumes after the third event: it gets the rest of
	// the thread's events, in order, once each, then live ones.
	c2 := e.connect(ctx)
	from := seqs[2]
	c2.send(ctx, map[string]any{"type": "resume", "seq": from, "thread": "mine"})
	replayed := c2.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" })
	replayed = replayed[:len(replayed)-1]
	if len(replayed) != len(evs)-3 {
		t.Fatalf("replayed %d events, want %d", len(replayed), len(evs)-3)
	}
	for i, m := range replayed {
		if m["seq"] != seqs[i+3] {
			t.Fatalf("replay %d: seq %v, want %v", i, m["seq"], seqs[i+3])
		}
	}
	_, run2 := e.startRun("mine", "again", "20s")
	live := c2.until(ctx, func(m map[string]any) bool { return m["type"] == engine.EventOutcomeAppended })
	if live[0]["run"] != run2["id"] || live[0]["type"] != engine.EventRunStarted {
		t.Fatalf("live after resume: %v", live[0])
	}
	// Subscribing to one run only.
	c3 := e.connect(ctx)
	_, run3 := e.startRun("mine", "review", "20s")
	// The hub follows the bus on its own goroutine: once the first client
	// has the announcement of the outcome the pause left, after the
	// interrupt, the replay window holds them too.
	c.until(ctx, func(m map[string]any) bool { return m["type"] == engine.EventOutcomeAppended && m["run"] == run3["id"] })
	c3.send(ctx, map[string]any{"type": "resume", "seq": 0, "run": run3["id"]})
	got := c3.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" })
	if got[len(got)-3]["type"] != engine.EventInterrupt || got[len(got)-2]["type"] != engine.EventOutcomeAppended {
		t.Fatalf("run filter replay ends with %v, %v", got[len(got)-3], got[len(got)-2])
	}
	for _, m := range got[:len(got)-1] {
		if m["run"] != run3["id"] {
			t.Fatalf("event of another run: %v", m)
		}
	}
}

func TestWebsocketWindowExceeded(t *testing.T) {
	e := newEnv(t, func(c *console.Config) { c.Events.Window = 8 })
	ctx := testCtx(t)
	for i := 0; i < 20; i++ {
		e.bus.Publish(engine.Event{Type: engine.EventCheckpoint, Run: "run_x", Thread: "x", Data: json.RawMessage(`{}`)})
	}
	// Wait until the hub has seen all 20 (a resume's reply names the
	// newest seq), on a connection of its own: one that resumed earlier
	// gets the events the hub sees later live, and a replay skips those.
	probe := e.connect(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		probe.send(ctx, map[string]any{"type": "resume", "seq": 19})
		msgs := probe.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" })
		if msgs[len(msgs)-1]["seq"] == 20.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub never caught up: %v", msgs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "resume", "seq": 19})
	if msgs := c.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" }); len(msgs) != 2 || msgs[0]["seq"] != 20.0 {
		t.Fatalf("resume from 19: %v", msgs)
	}
	c.send(ctx, map[string]any{"type": "resume", "seq": 2})
	msgs := c.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" })
	if msgs[0]["type"] != "window_exceeded" || msgs[0]["oldest"] != 13.0 || msgs[0]["requested"] != 2.0 {
		t.Fatalf("want window_exceeded from 13: %v", msgs[0])
	}
	if len(msgs) != 1+8+1 || msgs[1]["seq"] != 13.0 {
		t.Fatalf("after window_exceeded, the window: %d messages, %v", len(msgs), msgs[1])
	}
	// A seq from the future (an earlier life of the stream) is refused too.
	c.send(ctx, map[string]any{"type": "resume", "seq": 5000})
	if m := c.next(ctx); m["type"] != "window_exceeded" {
		t.Fatalf("future seq: %v", m)
	}
	c.send(ctx, map[string]any{"type": "hello"})
	for {
		m := c.next(ctx)
		if m["type"] == "error" {
			break
		}
	}
}

func TestSlowClientIsDropped(t *testing.T) {
	e := newEnv(t, func(c *console.Config) {
		c.Events.ClientQueue = 32
		c.Events.Window = 64
		c.Events.WriteTimeout = 20 * time.Second
	})
	ctx := testCtx(t)
	slow := e.connect(ctx)
	slow.send(ctx, map[string]any{"type": "subscribe"})
	if m := slow.next(ctx); m["type"] != "subscribed" {
		t.Fatal(m)
	}
	// The slow client now reads nothing while a flood is published: the
	// runtime must not wait for it.
	payload := json.RawMessage(`{"content":"` + strings.Repeat("x", 16<<10) + `"}`)
	start := time.Now()
	for i := 0; i < 3000; i++ {
		e.bus.Publish(engine.Event{Type: engine.EventModelToken, Run: "run_flood", Thread: "flood", Data: payload, Live: true})
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("publishing took %v: the bus waited for the slow client", d)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(string(e.do("GET", "/metrics", nil).body), "outpost_stream_dropped_total 1\n") {
		if time.Now().After(deadline) {
			t.Fatal("the slow client was never dropped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Runs go on meanwhile.
	if status, run := e.startRun("after-flood", "hello", "20s"); status != 201 || run["status"] != "completed" {
		t.Fatalf("run after the flood: %d %v", status, run)
	}
	// Reading now, the client drains what was in flight, then learns why
	// it was dropped.
	var err error
	for err == nil {
		_, _, err = slow.conn.Read(ctx)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "slow client") {
		t.Fatalf("want close 1008 with a reason, got %v", err)
	}
}

func TestServerSentEvents(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	open := func(lastID string, query string) (*bufio.Reader, func()) {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/api/v1/events"+query, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+e.token)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("SSE: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		return bufio.NewReader(res.Body), func() { res.Body.Close() }
	}
	type sse struct{ id, event, data string }
	read := func(r *bufio.Reader) sse {
		var ev sse
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("SSE read: %v", err)
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "" && ev.event != "":
				return ev
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			}
		}
	}
	r, done := open("", "?thread=sse")
	defer done()
	if ev := read(r); ev.event != "ready" {
		t.Fatalf("ready: %v", ev)
	}
	if ev := read(r); ev.event != "subscribed" {
		t.Fatalf("subscribed: %v", ev)
	}
	e.startRun("other", "hi", "20s")
	e.startRun("sse", "hi", "20s")
	var ids []string
	for {
		ev := read(r)
		var m map[string]any
		json.Unmarshal([]byte(ev.data), &m)
		if m["thread"] != "sse" || ev.id != strconv.Itoa(int(m["seq"].(float64))) {
			t.Fatalf("SSE event: %v", ev)
		}
		ids = append(ids, ev.id)
		if ev.event == engine.EventOutcomeAppended { // a run's last event
			break
		}
	}
	// Last-Event-ID resumes after the second event.
	r2, done2 := open(ids[1], "?thread=sse")
	defer done2()
	read(r2) // ready
	for _, want := range ids[2:] {
		if ev := read(r2); ev.id != want {
			t.Fatalf("resumed SSE: id %s, want %s", ev.id, want)
		}
	}
	if ev := read(r2); ev.event != "resumed" {
		t.Fatalf("want resumed, got %v", ev)
	}
	// No token: 401, as for every API request.
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/api/v1/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 401 {
		t.Fatalf("SSE without token: %v %v", err, res)
	}
	res.Body.Close()
}

// A client that only authenticates gets every event: subscribe and resume
// are optional. A resume then replays what came before the connection, and
// not what the connection has had live already.
func TestWebsocketStreamsWithoutSubscribe(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	_, before := e.startRun("early", "hello", "20s") // before the connection: only a resume brings it
	// The hub follows the bus on its own goroutine: a client that replays
	// the early run's end knows the hub holds all of it, so none of it
	// can still come to the next connection as live.
	c0 := e.connect(ctx)
	c0.send(ctx, map[string]any{"type": "resume", "seq": 0, "run": before["id"]})
	c0.until(ctx, func(m map[string]any) bool { return m["type"] == "run.completed" })
	c0.conn.CloseNow()

	c := e.connect(ctx)
	_, run := e.startRun("late", "hello", "20s")
	var live []float64
	// Up to the run's last event, the announcement of its outcome.
	for _, m := range c.until(ctx, func(m map[string]any) bool { return m["type"] == engine.EventOutcomeAppended }) {
		if m["run"] != run["id"] {
			t.Fatalf("a live event of another run: %v", m)
		}
		live = append(live, m["seq"].(float64))
	}
	if len(live) < 3 {
		t.Fatalf("live events: %v", live)
	}

	c.send(ctx, map[string]any{"type": "resume", "seq": 0})
	msgs := c.until(ctx, func(m map[string]any) bool { return m["type"] == "resumed" })
	replayed := 0
	for _, m := range msgs[:len(msgs)-1] {
		if m["run"] != before["id"] {
			t.Fatalf("the replay repeated an event the connection had live, or one of another run: %v", m)
		}
		replayed++
	}
	if replayed < 3 {
		t.Fatalf("the replay left out the events from before the connection: %v", msgs)
	}
	if got := msgs[len(msgs)-1]["replayed"]; got != float64(replayed) {
		t.Fatalf("resumed says %v replayed, the client got %d", got, replayed)
	}
}

// TestWebsocketMessagesAreStrict: a stream message with a field the
// protocol does not have (a typo for "thread", say) is answered with an
// error naming it, not taken as a subscribe without a filter, which would
// quietly stream every thread's events. The stream stays open for a
// corrected message.
func TestWebsocketMessagesAreStrict(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "subscribe", "threads": "mine"})
	m := c.next(ctx)
	if m["type"] != "error" || !strings.Contains(m["message"].(string), `"threads"`) {
		t.Fatalf("a subscribe with an unknown field: %v", m)
	}
	c.send(ctx, map[string]any{"type": "subscribe", "thread": "mine"})
	if m := c.next(ctx); m["type"] != "subscribed" || m["thread"] != "mine" {
		t.Fatalf("the corrected subscribe: %v", m)
	}
}

// TestEventsInOrderAndInShape: each event a websocket client receives has
// the shape DESIGN gives (seq, time, type, run, thread, node?, data) and
// nothing else, and the outcome a run leaves when it pauses or ends is
// announced after the events of the step that led there: after the
// interrupt, after the closing node's node.completed and run.completed,
// after a paused run's cancel.
func TestEventsInOrderAndInShape(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testCtx(t)
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "subscribe"})
	if m := c.next(ctx); m["type"] != "subscribed" {
		t.Fatalf("subscribed: %v", m)
	}
	outcome := func(status string) func(map[string]any) bool {
		return func(m map[string]any) bool {
			d, _ := m["data"].(map[string]any)
			return m["type"] == engine.EventOutcomeAppended && d["status"] == status
		}
	}
	// Reads events until want's outcome is announced, checking each
	// event's shape, and returns the types (with the node) read.
	extra := map[string]bool{}
	read := func(want string) []string {
		t.Helper()
		var got []string
		for _, m := range c.until(ctx, outcome(want)) {
			for k := range m {
				switch k {
				case "seq", "time", "type", "run", "thread", "node", "data":
				default:
					if !extra[k] {
						extra[k] = true
						t.Errorf("event %v has field %q, which DESIGN's event shape does not list", m["type"], k)
					}
				}
			}
			typ, _ := m["type"].(string)
			if n, _ := m["node"].(string); n != "" {
				typ += " " + n
			}
			got = append(got, typ)
		}
		return got
	}
	// before checks that each of types is among got before its last event
	// (the outcome).
	before := func(got []string, types ...string) {
		t.Helper()
		last := len(got) - 1
		for _, typ := range types {
			i := slices.Index(got, typ)
			if i < 0 || i > last {
				t.Errorf("%s is not before the outcome: %v", typ, got)
			}
		}
	}

	_, run := e.startRun("order", "please review", "10s")
	id := run["id"].(string)
	before(read("interrupted"), engine.EventRunStarted, engine.EventNodeCompleted+" draft", engine.EventInterrupt+" review")
	if r := e.do("POST", "/api/v1/runs/"+id+"/resume", map[string]any{"decision": "approve"}); r.status != 200 {
		t.Fatalf("resume: %d %s", r.status, r.body)
	}
	before(read("completed"), engine.EventRunResumed, engine.EventNodeCompleted+" review", engine.EventNodeCompleted+" closing", engine.EventRunCompleted)

	_, run = e.startRun("order-cancel", "please review", "10s")
	read("interrupted")
	if r := e.do("POST", "/api/v1/runs/"+run["id"].(string)+"/cancel", nil); r.status != 200 {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	before(read("cancelled"), engine.EventRunFailed)
}

// A client resuming from a seq of an earlier start of the appliance (event
// numbers rise across starts: each start's begin above the last's) is told
// that the appliance started again, not that the window no longer reaches
// back, which reads as if it had merely fallen behind.
func TestWebsocketResumeFromAnEarlierStart(t *testing.T) {
	bus := engine.NewBus()
	bus.StartAfter(3 << 32) // the third start
	e := newEnv(t, func(c *console.Config) { c.Bus = bus })
	ctx := testCtx(t)
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "resume", "seq": 2<<32 + 7})
	m := c.next(ctx)
	if m["type"] != "window_exceeded" || m["requested"] != float64(2<<32+7) {
		t.Fatalf("want window_exceeded for the earlier start's seq: %v", m)
	}
	if msg, _ := m["message"].(string); !strings.Contains(msg, "before the appliance's last start") {
		t.Fatalf("the message does not say the appliance started again: %q", msg)
	}
	// One of this start's, older than its window, is told the window.
	c.send(ctx, map[string]any{"type": "resume", "seq": 3 << 32})
	m = c.next(ctx)
	if m["type"] != "resumed" {
		t.Fatalf("this start's first seq: %v", m)
	}
}

// A node.completed event of a node that wrote the flags carries them as of
// its own step: a reader of the stream that reads the run later (the page
// did) finds the flags a later step set, and named them as the first
// node's.
func TestNodeCompletedCarriesTheFlagsOfItsStep(t *testing.T) {
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, twoGuardsGraph())
	run, completed := watchRun(t, e, "two-guards", twoGuardsAgent, "my chest hurts")
	got := map[string]any{}
	for node, d := range completed {
		got[node] = d["values"]
	}
	want := map[string]any{
		"guard_pre":  map[string]any{"flags": []any{"acute"}},
		"draft":      nil, // it wrote no flags
		"guard_post": map[string]any{"flags": []any{"acute", "uncited"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("values of node.completed: %v, want %v", got, want)
	}
	// The store, read after the run, has the later flags only.
	if flags := e.do("GET", "/api/v1/runs/"+run["id"].(string), nil).json(t)["flags"]; !reflect.DeepEqual(flags, []any{"acute", "uncited"}) {
		t.Fatalf("the run's flags: %v", flags)
	}
}

// A guardrail's flags that take more than a checkpoint keeps inline (the
// checkpoint holds them as a blob) still reach the stream in its
// node.completed event; flags past what an event carries are named by the
// ref of the blob that holds them, which the store keeps. Before, both
// events carried no flags and said nothing of them.
func TestNodeCompletedCarriesManyFlags(t *testing.T) {
	e := newEnvWithAgents(t, t.TempDir(), engine.ManagerOptions{}, nil, nil, manyFlagsGraph())
	_, completed := watchRun(t, e, "many", manyFlagsAgent, "my pills")
	type data struct {
		Values    map[string][]string `json:"values"`
		ValueRefs map[string]string   `json:"value_refs"`
	}
	got := map[string]data{}
	for node, d := range completed {
		raw, _ := json.Marshal(d)
		var v data
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("node.completed data: %v: %s", err, raw)
		}
		got[node] = v
	}
	pre, _ := json.Marshal(manyFlags(40))
	if len(pre) <= engine.BlobThreshold || !reflect.DeepEqual(got["guard_pre"], data{Values: map[string][]string{"flags": manyFlags(40)}}) {
		t.Fatalf("guard_pre's %d bytes of flags: the event has %+v", len(pre), got["guard_pre"])
	}
	post, _ := json.Marshal(manyFlags(engine.EventValuesLimit / 20))
	ref := engine.RefOf(post)
	if len(post) <= engine.EventValuesLimit || !reflect.DeepEqual(got["guard_post"], data{ValueRefs: map[string]string{"flags": ref.String()}}) {
		t.Fatalf("guard_post's %d bytes of flags: the event has %+v, want value_refs naming %s", len(post), got["guard_post"], ref)
	}
	stored, err := e.db.Blob(testCtx(t), ref)
	if err != nil || !bytes.Equal(stored, post) {
		t.Fatalf("the blob that value_refs names: %v (%d bytes)", err, len(stored))
	}
}

// watchRun subscribes to thread's events on the websocket, runs agent on
// it with input to its end, and returns the run and the data of each
// node.completed event it saw, by node.
func watchRun(t *testing.T, e *env, thread, agent, input string) (map[string]any, map[string]map[string]any) {
	t.Helper()
	ctx := testCtx(t)
	c := e.connect(ctx)
	c.send(ctx, map[string]any{"type": "subscribe", "thread": thread})
	if m := c.next(ctx); m["type"] != "subscribed" {
		t.Fatalf("subscribed: %v", m)
	}
	r := e.do("POST", "/api/v1/threads/"+thread+"/runs", map[string]any{"agent": agent, "input": input, "wait": "20s"})
	run := r.json(t)
	if r.status != http.StatusCreated || run["status"] != "completed" {
		t.Fatalf("start run: %d %s", r.status, r.body)
	}
	evs := c.until(ctx, func(m map[string]any) bool { return m["type"] == engine.EventOutcomeAppended })
	out := map[string]map[string]any{}
	for _, m := range evs {
		if m["type"] == engine.EventNodeCompleted {
			d, _ := m["data"].(map[string]any)
			out[m["node"].(string)] = d
		}
	}
	return run, out
}
