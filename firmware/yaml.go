package firmware

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// YAML graph files.
//
// A graph file whose name ends in .yaml or .yml is parsed with yaml.v3 into
// a node tree, checked against a deliberately small subset of YAML (below),
// converted to JSON, and then decoded by the same strict decoder as a JSON
// graph file, so that both forms accept exactly the same graphs and refuse
// the same mistakes. The JSON is written on a single line, and every YAML
// node it came from is recorded with its span in the JSON; a position that
// the JSON decoder or the compiler reports (a byte offset, which on one line
// is the column) is mapped back to the innermost YAML node around it.
//
// The subset: one document; mapping keys are plain strings; no anchors,
// aliases or merge keys (<<), no explicit tags; numbers written as JSON
// writes them (no 0x1F, 0o17, 1_000, .5, +1, .inf or .nan); booleans are
// true or false (yaml.v3 already reads yes, no, on and off as strings).
// Everything YAML offers for text (plain, quoted, literal | and folded >
// scalars, comments, flow style) is allowed.

// isYAML reports whether a graph file is YAML, by its extension.
func isYAML(path string) bool {
	return strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")
}

// yamlSpan is where one YAML node (a key or a value) went in the JSON: the
// bytes [start, end) hold it, and it was written at line:col of the YAML.
type yamlSpan struct {
	start, end int
	line, col  int
}

// yamlMap maps offsets of the JSON converted from a YAML file back to the
// YAML's lines and columns.
type yamlMap struct {
	spans []yamlSpan
}

// position returns the YAML line and column of the innermost node whose
// span holds off. The end is inclusive: encoding/json reports a wrong
// scalar type just after the scalar.
func (m *yamlMap) position(off int) (line, col int) {
	best := -1
	for i, s := range m.spans {
		if s.start <= off && off <= s.end && (best < 0 || s.end-s.start < m.spans[best].end-m.spans[best].start) {
			best = i
		}
	}
	if best < 0 {
		return 0, 0
	}
	return m.spans[best].line, m.spans[best].col
}

// relocate moves a *FileError about file, located in the one-line JSON,
// to the YAML line and column it came from.
func (m *yamlMap) relocate(file string, err error) error {
	var fe *FileError
	if errors.As(err, &fe) && fe.File == file && fe.Line == 1 && fe.Column > 0 {
		fe.Line, fe.Column = m.position(fe.Column - 1)
	}
	return err
}

// Limits on the search for a syntax error's position (see
// yamlSyntaxPosition): the largest file searched (beyond it, yaml.v3's own
// line is reported), and the bytes parsed one prefix at a time before the
// search turns to bisection.
const (
	maxYAMLSearchBytes = 1 << 20
	maxYAMLSearchWork  = 1 << 20
)

// yamlToJSON converts a YAML graph file to one line of JSON, and returns the
// map from its offsets back to the YAML. Errors are *FileError values that
// wrap ErrMalformed, at the YAML line and column.
func yamlToJSON(file string, data []byte) ([]byte, *yamlMap, error) {
	// YAML also breaks lines at a lone \r, NEL, LS and PS; refusing them
	// keeps every position a count of \n (as in JSON files).
	for off := 0; off < len(data); {
		r, size := utf8.DecodeRune(data[off:])
		if r == '\r' && (off+1 == len(data) || data[off+1] != '\n') || r == '\u0085' || r == '\u2028' || r == '\u2029' {
			line, col := lineCol(data, off)
			col = utf8.RuneCount(data[off-col+1:off]) + 1
			return nil, nil, yamlError(file, line, col, "", "line break %q: end lines with \\n or \\r\\n", r)
		}
		off += size
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, nil, yamlError(file, 1, 1, "", "empty YAML document")
		}
		return nil, nil, yamlSyntaxError(file, data, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		line, col := next.Line, next.Column
		if len(next.Content) > 0 {
			line, col = next.Content[0].Line, next.Content[0].Column
		}
		if lines := 1 + bytes.Count(data, []byte{'\n'}); line > lines {
			// An empty document ("---" last) is placed after the end.
			last := data[bytes.LastIndexByte(data, '\n')+1:]
			line, col = lines, utf8.RuneCount(last)+1
		}
		return nil, nil, yamlError(file, line, col, "", "a second YAML document; a graph file holds one")
	case err != io.EOF:
		return nil, nil, yamlSyntaxError(file, data, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil, yamlError(file, 1, 1, "", "empty YAML document")
	}
	c := &yamlConverter{file: file, m: &yamlMap{}}
	if err := c.value(doc.Content[0], "", 0); err != nil {
		return nil, nil, err
	}
	return c.buf.Bytes(), c.m, nil
}

func yamlError(file string, line, col int, node, format string, args ...any) *FileError {
	return &FileError{File: file, Line: line, Column: col, Node: node,
		Err: fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))}
}

