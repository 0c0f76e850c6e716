package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/console"
)

// buildOutpost builds the binary the way make build does (static), once per
// test binary.
func buildOutpost(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		// go test runs with the toolchain's go, which may not be on PATH.
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "outpost")
	cmd := exec.Command(gobin, "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// serving is an `outpost serve` process.
type serving struct {
	cmd    *exec.Cmd
	url    string
	token  string
	lines  chan string   // its standard output
	head   []string      // what it printed up to its console line
	stderr *lockedBuffer // what it writes to standard error
	done   chan error
}

// lockedBuffer is a bytes.Buffer that a process may write while a test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor reports whether the buffer holds s, waiting up to d for it.
func (l *lockedBuffer) waitFor(s string, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(l.String(), s) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// startBin starts cmd with its standard output on a pipe, and keeps what
// it writes to standard error.
func startBin(t *testing.T, cmd *exec.Cmd) (io.ReadCloser, *lockedBuffer) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	return out, stderr
}

var consoleLine = regexp.MustCompile(`^console: (http://127\.0\.0\.1:\d+)/$`)

// startServe starts `outpost serve` on data, with the flags extra adds, and
// returns once its console listens.
func startServe(t *testing.T, bin, data string, extra ...string) *serving {
	t.Helper()
	return startServeEnv(t, bin, nil, data, extra...)
}

// startServeEnv is startServe with env added to serve's environment.
func startServeEnv(t *testing.T, bin string, env []string, data string, extra ...string) *serving {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--data", data, "--listen", "127.0.0.1:0", "--model", "ollama:llama3.2",
		"--ollama", "http://127.0.0.1:1"}, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	out, stderr := startBin(t, cmd)
	s := &serving{cmd: cmd, lines: make(chan string, 100), stderr: stderr, done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	deadline := time.After(20 * time.Second)
	var head []string
	for s.url == "" {
		select {
		case line, ok := <-s.lines:
			require.True(t, ok, "serve exited early:\n%s\nstderr:\n%s", strings.Join(head, "\n"), stderr.String())
			head = append(head, line)
			if m := consoleLine.FindStringSubmatch(line); m != nil {
				s.url = m[1]
			}
		case <-deadline:
			t.Fatalf("serve printed no console line in 20s:\n%s\nstderr:\n%s", strings.Join(head, "\n"), stderr.String())
		}
	}
	s.head = head
	// Standard error reaches the buffer through its own pipe and copying
	// goroutine, so it may lag the console line that standard output
	// carried.
	assert.True(t, stderr.waitFor("falling back to the scripted model", 10*time.Second),
		"no Ollama: it says so plainly; stderr:\n%s", stderr.String())
	assert.Contains(t, strings.Join(head, "\n"), "bundle: medication-adherence")
	assert.Contains(t, strings.Join(head, "\n"), "budgets: each run at most 15m0s of run time and 100000 tokens", "the default budgets are shown")
	assert.Contains(t, strings.Join(head, "\n"), "a run a crash left running is resumed 3 times in a row at most (--max-recoveries)", "and the recovery limit")
	assert.Contains(t, strings.Join(head, "\n"), "and one suspected of the crashes runs alone for 2m0s at most (--max-alone-time)", "and the bound on a suspect's turn alone")
	assert.Contains(t, strings.Join(head, "\n"), "waiting for its turn for 2m0s at most (--max-suspect-wait)", "and the bound on a suspect's wait for it")
	tok, err := os.ReadFile(filepath.Join(data, console.TokenFile))
	require.NoError(t, err)
	s.token = strings.TrimSpace(string(tok))
	return s
}

func (s *serving) call(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// stop interrupts the process, as Ctrl-C does, and waits for a clean exit.
func (s *serving) stop(t *testing.T) string {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGINT))
	var rest []string
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				select {
				case err := <-s.done:
					require.NoError(t, err, "serve exits 0 on an interrupt")
				case <-timeout:
					t.Fatal("serve did not exit")
				}
				return strings.Join(rest, "\n")
			}
			rest = append(rest, line)
		case <-timeout:
			t.Fatalf("serve did not stop in 20s: %s", strings.Join(rest, "\n"))
		}
	}
}

