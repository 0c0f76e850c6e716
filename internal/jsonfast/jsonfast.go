// Package jsonfast encodes the few JSON shapes on Outpost's hot paths
// without reflection, byte for byte as encoding/json does. Anything it
// cannot encode quickly and exactly it hands to encoding/json.
package jsonfast

import (
	"encoding/json"
	"unicode/utf8"
)

// AppendString appends s quoted as json.Marshal quotes it.
func AppendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf || s[i] == '<' || s[i] == '>' || s[i] == '&' {
			b, _ := json.Marshal(s) // non-ASCII and HTML escapes: let json decide
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// Canonical returns raw as json.Marshal(json.RawMessage(raw)) does:
// compacted, with <, >, &, U+2028 and U+2029 escaped, or an error when raw
// is not JSON. A string literal that is already in that form, the common
// case of a run's output, is returned as it is, after one pass over it.
func Canonical(raw []byte) ([]byte, error) {
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
