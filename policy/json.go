package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/outpost-edge/outpost/internal/strictjson"
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
// be read (see strictjson.Decode): unknown fields, duplicate keys, keys
// that differ from a field only in case and trailing data are errors,
// which carry the line and column where the decoder can tell.
func decodeStrict(what string, data []byte, v any) error {
	_, err := strictjson.Decode(data, v)
	if err == nil {
		return nil
	}
	var e *strictjson.Error
	if errors.As(err, &e) && e.Offset >= 0 {
		line, col := strictjson.LineCol(data, e.Offset)
		return fmt.Errorf("%w: %s: line %d, column %d: %s", ErrBadRule, what, line, col, e.Msg)
	}
	return fmt.Errorf("%w: %s: %v", ErrBadRule, what, err)
}
