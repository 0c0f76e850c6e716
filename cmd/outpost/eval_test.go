package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/eval"
	"github.com/outpost-edge/outpost/firmware"
)

// referenceGolden is the golden file the embedded reference bundle ships.
const referenceGolden = "../../firmware/reference/bundle/golden/reference.jsonl"

// TestGoldenReference replays the golden conversations the embedded
// reference bundle ships, as "outpost eval" does with no file; "make test"
// runs it.
func TestGoldenReference(t *testing.T) {
	ref, err := firmware.Reference()
	require.NoError(t, err)
	convs, err := eval.Bundled(ref)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(convs), 40, "the reference bundle ships its golden conversations")
	fromFile, err := eval.Load(referenceGolden)
	require.NoError(t, err)
	require.Len(t, convs, len(fromFile), "the bundle holds the golden file as it is in the repository")
	resolve, err := resolver()
	require.NoError(t, err)
	rep, err := eval.Run(t.Context(), convs, eval.Options{Resolver: resolve})
	require.NoError(t, err)
	for _, c := range rep.Cases {
		if !c.Passed {
			t.Errorf("%s (%s:%d): %s", c.Name, c.File, c.Line, c.Failure)
		}
	}
	t.Logf("%d golden conversations: %d passed, %d failed in %s", len(rep.Cases), rep.Passed, rep.Failed, rep.Duration)
}

// With no file, eval replays the golden conversations that the bundle
// ships: the embedded one, or --bundle's (here the reference bundle as
// firmware export writes it). A bundle that ships none is a bad command
// line, as no file was before.
func TestEvalWithNoFileReplaysTheBundles(t *testing.T) {
	ref, err := firmware.Reference()
	require.NoError(t, err)
	exported := filepath.Join(t.TempDir(), "reference")
	require.NoError(t, firmware.Export(exported))
	for _, args := range [][]string{{"eval", "--json"}, {"eval", "--json", "--bundle", exported}} {
		code, stdout, stderr := outpost(t, args...)
		require.Zero(t, code, "%v: %s%s", args, stderr, stdout)
		var rep struct{ Passed, Failed int }
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
		require.Zero(t, rep.Failed, args)
		require.Equal(t, len(ref.Golden), rep.Passed, "%v replays every conversation the bundle ships", args)
	}

	none := filepath.Join(t.TempDir(), "none")
	require.NoError(t, firmware.Export(none))
	manifest := filepath.Join(none, "manifest.json")
	data, err := os.ReadFile(manifest)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	delete(m, "golden")
	data, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(manifest, data, 0o644))
	require.NoError(t, os.RemoveAll(filepath.Join(none, "golden")))
	require.NoError(t, firmware.Sign(none, "../../testdata/keys/dev.key"))
	code, stdout, stderr := outpost(t, "eval", "--bundle", none)
	require.Equal(t, 2, code, stdout+stderr)
	require.Contains(t, stderr, fmt.Sprintf("no FILE.jsonl given, and medication-adherence v%d ships no golden conversations", embeddedVersion(t)))
}

func agentsOf(convs []eval.Conversation) []string {
	var names []string
	seen := map[string]bool{}
	for _, c := range convs {
		if !seen[c.Agent] {
			seen[c.Agent] = true
			names = append(names, c.Agent)
		}
	}
	return names
}

