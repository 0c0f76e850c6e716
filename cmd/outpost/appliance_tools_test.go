package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/firmware"
)

// startedRun is what the API answers for a run it started or resumed.
type startedRun struct {
	ID, Status, Output string
}

// postRun posts a turn to serve and returns the run as the API gave it.
func (s *serving) postRun(t *testing.T, thread, body string, want int) startedRun {
	t.Helper()
	code, raw := s.call(t, http.MethodPost, "/api/v1/threads/"+thread+"/runs", body)
	require.Equal(t, want, code, "%s", raw)
	var run startedRun
	require.NoError(t, json.Unmarshal(raw, &run), "%s", raw)
	return run
}

// toolRefusals returns the data of the run's tool.unauthorized events (the
// stream sends each event whole).
func toolRefusals(t *testing.T, s *serving, runID string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range s.runEvents(t, runID) {
		if e.Type != "tool.unauthorized" {
			continue
		}
		var ev struct{ Data map[string]any }
		require.NoError(t, json.Unmarshal([]byte(e.Data), &ev), "%s", e.Data)
		out = append(out, ev.Data)
	}
	return out
}

// serve --appliance-tools takes current_time away from every run: serve
// says so among its start lines, a turn whose model calls it gets a
// tool.unauthorized event of layer appliance and the tool is not run, and
// a request that asks for it by name is refused with 422 unknown_tool
// saying that the appliance does not allow it.
func TestServeApplianceTools(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := builtOutpost(t)
	data := t.TempDir()
	s := startServe(t, bin, data, "--appliance-tools", "kb_search,record_note,schedule_followup")
	require.Contains(t, s.head, "tools: the appliance allows runs only kb_search, record_note, schedule_followup, within their agent's allowlist (--appliance-tools)")

	run := s.postRun(t, "t1", `{"agent": "medication-adherence-tools", "input": "what time is it today for my metformin", "wait": "20s"}`,
		http.StatusCreated)
	require.Equal(t, "completed", run.Status)
	assert.Contains(t, run.Output, `refused: tool "current_time" is not available`, "the model reads a refusal, not the clock")
	refusals := toolRefusals(t, s, run.ID)
	require.Len(t, refusals, 1)
	assert.Equal(t, "current_time", refusals[0]["tool"])
	assert.Equal(t, "appliance", refusals[0]["layer"])
	assert.Equal(t, `tool "current_time" is not allowed by the appliance configuration`, refusals[0]["reason"])
	for _, e := range s.runEvents(t, run.ID) {
		assert.NotEqual(t, "tool.called", e.Type, "the tool is not run: %s", e.Data)
	}

	code, body := s.call(t, http.MethodPost, "/api/v1/threads/t2/runs",
		`{"agent": "medication-adherence-tools", "input": "what time is it", "tools": ["kb_search", "current_time"]}`)
	require.Equal(t, http.StatusUnprocessableEntity, code, "%s", body)
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	assert.Equal(t, "unknown_tool", e.Error.Code)
	assert.Equal(t, `agent "medication-adherence-tools" cannot have tool current_time here: this appliance does not allow it`, e.Error.Message)
	s.stop(t)
}

