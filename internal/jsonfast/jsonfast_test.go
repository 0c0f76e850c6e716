package jsonfast

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "tab\tnew\nline\r", "\x00\x1f", "<b>&", "ünïcode", "\xff bad utf8", "\u2028"} {
		want, _ := json.Marshal(s)
		require.Equal(t, string(want), string(AppendString(nil, s)), "%q", s)
	}
	require.Equal(t, `x"a"`, string(AppendString([]byte("x"), "a")), "appends to dst")
}

func FuzzAppendString(f *testing.F) {
	f.Add("hello \"world\"\n")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendString(nil, s); string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	})
}

func TestCanonical(t *testing.T) {
	for _, raw := range []string{
		`"plain"`, `"esc \" \\ \/ \b \f \n \r \t \u00e9 \uABCD"`, `""`,
		// Left to encoding/json: each is changed by it, or refused.
		`"<b>"`, `"a & b"`, `"ünï"`, "\"\u2028\"", ` "padded"`, `{"a": 1}`, `[1, 2]`, `12`, `null`,
		`"bad \x escape"`, `"short \u12"`, `"\u12G4"`, `"unterminated`, `"escaped end\"`, `"`, "\"ctl \x01\"", `"a" "b"`,
		`"two" + "strings"`, `"in"side"`,
	} {
		want, wantErr := json.Marshal(json.RawMessage(raw))
		got, err := Canonical([]byte(raw))
		if wantErr != nil {
			require.Error(t, err, "%s", raw)
			continue
		}
		require.NoError(t, err, "%s", raw)
		require.Equal(t, string(want), string(got), "%s", raw)
	}
	require.True(t, canonicalString([]byte(`"plain \n text"`)), "the fast path is taken")
	require.False(t, canonicalString([]byte(`"<b>"`)))
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`"plain"`, `"a\u00e9\n"`, `"\`, `"\u"`, `{"a":"<"}`, `"x"y"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := json.Marshal(json.RawMessage(raw))
		got, err := Canonical(raw)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", raw, err, wantErr)
		}
		if err == nil && string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", raw, got, want)
		}
	})
}