func TestEvalCommand(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "g.jsonl")
	ref, err := resolver()
	require.NoError(t, err)
	// The embedded agent, whatever its name: a turn with no expectations
	// passes as long as the run can be made.
	name := embeddedAgent(t, ref)
	require.NoError(t, os.WriteFile(file, []byte(
		`{"name": "runs", "agent": "`+name+`", "turns": [{"input": "I forgot my metformin dose", "expect": {"final_contains": []}}]}`+"\n"+
			`{"name": "differs", "agent": "`+name+`", "turns": [{"input": "I forgot my metformin dose", "expect": {"path": ["closing"]}}]}`+"\n"), 0o644))

	code, stdout, stderr := outpost(t, "eval", file)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stdout, "runs")
	require.Contains(t, stdout, "FAIL differs (")
	require.Contains(t, stdout, "turn 1: path differs at index 0: want closing, got ")
	require.Contains(t, stdout, "2 conversations: 1 passed, 1 failed")
	require.Contains(t, stderr, "golden conversations failed: 1 of 2")

	// Flags after the files, and a JSON report.
	code, stdout, _ = outpost(t, "eval", file, "--json", "--parallel", "1")
	require.Equal(t, 1, code)
	var rep struct {
		Passed, Failed int
		Cases          []struct {
			Name    string
			Passed  bool
			Failure string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Equal(t, 1, rep.Passed)
	require.Equal(t, 1, rep.Failed)
	require.True(t, rep.Cases[0].Passed)
	require.True(t, strings.HasPrefix(rep.Cases[1].Failure, "turn 1: path differs at index 0"), rep.Cases[1].Failure)

	ok := filepath.Join(dir, "ok.jsonl")
	require.NoError(t, os.WriteFile(ok, []byte(`{"name": "runs", "agent": "`+name+`", "turns": [{"input": "hi"}]}`+"\n"), 0o644))
	code, stdout, stderr = outpost(t, "eval", ok)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "\n1 conversation: 1 passed, 0 failed (")

	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("# comment\n"+`{"name": "x", "agent": "a", "turns": [{"input": "hi", "expect": {"flag": []}}]}`+"\n"), 0o644))
	// A file that cannot be read is exit 2, not the 1 of a failed
	// conversation: CI can tell a broken harness from a regression.
	code, _, stderr = outpost(t, "eval", bad)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "bad.jsonl:2:")
	require.Contains(t, stderr, `unknown field "turns.0.expect.flag"`)

	code, _, stderr = outpost(t, "eval", "--parallel", "0", ok)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--parallel must be at least 1")
}

func embeddedAgent(t *testing.T, resolve engine.Resolver) string {
	t.Helper()
	_, err := resolve("\x00no such agent", engine.BundleRef{})
	require.ErrorIs(t, err, engine.ErrUnknownAgent)
	// The error lists what is available: "(available: NAME, ...)".
	_, list, found := strings.Cut(err.Error(), "(available: ")
	require.True(t, found, err.Error())
	name, _, _ := strings.Cut(strings.TrimSuffix(list, ")"), ",")
	return strings.TrimSpace(name)
}

// TestEvalBundle replays a bundle's own golden conversations with --bundle:
// the patterns test bundle, without the two agents whose node kinds only
// firmware's tests register, re-signed with the test key.
func TestEvalBundle(t *testing.T) {
	src := "../../testdata/bundles/patterns"
	dir := filepath.Join(t.TempDir(), "patterns")
	require.NoError(t, os.CopyFS(dir, os.DirFS(src)))
	for _, f := range []string{"manifest.sig", "agents/iterative.json", "agents/consensus.json"} {
		require.NoError(t, os.Remove(filepath.Join(dir, f)))
	}
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	delete(m, "files")
	agents := m["agents"].(map[string]any)
	delete(agents, "iterative")
	delete(agents, "consensus")
	raw, err = json.MarshalIndent(m, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "manifest.json"), raw, 0o644))
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			err = os.Chmod(p, 0o644)
		}
		return err
	}))
	require.NoError(t, firmware.Sign(dir, "../../testdata/keys/firmware-test.key"))
	golden := filepath.Join(dir, "golden", "patterns.jsonl")

	code, stdout, stderr := outpost(t, "eval", "--bundle", dir, "--keys", "../../testdata/keys/firmware-test.pub", golden)
	require.Zero(t, code, stdout+stderr)
	require.Contains(t, stdout, "sequential-missed-dose")
	require.Contains(t, stdout, "0 failed")

	// A key the bundle was not signed with is refused before any replay.
	other := t.TempDir()
	_, err = firmware.Keygen(other)
	require.NoError(t, err)
	code, _, stderr = outpost(t, "eval", "--bundle", dir, "--keys", other, golden)
	require.Equal(t, 2, code, "the replay could not be made: not a failed conversation")
	require.ErrorIs(t, errorFrom(stderr), firmware.ErrUnknownKey)

	// Without --keys only the development key is trusted.
	code, _, stderr = outpost(t, "eval", "--bundle", dir, golden)
	require.Equal(t, 2, code)
	require.ErrorIs(t, errorFrom(stderr), firmware.ErrUnknownKey)
}

