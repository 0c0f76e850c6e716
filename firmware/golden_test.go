package firmware_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/firmware"
)

// goldenWith is the patterns bundle's golden file with line as its third
// line, after a comment and a conversation that passes every check.
func goldenWith(line string) string {
	return "# golden conversations\n" +
		`{"name": "good", "agent": "sequential", "turns": [{"input": "hi", "expect": {"path": ["intake", "lookup", "answer"], "status": "completed"}}]}` + "\n" +
		line + "\n"
}

// A golden conversation whose expectations no replay could meet is a
// mistake in the bundle, as a misspelt name in its rules is: verify (Load)
// and install refuse it at its line and column, naming the conversation
// and the field, where only eval reported it before, and late.
func TestBundleGoldenExpectationsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		name, line, bad, field string // bad: the text the error points at
	}{
		{"status a turn cannot end in", `{"name": "s", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "done"}}]}`,
			`{"status": "done"}`, `turns.0.expect.status: "done" is not a status a turn ends in`},
		{"regular expression that does not compile", `{"name": "r", "agent": "sequential", "turns": [{"input": "hi", "expect": {"final_regex": "(kb-"}}]}`,
			`{"final_regex"`, `turns.0.expect.final_regex: error parsing regexp`},
		{"interrupt with another status", `{"name": "i", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "completed", "interrupt": "answer"}}]}`,
			`{"status": "completed", "interrupt"`, `turns.0.expect.interrupt: given with status completed`},
		{"after_resume with no resume", `{"name": "a", "agent": "sequential", "turns": [{"input": "hi", "after_resume": {"status": "completed"}}]}`,
			`{"status": "completed"}`, `turns.0.after_resume: given without a resume`},
		{"bad resume decision", `{"name": "d", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "interrupted"}, "resume": {"decision": "maybe"}}]}`,
			`{"decision": "maybe"}`, `turns.0.resume.decision: `},
		{"turn with no input", `{"name": "n", "agent": "sequential", "turns": [{"input": "hi"}, {"expect": {"status": "completed"}}]}`,
			`{"expect": {"status": "completed"}}`, `turns.1.input: every turn needs an input`},
		// A null reads as a field left out (an expectation not checked, a
		// resume not made), or as an input that is no input.
		{"null input", `{"name": "ni", "agent": "sequential", "turns": [{"input": "hi"}, {"input": null, "expect": {"status": "completed"}}]}`,
			`{"input": null`, `turns.1.input: null where an input (every turn needs one) is wanted`},
		{"null flags", `{"name": "nf", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "completed", "flags": null}}]}`,
			`{"status": "completed", "flags": null}`, `turns.0.expect.flags: null where a list is wanted (leave out a field that is not given)`},
		{"null tools", `{"name": "nt", "agent": "sequential", "turns": [{"input": "hi", "expect": {"tools": null}}]}`,
			`{"tools": null}`, `turns.0.expect.tools: null where a list is wanted`},
		{"null name in a path", `{"name": "np", "agent": "sequential", "turns": [{"input": "hi", "expect": {"path": ["intake", null]}}]}`,
			`["intake", null]`, `turns.0.expect.path.1: null where a string is wanted`},
		{"null status", `{"name": "ns", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": null}}]}`,
			`{"status": null}`, `turns.0.expect.status: null where a string is wanted`},
		{"null expect", `{"name": "ne", "agent": "sequential", "turns": [{"input": "hi", "expect": null}]}`,
			`{"input": "hi", "expect": null}`, `turns.0.expect: null where an object is wanted`},
		{"null resume", `{"name": "nr", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "interrupted"}, "resume": null}]}`,
			`{"input": "hi", "expect": {"status": "interrupted"}, "resume": null}`, `turns.0.resume: null where an object is wanted`},
		{"null resume value", `{"name": "nv", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "interrupted"}, "resume": {"decision": "edit", "value": null}}]}`,
			`{"decision": "edit", "value": null}`, `turns.0.resume.value: null where a value is wanted`},
		{"null turn", `{"name": "nn", "agent": "sequential", "turns": [{"input": "hi"}, null]}`,
			`[{"input": "hi"}, null]`, `turns.1: null where an object is wanted`},
		{"name used twice", `{"name": "good", "agent": "sequential", "turns": [{"input": "hi"}]}`,
			`{"name": "good"`, `name already used on line 2`},
		{"agent the bundle lacks", `{"name": "g", "agent": "sequentail", "turns": [{"input": "hi"}]}`,
			`{"name": "g"`, `agent: "sequentail" is not an agent of the bundle`},
		{"node the graph lacks", `{"name": "p", "agent": "sequential", "turns": [{"input": "hi", "expect": {"path": ["intake", "lokup"]}}]}`,
			`["intake", "lokup"]`, `turns.0.expect.path.1: "lokup" is not a node of agent "sequential"'s graph`},
		{"interrupt at a node the graph lacks", `{"name": "q", "agent": "sequential", "turns": [{"input": "hi", "expect": {"interrupt": "review"}}]}`,
			`{"interrupt": "review"}`, `turns.0.expect.interrupt: "review" is not a node of agent "sequential"'s graph`},
		// The flags an agent can raise are its guardrails' (the rules' red
		// flags and scope flag, or the citation flags), its reviews' and
		// its model nodes' flag_risks.
		{"flag the agent cannot raise", `{"name": "f", "agent": "conditional", "turns": [{"input": "chest pain", "expect": {"flags": ["acute", "acutee"]}}]}`,
			`["acute", "acutee"]`, `turns.0.expect.flags.1: "acutee" is not a flag agent "conditional" can raise (its flags: acute, out_of_scope)`},
		{"flag after a resume the agent cannot raise", `{"name": "fr", "agent": "reviewed", "turns": [{"input": "hi", "expect": {"status": "interrupted"}, "resume": {"decision": "approve"}, "after_resume": {"flags": ["review_aproved"]}}]}`,
			`["review_aproved"]`, `turns.0.after_resume.flags.0: "review_aproved" is not a flag agent "reviewed" can raise (its flags: review_approved, review_edited, review_rejected)`},
		{"flag of an agent that raises none", `{"name": "fn", "agent": "sequential", "turns": [{"input": "hi", "expect": {"flags": ["acute"]}}]}`,
			`["acute"]`, `turns.0.expect.flags.0: "acute" is not a flag agent "sequential" can raise (it raises none)`},
		{"tool the registry lacks", `{"name": "t", "agent": "sequential", "turns": [{"input": "hi", "expect": {"tools": ["lookup_schedul"]}}]}`,
			`["lookup_schedul"]`, `turns.0.expect.tools.0: "lookup_schedul" is not a tool of the bundle's registry`},
	} {
		// A file written on Windows ends its lines with \r\n: the line
		// and column are the same.
		for _, eol := range []string{"\n", "\r\n"} {
			t.Run(fmt.Sprintf("%s, lines ending %q", tc.name, eol), func(t *testing.T) {
				golden := strings.ReplaceAll(goldenWith(tc.line), "\n", eol)
				dir := variant(t, 2, func(dir string) { writeFile(t, dir, "golden/patterns.jsonl", golden) })
				off := strings.Index(golden, tc.bad)
				if off < 0 || !strings.Contains(tc.line, tc.bad) {
					t.Fatalf("%q is not in the line", tc.bad)
				}
				col := off - strings.LastIndex(golden[:off], "\n")
				name := tc.line[strings.Index(tc.line, `"name": "`)+9:]
				name = name[:strings.IndexByte(name, '"')]

				requireRefusedAt(t, dir, "golden/patterns.jsonl", 3, col, "", `conversation "`+name+`": `+tc.field)
			})
		}
	}

	// The expectations meet the bundle: an interrupt at a subgraph's node
	// is named by its parent, an expectation may be left out, and a
	// resumed turn's after_resume is checked as its expect is. A null
	// inside an input or an edit's value is the turn's data, not a field.
	ok := `{"name": "ok", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "interrupted", "interrupt": "answer/review"}, "resume": {"decision": "approve"}, "after_resume": {"path": ["answer"], "tools": []}}, ` +
		`{"input": {"text": "hi", "note": null}, "expect": {"status": "interrupted"}, "resume": {"decision": "edit", "value": {"text": "ok", "note": [null]}}}]}`
	// An agent's flags are checked where they are known: a node of a Go
	// program's own kind (iterative's test_polish) may raise any, and so
	// may a node whose config names the flags channel (noted's template).
	ok += "\n" + `{"name": "ok-flags", "agent": "conditional", "turns": [{"input": "chest pain", "expect": {"flags": ["acute"]}}, {"input": "hi", "expect": {"flags": []}}]}` +
		"\n" + `{"name": "ok-custom-kind", "agent": "iterative", "turns": [{"input": "hi", "expect": {"flags": ["converged"]}}]}` +
		"\n" + `{"name": "ok-written-flags", "agent": "noted", "turns": [{"input": "hi", "expect": {"flags": ["noted"]}}]}`
	dir := variant(t, 2, func(dir string) {
		writeFile(t, dir, "golden/patterns.jsonl", goldenWith(ok))
		writeFile(t, dir, "agents/noted.json", `{"name": "noted", "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "flags", "type": "strings", "reducer": "append"}],
  "input": "input",
  "nodes": [{"name": "note", "kind": "template", "config": {"template": "noted", "out": "flags"}}],
  "edges": [{"from": "START", "to": "note"}, {"from": "note", "to": "END"}]}`)
		editManifest(t, dir, func(m map[string]any) { m["agents"].(map[string]any)["noted"] = "agents/noted.json" })
	})
	if _, err := firmware.Load(dir, testKeyring(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := newInstaller(t, t.TempDir()).Install(dir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A bundle installed before a check was added still opens, so that the
// runs pinned to it go on: Open verifies what it verified then (signature,
// hashes, the digest recorded at install), not what verify checks now.
func TestInstalledBundleOpensWithoutGoldenChecks(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if _, err := in.Install(variant(t, 2, nil), firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	// An older appliance installed this version with a golden conversation
	// that today's install refuses: its folder and its index entry.
	bad := variant(t, 2, func(dir string) {
		writeFile(t, dir, "golden/patterns.jsonl", goldenWith(`{"name": "s", "agent": "sequential", "turns": [{"input": "hi", "expect": {"status": "done"}}]}`))
	})
	if _, err := firmware.Load(bad, testKeyring(t)); !errors.Is(err, firmware.ErrMalformed) {
		t.Fatalf("load: %v, want ErrMalformed", err)
	}
	installed := filepath.Join(data, "firmware", "patterns", "2")
	for _, f := range []string{firmware.ManifestFile, firmware.SignatureFile, "golden/patterns.jsonl"} {
		b, err := os.ReadFile(filepath.Join(bad, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(installed, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifest, _ := os.ReadFile(filepath.Join(bad, firmware.ManifestFile))
	indexPath := filepath.Join(data, "firmware", "index.json")
	index, _ := os.ReadFile(indexPath)
	var ix map[string]any
	if err := json.Unmarshal(index, &ix); err != nil {
		t.Fatal(err)
	}
	ix["installed"].([]any)[0].(map[string]any)["digest"] = firmware.Digest(manifest)
	index, _ = json.Marshal(ix)
	if err := os.WriteFile(indexPath, index, 0o644); err != nil {
		t.Fatal(err)
	}

	b, err := newInstaller(t, data).Open("patterns", 2)
	if err != nil {
		t.Fatalf("open: %v, want the installed bundle opened as installed", err)
	}
	if b.Digest != firmware.Digest(manifest) || len(b.Golden) != 2 {
		t.Fatalf("opened %s with %d golden conversations, want the installed copy", b.Digest, len(b.Golden))
	}
}

// A conversation built in Go, not decoded from a file, is checked as a
// decoded one is: a turn whose input is JSON null has no input (and is
// not told to leave it out).
func TestCheckGoldenBuiltInGo(t *testing.T) {
	for _, tc := range []struct {
		input json.RawMessage
		want  string // "" for none
	}{
		{json.RawMessage(`"hi"`), ""},
		{json.RawMessage(`{"text": "hi", "note": null}`), ""},
		{nil, "turns.1.input: every turn needs an input"},
		{json.RawMessage(`null`), "turns.1.input: null where an input (every turn needs one) is wanted"},
		{json.RawMessage(" null "), "turns.1.input: null where an input (every turn needs one) is wanted"},
	} {
		built := firmware.Conversation{Name: "go", Agent: "sequential", File: "g.jsonl", Line: 1,
			Turns: []firmware.Turn{{Input: json.RawMessage(`"first"`)}, {Input: tc.input}}}
		second := "{}"
		if tc.input != nil {
			second = `{"input": ` + string(tc.input) + `}`
		}
		decoded, err := firmware.DecodeGolden("g.jsonl", []byte(`{"name": "go", "agent": "sequential", "turns": [{"input": "first"}, `+second+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		for what, c := range map[string]firmware.Conversation{"built": built, "decoded": decoded[0]} {
			err := firmware.CheckGolden([]firmware.Conversation{c})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s, input %q: %v, want it taken", what, tc.input, err)
			case tc.want != "" && (!errors.Is(err, firmware.ErrMalformed) || !strings.HasSuffix(err.Error(), `conversation "go": `+tc.want)):
				t.Errorf("%s, input %q: %v, want ErrMalformed ending %q", what, tc.input, err, tc.want)
			}
		}
	}
}
