package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/strictjson"
	"github.com/outpost-edge/outpost/store"
)

// EventOptions tune the event stream.
type EventOptions struct {
	// Window is how many recent events are kept to answer a resume
	// (default 10,000).
	Window int
	// ClientQueue is how many events a client may fall behind before it is
	// dropped (default 1024).
	ClientQueue int
	// WriteTimeout bounds one write to a client (default 10s).
	WriteTimeout time.Duration
	// AuthTimeout bounds the wait for a websocket's auth message
	// (default 10s).
	AuthTimeout time.Duration
}

// EventValues returns the channels whose values the page reads from the
// node.completed events of the nodes that wrote them: the flags, as of
// that node's step, which a read of the run later may find changed by a
// later step. Give them to the run manager
// (engine.ManagerOptions.EventValues). Values past
// engine.EventValuesLimit come as "value_refs", blob refs, instead (see
// engine.EventNodeCompleted).
func EventValues() []string { return []string{store.FlagsChannel} }

// Control message types (none is an event type).
const (
	msgAuth           = "auth"
	msgSubscribe      = "subscribe"
	msgResume         = "resume"
	msgReady          = "ready"
	msgSubscribed     = "subscribed"
	msgResumed        = "resumed"
	msgWindowExceeded = "window_exceeded"
	msgError          = "error"
)

// hub follows the bus: it keeps the replay window and fans events out to
// the stream's clients without ever waiting for one.
type hub struct {
	opts    EventOptions
	metrics *Metrics
	sub     *engine.Subscription
	done    chan struct{}
	// start is where this life of the stream began: seqs up to it are an
	// earlier start's.
	lifeStart uint64

	mu      sync.Mutex
	ring    []engine.Event
	next    int // ring index the next event goes to
	n       int // events in the ring
	last    uint64
	clients map[*client]struct{}
	closed  bool
}

type client struct {
	q      chan engine.Event
	ctrl   chan batch
	gone   chan struct{}
	code   websocket.StatusCode
	reason string

	// guarded by hub.mu
	active      bool
	thread, run string
}

// batch is what a subscribe or resume sends before the live events: the
// control messages and replayed events, and the seq below which queued
// live events are duplicates.
type batch struct {
	msgs  []any
	floor uint64
}

