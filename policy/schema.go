package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Schema is a compiled JSON Schema for tool arguments. It implements the
// subset that tool definitions use in practice (type, properties, required,
// additionalProperties, items, enum, const, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, minLength, maxLength, pattern,
// minItems, maxItems) and refuses every other validation keyword at compile
// time: a schema whose "oneOf" or "$ref" was silently ignored would let
// arguments through that its author meant to refuse.
//
// Annotations (title, description, default, examples, format, $schema, $id,
// $comment, deprecated, readOnly, writeOnly) are accepted and ignored.
// Patterns use Go's RE2 syntax, which differs from ECMA 262 in a few corners
// (no lookaround, no backreferences); such a pattern fails to compile rather
// than matching differently.
type Schema struct {
	anything bool // the boolean schema true, or {}
	nothing  bool // the boolean schema false

	types      []string // nil: any type
	properties map[string]*Schema
	propNames  []string // sorted, for stable error order
	required   []string
	addlFalse  bool
	addl       *Schema
	items      *Schema
	enum       []any
	hasConst   bool
	constVal   any
	minimum    *float64
	maximum    *float64
	exclMin    *float64
	exclMax    *float64
	minLength  int
	maxLength  int // -1: none
	pattern    *regexp.Regexp
	minItems   int
	maxItems   int // -1: none
}

var schemaTypes = map[string]bool{
	"object": true, "array": true, "string": true, "number": true,
	"integer": true, "boolean": true, "null": true,
}

var schemaAnnotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"format": true, "$schema": true, "$id": true, "$comment": true,
	"deprecated": true, "readOnly": true, "writeOnly": true,
}

// CompileSchema compiles a JSON Schema document. Errors wrap ErrBadRule and
// name the schema path of the offending keyword.
func CompileSchema(raw json.RawMessage) (*Schema, error) {
	v, err := parseJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: schema: %v", ErrBadRule, err)
	}
	s, err := compileSchema(v, "#")
	if err != nil {
		return nil, fmt.Errorf("%w: schema: %v", ErrBadRule, err)
	}
	return s, nil
}

func compileSchema(v any, at string) (*Schema, error) {
	switch b := v.(type) {
	case bool:
		if b {
			return &Schema{anything: true, maxLength: -1, maxItems: -1}, nil
		}
		return &Schema{nothing: true}, nil
	case *object:
		// handled below
	default:
		return nil, fmt.Errorf("%s: a schema must be an object or a boolean", at)
	}
	obj := v.(*object)
	s := &Schema{maxLength: -1, maxItems: -1}
	if len(obj.keys) == 0 {
		s.anything = true
		return s, nil
	}
	for _, k := range obj.keys {
		val := obj.vals[k]
		kat := at + "/" + k
		var err error
		switch k {
		case "type":
			s.types, err = compileTypes(val, kat)
		case "properties":
			props, ok := val.(*object)
			if !ok {
				return nil, fmt.Errorf("%s: want an object", kat)
			}
			s.properties = map[string]*Schema{}
			for _, name := range props.keys {
				ps, err := compileSchema(props.vals[name], kat+"/"+name)
				if err != nil {
					return nil, err
				}
				s.properties[name] = ps
				s.propNames = append(s.propNames, name)
			}
			sort.Strings(s.propNames)
		case "required":
			arr, ok := val.([]any)
			if !ok {
				return nil, fmt.Errorf("%s: want an array of strings", kat)
			}
			seen := map[string]bool{}
			for _, e := range arr {
				name, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("%s: want an array of strings", kat)
				}
				if !seen[name] {
					seen[name] = true
					s.required = append(s.required, name)
				}
			}
			sort.Strings(s.required)
		case "additionalProperties":
			if b, ok := val.(bool); ok {
				s.addlFalse = !b
			} else {
				s.addl, err = compileSchema(val, kat)
			}
		case "items":
			if _, ok := val.([]any); ok {
				return nil, fmt.Errorf("%s: tuple items are not supported; use a single schema", kat)
			}
			s.items, err = compileSchema(val, kat)
		case "enum":
			arr, ok := val.([]any)
			if !ok || len(arr) == 0 {
				return nil, fmt.Errorf("%s: want a non-empty array", kat)
			}
			s.enum = arr
		case "const":
			s.hasConst, s.constVal = true, val
		case "minimum":
			s.minimum, err = compileNumber(val, kat)
		case "maximum":
			s.maximum, err = compileNumber(val, kat)
		case "exclusiveMinimum":
			s.exclMin, err = compileNumber(val, kat)
		case "exclusiveMaximum":
			s.exclMax, err = compileNumber(val, kat)
		case "minLength":
			s.minLength, err = compileCount(val, kat)
		case "maxLength":
			s.maxLength, err = compileCount(val, kat)
		case "minItems":
			s.minItems, err = compileCount(val, kat)
		case "maxItems":
			s.maxItems, err = compileCount(val, kat)
		case "pattern":
			p, ok := val.(string)
			if !ok {
				return nil, fmt.Errorf("%s: want a string", kat)
			}
			s.pattern, err = regexp.Compile(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", kat, err)
			}
		default:
			if !schemaAnnotations[k] {
				return nil, fmt.Errorf("%s: keyword %q is not supported", kat, k)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

func compileTypes(v any, at string) ([]string, error) {
	var names []string
	switch t := v.(type) {
	case string:
		names = []string{t}
	case []any:
		if len(t) == 0 {
			return nil, fmt.Errorf("%s: want at least one type", at)
		}
		for _, e := range t {
			name, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("%s: want a type name or an array of them", at)
			}
			names = append(names, name)
		}
	default:
		return nil, fmt.Errorf("%s: want a type name or an array of them", at)
	}
	for _, n := range names {
		if !schemaTypes[n] {
			return nil, fmt.Errorf("%s: unknown type %q", at, n)
		}
	}
	return names, nil
}

func compileNumber(v any, at string) (*float64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%s: want a number", at)
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%s: number %s is out of range", at, n)
	}
	return &f, nil
}

func compileCount(v any, at string) (int, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%s: want a non-negative integer", at)
	}
	i, err := strconv.ParseInt(string(n), 10, 32)
	if err != nil || i < 0 {
		return 0, fmt.Errorf("%s: want a non-negative integer, got %s", at, n)
	}
	return int(i), nil
}