// A run keeps the tool set it started with: a follow-up waiting for
// approval under a serve that allowed every tool is still carried out when
// it is approved under a serve whose --appliance-tools leaves
// schedule_followup out, while a new run under that serve is refused it.
func TestApplianceToolsKeepPinnedRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := builtOutpost(t)
	data := t.TempDir()
	const followup = `{"agent": "medication-adherence-tools", "input": "remind me to refill my metformin", "wait": "20s"}`
	s := startServe(t, bin, data)
	require.Contains(t, s.head, "tools: each run may call the tools its agent's allowlist names in its bundle (no --appliance-tools restriction)")
	waiting := s.postRun(t, "t1", followup, http.StatusCreated)
	require.Equal(t, "interrupted", waiting.Status, "the follow-up waits for approval")
	s.stop(t)

	s = startServe(t, bin, data, "--appliance-tools", "kb_search")
	code, body := s.call(t, http.MethodPost, "/api/v1/runs/"+waiting.ID+"/resume", `{"decision": "approve", "wait": "20s"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	var resumed startedRun
	require.NoError(t, json.Unmarshal(body, &resumed))
	require.Equal(t, "completed", resumed.Status, "%s", body)
	assert.Contains(t, resumed.Output, `"scheduled":true`, "the pinned set still holds schedule_followup")
	assert.Empty(t, toolRefusals(t, s, waiting.ID))
	followups, err := os.ReadFile(filepath.Join(data, "followups.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(followups), waiting.ID), "the follow-up was scheduled once")

	fresh := s.postRun(t, "t2", followup, http.StatusCreated)
	require.Equal(t, "completed", fresh.Status, "a new run is refused the tool and goes on")
	refusals := toolRefusals(t, s, fresh.ID)
	require.Len(t, refusals, 1)
	assert.Equal(t, "schedule_followup", refusals[0]["tool"])
	assert.Equal(t, "appliance", refusals[0]["layer"])
	s.stop(t)
}

// --appliance-tools naming a tool that no bundle the appliance can run has
// is refused at start, exit 2, on every command that takes it, before a
// data folder is made; "" (no tools) is a restriction like any other.
func TestApplianceToolsUnknownName(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, args := range [][]string{
		{"serve", "--listen", "127.0.0.1:0"},
		{"run", "hello"},
		{"resume", "run_0000000000000001", "--decision", "approve"},
	} {
		data := filepath.Join(t.TempDir(), "data")
		args = append([]string{args[0], "--data", data, "--appliance-tools", "kb_search,send_sms"}, args[1:]...)
		code, stdout, stderr := outpostBin(t, "", args...)
		require.Equal(t, 2, code, "%v: %s%s", args, stdout, stderr)
		assert.Contains(t, stderr, "--appliance-tools: no bundle this appliance can run has tool send_sms (its bundles have: current_time, kb_search, record_note, schedule_followup)", args)
		assert.NoDirExists(t, data, args)
	}

	data := t.TempDir()
	code, stdout, stderr := outpostBin(t, "", "run", "--data", data, "--appliance-tools", "", "--agent", "medication-adherence-tools",
		"--json", "what time is it today for my metformin")
	require.Equal(t, 0, code, "%s%s", stdout, stderr)
	assert.Contains(t, stdout, `"layer":"appliance"`, "no tools at all: current_time is refused")
	code, _, stderr = outpostBin(t, "", "run", "--data", data, "--appliance-tools", "kb_search", "--agent", "medication-adherence-tools",
		"--tools", "current_time", "what time is it")
	require.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, `--tools: agent "medication-adherence-tools" cannot have tool current_time here: this appliance does not allow it: unknown tool`)
}

// A name that only some of the bundles the appliance can run have is
// allowed: here the installed version's registry has page_nurse, which the
// embedded bundle (still there for the runs pinned to it) lacks. A name
// that none of them has is refused.
func TestApplianceToolsOfAnotherBundleVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	data, b := exportedBundle(t, dir)
	reg := filepath.Join(b, "tools.json")
	raw, err := os.ReadFile(reg)
	require.NoError(t, err)
	raw = bytes.Replace(raw, []byte(`"tools": [`),
		[]byte(`"tools": [{"name": "page_nurse", "description": "Page the nurse on duty.", "kind": "read"},`), 1)
	require.NoError(t, os.WriteFile(reg, raw, 0o644))
	setBundleVersion(t, b, embeddedVersion(t)+1)
	require.NoError(t, firmware.Sign(b, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
	code, _, stderr := outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", b)
	require.Zero(t, code, stderr)

	code, stdout, stderr := outpostBin(t, dir, "run", "--data", data, "--appliance-tools", "kb_search,page_nurse",
		"--agent", "medication-adherence-tools", "--json", "what time is it today for my metformin")
	require.Zero(t, code, "%s%s", stdout, stderr)
	assert.Contains(t, stdout, `"reason":"tool \"current_time\" is not allowed by the appliance configuration"`)

	code, _, stderr = outpostBin(t, dir, "run", "--data", data, "--appliance-tools", "kb_search,page_nurses", "hello")
	require.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "--appliance-tools: no bundle this appliance can run has tool page_nurses (its bundles have: current_time, kb_search, page_nurse, record_note, schedule_followup)")
}
