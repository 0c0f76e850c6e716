package policy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Detector names, as used in RedactionPolicy.Detectors and in the
// "[REDACTED:<name>]" placeholders.
const (
	DetectPhone   = "phone"
	DetectEmail   = "email"
	DetectSSN     = "ssn"
	DetectMRN     = "mrn"
	DetectDOB     = "dob"
	DetectAddress = "address"
)

// RedactionPolicy says what of a record may go upstream and what must be
// masked on the way.
type RedactionPolicy struct {
	// Fields are the dotted paths of the JSON fields that RedactJSON keeps
	// ("status", "output.final", "tools.name": an array's elements share
	// its path; "*" matches any one key). A listed path keeps its whole
	// subtree. Everything else is dropped, and no fields at all means
	// nothing is kept: what leaves the appliance is listed, never assumed.
	// CheckFields refuses a path that no record's field can match.
	Fields []string `json:"fields"`
	// Detectors are the detectors to run; none means all of them, so that
	// forgetting the list masks more, not less.
	Detectors []string `json:"detectors"`
}

// Redactor masks personal data in text and JSON. It is safe for concurrent
// use.
type Redactor struct {
	detectors []piiDetector
	fields    [][]string // split paths
}

type piiDetector struct {
	name string
	re   *regexp.Regexp
	// group is the capture group holding the sensitive part (0: the whole
	// match), so labels such as "MRN:" survive and the record stays readable.
	group int
	// accept rejects matches the pattern cannot (RE2 has no lookaround),
	// such as a digit run that continues past the match.
	accept func(s string, start, end int) bool
}

const monthNames = `(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)`

// builtinDetectors are tuned to miss medication doses ("500 mg"), times
// ("08:30"), knowledge-base ids ("kb-03"), years, versions and amounts,
// which fill this appliance's records and must stay readable.
var builtinDetectors = []piiDetector{
	{name: DetectEmail, re: regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}`)},
	{name: DetectSSN, re: regexp.MustCompile(`\b\d{3}-\d{2}-\d{4}\b|\b\d{3} \d{2} \d{4}\b`), accept: notInNumber},
	{name: DetectSSN, re: regexp.MustCompile(`(?i)\b(?:SSN|social security(?: number| no\.?)?)\s*[:#]?\s*(\d{9}|\d{3}[- ]\d{2}[- ]\d{4})\b`), group: 1},
	{name: DetectMRN, re: regexp.MustCompile(`(?i)\b(?:MRN|medical record(?: number| no\.?| #)?)\s*(?:[:#]|no\.?)?\s*#?\s*([A-Z]{0,3}-?\d{5,12})\b`), group: 1},
	{name: DetectDOB, re: regexp.MustCompile(`(?i)\b(?:DOB|D\.O\.B\.?|date of birth|birth ?date|born(?: on)?)\s*[:\-]?\s*(\d{1,2}[/.-]\d{1,2}[/.-](?:\d{4}|\d{2})|\d{4}[/.-]\d{1,2}[/.-]\d{1,2}|` + monthNames + `\.? \d{1,2}(?:st|nd|rd|th)?,? \d{4}|\d{1,2}(?:st|nd|rd|th)? (?:of )?` + monthNames + `\.?,? \d{4})`), group: 1},
	{name: DetectPhone, re: regexp.MustCompile(`(?:\+1[\s.-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.-])\d{3}[\s.-]\d{4}\b`), accept: notInNumber},
	{name: DetectPhone, re: regexp.MustCompile(`\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){2,5}\b`), accept: intlPhone},
	{name: DetectAddress, re: regexp.MustCompile(`\b\d{1,6}\s+(?:(?:[A-Z][A-Za-z'.-]*|\d+(?:st|nd|rd|th))\s+){1,4}(?i:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|way|place|pl|terrace|circle|cir|parkway|pkwy|highway|hwy|square|sq)\b\.?(?:,?\s+(?i:apt|apartment|suite|ste|unit|#)\.?\s*#?\s*[A-Za-z0-9-]+)?`)},
}

// notInNumber refuses matches glued to more digits, such as part of a long
// account number or a timestamp.
func notInNumber(s string, start, end int) bool {
	before := start > 0 && (isDigit(s[start-1]) || s[start-1] == '-' && start > 1 && isDigit(s[start-2]))
	after := end < len(s) && (isDigit(s[end]) || s[end] == '-' && end+1 < len(s) && isDigit(s[end+1]))
	return !before && !after
}

// intlPhone wants a plausible international number: 8 to 15 digits (E.164),
// not glued to other digits.
func intlPhone(s string, start, end int) bool {
	digits := 0
	for i := start; i < end; i++ {
		if isDigit(s[i]) {
			digits++
		}
	}
	return digits >= 8 && digits <= 15 && notInNumber(s, start, end)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// NewRedactor builds a redactor for a policy. Unknown detector names and
// empty field paths are errors wrapping ErrBadRule.
func NewRedactor(p RedactionPolicy) (*Redactor, error) {
	r := &Redactor{}
	want := map[string]bool{}
	for _, d := range p.Detectors {
		known := false
		for _, b := range builtinDetectors {
			if b.name == d {
				known = true
			}
		}
		if !known {
			return nil, itemError("detectors", fmt.Errorf("%w: redaction: unknown detector %q", ErrBadRule, d))
		}
		want[d] = true
	}
	for _, b := range builtinDetectors {
		if len(want) == 0 || want[b.name] {
			r.detectors = append(r.detectors, b)
		}
	}
	for i, f := range p.Fields {
		parts, err := splitFieldPath(i, f)
		if err != nil {
			return nil, err
		}
		r.fields = append(r.fields, parts)
	}
	return r, nil
}

// splitFieldPath splits the i-th of a policy's field paths into its
// segments, none of which may be empty.
func splitFieldPath(i int, f string) ([]string, error) {
	parts := strings.Split(f, ".")
	for _, part := range parts {
		if part == "" {
			return nil, itemError(fmt.Sprintf("fields.%d", i), fmt.Errorf("%w: redaction: bad field path %q", ErrBadRule, f))
		}
	}
	return parts, nil
}

// CheckFields refuses a field path whose first segment is neither "*" nor
// one of names, the fields of the records the policy is for (record says
// what they are called: "an outcome record"). Such a path keeps nothing,
// so a misspelt field would leave what it meant to send home without a
// word. Members below the first segment are not checked: records differ
// in them. The error is an *ItemError at "fields.N" wrapping ErrBadRule,
// as is that of an empty path or segment.
func (p RedactionPolicy) CheckFields(record string, names []string) error {
	for i, f := range p.Fields {
		parts, err := splitFieldPath(i, f)
		if err != nil {
			return err
		}
		if parts[0] == "*" || slices.Contains(names, parts[0]) {
			continue
		}
		return itemError(fmt.Sprintf("fields.%d", i), fmt.Errorf("%w: redaction: field %q keeps nothing: %s has no field %q (its fields: %s)",
			ErrBadRule, f, record, parts[0], strings.Join(names, ", ")))
	}
	return nil
}

// DecodeRedactionPolicy reads a redaction policy strictly and builds its
// redactor.
func DecodeRedactionPolicy(data []byte) (*Redactor, error) {
	var p RedactionPolicy
	if err := decodeStrict("redaction policy", data, &p); err != nil {
		return nil, err
	}
	return NewRedactor(p)
}

type span struct {
	start, end int
	name       string
}

// Redact replaces personal data in text with "[REDACTED:<detector>]".
func (r *Redactor) Redact(text string) string {
	var spans []span
	for _, d := range r.detectors {
		for _, m := range d.re.FindAllStringSubmatchIndex(text, -1) {
			start, end := m[2*d.group], m[2*d.group+1]
			if start < 0 {
				continue
			}
			if d.accept != nil && !d.accept(text, start, end) {
				continue
			}
			spans = append(spans, span{start, end, d.name})
		}
	}
	if len(spans) == 0 {
		return text
	}
	// Overlaps (an SSN inside a labelled SSN, a phone inside an address)
	// resolve to the earliest, then longest, span: one placeholder per
	// secret.
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].start != spans[j].start {
			return spans[i].start < spans[j].start
		}
		return spans[i].end > spans[j].end
	})
	var b strings.Builder
	pos := 0
	for _, s := range spans {
		if s.start < pos {
			if s.end > pos {
				pos = s.end // extend the masked region rather than leak a tail
			}
			continue
		}
		b.WriteString(text[pos:s.start])
		b.WriteString("[REDACTED:" + s.name + "]")
		pos = s.end
	}
	b.WriteString(text[pos:])
	return b.String()
}

