package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustRedactor(t testing.TB, p RedactionPolicy) *Redactor {
	t.Helper()
	r, err := NewRedactor(p)
	require.NoError(t, err)
	return r
}

func TestRedactPositive(t *testing.T) {
	r := mustRedactor(t, RedactionPolicy{})
	tests := []struct{ name, in, want string }{
		{"us phone dashes", "call 555-123-4567 today", "call [REDACTED:phone] today"},
		{"us phone parens", "cell (555) 123-4567.", "cell [REDACTED:phone]."},
		{"us phone dots", "555.123.4567", "[REDACTED:phone]"},
		{"us phone +1", "+1 555 123 4567", "[REDACTED:phone]"},
		{"uk phone", "ring +44 20 7946 0958 please", "ring [REDACTED:phone] please"},
		{"french phone", "+33 1 23 45 67 89", "[REDACTED:phone]"},
		{"german phone", "Tel: +49 30 1234567", "Tel: [REDACTED:phone]"},
		{"email", "write to jane.doe+meds@clinic.example.org now", "write to [REDACTED:email] now"},
		{"ssn", "SSN 123-45-6789 on file", "SSN [REDACTED:ssn] on file"},
		{"ssn labelled, no dashes", "ssn: 123456789", "ssn: [REDACTED:ssn]"},
		{"mrn colon", "MRN: 12345678", "MRN: [REDACTED:mrn]"},
		{"mrn hash with letter", "MRN#A1234567", "MRN#[REDACTED:mrn]"},
		{"medical record number", "medical record number 00456789", "medical record number [REDACTED:mrn]"},
		{"dob slashes", "DOB: 03/14/1962", "DOB: [REDACTED:dob]"},
		{"dob iso", "date of birth 1962-03-14", "date of birth [REDACTED:dob]"},
		{"born month name", "born March 14, 1962 in Porto", "born [REDACTED:dob] in Porto"},
		{"born day month", "Born on 14 Mar 1962.", "Born on [REDACTED:dob]."},
		{"street address", "lives at 123 Main St in town", "lives at [REDACTED:address] in town"},
		{"address with apartment", "45 Oak Avenue Apt 5, Springfield", "[REDACTED:address], Springfield"},
		{"address ordinal street", "1600 5th Ave.", "[REDACTED:address]"},
		{"address two-word name", "at 9 Old Mill Road", "at [REDACTED:address]"},
		{"several in one text", "Jane (DOB 1/2/1990, MRN 7654321) at 555-987-6543, jane@x.io", "Jane (DOB [REDACTED:dob], MRN [REDACTED:mrn]) at [REDACTED:phone], [REDACTED:email]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, r.Redact(tt.in))
		})
	}
}

func TestRedactNegative(t *testing.T) {
	r := mustRedactor(t, RedactionPolicy{})
	tests := []struct{ name, in string }{
		{"dose", "Metformin 500 mg twice daily"},
		{"dose range", "take 1-2 tablets, 250 mg each, up to 3000 mg/day"},
		{"times", "at 08:30 and 20:30, or 8:30 am"},
		{"kb ids", "see [kb-03] and [kb-12]"},
		{"years", "since 2019, reviewed in 2024 and 2025"},
		{"dates without a birth label", "refilled on 03/14/2024, next visit 2026-05-01"},
		{"versions", "bundle v1.2.3, firmware 2.10.0, schema 1.0"},
		{"amounts", "copay $1,234.56 or €12.50, 1,000,000 units"},
		{"percentages and ratios", "HbA1c 7.2%, BP 130/85, ratio 1:3"},
		{"long id not a phone", "order 123456789012345"},
		{"timestamps", "2026-03-01T08:30:00Z and 1700000000"},
		{"counts with street-ish words", "walk 30 minutes along the road, 2 pills at the way"},
		{"at sign without domain", "meet @ 5, user@localhost"},
		{"numbers in a list", "1. take 2 tablets\n2. drink 250 ml water"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.in, r.Redact(tt.in))
		})
	}
}

func TestRedactorDetectorsAndErrors(t *testing.T) {
	r := mustRedactor(t, RedactionPolicy{Detectors: []string{DetectEmail}})
	assert.Equal(t, "[REDACTED:email] 555-123-4567", r.Redact("a@b.co 555-123-4567"))

	_, err := NewRedactor(RedactionPolicy{Detectors: []string{"iban"}})
	assert.ErrorIs(t, err, ErrBadRule)
	_, err = NewRedactor(RedactionPolicy{Fields: []string{"a..b"}})
	assert.ErrorIs(t, err, ErrBadRule)
	_, err = DecodeRedactionPolicy([]byte(`{"fields":[],"detector":[]}`))
	assert.ErrorIs(t, err, ErrBadRule)
	_, err = DecodeRedactionPolicy([]byte(`{"fields":["status"],"detectors":["phone"]}`))
	assert.NoError(t, err)
}

