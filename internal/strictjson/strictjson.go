// Package strictjson decodes the JSON files an appliance is configured
// with (bundle manifests and graphs, tool registries, rules, redaction
// policies) strictly, and says where a problem is.
//
// encoding/json accepts unknown fields, duplicate keys (keeping the last)
// and keys that differ from a field only in case; a validator that sees one
// value while a tool sees another is a classic way to smuggle settings past
// a check. Decode refuses all of them, and trailing data, and reports each
// problem at its byte offset.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// MaxDepth bounds nesting, so a hostile file cannot exhaust the stack.
const MaxDepth = 64

// Sentinel errors, wrapped by an *Error: test for them with errors.Is.
var (
	// ErrUnknownField: an object key that names no field of the struct
	// it decodes into (a key that differs from a field only in case
	// included).
	ErrUnknownField = errors.New("unknown field")
	// ErrDuplicateKey: an object holds the same key twice.
	ErrDuplicateKey = errors.New("duplicate key")
)

// Error is a problem found at a byte offset of the input (-1: not known).
type Error struct {
	Offset int
	Msg    string
	// Field is the JSON path of the key an ErrUnknownField or
	// ErrDuplicateKey names ("nodes.2.kind"); empty for other problems.
	Field string
	// Err is ErrUnknownField or ErrDuplicateKey, or nil.
	Err error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinel the problem is, if any.
func (e *Error) Unwrap() error { return e.Err }

// Positions maps the JSON path of every object and array in a document
// ("nodes.2.config") to the byte offset where it starts, so that a problem
// found after decoding can still be reported at its line and column.
type Positions map[string]int

// At returns the offset of path, or of its nearest recorded ancestor (-1:
// none).
func (p Positions) At(path string) int {
	for {
		if off, ok := p[path]; ok {
			return off
		}
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			if off, ok := p[""]; ok {
				return off
			}
			return -1
		}
		path = path[:i]
	}
}

// ElementAt returns the offset of the i-th element of the array that
// starts at offset off of data (as Positions records it), or -1 when there
// is no such element. Positions records where arrays begin, not where each
// of their scalars stands: a problem with one string of a list is found
// here.
func ElementAt(data []byte, off, i int) int {
	if off < 0 || off >= len(data) || i < 0 {
		return -1
	}
	dec := json.NewDecoder(bytes.NewReader(data[off:]))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return -1
	}
	for n := 0; dec.More(); n++ {
		at := skipSpace(data, off+int(dec.InputOffset()))
		var elem json.RawMessage
		if err := dec.Decode(&elem); err != nil {
			return -1
		}
		if n == i {
			return at
		}
	}
	return -1
}

// Decode decodes one JSON document into v strictly: unknown fields,
// duplicate keys, keys that differ from a field only in case, nesting
// deeper than MaxDepth and trailing data are errors. Every error is an
// *Error. Values of types that decode themselves (raw messages,
// Unmarshalers) are not checked against fields, but are still checked for
// duplicate keys.
func Decode(data []byte, v any) (Positions, error) {
	pos := Positions{}
	// The structural walk runs first: it sees keys where they are, so it
	// can say where an unknown field is, which encoding/json cannot.
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := walk(dec, data, reflect.TypeOf(v), "", 0, pos); err != nil {
		return nil, located(data, err)
	}
	rest := skipSpace(data, int(dec.InputOffset()))
	if _, err := dec.Token(); err != io.EOF {
		return nil, &Error{Offset: rest, Msg: "unexpected data after the JSON value"}
	}
	full := json.NewDecoder(bytes.NewReader(data))
	full.DisallowUnknownFields()
	if err := full.Decode(v); err != nil {
		return nil, located(data, err)
	}
	return pos, nil
}

// LineCol renders a byte offset as a 1-based line and column (in bytes).
func LineCol(data []byte, off int) (line, col int) {
	off = max(0, min(off, len(data)))
	line = 1 + bytes.Count(data[:off], []byte{'\n'})
	col = off - bytes.LastIndexByte(data[:off], '\n')
	return line, col
}