var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?(?:line (\d+): )?`)

// yamlSyntaxError reports a document yaml.v3 could not parse. yaml.v3 gives
// a line only, and often the line of the construct that was open rather
// than the line of the problem, so the position is found by
// yamlSyntaxPosition instead.
func yamlSyntaxError(file string, data []byte, err error) *FileError {
	msg := err.Error()
	var line int
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		fmt.Sscan(m[1], &line)
		msg = msg[len(m[0]):]
	}
	col := 0
	if l, c, ok := yamlSyntaxPosition(data); ok {
		line, col = l, c
	}
	return yamlError(file, line, col, "", "YAML syntax: %s", msg)
}

// yamlSyntaxPosition finds where a document that does not parse stops being
// YAML: the line after the longest prefix of whole lines that still parses,
// and in it, the first character after the longest prefix of the line that
// still parses. So an unclosed quote or bracket is reported where it opens,
// a bad indentation or a stray ':' where it is. Columns count characters, as
// yaml.v3's do.
func yamlSyntaxPosition(data []byte) (line, col int, ok bool) {
	if len(data) > maxYAMLSearchBytes {
		return 0, 0, false
	}
	budget := maxYAMLSearchWork
	// Line i (0-based) starts at starts[i]; the whole of data, which does
	// not parse, is "line" len(starts).
	starts := []int{0}
	for i, b := range data {
		if b == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	k := lastParsing(len(starts), &budget, func(i int) int {
		if i == len(starts) {
			return len(data)
		}
		return starts[i]
	}, data)
	// Line k+1 (1-based) is the one that breaks the document. Cut it only
	// between characters; cutting after its last character and newline
	// gives prefix k+1 (or the whole of data), which does not parse.
	text := data[starts[k]:]
	if i := bytes.IndexByte(text, '\n'); i >= 0 {
		text = text[:i]
	}
	var bounds []int
	for i := range len(text) + 1 {
		if i == len(text) || utf8.RuneStart(text[i]) {
			bounds = append(bounds, i)
		}
	}
	c := lastParsing(len(bounds), &budget, func(i int) int {
		if i == len(bounds) {
			return min(starts[k]+len(text)+1, len(data))
		}
		return starts[k] + bounds[i]
	}, data)
	return k + 1, utf8.RuneCount(text[:bounds[c]]) + 1, true
}

// lastParsing returns the largest i in [0, n) for which data[:cut(i)]
// parses, given that cut(0) parses and cut(n) does not. Prefixes are tried
// from the longest down while the budget (in bytes parsed) lasts, then by
// bisection, which finds the right answer unless an unclosed quote or
// bracket makes a shorter prefix fail that a longer one closes.
func lastParsing(n int, budget *int, cut func(int) int, data []byte) int {
	lo, hi := 0, n
	for hi-lo > 1 && *budget >= cut(hi-1) {
		*budget -= cut(hi - 1)
		if yamlParses(data[:cut(hi-1)]) {
			return hi - 1
		}
		hi--
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if yamlParses(data[:cut(mid)]) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// yamlParses reports whether every document of data parses.
func yamlParses(data []byte) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		switch err := dec.Decode(&n); err {
		case nil:
		case io.EOF:
			return true
		default:
			return false
		}
	}
}

var jsonNumberRE = regexp.MustCompile(`^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$`)

// yamlConverter writes a YAML node tree as JSON, recording the spans.
type yamlConverter struct {
	file string
	buf  bytes.Buffer
	m    *yamlMap
	node string // the name of the graph node being converted, for errors
}

func (c *yamlConverter) fail(n *yaml.Node, format string, args ...any) error {
	return yamlError(c.file, n.Line, n.Column, c.node, format, args...)
}

// check refuses what the subset leaves out, on any node.
func (c *yamlConverter) check(n *yaml.Node) error {
	switch {
	case n.Kind == yaml.AliasNode:
		return c.fail(n, "YAML aliases (*%s) are not allowed: write the value out", n.Value)
	case n.Anchor != "":
		return c.fail(n, "YAML anchors (&%s) are not allowed", n.Anchor)
	case n.Style&yaml.TaggedStyle != 0:
		return c.fail(n, "YAML tags (%s) are not allowed", n.Tag)
	}
	return nil
}

// value writes n. Objects and arrays open with a space after the bracket,
// so that the offset encoding/json reports for a wrong type of object or
// array (just after its bracket) is inside it and not inside its first
// element.
func (c *yamlConverter) value(n *yaml.Node, path string, depth int) error {
	if depth > maxJSONDepth {
		return c.fail(n, "nested too deeply")
	}
	if err := c.check(n); err != nil {
		return err
	}
	start := c.buf.Len()
	switch n.Kind {
	case yaml.MappingNode:
		c.buf.WriteString("{ ")
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if err := c.check(k); err != nil {
				return err
			}
			switch {
			case k.Kind != yaml.ScalarNode:
				return c.fail(k, "a mapping key must be a plain string")
			case k.ShortTag() == "!!merge":
				return c.fail(k, "YAML merge keys (<<) are not allowed")
			case k.ShortTag() != "!!str":
				return c.fail(k, "a mapping key must be a string, not %s %q (quote it)", strings.TrimPrefix(k.ShortTag(), "!!"), k.Value)
			}
			if i > 0 {
				c.buf.WriteByte(',')
			}
			ks := c.buf.Len()
			c.buf.Write(jsonString(k.Value))
			c.m.spans = append(c.m.spans, yamlSpan{ks, c.buf.Len(), k.Line, k.Column})
			c.buf.WriteByte(':')
			sub := k.Value
			if path != "" {
				sub = path + "." + k.Value
			}
			if err := c.value(v, sub, depth+1); err != nil {
				return err
			}
		}
		c.buf.WriteByte('}')
	case yaml.SequenceNode:
		c.buf.WriteString("[ ")
		outer := c.node
		for i, e := range n.Content {
			if i > 0 {
				c.buf.WriteByte(',')
			}
			if path == "nodes" && depth == 1 {
				c.node = yamlNodeName(e)
			}
			if err := c.value(e, fmt.Sprintf("%s.%d", path, i), depth+1); err != nil {
				return err
			}
		}
		c.node = outer
		c.buf.WriteByte(']')
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!str", "!!timestamp": // a date is text, as written
			c.buf.Write(jsonString(n.Value))
		case "!!int", "!!float":
			if !jsonNumberRE.MatchString(n.Value) {
				return c.fail(n, "number %q: write numbers as JSON does (decimal, no '+', '_', 0x, 0o, .inf or .nan), or quote it for text", n.Value)
			}
			c.buf.WriteString(n.Value)
		case "!!bool":
			if strings.EqualFold(n.Value, "true") {
				c.buf.WriteString("true")
			} else {
				c.buf.WriteString("false")
			}
		case "!!null":
			c.buf.WriteString("null")
		default:
			return c.fail(n, "unsupported YAML value of type %s", tag)
		}
	default:
		return c.fail(n, "unsupported YAML node")
	}
	c.m.spans = append(c.m.spans, yamlSpan{start, c.buf.Len(), n.Line, n.Column})
	return nil
}

// yamlNodeName returns the name of a graph node written as a YAML mapping,
// or "".
func yamlNodeName(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "name" && v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
			return v.Value
		}
	}
	return ""
}

// jsonString quotes s as a JSON string, leaving <, > and & as they are.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}
