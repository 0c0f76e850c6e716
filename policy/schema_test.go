package policy

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSchemaValidate(t *testing.T) {
	search := `{"type":"object","properties":{
		"query":{"type":"string","minLength":1,"maxLength":10},
		"limit":{"type":"integer","minimum":1,"maximum":20},
		"score":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},
		"mode":{"enum":["fast","exact"]},
		"v":{"const":1},
		"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]+$"},"minItems":1,"maxItems":2},
		"note":{"type":["string","null"]},
		"flag":{"type":"boolean"},
		"weird key":{"type":"string"}
	},"required":["query"],"additionalProperties":false}`
	tests := []struct {
		name   string
		schema string
		doc    string
		want   []string // problems; nil means valid
	}{
		{"valid minimal", search, `{"query":"x"}`, nil},
		{"valid full", search, `{"query":"metformin","limit":3,"score":0.5,"mode":"fast","v":1.0,"tags":["a"],"note":null,"flag":true}`, nil},
		{"integer spelled as float", search, `{"query":"x","limit":2.0}`, nil},
		{"wrong type", search, `{"query":3}`, []string{"$.query: want string, got number"}},
		{"missing required", search, `{}`, []string{"$.query: required"}},
		{"unexpected property", search, `{"query":"x","zzz":1}`, []string{"$.zzz: unexpected property"}},
		{"odd key path", search, `{"query":"x","weird key":1}`, []string{`$["weird key"]: want string, got number`}},
		{"not integer", search, `{"query":"x","limit":1.5}`, []string{"$.limit: want integer, got number"}},
		{"below minimum", search, `{"query":"x","limit":0}`, []string{"$.limit: want at least 1, got 0"}},
		{"above maximum", search, `{"query":"x","limit":21}`, []string{"$.limit: want at most 20, got 21"}},
		{"exclusive bounds", search, `{"query":"x","score":1}`, []string{"$.score: want less than 1, got 1"}},
		{"exclusive min", search, `{"query":"x","score":0}`, []string{"$.score: want more than 0, got 0"}},
		{"enum", search, `{"query":"x","mode":"slow"}`, []string{`$.mode: want one of "fast", "exact"`}},
		{"const", search, `{"query":"x","v":2}`, []string{"$.v: want 1"}},
		{"too short", search, `{"query":""}`, []string{"$.query: want at least 1 characters, got 0"}},
		{"too long counts runes", search, `{"query":"ééééééééééé"}`, []string{"$.query: want at most 10 characters, got 11"}},
		{"runes within limit", search, `{"query":"éééééééééé"}`, nil},
		{"items pattern", search, `{"query":"x","tags":["ok","NO"]}`, []string{`$.tags[1]: does not match pattern "^[a-z]+$"`}},
		{"too few items", search, `{"query":"x","tags":[]}`, []string{"$.tags: want at least 1 items, got 0"}},
		{"too many items", search, `{"query":"x","tags":["a","b","c"]}`, []string{"$.tags: want at most 2 items, got 3"}},
		{"type array", search, `{"query":"x","note":5}`, []string{"$.note: want string or null, got number"}},
		{"boolean", search, `{"query":"x","flag":"yes"}`, []string{"$.flag: want boolean, got string"}},
		{"several problems in stable order", search, `{"limit":"a","zzz":1}`, []string{"$.query: required", "$.limit: want integer, got string", "$.zzz: unexpected property"}},
		{"top level not object", search, `[]`, []string{"$: want object, got array"}},
		{"malformed JSON", search, `{"query":`, []string{"$: invalid JSON: unexpected EOF"}},
		{"duplicate key", search, `{"query":"x","query":"y"}`, []string{`$: invalid JSON: duplicate key "query"`}},
		{"trailing data", search, `{"query":"x"} {}`, []string{"$: invalid JSON: unexpected data after the JSON value"}},
		{"additionalProperties schema", `{"type":"object","additionalProperties":{"type":"integer"}}`, `{"a":1,"b":"x"}`, []string{"$.b: want integer, got string"}},
		{"nested object", `{"type":"object","properties":{"p":{"type":"object","properties":{"q":{"type":"null"}},"required":["q"]}}}`, `{"p":{}}`, []string{"$.p.q: required"}},
		{"false schema", `{"type":"object","properties":{"x":false}}`, `{"x":1}`, []string{"$.x: no value is allowed here"}},
		{"true schema", `{"type":"object","properties":{"x":true}}`, `{"x":[1,{"a":null}]}`, nil},
		{"enum of objects ignores key order", `{"enum":[{"a":1,"b":[true]}]}`, `{"b":[true],"a":1.0}`, nil},
		{"annotations are ignored", `{"type":"string","description":"d","title":"t","format":"date","default":"x","examples":["y"]}`, `"anything"`, nil},
		{"unbounded number", `{"type":"number","maximum":10}`, `1e400`, []string{"$: want at most 10, got 1e400"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := CompileSchema(json.RawMessage(tt.schema))
			require.NoError(t, err)
			err = s.Validate(json.RawMessage(tt.doc))
			if tt.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrArgsInvalid)
			var ae *ArgsError
			require.True(t, errors.As(err, &ae))
			var got []string
			for _, p := range ae.Problems {
				got = append(got, p.String())
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestSchemaProblemsAreCapped(t *testing.T) {
	s, err := CompileSchema(json.RawMessage(`{"type":"array","items":{"type":"string"}}`))
	require.NoError(t, err)
	err = s.Validate(json.RawMessage(`[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]`))
	var ae *ArgsError
	require.ErrorAs(t, err, &ae)
	assert.Len(t, ae.Problems, maxProblems)
}

func TestSchemaDeepNestingIsRefused(t *testing.T) {
	s, err := CompileSchema(json.RawMessage(`true`))
	require.NoError(t, err)
	deep := make([]byte, 0, 2*1000)
	for i := 0; i < 1000; i++ {
		deep = append(deep, '[')
	}
	for i := 0; i < 1000; i++ {
		deep = append(deep, ']')
	}
	assert.ErrorIs(t, s.Validate(deep), ErrArgsInvalid)
}

func TestCompileSchemaErrors(t *testing.T) {
	tests := []struct {
		name, schema, want string
	}{
		{"not JSON", `{`, "schema: unexpected EOF"},
		{"not an object", `3`, "#: a schema must be an object or a boolean"},
		{"unknown type", `{"type":"str"}`, `#/type: unknown type "str"`},
		{"empty type array", `{"type":[]}`, "#/type: want at least one type"},
		{"type not string", `{"type":3}`, "#/type: want a type name or an array of them"},
		{"unsupported keyword fails closed", `{"oneOf":[{"type":"string"}]}`, `#/oneOf: keyword "oneOf" is not supported`},
		{"ref unsupported", `{"properties":{"a":{"$ref":"#/x"}}}`, `#/properties/a/$ref: keyword "$ref" is not supported`},
		{"bad pattern", `{"pattern":"(?<=a)b"}`, "#/pattern: error parsing regexp"},
		{"negative count", `{"minLength":-1}`, "#/minLength: want a non-negative integer, got -1"},
		{"fractional count", `{"maxItems":1.5}`, "#/maxItems: want a non-negative integer, got 1.5"},
		{"minimum not number", `{"minimum":"1"}`, "#/minimum: want a number"},
		{"minimum out of range", `{"minimum":1e999}`, "#/minimum: number 1e999 is out of range"},
		{"empty enum", `{"enum":[]}`, "#/enum: want a non-empty array"},
		{"required not strings", `{"required":[1]}`, "#/required: want an array of strings"},
		{"properties not object", `{"properties":[]}`, "#/properties: want an object"},
		{"tuple items", `{"items":[{"type":"string"}]}`, "#/items: tuple items are not supported"},
		{"bad nested schema", `{"items":{"additionalProperties":"no"}}`, "#/items/additionalProperties: a schema must be an object or a boolean"},
		{"duplicate keys", `{"type":"string","type":"object"}`, `duplicate key "type"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CompileSchema(json.RawMessage(tt.schema))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadRule)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
