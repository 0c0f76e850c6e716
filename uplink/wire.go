package uplink

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// Wire format. A batch is POST {collector}/v1/outcomes with an NDJSON body
// (Content-Type: application/x-ndjson), one outcome a line in seq order,
// and three headers:
//
//	Idempotency-Key:      {appliance}:{first_seq}-{last_seq}
//	X-Outpost-Signature:  sha256=<hex HMAC-SHA256 of the body under the appliance's secret>
//	X-Outpost-Chain-Head: <hash of the batch's last record>
//
// A line is the outcome's JSON (store.Outcome's field names) as the
// bundle's redaction policy lets it leave: appliance_id, seq, outcome_id,
// prev_hash and hash always go in clear; every other field goes in clear
// only when the policy keeps it unchanged. A field the policy drops goes as
// its digest, and one it masks goes as its digest plus the masked value:
//
//	"redacted": {"thread": {"digest": "<hex>"}, "output": {"digest": "<hex>", "value": <masked>}}
//
// The record's hash commits to a digest per field (store.OutcomeFields), so
// the collector recomputes it from the clear fields and the digests,
// verifies it, and checks that each prev_hash is the hash before: the chain
// is verified over exactly what arrives, without the redacted data. A
// masked value is for display only; its digest is what the chain verifies.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderSignature      = "X-Outpost-Signature"
	HeaderChainHead      = "X-Outpost-Chain-Head"
	// ContentType is a batch's media type; a collector refuses any other
	// with 415.
	ContentType = "application/x-ndjson"
	// OutcomesPath is where a collector receives batches.
	OutcomesPath = "/v1/outcomes"
	// AppliancesPath is where a collector lists what it holds, to those
	// with its bearer token.
	AppliancesPath = "/v1/appliances"
	// TokenFile is the file, in a collector's data folder, of the bearer
	// token GET /v1/appliances asks for (made at first start, mode 0600).
	TokenFile = "collector.token"
)

// Redactor is what a bundle's redaction policy offers the uplink
// (*policy.Redactor satisfies it): it keeps the policy's fields of a JSON
// document and masks personal data in them.
type Redactor interface {
	RedactJSON(json.RawMessage) json.RawMessage
}

// identityFields go in clear whatever the policy says: without them a
// record cannot be placed in its chain.
var identityFields = []string{"appliance_id", "seq", "outcome_id"}

// RedactedField is how a field the policy did not let out travels.
type RedactedField struct {
	Digest string          `json:"digest"`
	Value  json.RawMessage `json:"value,omitempty"`
}

