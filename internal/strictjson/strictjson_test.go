package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type inner struct {
	Name string `json:"name"`
}

type base struct {
	Version int `json:"version"`
}

type doc struct {
	base
	Items  []inner          `json:"items"`
	Extra  json.RawMessage  `json:"extra"`
	ByName map[string]inner `json:"by_name"`
	Hidden string           `json:"-"`
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name, in  string
		line, col int
		msg       string
	}{
		{"unknown field", "{\n  \"items\": [{\"name\": \"a\"}, {\"nme\": \"b\"}]}", 2, 29, `unknown field "items.1.nme"`},
		{"field in another case", `{"Items": []}`, 1, 2, `unknown field "Items"`},
		{"duplicate key", `{"version": 1, "version": 2}`, 1, 16, `duplicate key "version"`},
		{"duplicate key inside a raw message", `{"extra": {"a": 1, "a": 2}}`, 1, 20, `duplicate key "extra.a"`},
		{"unknown field in a map value", `{"by_name": {"x": {"nam": "y"}}}`, 1, 20, `unknown field "by_name.x.nam"`},
		{"a field tagged -", `{"Hidden": "x"}`, 1, 2, `unknown field "Hidden"`},
		{"trailing data", `{} {}`, 1, 4, "unexpected data after the JSON value"},
		{"wrong type", `{"version": "one"}`, 1, 18, "base.version: want int, got JSON string"},
		{"truncated", `{"items": [`, 1, 12, "unexpected end of input"},
		{"nested too deeply", `{"extra": ` + strings.Repeat("[", MaxDepth+2), 1, 75, "nested too deeply"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			_, err := Decode([]byte(tc.in), &d)
			var e *Error
			require.True(t, errors.As(err, &e), "%v", err)
			assert.Equal(t, tc.msg, e.Msg)
			line, col := LineCol([]byte(tc.in), e.Offset)
			assert.Equal(t, []int{tc.line, tc.col}, []int{line, col})
		})
	}
}

func TestDecodePositions(t *testing.T) {
	in := "{\"version\": 2,\n \"items\": [\n  {\"name\": \"a\"},\n  {\"name\": \"b\"}]}"
	var d doc
	pos, err := Decode([]byte(in), &d)
	require.NoError(t, err)
	assert.Equal(t, 2, d.Version, "an embedded struct's fields are promoted")
	assert.Equal(t, []inner{{"a"}, {"b"}}, d.Items)
	line, col := LineCol([]byte(in), pos.At("items.1.name"))
	assert.Equal(t, []int{4, 3}, []int{line, col}, "a scalar's path falls back to its object")
	assert.Equal(t, 0, pos.At(""))
	assert.Equal(t, 0, pos.At("nowhere"), "an unknown path falls back to the document")
}

// ElementAt finds an element of a list, whatever the elements and the
// space between them, and says when there is none.
func TestElementAt(t *testing.T) {
	in := "{\"fields\": [\"a\",\n  \"b\" ,{\"c\": [1, 2]},\t\"d\"], \"n\": 1}"
	arr := strings.Index(in, "[")
	for i, want := range []string{`"a"`, `"b"`, `{"c"`, `"d"`} {
		off := ElementAt([]byte(in), arr, i)
		require.GreaterOrEqual(t, off, 0, "element %d", i)
		assert.True(t, strings.HasPrefix(in[off:], want), "element %d at %q", i, in[off:])
	}
	line, col := LineCol([]byte(in), ElementAt([]byte(in), arr, 1))
	assert.Equal(t, []int{2, 3}, []int{line, col})
	for _, tc := range []struct{ off, i int }{{arr, 4}, {arr, -1}, {0, 0}, {-1, 0}, {len(in), 0}, {strings.Index(in, "1"), 0}} {
		assert.Equal(t, -1, ElementAt([]byte(in), tc.off, tc.i), "%+v", tc)
	}
	assert.Equal(t, -1, ElementAt([]byte(`[1, `), 0, 1), "cut short")
}

func TestDecodeSentinels(t *testing.T) {
	for _, tc := range []struct {
		in, field string
		want      error
	}{
		{`{"items": [{"nme": "b"}]}`, "items.0.nme", ErrUnknownField},
		{`{"Version": 1}`, "Version", ErrUnknownField},
		{`{"version": 1, "version": 2}`, "version", ErrDuplicateKey},
	} {
		var d doc
		_, err := Decode([]byte(tc.in), &d)
		require.ErrorIs(t, err, tc.want, tc.in)
		var e *Error
		require.True(t, errors.As(err, &e))
		assert.Equal(t, tc.field, e.Field)
	}
	var d doc
	_, err := Decode([]byte(`{"version": "one"}`), &d)
	assert.False(t, errors.Is(err, ErrUnknownField) || errors.Is(err, ErrDuplicateKey), "a type error is neither: %v", err)
}