// ArgProblem is one way arguments fail their schema, at a JSON path such as
// "$.items[2].name".
type ArgProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p ArgProblem) String() string { return p.Path + ": " + p.Message }

// ArgsError lists how arguments fail their schema. It wraps ErrArgsInvalid.
// Its message is meant to go back to the model, so that it can repair the
// call: it names paths and expectations, never internal details.
type ArgsError struct {
	Problems []ArgProblem
}

func (e *ArgsError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return strings.Join(parts, "; ")
}

func (e *ArgsError) Unwrap() error { return ErrArgsInvalid }

// maxProblems caps the report: a model needs the first few mistakes, and an
// attacker should not be able to make the error itself large.
const maxProblems = 10

// Validate checks a JSON document against the schema. It returns nil or an
// *ArgsError wrapping ErrArgsInvalid. Malformed JSON, duplicate keys and
// trailing data are reported at path "$".
func (s *Schema) Validate(doc json.RawMessage) error {
	v, err := parseJSON(doc)
	if err != nil {
		return &ArgsError{Problems: []ArgProblem{{Path: "$", Message: "invalid JSON: " + err.Error()}}}
	}
	var probs []ArgProblem
	s.validate(v, "$", &probs)
	if len(probs) == 0 {
		return nil
	}
	return &ArgsError{Problems: probs}
}