func newHub(bus *engine.Bus, opts EventOptions, m *Metrics) *hub {
	if opts.Window <= 0 {
		opts.Window = 10000
	}
	if opts.ClientQueue <= 0 {
		opts.ClientQueue = 1024
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.AuthTimeout <= 0 {
		opts.AuthTimeout = 10 * time.Second
	}
	h := &hub{opts: opts, metrics: m, ring: make([]engine.Event, opts.Window), clients: map[*client]struct{}{}, done: make(chan struct{})}
	if bus == nil {
		close(h.done)
		return h
	}
	h.last = bus.Seq() // where this life of the stream starts (Bus.StartAfter)
	h.lifeStart = h.last
	// The hub's own buffer is large: it only copies into the ring and
	// makes non-blocking sends, so it keeps up with any publisher.
	h.sub = bus.Subscribe(1<<16, nil)
	go h.pump()
	return h
}

func (h *hub) pump() {
	defer close(h.done)
	for e := range h.sub.C() {
		h.metrics.observeEvent(e)
		h.mu.Lock()
		h.ring[h.next] = e
		h.next = (h.next + 1) % len(h.ring)
		h.n = min(h.n+1, len(h.ring))
		h.last = e.Seq
		for c := range h.clients {
			if !c.active || !c.matches(e) {
				continue
			}
			select {
			case c.q <- e:
			default:
				h.dropLocked(c, websocket.StatusPolicyViolation,
					fmt.Sprintf("slow client: more than %d events behind; reconnect and resume from your last seq", cap(c.q)))
				h.metrics.dropped.Add(1)
			}
		}
		h.mu.Unlock()
	}
}

func (c *client) matches(e engine.Event) bool {
	if e.Type == engine.EventLost {
		return true
	}
	return (c.run == "" || e.Run == c.run) && (c.thread == "" || e.Thread == c.thread)
}

func (h *hub) add() *client {
	c := &client{q: make(chan engine.Event, h.opts.ClientQueue), ctrl: make(chan batch, 8), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		c.code, c.reason = websocket.StatusGoingAway, "server shutting down"
		close(c.gone)
		return c
	}
	h.clients[c] = struct{}{}
	h.metrics.wsClients.Add(1)
	return c
}

func (h *hub) remove(c *client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.clients[c]; ok {
		delete(h.clients, c)
		h.metrics.wsClients.Add(-1)
	}
}

func (h *hub) dropLocked(c *client, code websocket.StatusCode, reason string) {
	if _, ok := h.clients[c]; !ok {
		return
	}
	delete(h.clients, c)
	h.metrics.wsClients.Add(-1)
	c.code, c.reason = code, reason
	close(c.gone)
}

func (h *hub) close() {
	if h.sub != nil {
		h.sub.Close()
	}
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for c := range h.clients {
		h.dropLocked(c, websocket.StatusGoingAway, "server shutting down")
	}
}

// window returns the oldest and newest seq held (oldest = last+1 when
// empty). Call with h.mu held.
func (h *hub) windowLocked() (oldest, last uint64) {
	if h.n == 0 {
		return h.last + 1, h.last
	}
	first := h.ring[(h.next-h.n+len(h.ring))%len(h.ring)]
	return first.Seq, h.last
}

// subscribe sets c's filter and starts live delivery. With resume, it also
// replays the window's events after seq, or says the window no longer
// reaches back that far (or that seq is from another life of the stream).
func (h *hub) subscribe(c *client, thread, run string, resume bool, seq uint64) batch {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.thread, c.run, c.active = thread, run, true
	oldest, last := h.windowLocked()
	b := batch{floor: last}
	if !resume {
		b.msgs = append(b.msgs, map[string]any{"type": msgSubscribed, "thread": thread, "run": run, "seq": last})
		return b
	}
	from := seq
	if seq+1 < oldest || seq > last {
		h.metrics.windowMiss.Add(1)
		why := "the replay window no longer reaches back to that seq; reload state from the API"
		if seq < h.lifeStart {
			why = "that seq is from before the appliance's last start, whose events are not kept; reload state from the API"
		}
		if seq > last {
			why = "that seq is ahead of the stream (the appliance restarted?); reload state from the API"
		}
		b.msgs = append(b.msgs, map[string]any{"type": msgWindowExceeded, "requested": seq, "oldest": oldest,
			"seq": last, "message": why})
		from = oldest - 1
	}
	count := 0
	for i := 0; i < h.n; i++ {
		e := h.ring[(h.next-h.n+i+len(h.ring))%len(h.ring)]
		if e.Seq > from && c.matches(e) {
			b.msgs = append(b.msgs, e)
			count++
		}
	}
	b.msgs = append(b.msgs, map[string]any{"type": msgResumed, "from": seq, "seq": last, "replayed": count,
		"thread": thread, "run": run})
	return b
}

// start makes c receive every event from now on, as a websocket client
// does once it is authenticated, and returns the ready message that says
// where the stream stands.
func (h *hub) start(c *client) batch {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.thread, c.run, c.active = "", "", true
	_, last := h.windowLocked()
	return batch{msgs: []any{h.readyLocked()}, floor: last}
}

func (h *hub) ready() map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.readyLocked()
}

func (h *hub) readyLocked() map[string]any {
	oldest, last := h.windowLocked()
	return map[string]any{"type": msgReady, "seq": last, "oldest": oldest, "window": len(h.ring)}
}

// events serves GET /api/v1/events: a websocket, or Server-Sent Events for
// a client that asks for text/event-stream.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	switch {
	case isWebsocket(r):
		s.serveWebsocket(w, r)
	case strings.Contains(r.Header.Get("Accept"), "text/event-stream"):
		s.serveSSE(w, r)
	default:
		writeError(w, errorf(http.StatusBadRequest, "stream_required", "connect with a websocket, or with Accept: text/event-stream"))
	}
}

