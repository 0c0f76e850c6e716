package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/strictjson"
	"github.com/outpost-edge/outpost/store"
)

// runView is a run as the API shows it (DESIGN.md "HTTP API"), plus the
// run's input and the decisions recorded on it (who, when, what value).
type runView struct {
	ID            string                  `json:"id"`
	Thread        string                  `json:"thread"`
	Agent         string                  `json:"agent"`
	Status        engine.RunStatus        `json:"status"`
	Bundle        engine.BundleRef        `json:"bundle"`
	CorrelationID string                  `json:"correlation_id"`
	CreatedAt     time.Time               `json:"created_at"`
	EndedAt       *time.Time              `json:"ended_at,omitempty"`
	Input         json.RawMessage         `json:"input,omitempty"`
	Output        json.RawMessage         `json:"output,omitempty"`
	Interrupts    []interruptView         `json:"interrupts,omitempty"`
	Decisions     []engine.DecisionRecord `json:"decisions,omitempty"`
	Error         string                  `json:"error,omitempty"`
	// Held says that the run, though its status is queued or running,
	// executes nowhere: a crash left it so, and the bundle it is pinned to
	// is unavailable (its installed folder deleted or changed by hand). It
	// goes on at a start of serve once the same bundle is installed again,
	// or a cancel ends it. Absent for every other run.
	Held *engine.Hold `json:"held,omitempty"`
	// Flags are the flags the run raised (acute, refusal, uncited,
	// tool_failed, ...): its flags channel at its newest checkpoint, as its
	// outcome records them. Absent when it raised none.
	Flags []string `json:"flags,omitempty"`
	// ToolCalls are the run's tool-call records, in the order of their
	// keys; GET /api/v1/runs/{id} alone returns them.
	ToolCalls []toolCallView `json:"tool_calls,omitempty"`
	// ToolCallsError says why the run's tool calls cannot be read.
	ToolCallsError string `json:"tool_calls_error,omitempty"`

	// InputTruncated and OutputTruncated mark, in a list, an input or
	// output too large to list (over store.SummaryBytes): "input" or
	// "output" is then a short preview, a JSON string ending in "…", or
	// absent when the run's record keeps none. GET /api/v1/runs/{id}
	// returns both whole.
	InputTruncated  bool `json:"input_truncated,omitempty"`
	OutputTruncated bool `json:"output_truncated,omitempty"`
}

// interruptView is a pending interrupt. Node is the bare name of the node
// that asked (DESIGN.md "HTTP API"); Path names it through the subgraphs,
// as events do ("team/review", Node alone in the run's own graph): the
// bare name is the same in every instance of a subgraph.
type interruptView struct {
	ID      string          `json:"id"`
	Node    string          `json:"node"`
	Path    string          `json:"path"`
	Payload json.RawMessage `json:"payload"`
}

