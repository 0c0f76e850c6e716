package firmware

import (
	"strings"
	"testing"
)

// TestYAMLSyntaxPosition checks the search for where a document stops
// being YAML, including on a file too long to search one prefix at a time.
func TestYAMLSyntaxPosition(t *testing.T) {
	long := "name: x\nchannels:\n" + strings.Repeat("  - {name: c, type: string, reducer: replace}\n", 2500)
	tests := []struct {
		name, text string
		line, col  int
	}{
		{"stray colon", "a: b: c\n", 1, 5},
		{"tab", "a:\n  b: 1\n\tc: 2\n", 3, 1},
		{"dedent", "a:\n  b: 1\n c: 2\n", 3, 2},
		{"unclosed quote", "a: 1\nb: 'x\nc: 2\n", 2, 4},
		{"unclosed bracket", "a: [1,\n  2\nb: 3\n", 1, 4},
		{"quote closed on the next line", "a: 'x\n  y'\nb: 1\nc: d: e\n", 4, 5},
		{"no newline at the end", "a: 1\nb: c: d", 2, 5},
		{"characters, not bytes", "é: 1\nü: ö: 2\n", 2, 5},
		{"long file, error near the top", "name: x\n\tbad: 1\n" + long[8:], 2, 1},
		{"long file, error near the end", long + "  - {name: d\n", 2503, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if yamlParses([]byte(tt.text)) {
				t.Fatal("parses")
			}
			line, col, ok := yamlSyntaxPosition([]byte(tt.text))
			if !ok || line != tt.line || col != tt.col {
				t.Errorf("at %d:%d (%v), want %d:%d", line, col, ok, tt.line, tt.col)
			}
		})
	}
}
