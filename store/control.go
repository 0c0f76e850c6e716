package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/strictjson"
)

// ControlSocket is the name of the unix socket, in the data folder, through
// which the process that owns a store serves the operations that must run
// while it holds the file lock: an online backup, a check, a prune, and
// the reads of the runs commands (runs, one run, a thread's history). The
// socket is created with mode 0600, so only the folder's owner can use it.
const ControlSocket = "outpost.sock"

// ControlOwner is what the process that owns a store says of itself on
// the control socket: its command (serve, run) and whether it sends the
// outcome ledger to a collector, and to which (the URL with no user or
// password; the secret never leaves the process). uplink status reads it
// to say what the owner does, rather than guess.
type ControlOwner struct {
	Command     string `json:"command"`
	SendsUplink bool   `json:"sends_uplink"`
	UplinkURL   string `json:"uplink_url,omitempty"`
}

// ServeControl serves db's online operations on the control socket in dir
// until ctx ends. Call it from the process that owns the store, with the
// run manager that works db as live (nil when none does): the runs
// commands then read runs as the HTTP API shows them (ListLive), with
// their live status, and the runs that exit durability has not stored
// yet. opts adds to it: what the socket says of the process
// (ControlOptions.Owner; its uplink URL is served without its user and
// password), and what a prune reclaims beside the store.
func ServeControl(ctx context.Context, db *DB, dir string, live LiveRuns, opts ...ControlOptions) error {
	var o ControlOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	owner := o.Owner
	if u, err := url.Parse(owner.UplinkURL); err == nil && u.User != nil {
		u.User = nil
		owner.UplinkURL = u.String()
	}
	path := filepath.Join(dir, ControlSocket)
	// A socket left by a killed owner is stale: we hold the lock now.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket: %w", err)
	}
	var l net.Listener
	err := withSocketPath(dir, func(addr string) (err error) {
		l, err = net.Listen("unix", addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	// The socket is the folder's to remove (below), not the listener's:
	// its address may be a path through a descriptor closed by then.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /backup", func(w http.ResponseWriter, r *http.Request) {
		// The status is gone with the first byte, so the length is sent
		// first: a short body is how the client learns of a later failure.
		// One before the copy starts (a store closing) is an error answer.
		started := false
		err := db.view(func(tx *bbolt.Tx) error {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(tx.Size(), 10))
			w.Header().Set(streamCountHeader, strconv.FormatUint(streamCount(tx), 10))
			started = true
			_, err := tx.WriteTo(ctxWriter{r.Context(), w})
			return err
		})
		if err != nil && !started {
			writeControl(w, nil, fmt.Errorf("backup: %w", err))
		}
	})
	mux.HandleFunc("GET /check", func(w http.ResponseWriter, r *http.Request) {
		rep, err := db.Check(r.Context())
		writeControl(w, rep, err)
	})
	mux.HandleFunc("GET /ledger", func(w http.ResponseWriter, r *http.Request) {
		st, err := db.Ledger(r.Context())
		writeControl(w, st, err)
	})
	mux.HandleFunc("GET /owner", func(w http.ResponseWriter, r *http.Request) {
		writeControl(w, owner, nil)
	})
	mux.HandleFunc("POST /prune", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("older_than"))
		if err != nil {
			writeControl(w, nil, fmt.Errorf("older_than: %w", err))
			return
		}
		// The runs in flight that have no record yet keep their call
		// records, however old.
		inFlight := map[string]bool{}
		if live != nil {
			for _, run := range live.Unstored(engine.RunFilter{}) {
				inFlight[run.ID] = true
			}
		}
		rep, err := db.prune(r.Context(), d, time.Now(), inFlight)
		if err == nil && o.AfterPrune != nil {
			// The store's prune has committed, whatever fails now: a
			// client that takes it (Control.Prune) gets the report with
			// the error, what AfterPrune did before it failed counted,
			// as db prune prints it without serve. One that does not ask
			// (an older binary's, whose decoding refuses an unknown
			// field) gets the error alone, as it did.
			if err = o.AfterPrune(r.Context(), rep); err != nil && r.URL.Query().Get(reportOnError) == "1" {
				writeControlReport(w, rep, err)
				return
			}
		}
		writeControl(w, rep, err)
	})
	serveReads(mux, db, live)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(l)
	// Removed before ServeControl returns, so a process that waits for it
	// and exits leaves no socket behind.
	_ = os.Remove(path)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("control socket: %w", err)
	}
	return nil
}

