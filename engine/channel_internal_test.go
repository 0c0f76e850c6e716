package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "tab\tnew\nline\r", "\x00\x1f", "<b>&", "ünïcode", "\xff bad utf8", "\u2028"} {
		want, _ := json.Marshal(s)
		if got := AppendJSONString(nil, s); string(got) != string(want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	f.Add("hello \"world\"\n")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	})
}

// A draft of the reference workload's size: ASCII, a few quotes and
// newlines.
func BenchmarkAppendJSONString(b *testing.B) {
	s := strings.Repeat("Take your dose with food; \"kb-03\" says so.\n", 30)[:1200]
	b.SetBytes(int64(len(s)))
	buf := make([]byte, 0, 2*len(s))
	for b.Loop() {
		buf = AppendJSONString(buf[:0], s)
	}
}