type clientMessage struct {
	Type   string  `json:"type"`
	Token  string  `json:"token"`
	Thread string  `json:"thread"`
	Run    string  `json:"run"`
	Seq    *uint64 `json:"seq"`
}

func (s *Server) serveWebsocket(w http.ResponseWriter, r *http.Request) {
	authed := tokenEqual(bearer(r), s.cfg.Token)
	opts := &websocket.AcceptOptions{
		// The Origin was checked against the allowed names before this.
		InsecureSkipVerify: true,
	}
	if proto, tok := tokenSubprotocol(r); proto != "" {
		if !tokenEqual(tok, s.cfg.Token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outpost"`)
			writeError(w, errorf(http.StatusUnauthorized, "unauthorized", "the token in the subprotocol is not valid"))
			return
		}
		authed = true
		// The browser fails the connection unless the server echoes one of
		// the offered subprotocols.
		opts.Subprotocols = []string{proto}
	}
	conn, err := websocket.Accept(w, r, opts)
	if err != nil {
		return // Accept has answered
	}
	defer conn.CloseNow()
	conn.SetReadLimit(64 << 10)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if !authed {
		// Not a context deadline: its expiry would cut the connection
		// without saying why.
		timer := time.AfterFunc(s.hub.opts.AuthTimeout, func() {
			conn.Close(websocket.StatusPolicyViolation, "unauthorized: no auth message in time")
		})
		_, data, err := conn.Read(ctx)
		timer.Stop()
		if err != nil {
			conn.Close(websocket.StatusPolicyViolation, "unauthorized")
			return
		}
		var m clientMessage
		if json.Unmarshal(data, &m) != nil || m.Type != msgAuth || !tokenEqual(m.Token, s.cfg.Token) {
			conn.Close(websocket.StatusPolicyViolation, "unauthorized")
			return
		}
	}
	c := s.hub.add()
	defer s.hub.remove(c)
	// Every event flows from here on: subscribe narrows the stream, and
	// resume replays what came before (see writeLoop for the overlap).
	c.ctrl <- s.hub.start(c)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		defer cancel()
		s.writeLoop(ctx, conn, c)
	}()
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			break
		}
		var m clientMessage
		var reply batch
		switch err := decodeMessage(data, &m); {
		case err != nil:
			reply.msgs = []any{map[string]any{"type": msgError, "message": err.Error()}}
		case m.Type == msgSubscribe:
			reply = s.hub.subscribe(c, m.Thread, m.Run, false, 0)
		case m.Type == msgResume:
			if m.Seq == nil {
				reply.msgs = []any{map[string]any{"type": msgError, "message": "resume needs a seq"}}
				break
			}
			thread, run := s.currentFilter(c, m)
			reply = s.hub.subscribe(c, thread, run, true, *m.Seq)
		case m.Type == msgAuth:
			continue
		default:
			reply.msgs = []any{map[string]any{"type": msgError, "message": "unknown message type " + quote(m.Type)}}
		}
		select {
		case c.ctrl <- reply:
		case <-c.gone:
		case <-ctx.Done():
		}
	}
	cancel()
	<-writerDone
}

// decodeMessage reads a client's stream message as strictly as the API
// reads a body: a field the protocol does not have (a typo for "thread")
// would otherwise be dropped, and the message taken as a subscribe to
// every thread.
func decodeMessage(data []byte, m *clientMessage) error {
	_, err := strictjson.Decode(data, m)
	var se *strictjson.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, strictjson.ErrUnknownField) && errors.As(err, &se):
		return fmt.Errorf("unknown field %s in the message", quote(se.Field))
	case errors.Is(err, strictjson.ErrDuplicateKey) && errors.As(err, &se):
		return fmt.Errorf("field %s is given twice in the message", quote(se.Field))
	}
	return fmt.Errorf("malformed message: %v", err)
}

