package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	reg := mustRegistry(t)
	all := []string{"current_time", "kb_search", "record_note", "schedule_followup"}
	tests := []struct {
		name             string
		agent, runtime   []string
		override         []string
		want, wantIgnore []string
		excludedBy       map[string]string
	}{
		{"no restriction anywhere", nil, nil, nil, all, []string{}, nil},
		{"runtime narrows", nil, []string{"kb_search", "record_note"}, nil, []string{"kb_search", "record_note"}, []string{},
			map[string]string{"current_time": LayerAppliance, "schedule_followup": LayerAppliance}},
		{"override narrows further", nil, []string{"kb_search", "record_note"}, []string{"kb_search"}, []string{"kb_search"}, []string{},
			map[string]string{"record_note": LayerRequest, "schedule_followup": LayerAppliance}},
		{"override cannot widen past runtime", nil, []string{"kb_search"}, []string{"kb_search", "record_note"}, []string{"kb_search"}, []string{"record_note"}, nil},
		{"override cannot add unknown tools", nil, nil, []string{"kb_search", "rm_rf"}, []string{"kb_search"}, []string{"rm_rf"}, nil},
		{"empty runtime means nothing", nil, []string{}, nil, []string{}, []string{}, nil},
		{"empty override means nothing", nil, nil, []string{}, []string{}, []string{}, nil},
		{"runtime names outside the ceiling grant nothing", nil, []string{"kb_search", "shell"}, nil, []string{"kb_search"}, []string{}, nil},
		{"duplicates are harmless", nil, []string{"kb_search", "kb_search"}, []string{"kb_search", "kb_search"}, []string{"kb_search"}, []string{}, nil},
		{"agent narrows the ceiling", []string{"kb_search", "current_time"}, nil, nil, []string{"current_time", "kb_search"}, []string{},
			map[string]string{"record_note": LayerAgent, "schedule_followup": LayerAgent}},
		{"empty agent list means nothing", []string{}, nil, nil, []string{}, []string{},
			map[string]string{"kb_search": LayerAgent, "record_note": LayerAgent}},
		{"agent comes before the appliance", []string{"kb_search", "current_time"}, []string{"kb_search", "record_note"}, nil,
			[]string{"kb_search"}, []string{}, map[string]string{"current_time": LayerAppliance, "record_note": LayerAgent, "schedule_followup": LayerAgent}},
		{"override cannot widen past the agent", []string{"kb_search"}, nil, []string{"kb_search", "record_note"}, []string{"kb_search"}, []string{"record_note"},
			map[string]string{"record_note": LayerAgent}},
		{"agent names outside the ceiling grant nothing", []string{"kb_search", "shell"}, nil, nil, []string{"kb_search"}, []string{},
			map[string]string{"shell": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := Resolve(reg, tt.agent, tt.runtime, tt.override)
			require.NoError(t, err)
			got := a.Names()
			if got == nil {
				got = []string{}
			}
			assert.Equal(t, tt.want, got)
			ign := a.Ignored()
			if ign == nil {
				ign = []string{}
			}
			assert.Equal(t, tt.wantIgnore, ign)
			for n, layer := range tt.excludedBy {
				assert.Equal(t, layer, a.ExcludedBy(n), n)
			}
		})
	}
	_, err := Resolve(nil, nil, nil, nil)
	assert.ErrorIs(t, err, ErrBadRule)
}

func TestActiveSetCheck(t *testing.T) {
	a, err := Resolve(mustRegistry(t), nil, []string{"kb_search", "record_note", "current_time"}, []string{"kb_search", "record_note"})
	require.NoError(t, err)
	tests := []struct {
		name          string
		tool, args    string
		allowed       bool
		layer         string
		sentinel      error
		needsApproval bool
		reason        string
	}{
		{"read tool allowed", "kb_search", `{"query":"metformin"}`, true, "", nil, false, ""},
		{"write tool allowed but needs approval", "record_note", `{"text":"hi"}`, true, "", nil, true, ""},
		{"unknown tool", "shell", `{}`, false, LayerRegistry, ErrToolUnknown, false, `tool "shell" is not in the registry`},
		{"removed by the appliance", "schedule_followup", `{"days":3}`, false, LayerAppliance, ErrToolDenied, false, "not allowed by the appliance configuration"},
		{"removed by the request", "current_time", `{}`, false, LayerRequest, ErrToolDenied, false, "not allowed by this request"},
		{"bad arguments", "kb_search", `{"query":3}`, false, LayerSchema, ErrArgsInvalid, false, "$.query: want string, got number"},
		{"missing arguments", "kb_search", ``, false, LayerSchema, ErrArgsInvalid, false, "$.query: required"},
		{"smuggled duplicate argument", "kb_search", `{"query":"a","query":3}`, false, LayerSchema, ErrArgsInvalid, false, "duplicate key"},
		{"case matters", "KB_SEARCH", `{"query":"x"}`, false, LayerRegistry, ErrToolUnknown, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := a.Check(tt.tool, json.RawMessage(tt.args))
			assert.Equal(t, tt.allowed, res.Allowed)
			assert.Equal(t, tt.layer, res.Layer)
			assert.Equal(t, tt.needsApproval, res.NeedsApproval)
			if tt.sentinel == nil {
				assert.NoError(t, res.Err)
				assert.Equal(t, tt.tool, res.Tool.Name)
				return
			}
			assert.ErrorIs(t, res.Err, tt.sentinel)
			assert.Contains(t, res.Reason, tt.reason)
			assert.Contains(t, res.Err.Error(), tt.reason)
		})
	}
}

