package store

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// canonicalJSON must give what json.Marshal(json.RawMessage(raw)) gives:
// an outcome's output is hashed in that form.
func TestCanonicalJSON(t *testing.T) {
	for _, raw := range []string{
		`"plain"`, `"esc \" \\ \/ \b \f \n \r \t \u00e9 \uABCD"`, `""`,
		// Left to encoding/json: each is changed by it, or refused.
		`"<b>"`, `"a & b"`, `"ünï"`, "\"\u2028\"", ` "padded"`, `{"a": 1}`, `[1, 2]`, `12`, `null`,
		`"bad \x escape"`, `"short \u12"`, `"\u12G4"`, `"unterminated`, `"escaped end\"`, `"`, "\"ctl \x01\"", `"a" "b"`,
		`"two" + "strings"`, `"in"side"`,
	} {
		want, wantErr := json.Marshal(json.RawMessage(raw))
		got, err := canonicalJSON([]byte(raw))
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

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`"plain"`, `"a\u00e9\n"`, `"\`, `"\u"`, `{"a":"<"}`, `"x"y"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := json.Marshal(json.RawMessage(raw))
		got, err := canonicalJSON(raw)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", raw, err, wantErr)
		}
		if err == nil && string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", raw, got, want)
		}
	})
}
