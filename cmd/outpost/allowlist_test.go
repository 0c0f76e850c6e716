package main

import (
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

// toolsAgentFile is the tools agent's graph file in an exported reference
// bundle.
const toolsAgentFile = "agents/medication-adherence-tools.json"

// setToolsAgentList replaces the tools agent's "tools" member of the
// exported bundle b with list (a JSON array, or "" to leave it out).
func setToolsAgentList(t *testing.T, b, list string) {
	t.Helper()
	p := filepath.Join(b, filepath.FromSlash(toolsAgentFile))
	raw, err := os.ReadFile(p)
	require.NoError(t, err)
	start := strings.Index(string(raw), `  "tools": [`)
	end := start
	if start >= 0 {
		end += strings.Index(string(raw[start:]), "],\n") + len("],\n")
	} else {
		start = strings.Index(string(raw), `  "nodes": [`)
		require.Positive(t, start, "%s has nodes", p)
		end = start
	}
	repl := ""
	if list != "" {
		repl = `  "tools": ` + list + ",\n"
	}
	require.NoError(t, os.WriteFile(p, []byte(string(raw[:start])+repl+string(raw[end:])), 0o644))
}

// An integrator keeps the tools agent off the write tools with its
// allowlist, on the built binary: a model's call to record_note is refused
// with a tool.unauthorized event of layer agent and no note is written; a
// request naming record_note is refused with 422 unknown_tool saying that
// the agent leaves it out; GET /api/v1/agents shows each agent's list.
func TestServeAgentAllowlist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := builtOutpost(t)
	dir := t.TempDir()
	data, b := exportedBundle(t, dir)
	setToolsAgentList(t, b, `["kb_search", "current_time"]`)
	setBundleVersion(t, b, embeddedVersion(t)+1)
	require.NoError(t, firmware.Sign(b, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
	code, _, stderr := outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", b)
	require.Zero(t, code, stderr)

	s := startServe(t, bin, data)
	run := s.postRun(t, "t1", `{"agent": "medication-adherence-tools", "input": "Please tell my doctor the metformin upsets my stomach", "wait": "20s"}`,
		http.StatusCreated)
	require.Equal(t, "completed", run.Status)
	assert.Contains(t, run.Output, "I could not leave a note for your care team", "the answer does not claim the refused note")
	refusals := toolRefusals(t, s, run.ID)
	require.Len(t, refusals, 1)
	assert.Equal(t, "record_note", refusals[0]["tool"])
	assert.Equal(t, "agent", refusals[0]["layer"])
	assert.Equal(t, `tool "record_note" is not allowed by the agent's allowlist`, refusals[0]["reason"])
	for _, e := range s.runEvents(t, run.ID) {
		assert.NotEqual(t, "tool.called", e.Type, "the tool is not run: %s", e.Data)
	}
	assert.NoFileExists(t, filepath.Join(data, "notes.jsonl"), "no note was written")

	code2, body := s.call(t, http.MethodPost, "/api/v1/threads/t2/runs",
		`{"agent": "medication-adherence-tools", "input": "Please tell my doctor", "tools": ["kb_search", "record_note"]}`)
	require.Equal(t, http.StatusUnprocessableEntity, code2, "%s", body)
	var e struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	assert.Equal(t, "unknown_tool", e.Error.Code)
	assert.Equal(t, `agent "medication-adherence-tools" cannot have tool record_note here: the agent's allowlist leaves it out`, e.Error.Message)

	code2, body = s.call(t, http.MethodGet, "/api/v1/agents", "")
	require.Equal(t, http.StatusOK, code2, "%s", body)
	assert.JSONEq(t, `{"agents": ["medication-adherence", "medication-adherence-tools"],
		"allowlists": {"medication-adherence": [], "medication-adherence-tools": ["kb_search", "current_time"]}}`, string(body))
	s.stop(t)
}

// firmware verify shows each agent's allowlist; a tools agent that names
// none verifies with a warning on stderr (exit 0); a list naming a tool
// the registry lacks, or one twice, is refused with the agent, the tool,
// the file, line and column.
func TestFirmwareVerifyAllowlist(t *testing.T) {
	dir := t.TempDir()
	_, b := exportedBundle(t, dir)
	dev := filepath.Join("..", "..", "testdata", "keys", "dev.key")

	code, stdout, stderr := outpostBin(t, dir, "firmware", "verify", "--trust-dev-key", b)
	require.Zero(t, code, stderr)
	assert.Contains(t, stdout, "  medication-adherence: tools: none\n")
	assert.Contains(t, stdout, "  medication-adherence-tools: tools: kb_search, current_time, record_note, schedule_followup\n")
	assert.NotContains(t, stderr, "names no tools")

	setToolsAgentList(t, b, "")
	require.NoError(t, firmware.Sign(b, dev))
	code, stdout, stderr = outpostBin(t, dir, "firmware", "verify", "--trust-dev-key", b)
	require.Zero(t, code, stderr)
	assert.Contains(t, stdout, "  medication-adherence-tools: tools: every tool of the registry (it names none)\n")
	assert.Contains(t, stderr, `warning: agents/medication-adherence-tools.json: agent "medication-adherence-tools" names no tools, `+
		`so its tool_loop node "generate_response" may call every tool of the registry (current_time, kb_search, record_note, schedule_followup)`)
	code, stdout, _ = outpostBin(t, dir, "firmware", "verify", "--trust-dev-key", "--json", b)
	require.Zero(t, code)
	var out struct{ Allowlists map[string][]string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
	assert.Equal(t, map[string][]string{"medication-adherence": {}, "medication-adherence-tools": nil}, out.Allowlists)

	for _, c := range []struct{ list, want string }{
		{`["kb_search", "send_sms"]`, toolsAgentFile + `:64:26: malformed bundle file: tools.1: agent "medication-adherence-tools" names tool "send_sms", ` +
			`which is not in the bundle's registry (tools: current_time, kb_search, record_note, schedule_followup)`},
		{`["kb_search", "record_note", "kb_search"]`, toolsAgentFile + `:64:41: malformed bundle file: tools.2: agent "medication-adherence-tools" names tool "kb_search" twice`},
	} {
		setToolsAgentList(t, b, c.list)
		require.NoError(t, firmware.Sign(b, dev))
		code, _, stderr = outpostBin(t, dir, "firmware", "verify", "--trust-dev-key", b)
		require.Equal(t, 1, code, stderr)
		assert.Contains(t, stderr, c.want)
		setToolsAgentList(t, b, "")
	}
}