// toolCallView is a tool-call record as GET /api/v1/runs/{id} shows it:
// the call's key (run:step:task:index, with "#ask<n>" for the mark of a
// question asked about it and "#retry<n>" for its run after that), its
// arguments and the decision that let it run or refused it, and how it
// ended: status "done" with the result's size or the error, or "intent"
// when it has no result recorded (it may or may not have run).
type toolCallView struct {
	Key       string          `json:"key"`
	Node      string          `json:"node"`
	Tool      string          `json:"tool"`
	Args      json.RawMessage `json:"args,omitempty"`
	Decision  string          `json:"decision,omitempty"`
	DecidedBy string          `json:"decided_by,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Status    string          `json:"status"`
	Bytes     int             `json:"bytes"`
	Error     string          `json:"error,omitempty"`
	At        time.Time       `json:"at"`
	DoneAt    *time.Time      `json:"done_at,omitempty"`
}

// addFlags sets the flags of views from the store; a store that cannot
// say leaves them out, and the page shows the run without them.
func (s *Server) addFlags(ctx context.Context, runs []*engine.Run, views []runView) {
	if s.cfg.Records == nil {
		return
	}
	flags, err := s.cfg.Records.RunFlags(ctx, runs)
	if err != nil {
		s.cfg.Logf("console: %v", err)
		return
	}
	for i := range views {
		if f := flags[views[i].ID]; len(f) > 0 {
			views[i].Flags = f
		}
	}
}

// toolCalls reads run's tool-call records. The arguments are kept in an
// envelope with the decision (internal/wiring): a record whose envelope
// cannot be read shows the arguments as stored.
func (s *Server) toolCalls(ctx context.Context, run string) ([]toolCallView, error) {
	if s.cfg.Records == nil {
		return nil, nil
	}
	tcs, err := s.cfg.Records.ToolCalls(ctx, run+":")
	if err != nil {
		return nil, err
	}
	bytesOf := func(v engine.Value) ([]byte, error) {
		if v.Blob.IsZero() {
			return v.Inline, nil
		}
		return s.cfg.Manager.Store().Blob(ctx, v.Blob)
	}
	out := make([]toolCallView, 0, len(tcs))
	for _, tc := range tcs {
		v := toolCallView{Key: tc.Key, Node: tc.Node, Tool: tc.Tool, Status: string(tc.Status), Error: tc.Error, At: tc.IntentAt}
		if !tc.DoneAt.IsZero() {
			t := tc.DoneAt
			v.DoneAt = &t
		}
		raw, err := bytesOf(tc.Args)
		if err != nil {
			return nil, fmt.Errorf("tool call %s: args: %w", tc.Key, err)
		}
		var env struct {
			Args      json.RawMessage `json:"args"`
			Decision  string          `json:"decision"`
			DecidedBy string          `json:"decided_by"`
			Reason    string          `json:"reason"`
		}
		if json.Unmarshal(raw, &env) == nil {
			v.Args, v.Decision, v.DecidedBy, v.Reason = env.Args, env.Decision, env.DecidedBy, env.Reason
		} else if json.Valid(raw) {
			v.Args = raw
		}
		res, err := bytesOf(tc.Result)
		if err != nil {
			return nil, fmt.Errorf("tool call %s: result: %w", tc.Key, err)
		}
		v.Bytes = len(res)
		out = append(out, v)
	}
	return out, nil
}

func viewRun(r *engine.Run) runView {
	v := runView{ID: r.ID, Thread: r.Thread, Agent: r.Agent, Status: r.Status, Bundle: r.Bundle,
		CorrelationID: r.CorrelationID, CreatedAt: r.CreatedAt, Input: r.Input, Output: r.Output,
		InputTruncated: r.InputTruncated, OutputTruncated: r.OutputTruncated, Decisions: r.Decisions, Error: r.Error, Held: r.Held}
	if !r.EndedAt.IsZero() {
		t := r.EndedAt
		v.EndedAt = &t
	}
	for _, in := range r.Interrupts {
		p := in.Payload
		if len(p) == 0 {
			p = json.RawMessage("null")
		}
		v.Interrupts = append(v.Interrupts, interruptView{ID: in.ID, Node: in.Node, Path: in.Path(), Payload: p})
	}
	return v
}

// decode reads a JSON body strictly (internal/strictjson): a size limit,
// one JSON object, keys exactly as the fields are named (not in another
// case), each key once, no unknown fields. A key given twice or in another
// case would let the request mean one thing to a proxy or a log reader and
// another to the appliance.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, e := s.readBody(w, r)
	if e != nil {
		return e
	}
	return decodeBody(body, v)
}

// readBody reads a request's body, up to the size limit, whether it comes
// with a Content-Length or chunked, without one.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, errorf(http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body is over %d bytes", tooBig.Limit))
		}
		return nil, errorf(http.StatusBadRequest, "bad_body", "read body: "+err.Error())
	}
	return body, nil
}

// decodeBody is decode's check of a body read whole.
func decodeBody(body []byte, v any) *apiError {
	// Checked first, so that an array or a string is not reported in terms
	// of the Go type it would have been decoded into.
	if i := bytes.IndexFunc(body, func(c rune) bool { return !strings.ContainsRune(" \t\r\n", c) }); i >= 0 && body[i] != '{' {
		return errorf(http.StatusBadRequest, "bad_json", "the body must be a JSON object")
	}
	_, err := strictjson.Decode(body, v)
	var se *strictjson.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, strictjson.ErrUnknownField) && errors.As(err, &se):
		return errorf(http.StatusBadRequest, "unknown_field", fmt.Sprintf("unknown field %s in the body", quote(se.Field)))
	case errors.Is(err, strictjson.ErrDuplicateKey) && errors.As(err, &se):
		return errorf(http.StatusBadRequest, "duplicate_field", fmt.Sprintf("field %s is given twice in the body", quote(se.Field)))
	}
	return errorf(http.StatusBadRequest, "bad_json", "malformed JSON body: "+err.Error())
}

// parseWait accepts a Go duration ("30s") or a number of seconds.
func (s *Server) parseWait(raw json.RawMessage) (time.Duration, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var d time.Duration
	var str string
	var secs float64
	switch {
	case json.Unmarshal(raw, &str) == nil:
		var err error
		if d, err = time.ParseDuration(str); err != nil {
			return 0, errorf(http.StatusBadRequest, "bad_wait", "wait: "+err.Error())
		}
	case json.Unmarshal(raw, &secs) == nil:
		// Converted after the cap: a number past int64 nanoseconds would
		// otherwise come out as anything, negative included.
		if secs < 0 {
			return 0, errorf(http.StatusBadRequest, "bad_wait", "wait is negative")
		}
		d = time.Duration(min(secs, s.cfg.MaxWait.Seconds()) * float64(time.Second))
	default:
		return 0, errorf(http.StatusBadRequest, "bad_wait", `wait is a duration ("30s") or a number of seconds`)
	}
	if d < 0 {
		return 0, errorf(http.StatusBadRequest, "bad_wait", "wait is negative")
	}
	return min(d, s.cfg.MaxWait), nil
}

// printableID is the rule for IDs a client chooses (thread, correlation):
// 1 to 200 bytes with no control characters. They go into store keys,
// logs, events and the outcome ledger sent upstream.
func printableID(id string) bool {
	return id != "" && len(id) <= 200 && !strings.ContainsFunc(id, func(c rune) bool { return c < 0x20 || c == 0x7f })
}

func validThread(t string) *apiError {
	if !printableID(t) {
		return errorf(http.StatusBadRequest, "bad_thread", "a thread id is 1 to 200 printable characters")
	}
	return nil
}

// missingInput reports whether a run request's input is absent, null or
// the empty string: DESIGN gives input as required, and an empty message
// is a client's bug (the console page refuses to send one), not a turn.
func missingInput(raw json.RawMessage) bool {
	var str string
	return len(raw) == 0 || string(raw) == "null" || (json.Unmarshal(raw, &str) == nil && str == "")
}

type startRequest struct {
	Agent         string          `json:"agent"`
	Input         json.RawMessage `json:"input"`
	CorrelationID string          `json:"correlation_id"`
	Tools         *[]string       `json:"tools"`
	Wait          json.RawMessage `json:"wait"`
}

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) *apiError {
	thread := r.PathValue("thread")
	if e := validThread(thread); e != nil {
		return e
	}
	var req startRequest
	if e := s.decode(w, r, &req); e != nil {
		return e
	}
	wait, e := s.parseWait(req.Wait)
	if e != nil {
		return e
	}
	if req.Agent == "" {
		return errorf(http.StatusUnprocessableEntity, "agent_required", `"agent" is required`)
	}
	if missingInput(req.Input) {
		return errorf(http.StatusUnprocessableEntity, "input_required", `"input" is required and not empty`)
	}
	if req.CorrelationID != "" && !printableID(req.CorrelationID) {
		return errorf(http.StatusBadRequest, "bad_correlation_id", "a correlation_id is 1 to 200 printable characters")
	}
	// Resolving and checking the input first refuses a bad request before
	// the manager claims the thread or writes anything.
	ag, err := s.cfg.Resolve(req.Agent, engine.BundleRef{})
	if err != nil {
		if errors.Is(err, engine.ErrUnknownAgent) {
			return errorf(http.StatusUnprocessableEntity, "unknown_agent", err.Error())
		}
		return errorf(http.StatusInternalServerError, "resolve_failed", err.Error())
	}
	if ag.Input != nil {
		if _, err := ag.Input(req.Input); err != nil {
			return errorf(http.StatusUnprocessableEntity, "bad_input", err.Error())
		}
	}
	rr := engine.RunRequest{Thread: thread, Agent: req.Agent, Input: req.Input, CorrelationID: req.CorrelationID}
	if req.Tools != nil {
		seen := map[string]bool{}
		for _, t := range *req.Tools {
			if t == "" || strings.ContainsAny(t, ", ") {
				return errorf(http.StatusBadRequest, "bad_tools", fmt.Sprintf("tool name %q is not valid", t))
			}
			if seen[t] {
				return errorf(http.StatusBadRequest, "bad_tools", fmt.Sprintf("tool %s is named twice", quote(t)))
			}
			seen[t] = true
		}
		// Fail closed: a name the run could never use (a typo, a tool
		// this appliance leaves out) is refused, not quietly dropped
		// from a run that then goes ahead without it.
		unknown, err := firmware.UnknownTools(ag, *req.Tools)
		if err != nil {
			return errorf(http.StatusInternalServerError, "resolve_failed", err.Error())
		}
		if unknown != nil {
			return errorf(http.StatusUnprocessableEntity, "unknown_tool", fmt.Sprintf("agent %s cannot have tool %s here: %s",
				quote(req.Agent), strings.Join(unknown.Names, ", "), unknown.Why()))
		}
		rr.Meta = map[string]string{firmware.MetaTools: strings.Join(*req.Tools, ",")}
	}
	run, err := s.cfg.Manager.Start(r.Context(), rr)
	if err != nil {
		return startError(err)
	}
	return s.respondRun(w, r, run.ID, wait, http.StatusCreated, "")
}

func startError(err error) *apiError {
	switch {
	case errors.Is(err, engine.ErrThreadBusy):
		return errorf(http.StatusConflict, "thread_busy", err.Error())
	case errors.As(err, new(*firmware.UnknownToolsError)):
		return errorf(http.StatusUnprocessableEntity, "unknown_tool", err.Error())
	case errors.Is(err, engine.ErrUnknownAgent):
		return errorf(http.StatusUnprocessableEntity, "unknown_agent", err.Error())
	case errors.Is(err, engine.ErrManagerClosed):
		return errorf(http.StatusServiceUnavailable, "shutting_down", err.Error())
	case strings.Contains(err.Error(), "queue is full"):
		return errorf(http.StatusServiceUnavailable, "queue_full", err.Error())
	}
	return errorf(http.StatusInternalServerError, "start_failed", err.Error())
}

// respondRun waits (when asked) for the run to stop executing, then answers
// with its live record and status (201 for a new run, as DESIGN gives it,
// whether or not it has ended: a run that outlives the wait is reported
// queued, running or interrupted, for the client to poll or decide).
// answered names the interrupt a resume just answered: until the engine
// commits the resume, the store still holds the run waiting on it, so
// without a wait the run is reported queued, its interrupts answered (a
// new interrupt, met since, is reported as it is).
func (s *Server) respondRun(w http.ResponseWriter, r *http.Request, id string, wait time.Duration, status int, answered string) *apiError {
	if wait > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		_, err := s.cfg.Manager.Wait(ctx, id)
		cancel()
		if err != nil {
			return errorf(http.StatusInternalServerError, "read_failed", err.Error())
		}
	}
	run, err := s.cfg.Manager.Run(context.WithoutCancel(r.Context()), id)
	if err != nil {
		return errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	if answered != "" && wait == 0 && run.Status == engine.StatusInterrupted &&
		slices.ContainsFunc(run.Interrupts, func(in engine.PendingInterrupt) bool { return in.ID == answered }) {
		run.Status, run.Interrupts = engine.StatusQueued, nil
	}
	views := []runView{viewRun(run)}
	s.addFlags(context.WithoutCancel(r.Context()), []*engine.Run{run}, views)
	writeJSON(w, status, views[0])
	return nil
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) *apiError {
	run, e := s.lookup(r.Context(), r.PathValue("id"))
	if e != nil {
		return e
	}
	views := []runView{viewRun(run)}
	s.addFlags(r.Context(), []*engine.Run{run}, views)
	// A record that cannot be read is said, and does not hide the run.
	calls, err := s.toolCalls(r.Context(), run.ID)
	if err != nil {
		views[0].ToolCallsError = err.Error()
	}
	views[0].ToolCalls = calls
	writeJSON(w, http.StatusOK, views[0])
	return nil
}

func (s *Server) lookup(ctx context.Context, id string) (*engine.Run, *apiError) {
	run, err := s.cfg.Manager.Run(ctx, id)
	switch {
	case errors.Is(err, engine.ErrRunNotFound):
		return nil, errorf(http.StatusNotFound, "run_not_found", fmt.Sprintf("no run %s", quote(id)))
	case err != nil:
		return nil, errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	return run, nil
}

var statuses = map[engine.RunStatus]bool{engine.StatusQueued: true, engine.StatusRunning: true,
	engine.StatusInterrupted: true, engine.StatusCompleted: true, engine.StatusFailed: true,
	engine.StatusCancelled: true, engine.StatusBudgetExceeded: true}

// damagedView names a run record that GET /api/v1/runs left out because it
// cannot be read.
type damagedView struct {
	// Key is the record's key: the run ID as it is when it is printable
	// text, Go-quoted ("\x00" escapes) when it holds other bytes.
	Key   string `json:"key"`
	Error string `json:"error"`
}

// listRuns answers GET /api/v1/runs: {"runs": [...], "next"?} (DESIGN.md
// "HTTP API"), oldest first, or newest first with order=desc, and "damaged": [{"key", "error"}] when the page's range of
// run IDs holds run records that cannot be read (a failed checksum or
// decoding). Those are left out of "runs" instead of failing the list, so
// that one damaged record does not hide every other run; outpost db check
// names them too. The field is there only when something was left out. A
// damaged record's fields cannot be trusted, so it is named whatever the
// agent or thread asked for, on the one page whose range holds its key:
// after "after", up to "next" when there is one. A listing of queued,
// running or interrupted runs reads only the runs that the store's index
// of unfinished runs names (store/unfinished.go), so it names only theirs,
// and the records the index found unreadable when it was built.
//
// The first page (no "after") of a listing of interrupted runs also
// carries "waiting": {"runs", "questions"}, the count of every run waiting
// for review that the filter matches and of the questions they wait on,
// over all pages (countWaiting).
//
// Each run is a summary (engine.RunFilter.Summary): an input or output
// over store.SummaryBytes (8 KiB) is a preview, marked input_truncated or
// output_truncated (runView), so that a page of runs with large inputs
// stays small and reads no blob of theirs.
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) *apiError {
	q := r.URL.Query()
	status := engine.RunStatus(q.Get("status"))
	if status != "" && !statuses[status] {
		return errorf(http.StatusBadRequest, "bad_status", fmt.Sprintf("unknown status %s", quote(string(status))))
	}
	limit, e := intParam(q.Get("limit"), 100, 1000)
	if e != nil {
		return e
	}
	if after := q.Get("after"); after != "" && !engine.IsRunID(after) {
		return errorf(http.StatusBadRequest, "bad_after", fmt.Sprintf("after %s is not a run id: pass the \"next\" of the page before", quote(after)))
	}
	// order=desc lists newest first (run IDs are time-ordered), and "after"
	// then pages on towards older runs. Oldest first stays the default.
	var desc bool
	switch order := q.Get("order"); order {
	case "", "asc":
	case "desc":
		desc = true
	default:
		return errorf(http.StatusBadRequest, "bad_order", fmt.Sprintf("order %s is not \"asc\" or \"desc\"", quote(order)))
	}
	// before reports whether run ID a comes before b in the listing's order.
	before := func(a, b string) bool { return a < b != desc }
	damaged := map[string]string{} // key -> why it cannot be read
	// A list shows a summary of each run: a large input or output is a
	// preview (input_truncated, output_truncated), and listing reads no
	// blob of one. One more than the page, to know whether another
	// follows.
	f := engine.RunFilter{Status: status, Agent: q.Get("agent"), Thread: q.Get("thread"), After: q.Get("after"), Limit: limit + 1,
		Desc: desc, Summary: true, Damaged: func(key string, err error) { damaged[key] = err.Error() }}
	// Live statuses, and the runs that exit durability has not stored
	// yet, come from the manager.
	out, err := store.ListLive(r.Context(), s.cfg.Manager.Store(), s.cfg.Manager, f)
	if err != nil {
		return errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	more := false
	if len(out) > limit {
		out, more = out[:limit], true
	}
	views := make([]runView, len(out))
	for i, run := range out {
		views[i] = viewRun(run)
	}
	s.addFlags(r.Context(), out, views)
	resp := map[string]any{"runs": views}
	next := ""
	if more {
		next = out[len(out)-1].ID
		resp["next"] = next
	}
	// The listing read the keys up to the end of its page, past next; a
	// key after next is the next page's to name.
	var keys []string
	for key := range damaged {
		if next == "" || !before(next, key) {
			keys = append(keys, key)
		}
	}
	if status == engine.StatusInterrupted && f.After == "" {
		w, e := s.countWaiting(r.Context(), f)
		if e != nil {
			return e
		}
		resp["waiting"] = w
	}
	if len(keys) > 0 {
		sort.Slice(keys, func(i, j int) bool { return before(keys[i], keys[j]) })
		left := make([]damagedView, len(keys))
		for i, key := range keys {
			left[i] = damagedView{Key: keyText(key), Error: damaged[key]}
		}
		resp["damaged"] = left
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// waitingView counts the runs waiting for review that a listing's filter
// matches, on every page of it, and the questions (interrupts) they wait on.
type waitingView struct {
	Runs      int `json:"runs"`
	Questions int `json:"questions"`
}

// countWaiting counts what waits for review among the runs f matches,
// whatever page f asks for. The runs waiting are read through the store's
// index of unfinished runs, so this costs what they number, not what the
// whole history does: the first page of a listing of interrupted runs
// carries the count, and an operator's figure of what waits is then the
// store's, however many pages a client reads.
func (s *Server) countWaiting(ctx context.Context, f engine.RunFilter) (waitingView, *apiError) {
	f.After, f.Limit, f.Damaged = "", 0, func(string, error) {}
	runs, err := store.ListLive(ctx, s.cfg.Manager.Store(), s.cfg.Manager, f)
	if err != nil {
		return waitingView{}, errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	var w waitingView
	for _, run := range runs {
		w.Runs++
		w.Questions += max(1, len(run.Interrupts))
	}
	return w, nil
}

// keyText is a stored key as JSON shows it: the key itself when it is
// printable text that does not begin with a quote, and Go-quoted
// otherwise, so that the two forms never meet. It is the store's rule for
// the keys that db check --json names (store/errors.go), kept here since
// the console reaches the store only through engine's interfaces.
func keyText(key string) string {
	if key != "" && utf8.ValidString(key) && !strings.HasPrefix(key, `"`) &&
		!strings.ContainsFunc(key, func(c rune) bool { return !strconv.IsPrint(c) }) {
		return key
	}
	return strconv.Quote(key)
}