func (s *Schema) validate(v any, path string, probs *[]ArgProblem) {
	report := func(format string, args ...any) {
		if len(*probs) < maxProblems {
			*probs = append(*probs, ArgProblem{Path: path, Message: fmt.Sprintf(format, args...)})
		}
	}
	if s.nothing {
		report("no value is allowed here")
		return
	}
	if s.anything {
		return
	}
	if s.types != nil && !typeMatches(s.types, v) {
		report("want %s, got %s", strings.Join(s.types, " or "), jsonType(v))
		return // the other keywords would only repeat the mismatch
	}
	if s.hasConst && !jsonEqual(s.constVal, v) {
		report("want %s", compactJSON(s.constVal))
	}
	if s.enum != nil {
		found := false
		for _, e := range s.enum {
			if jsonEqual(e, v) {
				found = true
				break
			}
		}
		if !found {
			opts := make([]string, len(s.enum))
			for i, e := range s.enum {
				opts[i] = compactJSON(e)
			}
			report("want one of %s", strings.Join(opts, ", "))
		}
	}
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !math.IsInf(f, 0) {
			report("number %s is malformed", x)
			return
		}
		if s.minimum != nil && f < *s.minimum {
			report("want at least %v, got %s", *s.minimum, x)
		}
		if s.maximum != nil && f > *s.maximum {
			report("want at most %v, got %s", *s.maximum, x)
		}
		if s.exclMin != nil && f <= *s.exclMin {
			report("want more than %v, got %s", *s.exclMin, x)
		}
		if s.exclMax != nil && f >= *s.exclMax {
			report("want less than %v, got %s", *s.exclMax, x)
		}
	case string:
		n := utf8.RuneCountInString(x)
		if n < s.minLength {
			report("want at least %d characters, got %d", s.minLength, n)
		}
		if s.maxLength >= 0 && n > s.maxLength {
			report("want at most %d characters, got %d", s.maxLength, n)
		}
		if s.pattern != nil && !s.pattern.MatchString(x) {
			report("does not match pattern %q", s.pattern.String())
		}
	case []any:
		if len(x) < s.minItems {
			report("want at least %d items, got %d", s.minItems, len(x))
		}
		if s.maxItems >= 0 && len(x) > s.maxItems {
			report("want at most %d items, got %d", s.maxItems, len(x))
		}
		if s.items != nil {
			for i, e := range x {
				s.items.validate(e, fmt.Sprintf("%s[%d]", path, i), probs)
			}
		}
	case *object:
		for _, name := range s.required {
			if _, ok := x.vals[name]; !ok {
				if len(*probs) < maxProblems {
					*probs = append(*probs, ArgProblem{Path: childPath(path, name), Message: "required"})
				}
			}
		}
		for _, name := range s.propNames {
			if pv, ok := x.vals[name]; ok {
				s.properties[name].validate(pv, childPath(path, name), probs)
			}
		}
		extra := make([]string, 0, len(x.keys))
		for _, k := range x.keys {
			if _, declared := s.properties[k]; !declared {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		for _, k := range extra {
			switch {
			case s.addlFalse:
				if len(*probs) < maxProblems {
					*probs = append(*probs, ArgProblem{Path: childPath(path, k), Message: "unexpected property"})
				}
			case s.addl != nil:
				s.addl.validate(x.vals[k], childPath(path, k), probs)
			}
		}
	}
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// childPath writes $.name for plain names and $["odd name"] otherwise, so a
// path stays unambiguous whatever the key holds.
func childPath(parent, key string) string {
	if identRE.MatchString(key) {
		return parent + "." + key
	}
	q, _ := json.Marshal(key)
	return parent + "[" + string(q) + "]"
}

func typeMatches(types []string, v any) bool {
	for _, t := range types {
		switch t {
		case "integer":
			if n, ok := v.(json.Number); ok && isInteger(n) {
				return true
			}
		case "number":
			if _, ok := v.(json.Number); ok {
				return true
			}
		default:
			if jsonType(v) == t {
				return true
			}
		}
	}
	return false
}

// isInteger follows JSON Schema: 1.0 is an integer; the spelling does not
// matter, only the value.
func isInteger(n json.Number) bool {
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return false
	}
	return f == math.Trunc(f)
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case *object:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// jsonEqual compares decoded values by JSON meaning: numbers by value (1 and
// 1.0 are equal), objects regardless of key order.
func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		if x == y {
			return true
		}
		fx, err1 := strconv.ParseFloat(string(x), 64)
		fy, err2 := strconv.ParseFloat(string(y), 64)
		return err1 == nil && err2 == nil && fx == fy
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case *object:
		y, ok := b.(*object)
		if !ok || len(x.vals) != len(y.vals) {
			return false
		}
		for k, xv := range x.vals {
			yv, ok := y.vals[k]
			if !ok || !jsonEqual(xv, yv) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}

// compactJSON renders a decoded value for an error message.
func compactJSON(v any) string {
	var b strings.Builder
	writeJSON(&b, v)
	s := b.String()
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func writeJSON(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case json.Number:
		b.WriteString(string(x))
	case string:
		q, _ := json.Marshal(x)
		b.Write(q)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSON(b, e)
		}
		b.WriteByte(']')
	case *object:
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			q, _ := json.Marshal(k)
			b.Write(q)
			b.WriteByte(':')
			writeJSON(b, x.vals[k])
		}
		b.WriteByte('}')
	}
}