// errorFrom maps a printed error back to the sentinel it names, for
// ErrorIs checks on a command's stderr.
func errorFrom(stderr string) error {
	for _, e := range []error{firmware.ErrUnknownKey, firmware.ErrBundleSignature} {
		if strings.Contains(stderr, e.Error()) {
			return e
		}
	}
	return errors.New(stderr)
}

// eval FILE refuses, before it replays anything, a golden conversation of
// one's own that expects a flag its agent can never raise on the channel
// eval reads the flags from (--flags-channel), as verify refuses one of a
// bundle's own: no replay of it could pass. Where the channel may hold
// what the graph cannot tell (the run's input is written to the history
// channel), nothing is checked, and the replay says what it got.
func TestEvalRefusesAFlagTheAgentCannotRaise(t *testing.T) {
	ref, err := firmware.Reference()
	require.NoError(t, err)
	history := ref.Graphs[firmware.ReferenceAgent].History
	require.NotEmpty(t, history)

	const acute = "acute" // the red flag the reference rules raise for chest pain
	golden := filepath.Join(t.TempDir(), "g.jsonl")
	turn := func(name, flag string) string {
		return `{"name": "` + name + `", "agent": "` + firmware.ReferenceAgent + `", "turns": [{"input": "I have chest pain since I took my lisinopril", "expect": {"flags": ["` + flag + `"], "status": "completed"}}]}` + "\n"
	}
	require.NoError(t, os.WriteFile(golden, []byte(turn("acute", acute)+turn("misspelt", "acutee")), 0o644))
	refused := func(args []string, says string) {
		t.Helper()
		code, stdout, stderr := outpostBin(t, "", append(append([]string{"eval"}, args...), golden)...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Empty(t, stdout, "%v: nothing was replayed", args)
		require.Contains(t, stderr, "outpost eval: bad golden conversation: "+golden+":", args)
		require.Contains(t, stderr, says, args)
	}
	refused(nil, `conversation "misspelt": turns.0.expect.flags.0: "acutee" is not a flag agent "`+firmware.ReferenceAgent+`" can raise (its flags: `+acute+", ")
	// A channel the graph lacks holds no flag: not even the one its
	// "flags" channel holds is expected there.
	refused([]string{"--flags-channel", "alerts"}, `conversation "acute": turns.0.expect.flags.0: "`+acute+`" is not a flag agent "`+firmware.ReferenceAgent+`" can raise (it raises none)`)

	code, stdout, stderr := outpostBin(t, "", "eval", "--flags-channel", history, golden)
	require.Equal(t, 1, code, "the conversations are replayed and fail: %s", stderr)
	require.Contains(t, stdout, "FAIL acute ")
	require.Contains(t, stdout, "FAIL misspelt ")
}

// eval FILE refuses, before it replays anything, a golden conversation of
// one's own that names a node its agent's graph lacks (in a path or an
// interrupt), or a tool the bundle's registry or the agent's allowlist
// lacks, with the message firmware verify gives for the same file in a
// bundle: no replay of it could pass.
func TestEvalRefusesNamesTheAgentLacks(t *testing.T) {
	for _, c := range []struct {
		agent, name, expect, says string // agent: firmware.ReferenceToolsAgent when empty
	}{
		{"", "path", `{"path": ["intake", "guardrail_pre", "generate_reply"]}`,
			`conversation "path": turns.0.expect.path.2: "generate_reply" is not a node of agent "` + firmware.ReferenceToolsAgent + `"'s graph (nodes: intake, `},
		{"", "interrupt", `{"status": "interrupted", "interrupt": "review"}`,
			`conversation "interrupt": turns.0.expect.interrupt: "review" is not a node of agent "` + firmware.ReferenceToolsAgent + `"'s graph (nodes: intake, `},
		{"", "tools", `{"tools": ["schedule_follow_up"]}`,
			`conversation "tools": turns.0.expect.tools.0: "schedule_follow_up" is not a tool of the bundle's registry (tools: `},
		// The reference agent's allowlist names no tool: a call it made
		// would be refused, and a refused call is not listed.
		{firmware.ReferenceAgent, "allowlist", `{"tools": ["kb_search"]}`,
			`conversation "allowlist": turns.0.expect.tools.0: "kb_search" is not in agent "` + firmware.ReferenceAgent + `"'s allowlist (it names none)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			agent := cmp.Or(c.agent, firmware.ReferenceToolsAgent)
			conv := func(name, expect string) string {
				return `{"name": "` + name + `", "agent": "` + agent + `", "turns": [{"input": "please schedule a follow-up call about my refills", "expect": ` + expect + `}]}` + "\n"
			}
			golden := filepath.Join(t.TempDir(), "g.jsonl")
			require.NoError(t, os.WriteFile(golden, []byte(conv(c.name, c.expect)), 0o644))
			code, stdout, stderr := outpostBin(t, "", "eval", golden)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout, "nothing was replayed")
			require.Contains(t, stderr, "outpost eval: bad golden conversation: "+golden+":1:")
			require.Contains(t, stderr, c.says)

			// The same file in a bundle: verify says the same.
			bundle := filepath.Join(t.TempDir(), "bundle")
			require.NoError(t, firmware.Export(bundle))
			require.NoError(t, os.WriteFile(filepath.Join(bundle, "golden", "reference.jsonl"), []byte(conv(c.name, c.expect)), 0o644))
			require.NoError(t, firmware.Sign(bundle, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
			code, _, vstderr := outpostBin(t, "", "firmware", "verify", "--trust-dev-key", bundle)
			require.Equal(t, 1, code, vstderr)
			_, evalSays, _ := strings.Cut(strings.TrimSpace(stderr), golden+":")
			require.Contains(t, vstderr, "golden/reference.jsonl:"+evalSays)
		})
	}
}

// A call that its agent's allowlist leaves out is refused, and a turn's
// tools do not list it (its denied do): a golden conversation that expects
// such a call could never pass, which is why verify and eval refuse one
// (TestEvalRefusesNamesTheAgentLacks).
func TestEvalListsNoCallTheAllowlistRefused(t *testing.T) {
	bundle := filepath.Join(t.TempDir(), "bundle")
	require.NoError(t, firmware.Export(bundle))
	file := filepath.Join(bundle, "agents", firmware.ReferenceToolsAgent+".json")
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	var graph map[string]any
	require.NoError(t, json.Unmarshal(raw, &graph))
	graph["tools"] = []string{"kb_search", "current_time", "record_note"} // no schedule_followup
	raw, err = json.Marshal(graph)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, raw, 0o644))
	require.NoError(t, firmware.Sign(bundle, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
	golden := filepath.Join(t.TempDir(), "g.jsonl")
	require.NoError(t, os.WriteFile(golden, []byte(`{"name": "followup", "agent": "`+firmware.ReferenceToolsAgent+
		`", "turns": [{"input": "Please schedule a follow-up call about my refills", "expect": {"status": "completed"}}]}`+"\n"), 0o644))

	code, stdout, stderr := outpostBin(t, "", "eval", "--json", "--bundle", bundle, golden)
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Cases []struct {
			Results []struct {
				Observed eval.Observed `json:"observed"`
			} `json:"results"`
		} `json:"cases"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Len(t, rep.Cases, 1)
	require.Len(t, rep.Cases[0].Results, 1)
	got := rep.Cases[0].Results[0].Observed
	require.Equal(t, []string{"schedule_followup"}, got.Denied, "the call the allowlist refused")
	require.Empty(t, got.Tools, "a refused call listed among the turn's tools")
}