// ControlOptions add to what ServeControl serves.
type ControlOptions struct {
	// Owner is what the socket says of the process (GET /owner).
	Owner ControlOwner
	// AfterPrune, when set, is called in the owning process once a prune
	// asked for through the socket has committed, with its report, to
	// reclaim what beside the store no run refers to any more (the copies
	// of embedded bundles kept for the runs pinned to them, which the
	// owner may pin a new run to at any moment); its error is the
	// prune's.
	AfterPrune func(ctx context.Context, rep *PruneReport) error
}

// reportOnError is the query parameter by which a client of POST /prune
// asks for the report along with an error that follows the store's prune.
const reportOnError = "report_on_error"

// writeControlReport answers err, with the report rep of what was done
// before it.
func writeControlReport(w http.ResponseWriter, rep *PruneReport, err error) {
	e := newControlError(err)
	raw, merr := json.Marshal(rep)
	if merr != nil {
		writeControl(w, nil, errors.Join(err, merr))
		return
	}
	e.Report = raw
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	_ = json.NewEncoder(w).Encode(e)
}

func writeControl(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(newControlError(err))
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// Control is a client of the control socket of the process that owns a
// store.
type Control struct {
	dir string
	c   *http.Client
}

// DialControl returns a client for the store in dir, or an error when no
// process serves its control socket.
func DialControl(dir string) (*Control, error) {
	path := filepath.Join(dir, ControlSocket)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no control socket in %s: %w", dir, err)
	}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (conn net.Conn, err error) {
			err = withSocketPath(dir, func(addr string) error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, "unix", addr)
				return err
			})
			return conn, err
		},
	}}
	return &Control{dir: dir, c: c}, nil
}

// maxSocketPath is the longest path a unix socket address holds (sun_path
// is 108 bytes on Linux, 104 on the BSDs, with a terminating NUL).
const maxSocketPath = 103

// withSocketPath calls fn with an address for the control socket in dir.
// A data folder whose path is too long for a socket address is reached
// through a descriptor of the folder (/proc/self/fd/N/outpost.sock), open
// while fn runs; where that does not exist, the error says what is wrong.
func withSocketPath(dir string, fn func(addr string) error) error {
	path := filepath.Join(dir, ControlSocket)
	if len(path) <= maxSocketPath {
		return fn(path)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	short := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), ControlSocket)
	if _, err := os.Stat(filepath.Dir(short)); err != nil {
		return fmt.Errorf("the data folder's path is %d bytes, too long for a unix socket address (at most %d), "+
			"and there is no /proc/self/fd to reach it through: use a shorter data folder path", len(path), maxSocketPath)
	}
	return fn(short)
}

func (c *Control) do(ctx context.Context, method, path string, out any) error {
	resp, err := c.send(ctx, method, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxControlAnswer+1))
	switch {
	case err != nil:
		return fmt.Errorf("control socket in %s: %w", c.dir, err)
	case len(body) > maxControlAnswer:
		return fmt.Errorf("control socket in %s: the store owner's answer is over %d MiB", c.dir, maxControlAnswer>>20)
	}
	if _, err := strictjson.Decode(body, out); err != nil {
		return fmt.Errorf("control socket in %s: the store owner's answer: %w", c.dir, err)
	}
	return nil
}