func intParam(s string, def, max int) (int, *apiError) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, errorf(http.StatusBadRequest, "bad_limit", fmt.Sprintf("limit is a whole number from 1 to %d (a larger one reads as %d)", max, max))
	}
	return min(n, max), nil
}

type resumeRequest struct {
	Decision  string          `json:"decision"`
	Value     json.RawMessage `json:"value"`
	Reason    string          `json:"reason"`
	Interrupt string          `json:"interrupt"`
	Wait      json.RawMessage `json:"wait"`
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) *apiError {
	id := r.PathValue("id")
	var req resumeRequest
	if e := s.decode(w, r, &req); e != nil {
		return e
	}
	wait, e := s.parseWait(req.Wait)
	if e != nil {
		return e
	}
	d := engine.Decision{Kind: req.Decision, Value: req.Value, Reason: req.Reason, By: operator(r), At: time.Now().UTC()}
	if string(d.Value) == "null" {
		d.Value = nil
	}
	if d.Kind == engine.Edit && len(d.Value) == 0 {
		return errorf(http.StatusUnprocessableEntity, "value_required", `an "edit" decision needs a "value": the edited content`)
	}
	if err := d.Validate(); err != nil {
		return errorf(http.StatusUnprocessableEntity, "bad_decision", err.Error())
	}
	run, e := s.lookup(r.Context(), id)
	if e != nil {
		return e
	}
	if run.Status != engine.StatusInterrupted {
		return errorf(http.StatusConflict, "not_interrupted", fmt.Sprintf("run %s is %s, not interrupted", id, run.Status))
	}
	target := req.Interrupt
	if target == "" {
		if len(run.Interrupts) != 1 {
			return errorf(http.StatusUnprocessableEntity, "interrupt_required",
				fmt.Sprintf("run %s waits on %d interrupts: name one with \"interrupt\"", id, len(run.Interrupts)))
		}
		target = run.Interrupts[0].ID
	}
	_, err := s.cfg.Manager.Resume(r.Context(), id, map[string]engine.Decision{target: d})
	switch {
	case errors.Is(err, engine.ErrNotInterrupted):
		return errorf(http.StatusConflict, "not_interrupted", err.Error())
	case errors.Is(err, engine.ErrUnknownInterrupt):
		return errorf(http.StatusUnprocessableEntity, "unknown_interrupt", err.Error())
	case errors.Is(err, engine.ErrBadDecision):
		return errorf(http.StatusUnprocessableEntity, "bad_decision", err.Error())
	case errors.Is(err, engine.ErrManagerClosed):
		return errorf(http.StatusServiceUnavailable, "shutting_down", err.Error())
	case err != nil:
		return errorf(http.StatusInternalServerError, "resume_failed", err.Error())
	}
	return s.respondRun(w, r, id, wait, http.StatusOK, target)
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) *apiError {
	id := r.PathValue("id")
	// A cancel takes no body, or an empty JSON object. A body that is there
	// is checked whether it has a Content-Length or comes chunked without
	// one, so that a malformed one is refused before the run is touched.
	body, e := s.readBody(w, r)
	if e != nil {
		return e
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var empty struct{}
		if e := decodeBody(body, &empty); e != nil {
			return e
		}
	}
	run, e := s.lookup(r.Context(), id)
	if e != nil {
		return e
	}
	if run.Status.Terminal() {
		return errorf(http.StatusConflict, "run_ended", fmt.Sprintf("run %s has already ended (%s)", id, run.Status))
	}
	if err := s.cfg.Manager.Cancel(r.Context(), id); err != nil {
		if errors.Is(err, engine.ErrRunNotFound) {
			return errorf(http.StatusNotFound, "run_not_found", err.Error())
		}
		return errorf(http.StatusConflict, "cancel_failed", err.Error())
	}
	// An executing run stops at its next safe point: wait briefly for it.
	return s.respondRun(w, r, id, 5*time.Second, http.StatusOK, "")
}