// A tool the agent's allowlist leaves out is denied by the agent layer,
// even where the appliance and the request would allow it.
func TestActiveSetCheckAgentLayer(t *testing.T) {
	a, err := Resolve(mustRegistry(t), []string{"kb_search", "current_time"}, []string{"kb_search", "record_note"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"kb_search"}, a.Names())
	for _, c := range []struct{ tool, args, layer, reason string }{
		{"record_note", `{"text":"t"}`, LayerAgent, `tool "record_note" is not allowed by the agent's allowlist`},
		{"schedule_followup", `{"when":"x"}`, LayerAgent, `tool "schedule_followup" is not allowed by the agent's allowlist`},
		{"current_time", `{}`, LayerAppliance, `tool "current_time" is not allowed by the appliance configuration`},
	} {
		res := a.Check(c.tool, json.RawMessage(c.args))
		assert.False(t, res.Allowed, c.tool)
		assert.Equal(t, c.layer, res.Layer, c.tool)
		assert.Equal(t, c.reason, res.Reason, c.tool)
		assert.ErrorIs(t, res.Err, ErrToolDenied, c.tool)
	}
}

func TestActiveSetPinnedForm(t *testing.T) {
	a, err := Resolve(mustRegistry(t), nil, []string{"kb_search", "record_note", "current_time"}, []string{"kb_search", "record_note", "nope"})
	require.NoError(t, err)
	pinned, err := json.Marshal(a)
	require.NoError(t, err)

	// Stable: the same resolution gives the same bytes.
	b, err := Resolve(mustRegistry(t), nil, []string{"current_time", "record_note", "kb_search"}, []string{"nope", "record_note", "kb_search"})
	require.NoError(t, err)
	pinned2, err := json.Marshal(b)
	require.NoError(t, err)
	assert.Equal(t, string(pinned), string(pinned2))

	// A restored set judges calls exactly as the original did, including
	// which layer denies.
	restored, err := DecodeActiveSet(pinned)
	require.NoError(t, err)
	assert.Equal(t, a.Names(), restored.Names())
	assert.Equal(t, a.Ignored(), restored.Ignored())
	for _, call := range []struct{ tool, args string }{
		{"kb_search", `{"query":"x"}`}, {"kb_search", `{}`}, {"record_note", `{"text":"t"}`},
		{"current_time", `{}`}, {"schedule_followup", `{"days":1}`}, {"shell", `{}`},
	} {
		want, got := a.Check(call.tool, json.RawMessage(call.args)), restored.Check(call.tool, json.RawMessage(call.args))
		assert.Equal(t, want.Allowed, got.Allowed, call.tool)
		assert.Equal(t, want.Layer, got.Layer, call.tool)
		assert.Equal(t, want.Reason, got.Reason, call.tool)
	}
	again, err := json.Marshal(restored)
	require.NoError(t, err)
	assert.Equal(t, string(pinned), string(again))
}

// The agent layer survives the pinned form, and a set pinned before the
// layer existed (no tool excluded by it) still decodes and judges calls as
// it did.
func TestActiveSetPinnedAgentLayer(t *testing.T) {
	a, err := Resolve(mustRegistry(t), []string{"kb_search", "record_note"}, []string{"kb_search"}, nil)
	require.NoError(t, err)
	pinned, err := json.Marshal(a)
	require.NoError(t, err)
	assert.Contains(t, string(pinned), `"schedule_followup":"agent"`)
	restored, err := DecodeActiveSet(pinned)
	require.NoError(t, err)
	for _, n := range []string{"kb_search", "record_note", "current_time", "schedule_followup"} {
		assert.Equal(t, a.ExcludedBy(n), restored.ExcludedBy(n), n)
	}
	res := restored.Check("schedule_followup", json.RawMessage(`{"when":"x"}`))
	assert.Equal(t, LayerAgent, res.Layer)

	older := `{"version":1,"tools":[{"name":"kb_search","description":"Search.","kind":"read","idempotent":true}],` +
		`"excluded":{"record_note":"appliance","current_time":"request"},"ignored":["shell"]}`
	old, err := DecodeActiveSet([]byte(older))
	require.NoError(t, err)
	assert.Equal(t, []string{"kb_search"}, old.Names())
	assert.Equal(t, LayerAppliance, old.Check("record_note", nil).Layer)
	assert.Equal(t, LayerRequest, old.Check("current_time", nil).Layer)
	assert.Equal(t, LayerRegistry, old.Check("schedule_followup", nil).Layer)
}

func TestDecodeActiveSetErrors(t *testing.T) {
	tests := []struct{ name, data, want string }{
		{"wrong version", `{"version":2,"tools":[],"excluded":{},"ignored":[]}`, "version 2"},
		{"unknown field", `{"version":1,"tools":[],"excluded":{},"ignored":[],"extra":1}`, `unknown field "extra"`},
		{"bad layer", `{"version":1,"tools":[],"excluded":{"a":"moon"},"ignored":[]}`, `unknown layer "moon"`},
		{"both active and excluded", `{"version":1,"tools":[{"name":"a","kind":"read"}],"excluded":{"a":"request"},"ignored":[]}`, "both active and excluded"},
		{"bad tool", `{"version":1,"tools":[{"name":"a","kind":"run"}],"excluded":{},"ignored":[]}`, "kind must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeActiveSet([]byte(tt.data))
			assert.ErrorIs(t, err, ErrBadRule)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}