// send makes a request and returns the owner's answer when it is 200 OK,
// or the error it names.
func (c *Control) send(ctx context.Context, method, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://outpost"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("control socket in %s: %w", c.dir, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e controlError
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxControlAnswer))
		if _, err := strictjson.Decode(body, &e); err != nil || e.Error == "" {
			if resp.StatusCode == http.StatusNotFound {
				// The mux's own answer: a serve started from an older
				// binary than this command's.
				return nil, fmt.Errorf("store owner: it does not serve %s %s (is serve an older outpost? restart it)", method, req.URL.Path)
			}
			return nil, fmt.Errorf("store owner: answered %s", resp.Status)
		}
		return nil, e.err()
	}
	return resp, nil
}

// Check runs Check in the owning process.
func (c *Control) Check(ctx context.Context) (*CheckReport, error) {
	var rep CheckReport
	return &rep, c.do(ctx, http.MethodGet, "/check", &rep)
}

// Ledger reads the outcome ledger's state in the owning process.
func (c *Control) Ledger(ctx context.Context) (LedgerState, error) {
	var st LedgerState
	return st, c.do(ctx, http.MethodGet, "/ledger", &st)
}

// Owner returns what the owning process says of itself. An owner from
// before it said so answers with an error.
func (c *Control) Owner(ctx context.Context) (ControlOwner, error) {
	var o ControlOwner
	return o, c.do(ctx, http.MethodGet, "/owner", &o)
}

// Prune runs Prune in the owning process, then its ControlOptions.AfterPrune.
// When AfterPrune fails, the store's prune has committed all the same: the
// report comes back with the error, counting what AfterPrune did before it
// failed. Another error comes with no report (nil): nothing is known to
// have been done.
func (c *Control) Prune(ctx context.Context, olderThan time.Duration) (*PruneReport, error) {
	var rep PruneReport
	err := c.do(ctx, http.MethodPost, "/prune?older_than="+olderThan.String()+"&"+reportOnError+"=1", &rep)
	var re *reportedError
	switch {
	case err == nil:
		return &rep, nil
	case !errors.As(err, &re):
		return nil, err
	}
	var done PruneReport
	if _, derr := strictjson.Decode(re.report, &done); derr != nil {
		return nil, errors.Join(err, fmt.Errorf("control socket in %s: the report with the store owner's error: %w", c.dir, derr))
	}
	return &done, err
}

// BackupFile writes a consistent copy of the store, taken by the owning
// process, to path (atomically: a partial copy never appears there).
func (c *Control) BackupFile(ctx context.Context, path string) error {
	resp, err := c.send(ctx, http.MethodGet, "/backup")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer resp.Body.Close()
	// The length is how a copy cut short is told from a whole one.
	want := resp.ContentLength
	if want <= 0 {
		return fmt.Errorf("backup: the store owner sent no length")
	}
	copyProgressOf(ctx).start(want)
	return writeNewFile(path, func(f *os.File) error {
		n, err := io.Copy(ctxWriter{ctx, f}, resp.Body)
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if n != want {
			return fmt.Errorf("backup: got %d of %d bytes", n, want)
		}
		if err := f.Sync(); err != nil {
			return err
		}
		count, err := strconv.ParseUint(resp.Header.Get(streamCountHeader), 10, 64)
		if err != nil {
			return nil // an owner of an earlier version: a copy as it made them
		}
		return stampBackup(f.Name(), count)
	})
}

// streamCountHeader carries the stream count the copy a store owner sends
// holds, which the client stamps it with (stampBackup).
const streamCountHeader = "Outpost-Stream-Count"

// maxControlAnswer bounds an answer the client reads from the control
// socket, an error answer among them (one may carry a prune's report, as
// long as the report's own answer), and an answer of runs the owner will
// build: a page of runs carries their inputs and outputs whole.
const maxControlAnswer = 64 << 20

// controlError is an error answer. Kind, when set, names what the error
// is, so that the client's error matches the same sentinel (or is the same
// *CorruptError) as the owner's, and reads the same: an operator sees one
// message, whichever process read the store.
type controlError struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
	// A corrupt record's bucket, raw key and decoding error.
	Bucket string `json:"bucket,omitempty"`
	Key    []byte `json:"key,omitempty"`
	Cause  string `json:"cause,omitempty"`
	// Report is what was done before the error, where a client asked for
	// it (reportOnError).
	Report json.RawMessage `json:"report,omitempty"`
}

