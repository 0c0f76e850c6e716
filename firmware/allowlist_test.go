package firmware_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// helperRules make the scripted model call send_reminder for a reminder,
// then answer with what it read back.
const helperRules = `[
  {"name": "remind-first", "match": "(?i)remind", "when_no_tool_result": true,
   "tool_calls": [{"name": "send_reminder", "arguments": {"patient": "p1", "text": "{{input}}"}}]},
  {"name": "remind-answer", "match": "(?i)remind", "when_tool_result": true, "respond": "Result: {{context}}"}
]`

// helperGraph is a tool-loop agent for the patterns bundle; tools is its
// "tools" member with a trailing comma, or "" for none. Its "tools" line
// is line 9.
func helperGraph(name, tools string) string {
	return `{
  "name": "` + name + `",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "messages", "type": "messages", "reducer": "append"},
    {"name": "answer", "type": "string", "reducer": "replace"}
  ],
  "input": "input", "output": "answer", "history": "messages",
  ` + tools + `
  "nodes": [
    {"name": "loop", "kind": "tool_loop", "config": {"messages": "messages", "answer": "answer",
      "scripted_rules": "scripted/helper.json", "lane": "helper"}}
  ],
  "edges": [{"from": "START", "to": "loop"}, {"from": "loop", "to": "END"}]
}`
}

// withAgents is a signed variant of the patterns bundle with more agents
// (name to graph file) and files, and a lane for the helper agents.
func withAgents(t *testing.T, agents map[string]string, files map[string]string) string {
	return variant(t, 1, func(dir string) {
		writeFile(t, dir, "scripted/helper.json", helperRules)
		writeFile(t, dir, "lanes.json", `{"lanes": [{"agent": "sequential", "models": ["llama3.2:*", "qwen2.5:0.5b"]},
  {"agent": "helper", "models": ["scripted"]}]}`)
		for p, body := range files {
			writeFile(t, dir, p, body)
		}
		editManifest(t, dir, func(m map[string]any) {
			for name, file := range agents {
				m["agents"].(map[string]any)[name] = file
			}
		})
	})
}