// `outpost serve` as a process, the way the README starts it: it falls
// back to the scripted model when no Ollama answers and says so, serves a
// turn over HTTP, lets `outpost db check` in through its control socket,
// stops cleanly on Ctrl-C, and finds its runs again at the next start.
func TestServeAsAProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildOutpost(t)
	data := t.TempDir()
	s := startServe(t, bin, data)

	code, body := s.call(t, http.MethodGet, "/healthz", "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	assert.Contains(t, string(body), "no Ollama reachable at http://127.0.0.1:1 at start: using the scripted model", "the model's health says why it is the scripted one")
	code, _ = (&serving{url: s.url, token: "wrong"}).call(t, http.MethodGet, "/api/v1/runs", "")
	assert.Equal(t, http.StatusUnauthorized, code)

	code, body = s.call(t, http.MethodPost, "/api/v1/threads/t1/runs",
		`{"agent": "medication-adherence", "input": "I forgot my metformin dose this morning, what should I do?", "wait": "20s"}`)
	require.Equal(t, http.StatusCreated, code, "%s", body)
	var run struct {
		ID, Status string
		Output     json.RawMessage
	}
	require.NoError(t, json.Unmarshal(body, &run))
	assert.Equal(t, "completed", run.Status, "%s", body)
	assert.Contains(t, string(run.Output), "[kb-01] Metformin: missed dose", "the scripted answer cites the missed-dose guide")

	// The bench workload's agent belongs to no bundle: serve does not run it.
	code, body = s.call(t, http.MethodPost, "/api/v1/threads/t2/runs", `{"agent": "reference", "input": "I forgot my metformin dose"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", body)
	assert.Contains(t, string(body), "available: medication-adherence, medication-adherence-tools)")

	// The run's outcome went into the ledger, and the event stream says so.
	types, firstLife := s.events(t, run.ID)
	assert.Contains(t, types, "outcome.appended", "serve publishes the ledger's events too: %v", types)

	check := exec.Command(bin, "db", "check", "--data", data)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "store is sound", "db check reaches the running appliance through its control socket")

	assert.Contains(t, s.stop(t), "shutting down")

	s = startServe(t, bin, data)
	code, body = s.call(t, http.MethodGet, "/api/v1/runs/"+run.ID, "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	assert.Contains(t, string(body), `"status":"completed"`)

	// The event numbers of this life of the stream start above the last's,
	// so a client resuming from an old number cannot be given new events
	// under it.
	code, body = s.call(t, http.MethodPost, "/api/v1/threads/t1/runs", `{"agent": "medication-adherence", "input": "I forgot my lisinopril dose", "wait": "20s"}`)
	require.Equal(t, http.StatusCreated, code, "%s", body)
	require.NoError(t, json.Unmarshal(body, &run))
	_, secondLife := s.events(t, run.ID)
	require.NotEmpty(t, firstLife)
	require.NotEmpty(t, secondLife)
	assert.Greater(t, secondLife[0], firstLife[len(firstLife)-1], "seqs of the second life")
	s.stop(t)
}

// events reads the event stream's window for one run, as Server-Sent
// Events, until the run's outcome and its end are in, and returns the
// events' types and seqs.
func (s *serving) events(t *testing.T, runID string) (types []string, seqs []uint64) {
	t.Helper()
	for _, e := range s.runEvents(t, runID) {
		types, seqs = append(types, e.Type), append(seqs, e.Seq)
	}
	return types, seqs
}

// sseEvent is one event of the API's stream.
type sseEvent struct {
	Seq  uint64
	Type string
	Data string
}

// runEvents reads the stream of runID's events from the first, up to the
// outcome of its completion.
func (s *serving) runEvents(t *testing.T, runID string) []sseEvent {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+"/api/v1/events?run="+runID, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	var events []sseEvent
	completed, recorded := false, false
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			n, err := strconv.ParseUint(id, 10, 64)
			require.NoError(t, err)
			events = append(events, sseEvent{Seq: n})
		}
		if len(events) == 0 {
			continue
		}
		e := &events[len(events)-1]
		if typ, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			e.Type = typ
			completed = completed || typ == "run.completed"
			recorded = recorded || typ == "outcome.appended"
		}
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			e.Data = data
		}
		if sc.Text() == "" && completed && recorded {
			break
		}
	}
	return events
}

// The scripted model by default is healthy, and its health says it was the
// default, not a flag the operator gave.
func TestScriptedModelHealth(t *testing.T) {
	var out strings.Builder
	check := modelCheck(context.Background(), &modelChoice{model: "scripted", ollama: "http://127.0.0.1:1"}, nil, "", nil, &out)
	h := check(context.Background())
	assert.Equal(t, console.StateOK, h.State)
	assert.Equal(t, "scripted model (--model scripted, the default: the bundle's deterministic rules)", h.Detail)
	assert.Contains(t, out.String(), "model: scripted (the bundle's deterministic rules; no Ollama reachable at http://127.0.0.1:1)")
}

// An address in use stops serve before it makes a data folder or a store,
// with a message that says what to do.
func TestServeOnATakenAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	data := filepath.Join(t.TempDir(), "data")
	code, stdout, stderr := outpost(t, "serve", "--data", data, "--listen", l.Addr().String())
	require.NotZero(t, code)
	assert.Empty(t, stdout, "nothing is announced")
	assert.Contains(t, stderr, "address already in use")
	assert.Contains(t, stderr, "choose another address with --listen")
	assert.NoDirExists(t, data)
}

// A worker count below one is refused before anything starts: it was
// taken as the default, 8, without a word, whatever the operator asked.
func TestServeRefusesNoWorkers(t *testing.T) {
	for _, n := range []string{"0", "-2"} {
		data := filepath.Join(t.TempDir(), "data")
		code, stdout, stderr := outpost(t, "serve", "--data", data, "--listen", "127.0.0.1:0", "--workers", n)
		require.Equal(t, 2, code, stdout)
		assert.Contains(t, stderr, "--workers must be at least 1, not "+n)
		assert.NoDirExists(t, data)
	}
}

// An edit of a paused review that the review cannot use is refused over
// the HTTP API with 422 bad_decision, and the message names the field at
// fault and why; the review stands, and a usable edit then ends the run.
// requireRefused posts a resume of run that must be refused with a 422 of
// the code and message given.
func (s *serving) requireRefused(t *testing.T, run, resume, code, message string) {
	t.Helper()
	status, body := s.call(t, http.MethodPost, "/api/v1/runs/"+run+"/resume", resume)
	require.Equal(t, http.StatusUnprocessableEntity, status, "%s: %s", resume, body)
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	require.Equal(t, code, e.Error.Code, resume)
	require.Equal(t, message, e.Error.Message, resume)
}

// startReview serves on a new data folder and starts a turn of agent on
// input that must wait for review; it returns the run as the API gave it.
func startReview(t *testing.T, agent, input string) (*serving, []byte) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	s := startServe(t, builtOutpost(t), t.TempDir())
	code, body := s.call(t, http.MethodPost, "/api/v1/threads/t1/runs",
		`{"agent": "`+agent+`", "input": "`+input+`", "wait": "20s"}`)
	require.Equal(t, http.StatusCreated, code, "%s", body)
	require.Contains(t, string(body), `"status":"interrupted"`)
	return s, body
}

func TestEditErrorsSayWhatIsWrong(t *testing.T) {
	s, body := startReview(t, "medication-adherence", "remind me to refill my metformin")
	var run struct{ ID, Status, Output string }
	require.NoError(t, json.Unmarshal(body, &run))

	const refuses, want = `node "review_response" refuses this edit: `, `: an edit's value is the answer to send, as a JSON string or as {"text": "..."}`
	for _, tc := range []struct{ value, says string }{
		{`12345`, `"value" is a number` + want},
		{`["Call the pharmacy."]`, `"value" is an array` + want},
		{`{"txt": "Call the pharmacy."}`, `"value" has no "text" field (its fields: "txt")` + want},
		{`{"text": 7}`, `"value.text" is a number, not a string` + want},
		{`{"text": ""}`, `"value.text" is empty: write the answer, or approve or reject the draft`},
		{`"  "`, `"value" is empty: write the answer, or approve or reject the draft`},
	} {
		s.requireRefused(t, run.ID, `{"decision": "edit", "value": `+tc.value+`}`, "bad_decision", "resume run "+run.ID+": "+refuses+tc.says)
	}
	code, body := s.call(t, http.MethodGet, "/api/v1/runs/"+run.ID, "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.NoError(t, json.Unmarshal(body, &run))
	require.Equal(t, "interrupted", run.Status, "a refused edit leaves the review standing")

	code, body = s.call(t, http.MethodPost, "/api/v1/runs/"+run.ID+"/resume",
		`{"decision": "edit", "value": {"text": "Please call the pharmacy."}, "wait": "20s"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.NoError(t, json.Unmarshal(body, &run))
	require.Equal(t, "completed", run.Status, "%s", body)
	require.Contains(t, run.Output, "Please call the pharmacy.")
	s.stop(t)
}

// TestToolEditErrorsLeaveTheCallWaiting: an edit of a tool call's arguments
// that the tool's schema refuses (a typo that is not JSON, which arrives
// as a string, a missing field, a field of the wrong type) is refused with
// the reason, and the call still waits for a decision: it does not stand
// for a rejection of the call. A valid edit then runs the call with the
// arguments given.
func TestToolEditErrorsLeaveTheCallWaiting(t *testing.T) {
	s, body := startReview(t, "medication-adherence-tools", "please schedule a follow-up")
	var run struct {
		ID, Status, Output string
		Interrupts         []struct {
			ID      string
			Payload struct{ Reason, Tool string }
		}
	}
	require.NoError(t, json.Unmarshal(body, &run))
	require.Len(t, run.Interrupts, 1, "%s", body)
	require.Equal(t, "schedule_followup", run.Interrupts[0].Payload.Tool, "%s", body)
	asked := run.Interrupts[0].ID

	const refuses, want = `node "generate_response" refuses this edit: arguments for "schedule_followup": `,
		`: an edit's value is the call's arguments, a JSON object that the tool's schema accepts`
	for _, tc := range []struct{ value, says string }{
		{`"{\"when\": \"tomorrow\", \"note\": \"x\""`, `$: want object, got string` + want},
		{`{"note": "call back"}`, `$.when: required` + want},
		{`{"when": 3, "note": "call back"}`, `$.when: want string, got number` + want},
	} {
		s.requireRefused(t, run.ID, `{"decision": "edit", "interrupt": "`+asked+`", "value": `+tc.value+`}`,
			"bad_decision", "resume run "+run.ID+": "+refuses+tc.says)
		code, body := s.call(t, http.MethodGet, "/api/v1/runs/"+run.ID, "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		require.NoError(t, json.Unmarshal(body, &run))
		require.Equal(t, "interrupted", run.Status, "after the refused edit %s: %s", tc.value, body)
		require.Equal(t, asked, run.Interrupts[0].ID, "the same call still waits: %s", body)
	}

	code, body := s.call(t, http.MethodPost, "/api/v1/runs/"+run.ID+"/resume",
		`{"decision": "edit", "interrupt": "`+asked+`", "value": {"when": "Friday 10:00", "note": "call back"}, "wait": "20s"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.NoError(t, json.Unmarshal(body, &run))
	require.Equal(t, "completed", run.Status, "%s", body)
	require.Contains(t, run.Output, `"scheduled":true`, "the edited call ran")
	require.Contains(t, run.Output, "Friday 10:00", "with the edited arguments")
	s.stop(t)
}

// A stop that comes while serve resumes the runs an earlier process left
// (here before it starts: the pass has barely begun when serve waits for
// it) is a stop like any other: serve closes the store and exits 0, and
// says the runs resume at the next start. It exited 1 with "recover:
// context canceled".
func TestServeStoppedWhileResumingRunsExitsCleanly(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", data, "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errb bytes.Buffer
		code := execute(ctx, []string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, &out, &errb)
		require.Zero(t, code, "try %d: %s", i, errb.String())
		require.Contains(t, out.String(), "stopped; the store is closed", "try %d", i)
	}
	code, stdout, stderr := outpost(t, "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
}