// controlKinds are the errors that keep their identity across the socket.
var controlKinds = map[string]error{
	"run_not_found":        engine.ErrRunNotFound,
	"checkpoint_not_found": engine.ErrCheckpointNotFound,
	"blob_not_found":       engine.ErrBlobNotFound,
}

func newControlError(err error) controlError {
	e := controlError{Error: err.Error()}
	var ce *CorruptError
	if errors.As(err, &ce) {
		e.Kind, e.Bucket, e.Key, e.Cause = "corrupt", ce.Bucket, []byte(ce.Key), ce.Err.Error()
		return e
	}
	for kind, target := range controlKinds {
		if errors.Is(err, target) {
			e.Kind = kind
			break
		}
	}
	return e
}

// err rebuilds the owner's error. One of a known kind reads as the owner
// wrote it and matches what it matched there; any other is the owner's
// message, said to be the owner's.
func (e controlError) err() error {
	if len(e.Report) > 0 {
		report := e.Report
		e.Report = nil
		return &reportedError{err: e.err(), report: report}
	}
	if e.Kind == "corrupt" {
		return &ownerError{e.Error, &CorruptError{Bucket: e.Bucket, Key: string(e.Key), Err: errors.New(e.Cause)}}
	}
	if target, ok := controlKinds[e.Kind]; ok {
		return &ownerError{e.Error, target}
	}
	return fmt.Errorf("store owner: %s", e.Error)
}

// ownerError is an error of the store owner's, as it worded it, wrapping
// the sentinel or *CorruptError it stands for.
type ownerError struct {
	msg string
	err error
}

func (e *ownerError) Error() string { return e.msg }
func (e *ownerError) Unwrap() error { return e.err }

// reportedError is an error of the store owner's that came with the report
// of what it did before it.
type reportedError struct {
	err    error
	report json.RawMessage
}

func (e *reportedError) Error() string { return e.err.Error() }
func (e *reportedError) Unwrap() error { return e.err }

// HistoryEntry is one checkpoint as a listing shows it: where it sits,
// what made it, the channels it changed and the tasks that run next, by
// name. The channels' values stay in the store.
type HistoryEntry struct {
	ID       string    `json:"id"`
	ParentID string    `json:"parent_id,omitempty"`
	Run      string    `json:"run"`
	Step     int       `json:"step"`
	Source   string    `json:"source"`
	Nodes    []string  `json:"nodes,omitempty"`
	Channels []string  `json:"channels"`
	Next     []string  `json:"next"`
	Created  time.Time `json:"created_at"`
}

// NewHistoryEntry summarizes c.
func NewHistoryEntry(c *engine.Checkpoint) HistoryEntry {
	e := HistoryEntry{ID: c.ID, ParentID: c.ParentID, Run: c.RunID, Step: c.Step, Source: c.Source, Nodes: c.Nodes,
		Channels: make([]string, len(c.Channels)), Next: make([]string, len(c.Next)), Created: c.Created}
	for i, cv := range c.Channels {
		e.Channels[i] = cv.Channel
	}
	for i, t := range c.Next {
		e.Next[i] = t.Node
	}
	return e
}

// runsAnswer is GET /runs's answer. A run travels as its record, whole
// (with its input and output inline, however large): the store's own
// versioned, checksummed encoding, which keeps every byte of the JSON
// values a run holds, where encoding/json would compact them.
type runsAnswer struct {
	Runs    [][]byte        `json:"runs"`
	Damaged []damagedRecord `json:"damaged,omitempty"`
	// Truncated, asked for a summary, says of each run whether its input
	// and output are previews (engine.Run.InputTruncated).
	Truncated []truncation `json:"truncated,omitempty"`
	// Held is engine.Run.Held of each listed run that the owner's run
	// manager holds, by run ID: no part of a record.
	Held map[string]*engine.Hold `json:"held,omitempty"`
}

// truncation is a listed run's engine.Run.InputTruncated and
// OutputTruncated.
type truncation struct {
	Input  bool `json:"input,omitempty"`
	Output bool `json:"output,omitempty"`
}

