package firmware_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/firmware"
)

// brokenGraph builds a signed variant of the patterns bundle with one more
// agent, "broken", whose graph file is text (plus extra files).
func brokenGraph(t *testing.T, text string, extra map[string]string) string {
	return variant(t, 1, func(dir string) {
		writeFile(t, dir, "agents/broken.json", text)
		for p, body := range extra {
			writeFile(t, dir, p, body)
		}
		editManifest(t, dir, func(m map[string]any) {
			m["agents"].(map[string]any)["broken"] = "agents/broken.json"
		})
	})
}

const graphHead = `{
  "name": "broken",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "flags", "type": "strings", "reducer": "append"},
    {"name": "answer", "type": "string", "reducer": "replace"}
  ],
  "nodes": [
`

func TestGraphErrors(t *testing.T) {
	edges := `  ],
  "edges": [{"from": "START", "to": "a"}]
}`
	tests := []struct {
		name       string
		graph      string
		extra      map[string]string
		want       error
		line, col  int
		node, text string
	}{
		{name: "syntax error", want: firmware.ErrMalformed, line: 9, col: 38,
			graph: graphHead + `    {"name": "a", "kind": "template" "config": {}}` + "\n" + edges, text: "invalid character"},
		{name: "unknown field in a node", want: firmware.ErrMalformed, line: 9, col: 39,
			graph: graphHead + `    {"name": "a", "kind": "template", "colour": "red"}` + "\n" + edges, text: `unknown field "nodes.0.colour"`},
		{name: "unknown field in a config", want: firmware.ErrMalformed, line: 9, col: 84, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "template", "config": {"template": "x", "out": "answer", "outt": "x"}}` + "\n" + edges, text: `unknown field "outt"`},
		{name: "wrong type in a config", want: firmware.ErrMalformed, line: 9, col: 97, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "retrieve", "config": {"query": "input", "out": "answer", "k": "three"}}` + "\n" + edges, text: "want int"},
		{name: "unknown node kind", want: firmware.ErrUnknownNodeKind, line: 9, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "teleport"}` + "\n" + edges, text: `"teleport"`},
		{name: "model kind without a conversation", want: firmware.ErrMalformed, line: 9, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "model", "config": {"out": "answer"}}` + "\n" + edges, text: "needs messages or input"},
		{name: "model kind with a missing rules file", want: firmware.ErrMalformed, line: 9, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "model", "config": {"input": "input", "out": "answer", "scripted_rules": "nope.json"}}` + "\n" + edges, text: "nope.json"},
		{name: "tool_loop kind without messages", want: firmware.ErrMalformed, line: 9, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "tool_loop", "config": {}}` + "\n" + edges, text: "messages"},
		{name: "template names no channel", want: firmware.ErrMalformed, line: 9, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "template", "config": {"template": "{{nope}}", "out": "answer"}}` + "\n" + edges, text: "{{nope}}"},
		{name: "edge to an unknown node", want: firmware.ErrMalformed, line: 11, col: 43,
			graph: graphHead + `    {"name": "a", "kind": "router"}
  ],
  "edges": [{"from": "START", "to": "a"}, {"from": "a", "to": "b"}]
}`, text: `unknown node "b"`},
		{name: "conditional edges without default", want: firmware.ErrMalformed, line: 12, col: 5, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "router"}
  ],
  "edges": [{"from": "START", "to": "a"},
    {"from": "a", "to": "END", "when": {"flag_set": "acute"}}]
}`, text: "default"},
		{name: "condition with two tests", want: firmware.ErrMalformed, line: 12, col: 40, node: "a",
			graph: graphHead + `    {"name": "a", "kind": "router"}
  ],
  "edges": [{"from": "START", "to": "a"},
    {"from": "a", "to": "END", "when": {"flag_set": "acute", "channel_empty": "answer"}},
    {"from": "a", "to": "END", "when": {"default": true}}]
}`, text: "exactly one"},
		{name: "expression instead of a condition", want: firmware.ErrMalformed, line: 12, col: 41,
			graph: graphHead + `    {"name": "a", "kind": "router"}
  ],
  "edges": [{"from": "START", "to": "a"},
    {"from": "a", "to": "END", "when": {"expr": "len(answer) > 3"}}]
}`, text: `unknown field "edges.1.when.expr"`},
		{name: "unsupported channel type", want: firmware.ErrMalformed, line: 4, col: 5,
			graph: strings.Replace(graphHead, `"type": "string", "reducer": "replace"}`, `"type": "string", "reducer": "sum"}`, 1) +
				`    {"name": "a", "kind": "router"}` + "\n" + edges, text: "not supported"},
		{name: "subgraph cycle", want: firmware.ErrMalformed,
			graph: graphHead + `    {"name": "a", "kind": "subgraph", "config": {"graph": "agents/loop.json"}}` + "\n" + edges,
			extra: map[string]string{"agents/loop.json": `{"name": "loop", "channels": [], "nodes": [
  {"name": "again", "kind": "subgraph", "config": {"graph": "agents/loop.json"}}],
  "edges": [{"from": "START", "to": "again"}]}`}, text: "cycle"},
		{name: "unreachable node", want: firmware.ErrMalformed,
			graph: graphHead + `    {"name": "a", "kind": "router"}, {"name": "island", "kind": "router"}` + "\n" + edges, text: "unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := firmware.Load(brokenGraph(t, tt.graph, tt.extra), testKeyring(t))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var fe *firmware.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a *FileError", err)
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("err = %v, want it to mention %q", err, tt.text)
			}
			if tt.line != 0 && (fe.Line != tt.line || fe.Column != tt.col) {
				t.Errorf("at %d:%d, want %d:%d (%v)", fe.Line, fe.Column, tt.line, tt.col, err)
			}
			if fe.Node != tt.node {
				t.Errorf("node %q, want %q (%v)", fe.Node, tt.node, err)
			}
			t.Log(err)
		})
	}
}

func TestRegisterKindRefusesBuiltins(t *testing.T) {
	for _, name := range []string{"template", "model", "test_vote", ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterKind(%q) did not panic", name)
				}
			}()
			firmware.RegisterKind(name, buildVote)
		}()
	}
}