type checkpointView struct {
	ID        string    `json:"id"`
	ParentID  string    `json:"parent_id,omitempty"`
	Run       string    `json:"run"`
	Step      int       `json:"step"`
	Source    string    `json:"source"`
	Nodes     []string  `json:"nodes"`
	Next      []string  `json:"next"`
	Channels  []string  `json:"channels"`
	CreatedAt time.Time `json:"created_at"`
}

type decisionView struct {
	Run string `json:"run"`
	engine.DecisionRecord
}

func (s *Server) history(w http.ResponseWriter, r *http.Request) *apiError {
	thread := r.PathValue("thread")
	if e := validThread(thread); e != nil {
		return e
	}
	q := r.URL.Query()
	limit, e := intParam(q.Get("limit"), 100, 1000)
	if e != nil {
		return e
	}
	// History is newest first, so the page after a cursor holds the
	// checkpoints older than it: "after" (DESIGN's name for the "next" of
	// the page before) is read as the store's "before"; "before" is kept as
	// an alias, for clients written against it.
	after, before := q.Get("after"), q.Get("before")
	if after != "" && before != "" && after != before {
		return errorf(http.StatusBadRequest, "bad_after", `give "after" (or its alias "before"), not both`)
	}
	if after == "" {
		after = before
	}
	cps, err := engine.HistoryPage(r.Context(), s.cfg.Manager.Store(), thread, "", after, limit+1)
	switch {
	case errors.Is(err, engine.ErrCheckpointNotFound):
		return errorf(http.StatusBadRequest, "bad_after", fmt.Sprintf("after %s names no checkpoint of thread %s: pass the \"next\" of the page before", quote(after), quote(thread)))
	case err != nil:
		return errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	if len(cps) == 0 && after == "" {
		return errorf(http.StatusNotFound, "thread_not_found", fmt.Sprintf("thread %s has no checkpoints", quote(thread)))
	}
	resp := map[string]any{}
	if len(cps) > limit {
		cps = cps[:limit]
		resp["next"] = cps[len(cps)-1].ID
	}
	views := make([]checkpointView, len(cps))
	var runIDs []string
	seen := map[string]bool{}
	for i, c := range cps {
		v := checkpointView{ID: c.ID, ParentID: c.ParentID, Run: c.RunID, Step: c.Step, Source: c.Source,
			Nodes: c.Nodes, Next: make([]string, len(c.Next)), Channels: make([]string, len(c.Channels)), CreatedAt: c.Created}
		if v.Nodes == nil {
			v.Nodes = []string{}
		}
		for j, t := range c.Next {
			v.Next[j] = t.Node
		}
		for j, ch := range c.Channels {
			v.Channels[j] = ch.Channel
		}
		views[i] = v
		if c.RunID != "" && !seen[c.RunID] {
			seen[c.RunID] = true
			runIDs = append(runIDs, c.RunID)
		}
	}
	// Who decided what, when: the decisions of the runs in this page.
	decisions := []decisionView{}
	for _, id := range runIDs {
		run, err := s.cfg.Manager.Store().Run(r.Context(), id)
		if err != nil {
			continue // a fork's checkpoint may name a run never stored
		}
		for _, d := range run.Decisions {
			decisions = append(decisions, decisionView{Run: id, DecisionRecord: d})
		}
	}
	resp["checkpoints"] = views
	resp["decisions"] = decisions
	writeJSON(w, http.StatusOK, resp)
	return nil
}

type forkRequest struct {
	Checkpoint string `json:"checkpoint"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) *apiError {
	thread := r.PathValue("thread")
	if e := validThread(thread); e != nil {
		return e
	}
	var req forkRequest
	if e := s.decode(w, r, &req); e != nil {
		return e
	}
	if req.Checkpoint == "" {
		return errorf(http.StatusUnprocessableEntity, "checkpoint_required", `"checkpoint" is required`)
	}
	// The manager knows whether a run holds the thread, whatever the store
	// holds; a run record that cannot be read (and so names no thread) is
	// passed over, as the run list does.
	if id, busy := s.cfg.Manager.ThreadRun(thread); busy {
		run, err := s.cfg.Manager.Run(r.Context(), id)
		status := "not finished"
		if err == nil {
			status = string(run.Status)
		}
		return errorf(http.StatusConflict, "thread_busy", fmt.Sprintf("run %s on the thread is %s: cancel or finish it before forking", id, status))
	}
	runs, err := s.cfg.Manager.Store().Runs(r.Context(), engine.RunFilter{Thread: thread, Summary: true, Damaged: func(string, error) {}})
	if err != nil {
		return errorf(http.StatusInternalServerError, "read_failed", err.Error())
	}
	if len(runs) == 0 {
		return errorf(http.StatusNotFound, "thread_not_found", fmt.Sprintf("thread %s has no runs", quote(thread)))
	}
	last := runs[len(runs)-1]
	if !last.Status.Terminal() {
		return errorf(http.StatusConflict, "thread_busy", fmt.Sprintf("run %s on the thread is %s: cancel or finish it before forking", last.ID, last.Status))
	}
	ag, err := s.cfg.Resolve(last.Agent, last.Bundle)
	if err != nil {
		return errorf(http.StatusInternalServerError, "resolve_failed", err.Error())
	}
	c, err := ag.Graph.Fork(r.Context(), engine.RunConfig{Thread: thread, Store: s.cfg.Manager.Store()}, req.Checkpoint)
	if err != nil {
		if errors.Is(err, engine.ErrCheckpointNotFound) {
			// Said short when the checkpoint named is not there; one of its
			// ancestors missing (damage) keeps the whole chain.
			msg := err.Error()
			if _, cerr := s.cfg.Manager.Store().Checkpoint(r.Context(), thread, "", req.Checkpoint); errors.Is(cerr, engine.ErrCheckpointNotFound) {
				msg = fmt.Sprintf("thread %s has no checkpoint %s (GET /api/v1/threads/%s/history lists them)",
					quote(thread), quote(req.Checkpoint), url.PathEscape(thread))
			}
			return errorf(http.StatusNotFound, "checkpoint_not_found", msg)
		}
		return errorf(http.StatusInternalServerError, "fork_failed", err.Error())
	}
	writeJSON(w, http.StatusCreated, map[string]string{"thread": thread, "checkpoint": c.ID, "parent": c.ParentID})
	return nil
}

// agents lists the agents offered to new runs and, for those whose bundle
// says, each one's allowlist (BundleInfo.Allowlists: null for none).
func (s *Server) agents(w http.ResponseWriter, r *http.Request) *apiError {
	names := append([]string{}, s.cfg.Agents...)
	known := map[string][]string{}
	if s.cfg.Bundles != nil {
		for _, b := range s.cfg.Bundles() {
			if b.Active {
				maps.Copy(known, b.Allowlists)
			}
		}
	}
	allowlists := map[string][]string{}
	for _, n := range names {
		if l, ok := known[n]; ok {
			allowlists[n] = l
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"agents": names, "allowlists": allowlists})
	return nil
}

func (s *Server) graph(w http.ResponseWriter, r *http.Request) *apiError {
	name := r.PathValue("agent")
	ag, err := s.cfg.Resolve(name, engine.BundleRef{})
	if err != nil {
		if errors.Is(err, engine.ErrUnknownAgent) {
			return errorf(http.StatusNotFound, "unknown_agent", err.Error())
		}
		return errorf(http.StatusInternalServerError, "resolve_failed", err.Error())
	}
	writeJSON(w, http.StatusOK, map[string]any{"agent": ag.Name, "bundle": ag.Bundle,
		"nodes": ag.Graph.Nodes(), "mermaid": ag.Graph.Mermaid()})
	return nil
}

func (s *Server) firmware(w http.ResponseWriter, r *http.Request) *apiError {
	bundles := []BundleInfo{}
	if s.cfg.Bundles != nil {
		bundles = append(bundles, s.cfg.Bundles()...)
	}
	kept := []firmware.Kept{}
	if s.cfg.Kept != nil {
		k, err := s.cfg.Kept()
		if err != nil {
			return errorf(http.StatusInternalServerError, "firmware_failed", err.Error())
		}
		kept = append(kept, k...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"bundles": bundles, "kept": kept})
	return nil
}

func (s *Server) uplinkStatus(ctx context.Context) (*UplinkStatus, error) {
	if s.cfg.Uplink == nil {
		return &UplinkStatus{Configured: false,
			Note: "no uplink is configured in this build: outcome records stay on this appliance"}, nil
	}
	return s.cfg.Uplink(ctx)
}

func (s *Server) uplink(w http.ResponseWriter, r *http.Request) *apiError {
	st, err := s.uplinkStatus(r.Context())
	if err != nil {
		return errorf(http.StatusInternalServerError, "uplink_failed", err.Error())
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}
