package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testRegistry = `{"tools": [
  {"name": "kb_search", "description": "Search the knowledge base.", "kind": "read", "idempotent": true,
   "schema": {"type": "object", "properties": {"query": {"type": "string", "minLength": 1}}, "required": ["query"], "additionalProperties": false}},
  {"name": "current_time", "description": "The appliance's clock.", "kind": "read", "idempotent": true},
  {"name": "record_note", "description": "Write a note.", "kind": "write", "idempotent": true,
   "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
  {"name": "schedule_followup", "description": "Book a follow-up.", "kind": "write",
   "schema": {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1}}, "required": ["days"]}}
]}`

func mustRegistry(t testing.TB) *Registry {
	t.Helper()
	r, err := DecodeRegistry([]byte(testRegistry))
	require.NoError(t, err)
	return r
}

func TestDecodeRegistry(t *testing.T) {
	r := mustRegistry(t)
	assert.Equal(t, []string{"current_time", "kb_search", "record_note", "schedule_followup"}, r.Names())
	kb, ok := r.Lookup("kb_search")
	require.True(t, ok)
	assert.Equal(t, KindRead, kb.Kind)
	assert.True(t, kb.Idempotent)
	assert.JSONEq(t, `{"type":"object","properties":{"query":{"type":"string","minLength":1}},"required":["query"],"additionalProperties":false}`, string(kb.Schema))

	// The registry writes itself in the form it reads.
	out, err := json.Marshal(r)
	require.NoError(t, err)
	again, err := DecodeRegistry(out)
	require.NoError(t, err)
	assert.Equal(t, r.Tools(), again.Tools())

	// Returned tools are copies: changing one changes nothing pinned.
	kb.Schema[0] = 'X'
	kb2, _ := r.Lookup("kb_search")
	assert.Equal(t, byte('{'), kb2.Schema[0])
}

func TestDecodeRegistryErrors(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"unknown top-level field", "{\n  \"tools\": [],\n  \"tool\": []\n}", `line 3, column 3: unknown field "tool"`},
		{"unknown tool field", "{\"tools\": [\n {\"name\": \"a\", \"kind\": \"read\",\n  \"idempotnet\": true}]}", `line 3, column 3: unknown field "tools.0.idempotnet"`},
		{"field in wrong case", `{"tools": [{"Name": "a", "kind": "read"}]}`, `line 1, column 13: unknown field "tools.0.Name"`},
		{"duplicate key", `{"tools": [{"name": "a", "name": "b", "kind": "read"}]}`, `duplicate key "tools.0.name"`},
		{"syntax error", "{\"tools\": [\n{\"name\": }]}", "line 2"},
		{"wrong type", "{\"tools\": [{\"name\": \"a\",\n \"kind\": \"read\", \"idempotent\": \"yes\"}]}", "line 2, column"},
		{"trailing data", `{"tools": []} x`, "unexpected data after the JSON value"},
		{"truncated", `{"tools": [`, "unexpected end of input"},
		{"missing tools", `{}`, `missing "tools"`},
		{"not an object", `[]`, "want policy.registryFile"},
		{"bad name", `{"tools": [{"name": "kb search", "kind": "read"}]}`, "name must match"},
		{"empty name", `{"tools": [{"name": "", "kind": "read"}]}`, "name must match"},
		{"duplicate tool", `{"tools": [{"name": "a", "kind": "read"}, {"name": "a", "kind": "read"}]}`, "declared twice"},
		{"missing kind", `{"tools": [{"name": "a"}]}`, `kind must be "read" or "write", got ""`},
		{"bad kind", `{"tools": [{"name": "a", "kind": "exec"}]}`, `got "exec"`},
		{"schema does not compile", `{"tools": [{"name": "a", "kind": "read", "schema": {"type": "thing"}}]}`, `unknown type "thing"`},
		{"schema not an object schema", `{"tools": [{"name": "a", "kind": "read", "schema": {"type": "string"}}]}`, `schema must have "type": "object"`},
		{"every problem reported", `{"tools": [{"name": "a", "kind": "x"}, {"name": "b", "kind": "y"}]}`, `tool 1 ("b")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRegistry([]byte(tt.file))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadRule)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestToolWithoutSchemaTakesNoArguments(t *testing.T) {
	a, err := Resolve(mustRegistry(t), nil, nil, nil)
	require.NoError(t, err)
	for _, args := range []string{``, `null`, `{}`, ` {} `} {
		assert.True(t, a.Check("current_time", json.RawMessage(args)).Allowed, "args %q", args)
	}
	res := a.Check("current_time", json.RawMessage(`{"tz":"UTC"}`))
	assert.False(t, res.Allowed)
	assert.Equal(t, LayerSchema, res.Layer)
}

// Each policy decoder names the item at fault by its JSON path, so that a
// caller holding the file can point at it.
func TestItemErrorPaths(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		decode     func() error
	}{
		{"tool", "tools.1", func() error {
			_, err := DecodeRegistry([]byte(`{"tools": [{"name": "a", "kind": "read"}, {"name": "b", "kind": "reed"}]}`))
			return err
		}},
		{"red flag", "red_flags.0", func() error {
			_, err := DecodeRules([]byte(`{"red_flags": [{"name": "x", "pattern": "(", "flag": "f", "template": "t"}]}`))
			return err
		}},
		{"scope", "scope", func() error {
			_, err := DecodeRules([]byte(`{"scope": {"keywords": ["dose"]}}`))
			return err
		}},
		{"citations", "citations", func() error {
			_, err := DecodeRules([]byte(`{"citations": {"pattern": "(a)(b)"}}`))
			return err
		}},
		{"approval", "approvals.1", func() error {
			_, err := DecodeRules([]byte(`{"approvals": [{"tool": "a", "decision": "allow"}, {"tool": "b", "decision": "maybe"}]}`))
			return err
		}},
		{"detector", "detectors", func() error {
			_, err := DecodeRedactionPolicy([]byte(`{"detectors": ["nope"]}`))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode()
			require.ErrorIs(t, err, ErrBadRule)
			var ie *ItemError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, tc.path, ie.Path)
		})
	}
}