// damagedRecord is a run record that RunFilter.Damaged was told of.
type damagedRecord struct {
	Key   []byte       `json:"key"`
	Error controlError `json:"error"`
}

// runAnswer is GET /run's answer.
type runAnswer struct {
	Run  []byte       `json:"run"`
	Held *engine.Hold `json:"held,omitempty"`
}

// historyAnswer is GET /history's answer.
type historyAnswer struct {
	Checkpoints []HistoryEntry `json:"checkpoints"`
}

// encodeRunWhole encodes r as a run record with its input and output
// inline.
func encodeRunWhole(r *engine.Run) []byte {
	rec, _ := newRunRecord(r)
	rec.Input, rec.InputRef, rec.Output, rec.OutputRef = r.Input, "", r.Output, ""
	return encodeRunRecord(&rec)
}

// decodeRunWhole decodes a record that encodeRunWhole made.
func decodeRunWhole(b []byte) (*engine.Run, error) {
	r, rb, err := decodeRun(b)
	if err != nil {
		return nil, err
	}
	if rb.outOfLine() {
		return nil, errors.New("the run's input or output is out of line")
	}
	return r, nil
}

// queryParams returns r's query parameters, refusing one not in allowed or
// given twice: a parameter the owner would ignore is a client's mistake.
func queryParams(r *http.Request, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for k, vs := range r.URL.Query() {
		if !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("unknown parameter %q", k)
		}
		if len(vs) > 1 {
			return nil, fmt.Errorf("parameter %q given %d times", k, len(vs))
		}
		out[k] = vs[0]
	}
	return out, nil
}

// queryLimit reads the limit parameter: 0 (for all) when absent.
func queryLimit(q map[string]string) (int, error) {
	s, ok := q["limit"]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("limit %q: want a whole number, 0 or more", s)
	}
	return n, nil
}

// serveReads adds the reads that runs list, show and history make: of
// runs as live knows them, when it is not nil.
func serveReads(mux *http.ServeMux, db *DB, live LiveRuns) {
	mux.HandleFunc("GET /runs", func(w http.ResponseWriter, r *http.Request) {
		q, err := queryParams(r, "status", "agent", "thread", "after", "limit", "damaged", "desc", "summary")
		if err != nil {
			writeControl(w, nil, fmt.Errorf("list runs: %w", err))
			return
		}
		limit, err := queryLimit(q)
		if err != nil {
			writeControl(w, nil, fmt.Errorf("list runs: %w", err))
			return
		}
		f := engine.RunFilter{Status: engine.RunStatus(q["status"]), Agent: q["agent"], Thread: q["thread"], After: q["after"], Limit: limit,
			Desc: q["desc"] == "1", Summary: q["summary"] == "1"}
		ans := runsAnswer{Runs: [][]byte{}}
		if q["damaged"] == "1" {
			f.Damaged = func(key string, err error) {
				ans.Damaged = append(ans.Damaged, damagedRecord{Key: []byte(key), Error: newControlError(err)})
			}
		}
		runs, err := ListLive(r.Context(), db, live, f)
		if err != nil {
			writeControl(w, nil, err)
			return
		}
		size := 0
		for _, run := range runs {
			b := encodeRunWhole(run)
			// Base64 in the answer: 4 bytes for 3.
			if size += len(b)/3*4 + 8; size > maxControlAnswer {
				writeControl(w, nil, fmt.Errorf("list runs: %d runs are over %d MiB: ask for fewer", len(runs), maxControlAnswer>>20))
				return
			}
			ans.Runs = append(ans.Runs, b)
			if f.Summary {
				ans.Truncated = append(ans.Truncated, truncation{Input: run.InputTruncated, Output: run.OutputTruncated})
			}
			if run.Held != nil {
				if ans.Held == nil {
					ans.Held = map[string]*engine.Hold{}
				}
				ans.Held[run.ID] = run.Held
			}
		}
		writeControl(w, ans, nil)
	})
	mux.HandleFunc("GET /run", func(w http.ResponseWriter, r *http.Request) {
		q, err := queryParams(r, "id")
		if err != nil {
			writeControl(w, nil, fmt.Errorf("load run: %w", err))
			return
		}
		var run *engine.Run
		if live != nil {
			run, err = live.Run(r.Context(), q["id"])
		} else {
			run, err = db.Run(r.Context(), q["id"])
		}
		if err != nil {
			writeControl(w, nil, err)
			return
		}
		writeControl(w, runAnswer{Run: encodeRunWhole(run), Held: run.Held}, nil)
	})
	mux.HandleFunc("GET /history", func(w http.ResponseWriter, r *http.Request) {
		q, err := queryParams(r, "thread", "ns", "before", "limit")
		if err != nil {
			writeControl(w, nil, fmt.Errorf("list checkpoints: %w", err))
			return
		}
		limit, err := queryLimit(q)
		if err != nil {
			writeControl(w, nil, fmt.Errorf("list checkpoints: %w", err))
			return
		}
		cps, err := engine.HistoryPage(r.Context(), db, q["thread"], q["ns"], q["before"], limit)
		if err != nil {
			writeControl(w, nil, err)
			return
		}
		ans := historyAnswer{Checkpoints: make([]HistoryEntry, len(cps))}
		for i, c := range cps {
			ans.Checkpoints[i] = NewHistoryEntry(c)
		}
		writeControl(w, ans, nil)
	})
}