// CheckFields takes a path by its first segment, which must be a field of
// the records or the wildcard "*"; what lies below it is the record's
// business. An empty path or segment is refused as NewRedactor refuses it.
// Each refusal names the item, so that a bundle's file can say where.
func TestRedactionCheckFields(t *testing.T) {
	names := []string{"status", "output", "flags"}
	for _, tt := range []struct {
		name, field string
		path, says  string // the refusal's item and words; empty: accepted
	}{
		{name: "plain", field: "flags"},
		{name: "dotted", field: "output.final"},
		{name: "dotted, deep", field: "output.final.text"},
		{name: "a member no record may have", field: "output.nope"},
		{name: "wildcard", field: "*"},
		{name: "wildcard, dotted", field: "*.name"},
		{name: "plain, unknown", field: "flgas", path: "fields.1",
			says: `redaction: field "flgas" keeps nothing: an outcome record has no field "flgas" (its fields: status, output, flags)`},
		{name: "dotted, unknown root", field: "outptu.final", path: "fields.1",
			says: `field "outptu.final" keeps nothing: an outcome record has no field "outptu"`},
		{name: "a wildcard inside a word", field: "out*", path: "fields.1", says: `has no field "out*"`},
		{name: "empty", field: "", path: "fields.1", says: `bad field path ""`},
		{name: "empty segment", field: "output..final", path: "fields.1", says: `bad field path "output..final"`},
		{name: "trailing dot", field: "flags.", path: "fields.1", says: `bad field path "flags."`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := RedactionPolicy{Fields: []string{"status", tt.field}}.CheckFields("an outcome record", names)
			if tt.says == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrBadRule)
			var ie *ItemError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, tt.path, ie.Path)
			assert.Contains(t, err.Error(), tt.says)
		})
	}
}

func TestRedactJSON(t *testing.T) {
	in := `{"status":"completed","agent":"med","result":{"text":"Call 555-123-4567","debug":"MRN: 12345678","score":3},
	"input":"I am jane@x.io","tools":[{"name":"kb_search","args":{"q":"born 1/2/1990"}},{"name":"record_note","args":{}}],
	"contacts":{"jane@x.io":"friend"},"n":42,"ok":true,"none":null}`
	tests := []struct {
		name   string
		fields []string
		want   string
	}{
		{"keeps listed fields and redacts them", []string{"status", "result.text", "n", "ok", "none"}, `{"status":"completed","result":{"text":"Call [REDACTED:phone]"},"n":42,"ok":true,"none":null}`},
		{"a listed object keeps its subtree", []string{"result"}, `{"result":{"text":"Call [REDACTED:phone]","debug":"MRN: [REDACTED:mrn]","score":3}}`},
		{"paths through arrays", []string{"tools.name"}, `{"tools":[{"name":"kb_search"},{"name":"record_note"}]}`},
		{"wildcard", []string{"tools.*"}, `{"tools":[{"name":"kb_search","args":{"q":"born [REDACTED:dob]"}},{"name":"record_note","args":{}}]}`},
		{"keys are redacted too", []string{"contacts"}, `{"contacts":{"[REDACTED:email]":"friend"}}`},
		{"nothing listed, nothing kept", nil, `{}`},
		{"a scalar where an object was expected is dropped", []string{"status.code"}, `{}`},
		{"unknown fields are dropped", []string{"missing"}, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustRedactor(t, RedactionPolicy{Fields: tt.fields})
			out := r.RedactJSON(json.RawMessage(in))
			assert.Equal(t, tt.want, string(out))
			assert.True(t, json.Valid(out))
		})
	}

	r := mustRedactor(t, RedactionPolicy{Fields: []string{"*"}})
	assert.Equal(t, "null", string(r.RedactJSON(json.RawMessage(`{"a":`))), "invalid JSON leaks nothing")
	assert.Equal(t, "null", string(r.RedactJSON(json.RawMessage(`{"a":1,"a":"555-123-4567"}`))), "duplicate keys leak nothing")
	assert.Equal(t, `{"[REDACTED:email]":1,"[REDACTED:email]#2":2}`, string(r.RedactJSON(json.RawMessage(`{"a@b.co":1,"c@d.co":2}`))))
	assert.Equal(t, `[]`, string(mustRedactor(t, RedactionPolicy{Fields: []string{"*"}}).RedactJSON(json.RawMessage(`["123-45-6789"]`))), "fields name object members; bare scalars are not listed, so they are dropped")
}
