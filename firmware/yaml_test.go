package firmware_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/firmware"
)

// brokenYAMLGraph is brokenGraph with the graph file in YAML.
func brokenYAMLGraph(t *testing.T, text string, extra map[string]string) string {
	return variant(t, 1, func(dir string) {
		writeFile(t, dir, "agents/broken.yaml", text)
		for p, body := range extra {
			writeFile(t, dir, p, body)
		}
		editManifest(t, dir, func(m map[string]any) {
			m["agents"].(map[string]any)["broken"] = "agents/broken.yaml"
		})
	})
}

// yamlHead is lines 1 to 6 of the graphs in TestYAMLGraphErrors; their
// nodes start on line 7, at column 3 ("- ") or 5 (the node's first key).
const yamlHead = `name: broken
channels:
  - {name: input, type: string, reducer: replace}
  - {name: flags, type: strings, reducer: append}
  - {name: answer, type: string, reducer: replace}
nodes:
`

const yamlEdges = `edges:
  - {from: START, to: a}
`

func TestYAMLGraphErrors(t *testing.T) {
	tests := []struct {
		name       string
		graph      string
		extra      map[string]string
		want       error
		line, col  int
		node, text string
	}{
		{name: "syntax error: tab in the indentation", want: firmware.ErrMalformed, line: 8, col: 1,
			graph: yamlHead + "  - name: a\n\tkind: router\n" + yamlEdges, text: "YAML syntax"},
		{name: "syntax error: unclosed bracket", want: firmware.ErrMalformed, line: 7, col: 5,
			graph: yamlHead + "  - {name: a, kind: router\n" + yamlEdges, text: "YAML syntax"},
		{name: "syntax error: unclosed quote", want: firmware.ErrMalformed, line: 8, col: 11,
			graph: yamlHead + "  - name: a\n    kind: \"router\n" + yamlEdges, text: "YAML syntax"},
		{name: "syntax error: a second colon", want: firmware.ErrMalformed, line: 8, col: 17,
			graph: yamlHead + "  - name: a\n    kind: router: template\n" + yamlEdges, text: "mapping values are not allowed"},
		{name: "syntax error: bad indentation", want: firmware.ErrMalformed, line: 8, col: 4,
			graph: yamlHead + "  - name: a\n   kind: router\n" + yamlEdges, text: "YAML syntax"},
		{name: "unknown field in a node", want: firmware.ErrMalformed, line: 9, col: 5,
			graph: yamlHead + "  - name: a\n    kind: router\n    colour: red\n" + yamlEdges, text: `unknown field "nodes.0.colour"`},
		{name: "unknown field in a config", want: firmware.ErrMalformed, line: 11, col: 7, node: "a",
			graph: yamlHead + "  - name: a\n    kind: template\n    config:\n      template: x\n      outt: answer\n" + yamlEdges, text: `unknown field "outt"`},
		{name: "unknown field in a condition", want: firmware.ErrMalformed, line: 10, col: 31,
			graph: yamlHead + "  - {name: a, kind: router}\nedges:\n  - {from: START, to: a}\n  - {from: a, to: END, when: {expr: len(answer) > 3}}\n",
			text:  `unknown field "edges.1.when.expr"`},
		{name: "wrong type: text for a number", want: firmware.ErrMalformed, line: 7, col: 70, node: "a",
			graph: yamlHead + "  - {name: a, kind: retrieve, config: {query: input, out: answer, k: three}}\n" + yamlEdges, text: "want int"},
		{name: "wrong type: a number for text", want: firmware.ErrMalformed, line: 8, col: 11,
			graph: yamlHead + "  - name: a\n    kind: 5\n" + yamlEdges, text: "want string"},
		{name: "wrong type: a mapping for a number", want: firmware.ErrMalformed, line: 10, col: 7,
			graph: yamlHead + "  - name: a\n    kind: router\n    retries:\n      times: 2\n" + yamlEdges, text: "want int"},
		{name: "wrong type: a list for a mapping", want: firmware.ErrMalformed, line: 9, col: 13, node: "a",
			graph: yamlHead + "  - name: a\n    kind: template\n    config: [template, out]\n" + yamlEdges, text: "got JSON array"},
		{name: "duplicate key in a node", want: firmware.ErrMalformed, line: 9, col: 5,
			graph: yamlHead + "  - name: a\n    kind: router\n    name: b\n" + yamlEdges, text: `duplicate key "nodes.0.name"`},
		{name: "duplicate key at the top", want: firmware.ErrMalformed, line: 10, col: 1,
			graph: yamlHead + "  - {name: a, kind: router}\n" + yamlEdges + "name: again\n", text: `duplicate key "name"`},
		{name: "duplicate key in a config", want: firmware.ErrMalformed, line: 7, col: 66,
			graph: yamlHead + "  - {name: a, kind: template, config: {template: x, out: answer, out: flags}}\n" + yamlEdges, text: `duplicate key "nodes.0.config.out"`},
		{name: "anchor refused", want: firmware.ErrMalformed, line: 9, col: 13, node: "a",
			graph: yamlHead + "  - name: a\n    kind: template\n    config: &cfg {template: x, out: answer}\n" + yamlEdges, text: "anchors (&cfg) are not allowed"},
		{name: "alias of an unknown anchor", want: firmware.ErrMalformed, line: 9, col: 11,
			graph: yamlHead + "  - {name: a, kind: router}\n  - name: b\n    kind: *k\n" + yamlEdges, text: "unknown anchor"},
		{name: "merge key refused", want: firmware.ErrMalformed, line: 8, col: 5, node: "a",
			graph: yamlHead + "  - name: a\n    <<: {kind: router}\n" + yamlEdges, text: "merge keys"},
		{name: "key that is not a string", want: firmware.ErrMalformed, line: 9, col: 5, node: "a",
			graph: yamlHead + "  - name: a\n    kind: router\n    1: one\n" + yamlEdges, text: `not int "1"`},
		{name: "explicit tag refused", want: firmware.ErrMalformed, line: 8, col: 11, node: "a",
			graph: yamlHead + "  - name: a\n    kind: !!str router\n" + yamlEdges, text: "tags (!!str)"},
		{name: "number that JSON would not write", want: firmware.ErrMalformed, line: 9, col: 14, node: "a",
			graph: yamlHead + "  - name: a\n    kind: router\n    retries: 0x1\n" + yamlEdges, text: `number "0x1"`},
		{name: "two documents", want: firmware.ErrMalformed, line: 11, col: 1,
			graph: yamlHead + "  - {name: a, kind: router}\n" + yamlEdges + "---\nname: other\n", text: "second YAML document"},
		{name: "line break other than \\n", want: firmware.ErrMalformed, line: 8, col: 17,
			graph: yamlHead + "  - name: a\n    kind: router\r    retries: 1\n" + yamlEdges, text: `line break '\r'`},
		{name: "Windows line ends", want: firmware.ErrMalformed, line: 9, col: 5,
			graph: strings.ReplaceAll(yamlHead+"  - name: a\n    kind: router\n    colour: red\n"+yamlEdges, "\n", "\r\n"), text: `unknown field "nodes.0.colour"`},
		{name: "empty file", want: firmware.ErrMalformed, line: 1, col: 1,
			graph: "# nothing here\n", text: "empty YAML document"},
		{name: "unknown node kind", want: firmware.ErrUnknownNodeKind, line: 7, col: 5, node: "a",
			graph: yamlHead + "  - name: a\n    kind: teleport\n" + yamlEdges, text: `"teleport"`},
		{name: "undeclared channel", want: firmware.ErrMalformed, line: 7, col: 5, node: "a",
			graph: yamlHead + "  - name: a\n    kind: template\n    config: {template: x, out: nope}\n" + yamlEdges, text: `"nope"`},
		{name: "edge to an unknown node", want: firmware.ErrMalformed, line: 10, col: 5,
			graph: yamlHead + "  - {name: a, kind: router}\nedges:\n  - {from: START, to: a}\n  - {from: a, to: b}\n", text: `unknown node "b"`},
		{name: "error in a YAML subgraph", want: firmware.ErrMalformed, line: 4, col: 29,
			graph: yamlHead + "  - {name: a, kind: subgraph, config: {graph: agents/sub.yml}}\n" + yamlEdges,
			extra: map[string]string{"agents/sub.yml": "name: sub\nchannels: []\nnodes:\n  - {name: x, kind: router, colour: red}\nedges: [{from: START, to: x}]\n"},
			text:  "agents/sub.yml:4:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := firmware.Load(brokenYAMLGraph(t, tt.graph, tt.extra), testKeyring(t))
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
			if fe.Line != tt.line || fe.Column != tt.col {
				t.Errorf("at %d:%d, want %d:%d (%v)", fe.Line, fe.Column, tt.line, tt.col, err)
			}
			if fe.Node != tt.node {
				t.Errorf("node %q, want %q (%v)", fe.Node, tt.node, err)
			}
			t.Log(err)
		})
	}
}

// TestYAMLGraphsMatchJSON checks that the YAML pattern agents decode to the
// same graphs as their JSON twins.
func TestYAMLGraphsMatchJSON(t *testing.T) {
	b := loadPatterns(t)
	for _, name := range []string{"sequential", "conditional", "hierarchical"} {
		j, y := b.Graphs[name], b.Graphs[name+"_yaml"]
		if j == nil || y == nil {
			t.Fatalf("%s: graphs %v and %v", name, j, y)
		}
		want, _ := json.Marshal(j) // compacts the nodes' raw configs
		got, _ := json.Marshal(y)
		if name == "hierarchical" {
			got = []byte(strings.Replace(string(got), "teams/research.yaml", "teams/research.json", 1))
		}
		if string(got) != string(want) {
			t.Errorf("%s:\nYAML %s\nJSON %s", name, got, want)
		}
	}
}