// Runs lists runs in the owning process, as ListLive does with the run
// manager the owner serves the socket with (as DB.Runs does when it has
// none): the runs the HTTP API lists. f.Damaged, when set, is told of
// each run record the owner could not read, after the list has arrived.
func (c *Control) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	q := url.Values{}
	for k, v := range map[string]string{"status": string(f.Status), "agent": f.Agent, "thread": f.Thread, "after": f.After} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.Damaged != nil {
		q.Set("damaged", "1")
	}
	if f.Desc {
		q.Set("desc", "1")
	}
	if f.Summary {
		q.Set("summary", "1")
	}
	var ans runsAnswer
	if err := c.do(ctx, http.MethodGet, "/runs?"+q.Encode(), &ans); err != nil {
		return nil, err
	}
	var out []*engine.Run // nil for none, as DB.Runs
	for i, b := range ans.Runs {
		r, err := decodeRunWhole(b)
		if err != nil {
			return nil, fmt.Errorf("list runs: the store owner's run %d: %w", i+1, err)
		}
		if i < len(ans.Truncated) {
			r.InputTruncated, r.OutputTruncated = ans.Truncated[i].Input, ans.Truncated[i].Output
		}
		r.Held = ans.Held[r.ID]
		out = append(out, r)
	}
	if f.Damaged != nil {
		for _, d := range ans.Damaged {
			f.Damaged(string(d.Key), d.Error.err())
		}
	}
	return out, nil
}

// Run reads one run in the owning process, as its run manager's Run does
// (DB.Run when it has none): a run that is not there is
// engine.ErrRunNotFound.
func (c *Control) Run(ctx context.Context, id string) (*engine.Run, error) {
	var ans runAnswer
	if err := c.do(ctx, http.MethodGet, "/run?"+url.Values{"id": {id}}.Encode(), &ans); err != nil {
		return nil, err
	}
	r, err := decodeRunWhole(ans.Run)
	if err != nil {
		return nil, fmt.Errorf("load run %s: the store owner's record: %w", id, err)
	}
	r.Held = ans.Held
	return r, nil
}

// History lists a namespace's checkpoints in the owning process, as
// engine.HistoryPage does, each as a HistoryEntry.
func (c *Control) History(ctx context.Context, thread, ns, before string, limit int) ([]HistoryEntry, error) {
	q := url.Values{"thread": {thread}}
	for k, v := range map[string]string{"ns": ns, "before": before} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var ans historyAnswer
	if err := c.do(ctx, http.MethodGet, "/history?"+q.Encode(), &ans); err != nil {
		return nil, err
	}
	return ans.Checkpoints, nil
}