// RedactJSON keeps only the policy's fields of a JSON document and redacts
// every string in them (object keys included, since a map keyed by e-mail
// address leaks as much as a value). Numbers are kept as they are. Input
// that is not valid JSON (or has duplicate keys) yields "null": it cannot be
// filtered, so none of it leaves.
func (r *Redactor) RedactJSON(raw json.RawMessage) json.RawMessage {
	v, err := parseJSON(raw)
	if err != nil {
		return json.RawMessage("null")
	}
	var b strings.Builder
	if !r.writeRedacted(&b, v, fieldSel{paths: r.fields}) {
		return json.RawMessage("null")
	}
	return json.RawMessage(b.String())
}

// fieldSel is what the policy keeps of a value: all of it, or the members
// named by the remaining segments of some field paths.
type fieldSel struct {
	all   bool
	paths [][]string
}

// writeRedacted writes what sel keeps of v and reports whether it wrote
// anything. Under a partial selection only objects and arrays can hold
// what the policy names; a scalar found where the policy expected an object
// is dropped, not guessed at.
func (r *Redactor) writeRedacted(b *strings.Builder, v any, sel fieldSel) bool {
	switch x := v.(type) {
	case []any:
		b.WriteByte('[')
		n := 0
		for _, e := range x {
			var eb strings.Builder
			// Array elements share their array's path.
			if r.writeRedacted(&eb, e, sel) {
				if n > 0 {
					b.WriteByte(',')
				}
				n++
				b.WriteString(eb.String())
			}
		}
		b.WriteByte(']')
		return true
	case *object:
		b.WriteByte('{')
		n := 0
		used := map[string]bool{}
		for _, k := range x.keys {
			child := fieldSel{all: sel.all}
			if !sel.all {
				for _, p := range sel.paths {
					if p[0] != "*" && p[0] != k {
						continue
					}
					if len(p) == 1 {
						child = fieldSel{all: true}
						break
					}
					child.paths = append(child.paths, p[1:])
				}
				if !child.all && child.paths == nil {
					continue
				}
			}
			var vb strings.Builder
			if !r.writeRedacted(&vb, x.vals[k], child) {
				continue
			}
			key := r.Redact(k)
			for i := 2; used[key]; i++ {
				key = fmt.Sprintf("%s#%d", r.Redact(k), i)
			}
			used[key] = true
			if n > 0 {
				b.WriteByte(',')
			}
			n++
			q, _ := json.Marshal(key)
			b.Write(q)
			b.WriteByte(':')
			b.WriteString(vb.String())
		}
		b.WriteByte('}')
		return true
	}
	if !sel.all {
		return false
	}
	if str, ok := v.(string); ok {
		q, _ := json.Marshal(r.Redact(str))
		b.Write(q)
		return true
	}
	writeJSON(b, v)
	return true
}
