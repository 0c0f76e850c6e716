package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"unicode/utf8"
)

// Reducer kinds.
const (
	KindReplace = "replace"
	KindAppend  = "append"
	KindMerge   = "merge"
	KindSum     = "sum"
)

// Chan is a typed handle on a declared channel. It is only a name with a type:
// the same handle can be used with every graph that declares the channel.
type Chan[T any] struct{ name string }

// Name returns the channel's name.
func (c Chan[T]) Name() string { return c.name }

// Get reads the channel's current value from s, or T's zero value when unset.
func (c Chan[T]) Get(s State) T {
	v, ok := s.Value(c.name)
	if !ok || v == nil {
		var zero T
		return zero
	}
	return v.(T)
}

// Set returns a write of v to the channel; the channel's reducer combines it
// with the current value (replace, append, merge or sum).
func (c Chan[T]) Set(v T) Write { return Write{Channel: c.name, Value: v} }

// Push returns a write that appends items to an append channel.
func Push[E any](c Chan[[]E], items ...E) Write {
	return Write{Channel: c.name, Value: items}
}

// Write is one update to one channel, as returned by a node.
type Write struct {
	Channel string
	Value   any
}

// Number is what a sum channel can hold.
type Number interface {
	~int | ~int32 | ~int64 | ~uint | ~uint32 | ~uint64 | ~float32 | ~float64
}

// channelSpec is the untyped form of a channel kept by a compiled graph.
type channelSpec struct {
	name   string
	kind   string
	reduce func(old, upd any) any
	// check reports whether a written value has the channel's type.
	check  func(v any) bool
	encode func(v any) ([]byte, error)
	decode func(b []byte) (any, error)
	// length and tail serve append channels: how many items a value holds,
	// and the items from index i on.
	length func(v any) int
	tail   func(v any, i int) any
	// extend serves append channels: reduce, appending in place when the
	// caller owns the array's spare capacity.
	extend func(old, upd any, owned bool) any
	// clip caps an append channel's slice at its length, so a node that
	// appends to what it read never writes into the shared array.
	clip func(v any) any
	// diff serves sum channels: what was added to in to reach final.
	diff func(final, in any) (any, bool)
}

func newSpec[T any](name, kind string, reduce func(old, upd T) T) *channelSpec {
	s := &channelSpec{
		name: name,
		kind: kind,
		check: func(v any) bool {
			_, ok := v.(T)
			return ok
		},
		encode: func(v any) ([]byte, error) {
			if str, ok := v.(string); ok {
				return AppendJSONString(nil, str), nil
			}
			return json.Marshal(v)
		},
		decode: func(b []byte) (any, error) {
			var t T
			if err := json.Unmarshal(b, &t); err != nil {
				return nil, err
			}
			return t, nil
		},
	}
	s.reduce = func(old, upd any) any {
		var o T
		if old != nil {
			o = old.(T)
		}
		return reduce(o, upd.(T))
	}
	return s
}

// declare registers a channel on the builder and returns its handle.
func declare[T any](b *Builder, s *channelSpec) Chan[T] {
	if _, dup := b.channels[s.name]; dup {
		b.problems = append(b.problems, fmt.Sprintf("channel %q declared twice", s.name))
	} else {
		b.channels[s.name] = s
		b.channelOrder = append(b.channelOrder, s.name)
	}
	return Chan[T]{name: s.name}
}

// Replace declares a channel whose writes replace its value. When several
// tasks of one superstep write it, the last in task order wins.
func Replace[T any](b *Builder, name string) Chan[T] {
	return declare[T](b, newSpec[T](name, KindReplace, func(_, upd T) T { return upd }))
}

// Append declares a list channel whose writes are appended. Checkpoints store
// only the items that each step added.
func Append[E any](b *Builder, name string) Chan[[]E] {
	s := newSpec[[]E](name, KindAppend, func(old, upd []E) []E {
		// Copy: earlier snapshots of the state share old's array.
		out := make([]E, 0, len(old)+len(upd))
		return append(append(out, old...), upd...)
	})
	s.extend = func(old, upd any, owned bool) any {
		o, u := old.([]E), upd.([]E)
		if owned {
			// Only the execution that allocated the array appends to it,
			// past every length that an earlier snapshot can see.
			return append(o, u...)
		}
		out := make([]E, 0, len(o)+len(u)+8)
		return append(append(out, o...), u...)
	}
	s.clip = func(v any) any {
		x := v.([]E)
		return x[:len(x):len(x)]
	}
	s.length = func(v any) int {
		if v == nil {
			return 0
		}
		return len(v.([]E))
	}
	s.tail = func(v any, i int) any {
		if v == nil {
			return []E(nil)
		}
		return v.([]E)[i:]
	}
	return declare[[]E](b, s)
}

// Merge declares a map channel whose writes are merged key by key.
func Merge[K comparable, V any](b *Builder, name string) Chan[map[K]V] {
	return declare[map[K]V](b, newSpec[map[K]V](name, KindMerge, func(old, upd map[K]V) map[K]V {
		out := make(map[K]V, len(old)+len(upd))
		maps.Copy(out, old)
		maps.Copy(out, upd)
		return out
	}))
}

// Sum declares a numeric channel whose writes are added.
func Sum[N Number](b *Builder, name string) Chan[N] {
	s := newSpec[N](name, KindSum, func(old, upd N) N { return old + upd })
	s.diff = func(final, in any) (any, bool) {
		var i N
		if in != nil {
			i = in.(N)
		}
		d := final.(N) - i
		return d, d != 0
	}
	return declare[N](b, s)
}

// Custom declares a channel with a reducer of the caller's own. reduce must
// be pure and must not modify old: earlier snapshots share it.
func Custom[T any](b *Builder, name, kind string, reduce func(old, upd T) T) Chan[T] {
	return declare[T](b, newSpec[T](name, "custom:"+kind, reduce))
}

// AppendJSONString appends s quoted as encoding/json quotes it, without
// reflection: string channels (drafts, answers) are the hot path of
// checkpoint encoding, and the store's outcome records use it too.
func AppendJSONString(dst []byte, s string) []byte {
	n := len(dst)
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if jsonPlain[c] {
			continue
		}
		if c >= utf8.RuneSelf || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // non-ASCII and HTML escapes: let json decide
			return append(dst[:n], b...)
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

// jsonPlain marks the bytes AppendJSONString copies as they are: printable
// ASCII but for the quote, the backslash and the three HTML characters
// encoding/json escapes. One table lookup a byte, in a single pass, takes
// 0.34 times as long as the two passes of comparisons it replaced
// (BenchmarkAppendJSONString, a 1,200-character draft: medians of 6 runs,
// 919 and 2,666 ns).
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

const hexDigits = "0123456789abcdef"
