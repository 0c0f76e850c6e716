package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// maxJSONDepth bounds nesting in the values this package walks itself, so a
// hostile argument blob cannot exhaust the stack.
const maxJSONDepth = 256

// object is a decoded JSON object that keeps its key order, so redacted
// output reads like its input and validation errors come out in a stable
// order.
type object struct {
	keys []string
	vals map[string]any
}

// parseJSON decodes exactly one JSON value into nil, bool, json.Number,
// string, []any or *object. Unlike encoding/json it refuses duplicate keys:
// a validator that sees the last duplicate while a tool sees the first is a
// classic way to smuggle arguments past a schema.
func parseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the JSON value")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxJSONDepth)
	}
	tok, err := nextToken(dec)
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := &object{vals: map[string]any{}}
			for dec.More() {
				kt, err := nextToken(dec)
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("object key is not a string")
				}
				if _, dup := obj.vals[k]; dup {
					return nil, fmt.Errorf("duplicate key %q", k)
				}
				v, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				obj.keys = append(obj.keys, k)
				obj.vals[k] = v
			}
			if _, err := nextToken(dec); err != nil {
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := nextToken(dec); err != nil {
				return nil, err
			}
			return arr, nil
		}
		return nil, fmt.Errorf("unexpected %q", t)
	default:
		return t, nil
	}
}

// nextToken is dec.Token, where running out of input inside a value is
// unexpected rather than a clean end.
func nextToken(dec *json.Decoder) (json.Token, error) {
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, io.ErrUnexpectedEOF
	}
	return tok, err
}

// decodeStrict decodes one JSON document into v the way bundle files must
// be read: unknown fields, duplicate keys, keys that differ from a field
// only in case (encoding/json would accept them) and trailing data are
// errors. Errors carry the line and column where the decoder can tell.
func decodeStrict(what string, data []byte, v any) error {
	// The structural walk runs first: it sees keys where they are, so it can
	// say where an unknown field is, which encoding/json cannot.
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := walkStrict(dec, data, reflect.TypeOf(v), "", 0); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadRule, what, locate(data, err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: %s: %s: unexpected data after the JSON value", ErrBadRule, what, position(data, int(dec.InputOffset())))
	}
	full := json.NewDecoder(bytes.NewReader(data))
	full.DisallowUnknownFields()
	if err := full.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadRule, what, locate(data, err))
	}
	return nil
}

// posError is an error found at a byte offset of the input.
type posError struct {
	off int
	msg string
}

func (e *posError) Error() string { return e.msg }

// locate turns offsets known to the error into "line L, column C".
func locate(data []byte, err error) string {
	var pe *posError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &pe):
		return position(data, pe.off) + ": " + pe.msg
	case errors.As(err, &se):
		return position(data, int(se.Offset)) + ": " + se.Error()
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "value"
		}
		return fmt.Sprintf("%s: %s: want %s, got JSON %s", position(data, int(te.Offset)), field, te.Type, te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "unexpected end of input"
	}
	return err.Error()
}

// position renders a byte offset as a 1-based line and column (in bytes).
func position(data []byte, off int) string {
	if off > len(data) {
		off = len(data)
	}
	if off < 0 {
		off = 0
	}
	line := 1 + bytes.Count(data[:off], []byte{'\n'})
	col := off - bytes.LastIndexByte(data[:off], '\n')
	return fmt.Sprintf("line %d, column %d", line, col)
}

var (
	rawMessageType  = reflect.TypeOf(json.RawMessage(nil))
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

// walkStrict consumes one value from dec and checks its object keys against
// the struct fields of t. Values of types that decode themselves (raw
// messages, interfaces, Unmarshalers) are skipped, but still checked for
// duplicate keys.
func walkStrict(dec *json.Decoder, data []byte, t reflect.Type, path string, depth int) error {
	if depth > maxJSONDepth {
		return &posError{int(dec.InputOffset()), "nested too deeply"}
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	typed := t != nil && t != rawMessageType && !reflect.PointerTo(t).Implements(unmarshalerType) &&
		(t.Kind() == reflect.Struct || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map)
	before := int(dec.InputOffset())
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		return nil // scalars are type-checked by encoding/json later
	}
	switch d {
	case '{':
		var fields map[string]reflect.Type
		if typed && t.Kind() == reflect.Struct {
			fields = structFields(t)
		}
		seen := map[string]bool{}
		for dec.More() {
			keyOff := keyStart(data, int(dec.InputOffset()))
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := kt.(string)
			if seen[k] {
				return &posError{keyOff, fmt.Sprintf("duplicate key %q", path+k)}
			}
			seen[k] = true
			var next reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[k]
				if !ok {
					return &posError{keyOff, fmt.Sprintf("unknown field %q", path+k)}
				}
				next = ft
			case typed && t.Kind() == reflect.Map:
				next = t.Elem()
			}
			if err := walkStrict(dec, data, next, path+k+".", depth+1); err != nil {
				return err
			}
		}
	case '[':
		var elem reflect.Type
		if typed && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for dec.More() {
			if err := walkStrict(dec, data, elem, path, depth+1); err != nil {
				return err
			}
		}
	default:
		return &posError{before, fmt.Sprintf("unexpected %q", d)}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// keyStart finds where the next key begins: InputOffset stops before the
// separator, and a position pointing at a comma would confuse a reader.
func keyStart(data []byte, off int) int {
	for off < len(data) && strings.IndexByte(" \t\r\n,", data[off]) >= 0 {
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