// EncodeRecord writes o as one wire line (without the newline). A nil
// redactor lets nothing but the identity fields out in clear.
func EncodeRecord(o *store.Outcome, r Redactor) ([]byte, error) {
	vals, err := o.FieldValues()
	if err != nil {
		return nil, err
	}
	governed := slices.DeleteFunc(slices.Clone(store.OutcomeFields), func(f string) bool {
		return slices.Contains(identityFields, f)
	})
	kept := map[string]json.RawMessage{}
	if r != nil {
		var doc bytes.Buffer
		doc.WriteByte('{')
		for i, f := range governed {
			if i > 0 {
				doc.WriteByte(',')
			}
			doc.WriteString(strconv.Quote(f) + ":")
			doc.Write(vals[f])
		}
		doc.WriteByte('}')
		// A result that is not an object (RedactJSON's "null" for input it
		// cannot filter) keeps nothing.
		_ = json.Unmarshal(r.RedactJSON(doc.Bytes()), &kept)
	}
	var b bytes.Buffer
	b.WriteByte('{')
	field := func(name string, v []byte) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(name) + ":")
		b.Write(v)
	}
	for _, f := range identityFields {
		field(f, vals[f])
	}
	redacted := map[string]RedactedField{}
	for _, f := range governed {
		v, ok := kept[f]
		if ok {
			var c bytes.Buffer
			if json.Compact(&c, v) == nil && bytes.Equal(c.Bytes(), vals[f]) {
				field(f, vals[f])
				continue
			}
		}
		rf := RedactedField{Digest: store.FieldDigest(vals[f])}
		if ok && string(v) != "null" {
			rf.Value = v
		}
		redacted[f] = rf
	}
	field("prev_hash", []byte(strconv.Quote(o.PrevHash)))
	field("hash", []byte(strconv.Quote(o.Hash)))
	if len(redacted) > 0 {
		// encoding/json sorts map keys, so the line is deterministic and a
		// resent batch carries the same signature.
		raw, err := json.Marshal(redacted)
		if err != nil {
			return nil, err
		}
		field("redacted", raw)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Record is one received outcome, verified against its own hash.
type Record struct {
	ApplianceID string
	Seq         uint64
	PrevHash    string
	Hash        string
	// Line is the record as it arrived.
	Line []byte
}

// DecodeRecord parses one wire line and verifies that its hash matches
// what it carries (clear fields and digests). It does not check the chain.
func DecodeRecord(line []byte) (*Record, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the record", ErrMalformed)
	}
	var redacted map[string]RedactedField
	if raw, ok := fields["redacted"]; ok {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&redacted); err != nil {
			return nil, fmt.Errorf("%w: redacted: %v", ErrMalformed, err)
		}
		delete(fields, "redacted")
	}
	var prev, hash string
	for name, dst := range map[string]*string{"prev_hash": &prev, "hash": &hash} {
		raw, ok := fields[name]
		if !ok || json.Unmarshal(raw, dst) != nil || !isHexHash(*dst) {
			return nil, fmt.Errorf("%w: %s must be 64 hex digits", ErrMalformed, name)
		}
	}
	for name := range fields {
		if name != "prev_hash" && name != "hash" && !slices.Contains(store.OutcomeFields, name) {
			return nil, fmt.Errorf("%w: unknown field %q", ErrMalformed, name)
		}
	}
	for _, f := range identityFields {
		if _, ok := fields[f]; !ok {
			return nil, fmt.Errorf("%w: %s is missing", ErrMalformed, f)
		}
	}
	// The clear fields decode strictly into the typed envelope, whose
	// canonical encoding is what the sender digested.
	var o store.Outcome
	clear, _ := json.Marshal(fields)
	d := json.NewDecoder(bytes.NewReader(clear))
	d.DisallowUnknownFields()
	if err := d.Decode(&o); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	vals, err := o.FieldValues()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	digests := map[string]string{}
	for _, f := range store.OutcomeFields {
		rf, isRedacted := redacted[f]
		_, isClear := fields[f]
		switch {
		case isRedacted && isClear:
			return nil, fmt.Errorf("%w: field %s is both in clear and redacted", ErrMalformed, f)
		case isRedacted:
			if !isHexHash(rf.Digest) {
				return nil, fmt.Errorf("%w: redacted %s: digest must be 64 hex digits", ErrMalformed, f)
			}
			digests[f] = rf.Digest
		case isClear:
			digests[f] = store.FieldDigest(vals[f])
		default:
			return nil, fmt.Errorf("%w: field %s is neither sent nor digested", ErrMalformed, f)
		}
	}
	for f := range redacted {
		if !slices.Contains(store.OutcomeFields, f) || slices.Contains(identityFields, f) {
			return nil, fmt.Errorf("%w: redacted field %q cannot be redacted", ErrMalformed, f)
		}
	}
	want, err := store.OutcomeHash(prev, digests)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if want != hash {
		return nil, &ChainError{Code: CodeBadHash, Seq: o.Seq,
			Msg: fmt.Sprintf("record seq %d does not match its hash %.12s…: it was altered", o.Seq, hash)}
	}
	if o.ApplianceID == "" || o.Seq == 0 {
		return nil, fmt.Errorf("%w: empty appliance_id or seq 0", ErrMalformed)
	}
	return &Record{ApplianceID: o.ApplianceID, Seq: o.Seq, PrevHash: prev, Hash: hash, Line: bytes.Clone(line)}, nil
}

func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// Sign returns the X-Outpost-Signature value of body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// verifySignature checks an X-Outpost-Signature value in constant time.
func verifySignature(secret, body []byte, sig string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(sig))
}

// IdempotencyKey names a batch: {appliance}:{first}-{last}.
func IdempotencyKey(appliance string, first, last uint64) string {
	return fmt.Sprintf("%s:%d-%d", appliance, first, last)
}

// parseIdempotencyKey splits a key made by IdempotencyKey. Appliance ids
// hold no colon (the store refuses one).
func parseIdempotencyKey(k string) (appliance string, first, last uint64, err error) {
	i := strings.LastIndexByte(k, ':')
	if i <= 0 {
		return "", 0, 0, fmt.Errorf("%w: Idempotency-Key %q: want {appliance}:{first}-{last}", ErrMalformed, k)
	}
	a, b, ok := strings.Cut(k[i+1:], "-")
	first, err1 := strconv.ParseUint(a, 10, 64)
	last, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || first == 0 || last < first {
		return "", 0, 0, fmt.Errorf("%w: Idempotency-Key %q: want {appliance}:{first}-{last}", ErrMalformed, k)
	}
	return k[:i], first, last, nil
}

// sentEvent is the data of an uplink.sent event.
func sentEvent(appliance string, first, last, acked uint64, n, size int) engine.Event {
	data, _ := json.Marshal(map[string]any{"appliance_id": appliance, "first_seq": first, "last_seq": last,
		"acked_seq": acked, "records": n, "bytes": size})
	return engine.Event{Type: engine.EventUplinkSent, Data: data}
}
