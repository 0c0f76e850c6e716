package store

import (
	"encoding/json"
	"unicode/utf8"
)

// canonicalJSON returns raw as json.Marshal(json.RawMessage(raw)) does:
// compacted, with <, >, &, U+2028 and U+2029 escaped, or an error when raw
// is not JSON. A string literal that is already in that form, the common
// case of a run's output, is returned as it is, after one pass over it.
func canonicalJSON(raw []byte) ([]byte, error) {
	if canonicalString(raw) {
		return raw, nil
	}
	return json.Marshal(json.RawMessage(raw))
}

// canonicalString reports whether b is a JSON string literal of printable
// ASCII that needs no HTML escape: valid, and left as it is by compaction.
func canonicalString(b []byte) bool {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return false
	}
	for i := 1; i < len(b)-1; i++ {
		switch c := b[i]; {
		case c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '<' || c == '>' || c == '&':
			return false
		case c == '\\':
			i++
			if i >= len(b)-1 {
				return false // the closing quote is escaped
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b)-1 {
					return false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return false
					}
				}
				i += 4
			default:
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
