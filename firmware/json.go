package firmware

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

const maxJSONDepth = 64

// positions maps the JSON path of every object and array in a document
// ("nodes.2.config") to the byte offset where it starts, so that a problem
// found after decoding can still be reported at its line and column.
type positions map[string]int

// at returns the offset of path, or of its nearest recorded ancestor.
func (p positions) at(path string) int {
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

// decodeStrict decodes one JSON document into v the way every bundle file
// is read: unknown fields, duplicate keys, keys that differ from a field only
// in case, and trailing data are errors. Errors are *FileError values with
// the line and column.
func decodeStrict(file string, data []byte, v any) (positions, error) {
	return decodeStrictAt(file, data, 0, data, v)
}

// decodeStrictAt decodes sub, which sits at offset base of the file whole
// (a node's config inside a graph file), reporting positions in whole.
// Recorded positions are offsets in whole too.
func decodeStrictAt(file string, whole []byte, base int, sub []byte, v any) (positions, error) {
	pos := positions{}
	dec := json.NewDecoder(bytes.NewReader(sub))
	if err := walkStrict(dec, sub, reflect.TypeOf(v), "", 0, pos); err != nil {
		return nil, locate(file, whole, base, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed(file, whole, base+int(dec.InputOffset()), "", "unexpected data after the JSON value")
	}
	full := json.NewDecoder(bytes.NewReader(sub))
	full.DisallowUnknownFields()
	if err := full.Decode(v); err != nil {
		return nil, locate(file, whole, base, err)
	}
	for k, off := range pos {
		pos[k] = base + off
	}
	return pos, nil
}

// posError is an error found at a byte offset of the input.
type posError struct {
	off int
	msg string
}

func (e *posError) Error() string { return e.msg }

func locate(file string, data []byte, base int, err error) error {
	var pe *posError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &pe):
		return malformed(file, data, base+pe.off, "", "%s", pe.msg)
	case errors.As(err, &se):
		return malformed(file, data, base+int(se.Offset), "", "%s", se.Error())
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "value"
		}
		return malformed(file, data, base+int(te.Offset), "", "%s: want %s, got JSON %s", field, te.Type, te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return malformed(file, data, len(data), "", "unexpected end of input")
	}
	return malformed(file, data, -1, "", "%v", err)
}

// lineCol renders a byte offset as a 1-based line and column (in bytes).
func lineCol(data []byte, off int) (int, int) {
	off = max(0, min(off, len(data)))
	line := 1 + bytes.Count(data[:off], []byte{'\n'})
	col := off - bytes.LastIndexByte(data[:off], '\n')
	return line, col
}

var (
	rawMessageType  = reflect.TypeOf(json.RawMessage(nil))
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

func nextToken(dec *json.Decoder) (json.Token, error) {
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, io.ErrUnexpectedEOF
	}
	return tok, err
}

// walkStrict consumes one value from dec, checks its object keys against
// the struct fields of t, and records where each object and array starts.
// Values of types that decode themselves (raw messages, Unmarshalers) are
// not checked against fields, but are still checked for duplicate keys.
func walkStrict(dec *json.Decoder, data []byte, t reflect.Type, path string, depth int, pos positions) error {
	if depth > maxJSONDepth {
		return &posError{int(dec.InputOffset()), "nested too deeply"}
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
				return &posError{keyOff, fmt.Sprintf("duplicate key %q", prefix+k)}
			}
			seen[k] = true
			var next reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[k]
				if !ok {
					return &posError{keyOff, fmt.Sprintf("unknown field %q", prefix+k)}
				}
				next = ft
			case typed && t.Kind() == reflect.Map:
				next = t.Elem()
			}
			if err := walkStrict(dec, data, next, prefix+k, depth+1, pos); err != nil {
				return err
			}
		}
	case '[':
		var elem reflect.Type
		if typed && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walkStrict(dec, data, elem, prefix+strconv.Itoa(i), depth+1, pos); err != nil {
				return err
			}
		}
	default:
		return &posError{start, fmt.Sprintf("unexpected %q", d)}
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
// types.
func structFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if _, tagged := f.Tag.Lookup("json"); f.Anonymous && !tagged && f.Type.Kind() == reflect.Struct {
			// An embedded struct's fields are promoted, as encoding/json
			// does.
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