// An agent's tools list must name tools of the registry, each once, and
// sit in the agent's own file; each refusal names the agent, the tool and
// where, in JSON and in YAML.
func TestAllowlistErrors(t *testing.T) {
	const yamlGraph = `name: helper
channels:
  - {name: input, type: string, reducer: replace}
  - {name: messages, type: messages, reducer: append}
  - {name: answer, type: string, reducer: replace}
input: input
output: answer
tools:
  - lookup_schedule
  - send_remindr
nodes:
  - name: loop
    kind: tool_loop
    config: {messages: messages, answer: answer, scripted_rules: scripted/helper.json, lane: helper}
edges:
  - {from: START, to: loop}
  - {from: loop, to: END}
`
	tests := []struct {
		name      string
		agents    map[string]string
		files     map[string]string
		line, col int
		text      string
	}{
		{"a tool the registry lacks", map[string]string{"helper-agent": "agents/helper.json"},
			map[string]string{"agents/helper.json": helperGraph("helper", `"tools": ["lookup_schedule", "send_remindr"],`)}, 9, 32,
			`tools.1: agent "helper-agent" names tool "send_remindr", which is not in the bundle's registry (tools: lookup_schedule, send_reminder)`},
		{"a tool named twice", map[string]string{"helper": "agents/helper.json"},
			map[string]string{"agents/helper.json": helperGraph("helper", `"tools": ["send_reminder", "lookup_schedule", "send_reminder"],`)}, 9, 49,
			`tools.2: agent "helper" names tool "send_reminder" twice`},
		{"null", map[string]string{"helper": "agents/helper.json"},
			map[string]string{"agents/helper.json": helperGraph("helper", `"tools": null,`)}, 9, 12,
			`tools: null: leave the field out for the whole registry, or write [] for no tools`},
		{"YAML: a tool the registry lacks", map[string]string{"helper": "agents/helper.yaml"},
			map[string]string{"agents/helper.yaml": yamlGraph}, 10, 5,
			`tools.1: agent "helper" names tool "send_remindr", which is not in the bundle's registry`},
		{"YAML: null", map[string]string{"helper": "agents/helper.yaml"},
			map[string]string{"agents/helper.yaml": strings.Replace(yamlGraph, "tools:\n  - lookup_schedule\n  - send_remindr\n", "tools: ~\n", 1)}, 8, 8,
			`tools: null`},
		{"in a file run only as a subgraph", map[string]string{"outer": "agents/outer.json"},
			map[string]string{"agents/helper.json": helperGraph("helper", `"tools": ["lookup_schedule"],`),
				"agents/outer.json": `{"name": "outer", "channels": [{"name": "messages", "type": "messages", "reducer": "append"}],
  "nodes": [{"name": "sub", "kind": "subgraph", "config": {"graph": "agents/helper.json"}}],
  "edges": [{"from": "START", "to": "sub"}, {"from": "sub", "to": "END"}]}`}, 9, 12,
			`tools: graph "helper" is run only as a subgraph, and an allowlist is read from an agent's own file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := firmware.Load(withAgents(t, tt.agents, tt.files), testKeyring(t))
			require.ErrorIs(t, err, firmware.ErrMalformed)
			var fe *firmware.FileError
			require.ErrorAs(t, err, &fe)
			assert.Contains(t, err.Error(), tt.text)
			assert.Equal(t, [2]int{tt.line, tt.col}, [2]int{fe.Line, fe.Column}, "%v", err)
		})
	}
}

// A bundle with a tool loop whose agent names no tools loads, with a
// warning naming the agent, the node and the registry's tools; one whose
// agent names them (even none) has no warning. A tool loop reached through
// a subgraph counts.
func TestAllowlistWarnings(t *testing.T) {
	b, err := firmware.Load(withAgents(t, map[string]string{"helper": "agents/helper.json", "outer": "agents/outer.json", "quiet": "agents/quiet.json"},
		map[string]string{
			"agents/helper.json": helperGraph("helper", ""),
			"agents/quiet.json":  helperGraph("quiet", `"tools": [],`),
			"agents/outer.json": `{"name": "outer", "channels": [{"name": "messages", "type": "messages", "reducer": "append"}],
  "nodes": [{"name": "sub", "kind": "subgraph", "config": {"graph": "agents/helper.json"}}],
  "edges": [{"from": "START", "to": "sub"}, {"from": "sub", "to": "END"}]}`,
		}), testKeyring(t))
	require.NoError(t, err)
	assert.Equal(t, []string{
		`agents/helper.json: agent "helper" names no tools, so its tool_loop node "loop" may call every tool of the registry (lookup_schedule, send_reminder): list the ones it needs in "tools"`,
		`agents/outer.json: agent "outer" names no tools, so its tool_loop node "loop" (in subgraph "helper") may call every tool of the registry (lookup_schedule, send_reminder): list the ones it needs in "tools"`,
	}, b.Warnings())
	assert.Nil(t, b.Allowlist("helper"))
	assert.Equal(t, []string{}, b.Allowlist("quiet"))
	assert.Empty(t, loadPatterns(t).Warnings(), "no tool loop, no warning")
}

// A model's call to a tool the agent's allowlist leaves out is refused
// with layer "agent", and the tool never runs: in a run the manager pins,
// and in a graph invoked directly, where the allowlist of the agent that
// runs the file bounds it. A request naming the tool is refused before
// the run opens, saying that the agent leaves it out.
func TestAllowlistDeniesCalls(t *testing.T) {
	var sent atomic.Int32
	rt := &firmware.Runtime{Impls: map[string]agent.Tool{
		"send_reminder": agent.ToolFunc(func(context.Context, json.RawMessage, string) (json.RawMessage, error) {
			sent.Add(1)
			return json.RawMessage(`{"sent":true}`), nil
		}),
	}}
	b, err := firmware.LoadWithRuntime(withAgents(t, map[string]string{"helper": "agents/helper.json"},
		map[string]string{"agents/helper.json": helperGraph("helper", `"tools": ["lookup_schedule"],`)}), testKeyring(t), rt)
	require.NoError(t, err)
	ag, err := b.Agent("helper")
	require.NoError(t, err)

	unknown, err := firmware.UnknownTools(ag, []string{"send_reminder"})
	require.NoError(t, err)
	require.NotNil(t, unknown)
	assert.Equal(t, []string{"send_reminder"}, unknown.Unlisted)
	assert.Equal(t, "the agent's allowlist leaves it out", unknown.Why())
	unknown, err = firmware.UnknownTools(ag, []string{"send_reminder", "shell"})
	require.NoError(t, err)
	assert.Equal(t, "its bundle's registry lacks shell, and the agent's allowlist leaves out send_reminder", unknown.Why())

	ctx := context.Background()
	bus := engine.NewBus()
	events := bus.Subscribe(256, nil)
	store := engine.NewMemoryStore()
	rt.Runs = store
	m := engine.NewManager(store, firmware.BundleResolver(b), engine.ManagerOptions{Events: bus})
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t", Agent: "helper", Input: json.RawMessage(`"remind me of my dose"`)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status, run.Error)
	assert.Contains(t, string(run.Output), `refused: tool \"send_reminder\" is not available`)
	var pinned struct{ Excluded map[string]string }
	require.NoError(t, json.Unmarshal([]byte(run.Meta[firmware.MetaActiveTools]), &pinned))
	assert.Equal(t, map[string]string{"send_reminder": policy.LayerAgent}, pinned.Excluded)
	m.Close()
	bus.Close()
	var layers []string
	for e := range events.C() {
		if e.Type == engine.EventToolDenied && e.Run == run.ID {
			var d map[string]any
			require.NoError(t, json.Unmarshal(e.Data, &d))
			layers = append(layers, d["layer"].(string)+": "+d["reason"].(string))
		}
	}
	assert.Equal(t, []string{`agent: tool "send_reminder" is not allowed by the agent's allowlist`}, layers)

	res, err := ag.Graph.Invoke(ctx, engine.RunConfig{Thread: "direct", Store: engine.NewMemoryStore()},
		engine.Write{Channel: "input", Value: "remind me of my dose"},
		engine.Write{Channel: "messages", Value: []models.Message{{Role: models.RoleUser, Content: "remind me of my dose"}}})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	assert.Zero(t, sent.Load(), "send_reminder never ran")
}

// A golden conversation that expects its agent to call a tool that the
// agent's allowlist leaves out could never pass: a refused call is a
// tool.unauthorized event, not one of the turn's tools. Verify (Load) and
// install refuse it at the tool list's line and column, naming the
// conversation, the turn, the tool and the agent; a tool the allowlist
// names, or any tool of the registry for an agent that names none, is
// fine.
func TestGoldenToolOutsideTheAgentsAllowlistIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, tools, line, bad, says string
	}{
		{"a tool the allowlist leaves out", `"tools": ["lookup_schedule"],`,
			`{"name": "h", "agent": "helper", "turns": [{"input": "hi"}, {"input": "remind me", "expect": {"tools": ["lookup_schedule", "send_reminder"]}}]}`,
			`["lookup_schedule", "send_reminder"]`,
			`conversation "h": turns.1.expect.tools.1: "send_reminder" is not in agent "helper"'s allowlist (tools: lookup_schedule)`},
		{"after a resume", `"tools": ["lookup_schedule"],`,
			`{"name": "r", "agent": "helper", "turns": [{"input": "remind me", "expect": {"status": "interrupted"}, "resume": {"decision": "approve"}, "after_resume": {"tools": ["send_reminder"]}}]}`,
			`["send_reminder"]`,
			`conversation "r": turns.0.after_resume.tools.0: "send_reminder" is not in agent "helper"'s allowlist (tools: lookup_schedule)`},
		{"an allowlist of none", `"tools": [],`,
			`{"name": "n", "agent": "helper", "turns": [{"input": "remind me", "expect": {"tools": ["send_reminder"]}}]}`,
			`["send_reminder"]`,
			`conversation "n": turns.0.expect.tools.0: "send_reminder" is not in agent "helper"'s allowlist (it names none)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			golden := goldenWith(tc.line)
			dir := withAgents(t, map[string]string{"helper": "agents/helper.json"},
				map[string]string{"agents/helper.json": helperGraph("helper", tc.tools), "golden/patterns.jsonl": golden})
			off := strings.Index(golden, tc.bad)
			require.GreaterOrEqual(t, off, 0)
			col := off - strings.LastIndex(golden[:off], "\n")
			requireRefusedAt(t, dir, "golden/patterns.jsonl", 3, col, "", tc.says)
		})
	}

	for _, tools := range []string{`"tools": ["send_reminder"],`, ""} {
		golden := goldenWith(`{"name": "ok", "agent": "helper", "turns": [{"input": "remind me", "expect": {"tools": ["send_reminder"]}}]}`)
		dir := withAgents(t, map[string]string{"helper": "agents/helper.json"},
			map[string]string{"agents/helper.json": helperGraph("helper", tools), "golden/patterns.jsonl": golden})
		_, err := firmware.Load(dir, testKeyring(t))
		require.NoError(t, err, "allowlist %q", tools)
		_, err = newInstaller(t, t.TempDir()).Install(dir, firmware.InstallOptions{})
		require.NoError(t, err, "allowlist %q", tools)
	}
}