func located(data []byte, err error) *Error {
	var e *Error
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &se):
		return &Error{Offset: int(se.Offset), Msg: se.Error()}
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "value"
		}
		return &Error{Offset: int(te.Offset), Msg: fmt.Sprintf("%s: want %s, got JSON %s", field, te.Type, te.Value)}
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return &Error{Offset: len(data), Msg: "unexpected end of input"}
	}
	return &Error{Offset: -1, Msg: err.Error()}
}

var (
	rawMessageType  = reflect.TypeOf(json.RawMessage(nil))
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

// nextToken is dec.Token, where running out of input inside a value is
// unexpected rather than a clean end.
func nextToken(dec *json.Decoder) (json.Token, error) {
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, io.ErrUnexpectedEOF
	}
	return tok, err
}

// walk consumes one value from dec, checks its object keys against the
// struct fields of t, and records where each object and array starts.
func walk(dec *json.Decoder, data []byte, t reflect.Type, path string, depth int, pos Positions) error {
	if depth > MaxDepth {
		return &Error{Offset: int(dec.InputOffset()), Msg: "nested too deeply"}
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	typed := t != nil && t != rawMessageType && !reflect.PointerTo(t).Implements(unmarshalerType) &&
		(t.Kind() == reflect.Struct || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map)
	start := skipSpace(data, int(dec.InputOffset()))
	tok, err := nextToken(dec)
	if err != nil {
		return err
	}
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		return nil // scalars are type-checked by encoding/json afterwards
	}
	pos[path] = start
	prefix := path
	if prefix != "" {
		prefix += "."
	}
	switch d {
	case '{':
		var fields map[string]reflect.Type
		if typed && t.Kind() == reflect.Struct {
			fields = structFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			keyOff := skipSpace(data, int(dec.InputOffset()))
			kt, err := nextToken(dec)
			if err != nil {
				return err
			}
			k, _ := kt.(string)
			if seen[k] {
				return &Error{Offset: keyOff, Msg: fmt.Sprintf("duplicate key %q", prefix+k), Field: prefix + k, Err: ErrDuplicateKey}
			}
			seen[k] = true
			var next reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[k]
				if !ok {
					return &Error{Offset: keyOff, Msg: fmt.Sprintf("unknown field %q", prefix+k), Field: prefix + k, Err: ErrUnknownField}
				}
				next = ft
			case typed && t.Kind() == reflect.Map:
				next = t.Elem()
			}
			if err := walk(dec, data, next, prefix+k, depth+1, pos); err != nil {
				return err
			}
		}
	case '[':
		var elem reflect.Type
		if typed && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, data, elem, prefix+strconv.Itoa(i), depth+1, pos); err != nil {
				return err
			}
		}
	default:
		return &Error{Offset: start, Msg: fmt.Sprintf("unexpected %q", d)}
	}
	_, err = nextToken(dec) // the closing delimiter
	return err
}

// skipSpace moves past whitespace and separators: InputOffset stops before
// them, and a position pointing at a comma would confuse a reader.
func skipSpace(data []byte, off int) int {
	for off < len(data) && strings.IndexByte(" \t\r\n,:", data[off]) >= 0 {
		off++
	}
	return off
}

// structFields maps the exact JSON names of t's exported fields to their
// types. An embedded struct's fields are promoted, as encoding/json does.
func structFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if _, tagged := f.Tag.Lookup("json"); f.Anonymous && !tagged && f.Type.Kind() == reflect.Struct {
			for k, v := range structFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("json"); ok {
			tagName, _, _ := strings.Cut(tag, ",")
			if tagName == "-" {
				continue
			}
			if tagName != "" {
				name = tagName
			}
		}
		fields[name] = f.Type
	}
	return fields
}