// currentFilter: a resume keeps the filter of an earlier subscribe unless
// it names its own.
func (s *Server) currentFilter(c *client, m clientMessage) (thread, run string) {
	if m.Thread != "" || m.Run != "" {
		return m.Thread, m.Run
	}
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return c.thread, c.run
}

// writeLoop is a websocket client's only writer. A subscribe's or resume's
// batch is written before any live event queued after it (ctrl is drained
// first), and queued events at or below its floor are skipped as already
// sent.
func (s *Server) writeLoop(ctx context.Context, conn *websocket.Conn, c *client) {
	// sent is the newest seq written; live..sent is the run of events this
	// connection has had live, which a resume's replay skips, since the
	// client has them already. The live events under a filter are all of
	// that filter's events in the run: a client that falls behind is
	// dropped, not skipped over.
	var sent, live uint64
	write := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return true
		}
		wctx, cancel := context.WithTimeout(ctx, s.hub.opts.WriteTimeout)
		defer cancel()
		return conn.Write(wctx, websocket.MessageText, b) == nil
	}
	writeBatch := func(b batch) bool {
		skipped := 0
		for _, m := range b.msgs {
			if e, ok := m.(engine.Event); ok && live != 0 && e.Seq >= live && e.Seq <= sent {
				skipped++
				continue
			}
			if ctl, ok := m.(map[string]any); ok && ctl["type"] == msgResumed && skipped > 0 {
				ctl["replayed"] = ctl["replayed"].(int) - skipped // what this client gets
			}
			if !write(m) {
				return false
			}
		}
		sent = max(sent, b.floor)
		return true
	}
	for {
		select {
		case <-c.gone:
			conn.Close(c.code, c.reason)
			return
		default:
		}
		select {
		case b := <-c.ctrl:
			if !writeBatch(b) {
				return
			}
			continue
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-c.gone:
			conn.Close(c.code, c.reason)
			return
		case b := <-c.ctrl:
			if !writeBatch(b) {
				return
			}
		case e := <-c.q:
			if e.Seq <= sent && e.Type != engine.EventLost {
				continue
			}
			if !write(e) {
				return
			}
			if live == 0 && e.Type != engine.EventLost {
				live = e.Seq
			}
			sent = max(sent, e.Seq)
		}
	}
}

// serveSSE streams the same events as Server-Sent Events: ?thread= and
// ?run= filter, Last-Event-ID resumes.
func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	q := r.URL.Query()
	c := s.hub.add()
	defer s.hub.remove(c)
	var b batch
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		seq, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			writeError(w, errorf(http.StatusBadRequest, "bad_last_event_id", "Last-Event-ID is a seq"))
			return
		}
		b = s.hub.subscribe(c, q.Get("thread"), q.Get("run"), true, seq)
	} else {
		b = s.hub.subscribe(c, q.Get("thread"), q.Get("run"), false, 0)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(v any) bool {
		var buf []byte
		switch m := v.(type) {
		case engine.Event:
			data, _ := json.Marshal(m)
			buf = fmt.Appendf(nil, "id: %d\nevent: %s\ndata: %s\n\n", m.Seq, m.Type, data)
		case map[string]any:
			data, _ := json.Marshal(m)
			buf = fmt.Appendf(nil, "event: %s\ndata: %s\n\n", m["type"], data)
		case string:
			buf = []byte(m)
		}
		rc.SetWriteDeadline(time.Now().Add(s.hub.opts.WriteTimeout))
		if _, err := w.Write(buf); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	msgs := append([]any{s.hub.ready()}, b.msgs...)
	for _, m := range msgs {
		if !write(m) {
			return
		}
	}
	sent := b.floor
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.gone:
			write(map[string]any{"type": "dropped", "message": c.reason})
			return
		case <-heartbeat.C:
			if !write(": keep-alive\n\n") {
				return
			}
		case e := <-c.q:
			if e.Seq <= sent && e.Type != engine.EventLost {
				continue
			}
			if !write(e) {
				return
			}
			sent = max(sent, e.Seq)
		}
	}
}
