package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// The outcome ledger is the outbox of finished runs: one record per run
// that ended (or paused at an interrupt), appended in the same transaction
// as the run's final commit, so a run either has its outcome or is not
// finished. Records are keyed by a dense sequence number from 1 and each
// holds the hash of the one before it. Nothing in this package edits or
// deletes one; Check verifies the chain, and the uplink drains it up to the
// cursor the collector has acknowledged.
const (
	// outcomeVersion records keep seq, prev_hash and hash in a fixed
	// header (8 bytes big-endian, then 32 and 32 raw bytes) and the rest as
	// JSON, so the transaction that appends one only fills in the header.
	// outcomeVersionJSON records, the first format, are JSON throughout;
	// they are still read.
	outcomeVersion     = 2
	outcomeVersionJSON = 1
	outcomeRunVersion  = 1
	cursorVersion      = 1
)

// GenesisHash is the prev_hash of an appliance's first outcome.
var GenesisHash = strings.Repeat("0", 64)

// Outcome is the envelope a run leaves when it ends. Its JSON field names
// are the wire names the uplink sends and the names a bundle's redaction
// policy selects (see OutcomeFields).
type Outcome struct {
	ApplianceID   string           `json:"appliance_id"`
	Seq           uint64           `json:"seq"`
	OutcomeID     string           `json:"outcome_id"`
	CorrelationID string           `json:"correlation_id"`
	CausationID   string           `json:"causation_id"`
	Thread        string           `json:"thread"`
	Run           string           `json:"run"`
	Agent         string           `json:"agent"`
	Bundle        engine.BundleRef `json:"bundle"`
	Status        engine.RunStatus `json:"status"`
	StartedAt     time.Time        `json:"started_at"`
	EndedAt       time.Time        `json:"ended_at"`
	Steps         int              `json:"steps"`
	// Tokens is what the run's model calls spent, as its budget counts
	// them: failed calls, and the calls of an attempt that a crash cut
	// short, included. ModelCalls counts the calls of the run's path,
	// failed ones included: a call made after the run's last commit
	// before a crash (exit durability), which the recovered run made
	// again, is not counted twice.
	Tokens     int           `json:"tokens"`
	ModelCalls int           `json:"model_calls"`
	Tools      []OutcomeTool `json:"tools"`
	Flags      []string      `json:"flags"`
	// Output is the run's result (completed runs), as JSON; Error is its
	// error. The ledger holds them unredacted: redaction happens on the way
	// out (see package uplink).
	Output   json.RawMessage `json:"output"`
	Error    string          `json:"error"`
	PrevHash string          `json:"prev_hash"`
	Hash     string          `json:"hash"`
}

// OutcomeTool is one tool call of a run, as the ledger keeps it: never its
// arguments, only their hash, and never its error, only that it failed.
// Failed is left out of the record when false, so the records of calls
// that did not fail read (and hash) as they always have.
type OutcomeTool struct {
	Name     string `json:"name"`
	Decision string `json:"decision"`
	ArgsHash string `json:"args_hash"`
	Failed   bool   `json:"failed,omitempty"`
}

// OutcomeFields lists, in hashing order, the fields an outcome's hash
// covers besides prev_hash. The hash is
//
//	sha256("outpost-outcome/1\n" + "prev_hash=" + prev_hash + "\n" +
//	       for each field f: f + "=" + hex(sha256(json(f's value))) + "\n")
//
// where json is encoding/json's encoding of the field's typed value. Hashing
// a digest per field (a commitment) rather than the whole record lets a
// receiver that gets some fields only as digests, because the redaction
// policy kept them home, still recompute the hash and verify the chain.
var OutcomeFields = []string{
	"appliance_id", "seq", "outcome_id", "correlation_id", "causation_id", "thread", "run", "agent",
	"bundle", "status", "started_at", "ended_at", "steps", "tokens", "model_calls", "tools", "flags",
	"output", "error",
}

// FieldValues returns the canonical JSON of each of OutcomeFields.
func (o *Outcome) FieldValues() (map[string][]byte, error) {
	vals, err := o.fieldJSON(false)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(vals))
	for i, f := range OutcomeFields {
		out[f] = vals[i]
	}
	return out, nil
}

// fieldJSON returns the canonical JSON of each of OutcomeFields, in that
// order. With canonicalOutput, o.Output is taken as already canonical (as
// newPendingOutcome makes it), which saves a pass over a large output.
func (o *Outcome) fieldJSON(canonicalOutput bool) ([][]byte, error) {
	vals := [...]any{
		o.ApplianceID, o.Seq, o.OutcomeID, o.CorrelationID, o.CausationID, o.Thread, o.Run, o.Agent,
		o.Bundle, o.Status, o.StartedAt, o.EndedAt, o.Steps, o.Tokens, o.ModelCalls, o.Tools, o.Flags,
		o.Output, o.Error,
	}
	out := make([][]byte, len(vals))
	buf := make([]byte, 0, 512) // the small fields share one array
	for i, v := range vals {
		if i == outputField && canonicalOutput {
			out[i] = o.Output
			if out[i] == nil {
				out[i] = []byte("null")
			}
			continue
		}
		start := len(buf)
		var err error
		if buf, err = appendFieldJSON(buf, v); err != nil {
			return nil, fmt.Errorf("outcome field %s: %w", OutcomeFields[i], err)
		}
		out[i] = buf[start:len(buf):len(buf)]
	}
	return out, nil
}

// appendFieldJSON appends v as json.Marshal encodes it. The types of
// Outcome's fields are encoded without reflection: an outcome is hashed
// at the end of every run.
func appendFieldJSON(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case string:
		return engine.AppendJSONString(dst, v), nil
	case engine.RunStatus:
		return engine.AppendJSONString(dst, string(v)), nil
	case uint64:
		return strconv.AppendUint(dst, v, 10), nil
	case int:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case engine.BundleRef:
		dst = engine.AppendJSONString(append(dst, `{"name":`...), v.Name)
		dst = strconv.AppendInt(append(dst, `,"version":`...), v.Version, 10)
		return append(engine.AppendJSONString(append(dst, `,"digest":`...), v.Digest), '}'), nil
	case []OutcomeTool:
		return appendJSONList(dst, v, func(dst []byte, t OutcomeTool) []byte {
			dst = engine.AppendJSONString(append(dst, `{"name":`...), t.Name)
			dst = engine.AppendJSONString(append(dst, `,"decision":`...), t.Decision)
			dst = engine.AppendJSONString(append(dst, `,"args_hash":`...), t.ArgsHash)
			if t.Failed {
				dst = append(dst, `,"failed":true`...)
			}
			return append(dst, '}')
		}), nil
	case []string:
		return appendJSONList(dst, v, engine.AppendJSONString), nil
	case time.Time:
		b, err := v.MarshalJSON() // as json.Marshal calls it
		return append(dst, b...), err
	case json.RawMessage:
		if len(v) > 0 {
			b, err := canonicalJSON(v)
			return append(dst, b...), err
		}
	}
	b, err := json.Marshal(v)
	return append(dst, b...), err
}

// appendJSONList appends xs as a JSON array, each item by item, or null
// for a nil slice, as json.Marshal does.
func appendJSONList[T any](dst []byte, xs []T, item func([]byte, T) []byte) []byte {
	if xs == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, x := range xs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = item(dst, x)
	}
	return append(dst, ']')
}

// Positions in OutcomeFields (and fieldJSON) that the ledger sets itself.
var (
	seqField, flagsField, outputField = fieldIndex("seq"), fieldIndex("flags"), fieldIndex("output")
	causationField, toolsField        = fieldIndex("causation_id"), fieldIndex("tools")
	modelCallsField, tokensField      = fieldIndex("model_calls"), fieldIndex("tokens")
)

func fieldIndex(name string) int {
	i := slices.Index(OutcomeFields, name)
	if i < 0 {
		panic("store: no outcome field " + name)
	}
	return i
}

// fieldDigests holds the digest of each of OutcomeFields, by position: the
// ledger's writer copies and hashes it in every append, inside the
// transaction, where a map's clone and lookups cost more than the hash.
// Digests are kept as bytes and spelled in hex only where they are hashed.
type fieldDigests [19][sha256.Size]byte

func init() {
	if len(fieldDigests{}) != len(OutcomeFields) {
		panic("store: fieldDigests does not match OutcomeFields")
	}
}

func digestsOf(vals [][]byte) fieldDigests {
	var d fieldDigests
	for i := range OutcomeFields {
		d[i] = sha256.Sum256(vals[i])
	}
	return d
}

// FieldDigest is the hex sha256 of a field's canonical JSON.
func FieldDigest(canonical []byte) string {
	s := sha256.Sum256(canonical)
	return hex.EncodeToString(s[:])
}

// Digests returns the digest of each of OutcomeFields.
func (o *Outcome) Digests() (map[string]string, error) {
	vals, err := o.fieldJSON(false)
	if err != nil {
		return nil, err
	}
	d := digestsOf(vals)
	m := make(map[string]string, len(d))
	for i, f := range OutcomeFields {
		m[f] = hex.EncodeToString(d[i][:])
	}
	return m, nil
}

// ComputeHash returns the hash o should carry, given its PrevHash.
func (o *Outcome) ComputeHash() (string, error) {
	vals, err := o.fieldJSON(false)
	if err != nil {
		return "", err
	}
	d := digestsOf(vals)
	return chainHash(o.PrevHash, &d), nil
}

// OutcomeHash chains field digests to prevHash (see OutcomeFields). Every
// field must have a digest, as 64 lowercase hex digits (FieldDigest's
// form).
func OutcomeHash(prevHash string, digests map[string]string) (string, error) {
	var d fieldDigests
	for i, f := range OutcomeFields {
		s, ok := digests[f]
		if !ok {
			return "", fmt.Errorf("outcome hash: no digest for field %s", f)
		}
		if !isHash(s) {
			return "", fmt.Errorf("outcome hash: the digest of field %s is not 64 lowercase hex digits", f)
		}
		_, _ = hex.Decode(d[i][:], []byte(s))
	}
	return chainHash(prevHash, &d), nil
}

// chainHash is OutcomeHash of digests by position.
func chainHash(prevHash string, d *fieldDigests) string {
	b := make([]byte, 0, 2048)
	b = append(append(append(b, "outpost-outcome/1\nprev_hash="...), prevHash...), '\n')
	for i, f := range OutcomeFields {
		b = append(hex.AppendEncode(append(append(b, f...), '='), d[i][:]), '\n')
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// encodeOutcome encodes o for the ledger; with a non-zero outputBlob the
// record names that blob instead of holding the output.
func encodeOutcome(o *Outcome, outputBlob engine.BlobRef) ([]byte, error) {
	body, err := encodeOutcomeBody(o, outputBlob)
	if err != nil {
		return nil, err
	}
	return sealOutcome(o.Seq, o.PrevHash, o.Hash, body)
}

// encodeOutcomeBody encodes what follows the header: o without its seq and
// hashes.
func encodeOutcomeBody(o *Outcome, outputBlob engine.BlobRef) ([]byte, error) {
	vals, err := o.fieldJSON(false)
	if err != nil {
		return nil, err
	}
	return outcomeBody(vals, outputBlob), nil
}

// outcomeBody assembles a record's body, a JSON object, from the canonical
// JSON of each field (see fieldJSON): every field but seq, and, when
// outputBlob is set, a null output and the blob's reference.
func outcomeBody(vals [][]byte, outputBlob engine.BlobRef) []byte {
	n := 64
	for _, v := range vals {
		n += len(v) + 20
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, f := range OutcomeFields {
		if i == seqField {
			continue
		}
		v := vals[i]
		if i == outputField && !outputBlob.IsZero() {
			v = []byte("null")
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(append(append(append(b, '"'), f...), '"', ':'), v...)
	}
	if !outputBlob.IsZero() {
		b = append(append(append(b, `,"output_blob":"`...), outputBlob.String()...), '"')
	}
	return append(b, '}')
}

const outcomeHeaderLen = 8 + 32 + 32

// sealOutcome puts the header before body and seals the record.
func sealOutcome(seq uint64, prevHash, hash string, body []byte) ([]byte, error) {
	b := beginRecord(outcomeVersion, outcomeHeaderLen+len(body))
	b = binary.BigEndian.AppendUint64(b, seq)
	for _, h := range []string{prevHash, hash} {
		if len(h) != 64 {
			return nil, fmt.Errorf("outcome %d: hash %q is not 64 hex digits", seq, h)
		}
		var err error
		if b, err = hex.AppendDecode(b, []byte(h)); err != nil {
			return nil, fmt.Errorf("outcome %d: hash %q: %w", seq, h, err)
		}
	}
	return seal(append(b, body...)), nil
}

// openOutcome checks a ledger record's checksum and returns its version
// and payload.
func openOutcome(b []byte) (byte, []byte, error) {
	if len(b) < envelopeOverhead {
		return 0, nil, errTruncated
	}
	v := b[0]
	if v != outcomeVersion && v != outcomeVersionJSON {
		v = outcomeVersion // openRecord names the version it wants
	}
	payload, err := openRecord(b, v)
	if err == nil && v == outcomeVersion && len(payload) < outcomeHeaderLen {
		err = errTruncated
	}
	return v, payload, err
}

// outcomeHead reads only a ledger record's seq and hash.
func outcomeHead(b []byte) (uint64, string, error) {
	v, payload, err := openOutcome(b)
	if err != nil {
		return 0, "", err
	}
	if v == outcomeVersionJSON {
		o, _, err := decodeOutcome(b)
		if err != nil {
			return 0, "", err
		}
		return o.Seq, o.Hash, nil
	}
	return binary.BigEndian.Uint64(payload), hex.EncodeToString(payload[40:72]), nil
}

// isHash reports whether s is a hex sha256, as the ledger writes them.
func isHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// decodeOutcome decodes a ledger record. An output kept out of line comes
// back empty, named by the returned reference: resolveOutcome fills it in.
func decodeOutcome(b []byte) (*Outcome, engine.BlobRef, error) {
	var rec outcomeRecord
	v, payload, err := openOutcome(b)
	if err != nil {
		return nil, engine.BlobRef{}, err
	}
	if v == outcomeVersionJSON {
		err = decodeJSONPayload(payload, &rec)
		if err == nil && (!isHash(rec.PrevHash) || !isHash(rec.Hash)) {
			err = errors.New("prev_hash and hash must be 64 lowercase hex digits")
		}
	} else {
		err = decodeJSONPayload(payload[outcomeHeaderLen:], &rec)
		if err == nil && (rec.Seq != 0 || rec.PrevHash != "" || rec.Hash != "") {
			err = errors.New("the record's body repeats its header's seq or hashes")
		}
		rec.Seq = binary.BigEndian.Uint64(payload)
		rec.PrevHash, rec.Hash = hex.EncodeToString(payload[8:40]), hex.EncodeToString(payload[40:72])
	}
	if err != nil {
		return nil, engine.BlobRef{}, err
	}
	var ref engine.BlobRef
	if rec.OutputBlob != "" {
		if len(rec.Output) > 0 && string(rec.Output) != "null" {
			return nil, ref, fmt.Errorf("outcome %d holds its output both inline and as blob %s", rec.Seq, rec.OutputBlob)
		}
		if ref, err = engine.ParseBlobRef(rec.OutputBlob); err != nil {
			return nil, ref, err
		}
		rec.Output = nil
	}
	return &rec.Outcome, ref, nil
}

// resolveOutcome reads an outcome's out-of-line output from blobs.
func resolveOutcome(o *Outcome, ref engine.BlobRef, b *blobs) error {
	if ref.IsZero() {
		return nil
	}
	data, err := b.load(ref)
	if err != nil {
		return fmt.Errorf("outcome %d: output blob %s: %w", o.Seq, ref, err)
	}
	o.Output = bytes.Clone(data)
	return nil
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// outcomeIndexSuffix follows a run ID in the key of the run's outcome
// index entry. Run IDs hold no NUL byte (validKeyPart), so the entry sorts
// right after the run's record and before any other run's.
const outcomeIndexSuffix = "\x00o"

// outcomeIndexKey is the key of runID's outcome index entry in the runs
// bucket.
func outcomeIndexKey(runID string) []byte { return []byte(runID + outcomeIndexSuffix) }

// isOutcomeIndexKey reports whether k, a key of the runs bucket, is an
// outcome index entry's rather than a run record's.
func isOutcomeIndexKey(k []byte) bool { return bytes.IndexByte(k, 0) >= 0 }

// recordKind names what the record under k in bucket name is, for the
// counts of check and salvage: the runs bucket's outcome index entries
// are counted under their old bucket's name, as before version 6.
func recordKind(name string, k []byte) string {
	if name == bucketRuns && isOutcomeIndexKey(k) {
		return bucketOutcomeRuns
	}
	return name
}

// migrateOutcomeIndex moves the outcome index of a file of version 5 or
// before from its own bucket into the runs bucket, and drops the bucket.
// It does nothing when there is no such bucket.
func migrateOutcomeIndex(tx *bbolt.Tx) error {
	old := tx.Bucket([]byte(bucketOutcomeRuns))
	if old == nil {
		return nil
	}
	runs, err := tx.CreateBucketIfNotExists([]byte(bucketRuns))
	if err != nil {
		return err
	}
	runs.FillPercent = fillPercent[bucketRuns]
	err = old.ForEach(func(k, v []byte) error {
		if err := validKeyPart("run ID", string(k), true); err != nil {
			return corrupt(bucketOutcomeRuns, k, err)
		}
		return runs.Put(outcomeIndexKey(string(k)), v)
	})
	if err != nil {
		return fmt.Errorf("move the outcome index into %s: %w", bucketRuns, err)
	}
	return tx.DeleteBucket([]byte(bucketOutcomeRuns))
}

// outcomeRun is the per-run index entry: the run's latest outcome, so a
// run committed twice in the same state appends once, and a resumed run's
// next outcome names the one before as its cause.
//
// It lives in the runs bucket, right after the run's record, under
// outcomeIndexKey (format version 6). The commit that ends a run rewrites
// both, so they share a leaf page: a bucket of their own cost a leaf and
// a branch page more at every run's end. Bench page writes per run: one
// thread of 200 turns, 4,694 instead of 5,001 (two runs each, the same);
// 64 threads of 20 (medians of 5), 3,943 instead of 4,066 committing every
// step and 1,158 instead of 1,216 at run end. Files of version 5 and
// before keep it in the outcomeruns bucket, which the first writable open
// moves here (migrateOutcomeIndex).
type outcomeRun struct {
	Seq        uint64           `json:"seq"`
	OutcomeID  string           `json:"outcome_id"`
	Status     engine.RunStatus `json:"status"`
	Checkpoint string           `json:"checkpoint"`
}

// leavesOutcome reports whether a run in this state has ended or paused:
// the states that leave an outcome.
func leavesOutcome(s engine.RunStatus) bool {
	return s.Terminal() || s == engine.StatusInterrupted
}

// pendingOutcome is an outcome as prepareCommit builds it outside the
// transaction: every field the run alone determines, with its digest, and
// the output's blob when it is kept out of line. appendOutcome completes it
// inside the transaction with what only the store knows (the ledger head,
// the run's tool calls and flags) and rehashes only those fields. A batch
// may apply a request twice (see committer.run), so appendOutcome never
// changes a pendingOutcome.
type pendingOutcome struct {
	run     *engine.Run
	o       Outcome
	digests fieldDigests
	// flagsKnown says o.Flags holds the run's final flags, read outside
	// the transaction; otherwise appendOutcome reads them from the store.
	flagsKnown bool
	// body is the record's body as appendOutcome writes it when the store
	// adds nothing to o: no earlier outcome of the run, no tool or model
	// calls, flags known from the commit. Otherwise it encodes anew.
	body []byte
	// outputBlob names the blob that holds o.Output when it is above
	// engine.BlobThreshold; the stored record then carries only the
	// reference.
	outputBlob engine.BlobRef
}

// newPendingOutcome prepares the outcome of c's run, as of now, reading
// what it needs of the run's earlier commits through view (nil: it leaves
// that to appendOutcome). It returns the output blob's bytes when the
// output goes out of line.
func newPendingOutcome(c *engine.Commit, appliance string, now time.Time, trail *flagTrail, view func(func(*blobs) error) error) (*pendingOutcome, []byte, error) {
	r := c.Run
	var b [12]byte
	_, _ = rand.Read(b[:])
	o := Outcome{
		ApplianceID: appliance, OutcomeID: "oc_" + hex.EncodeToString(b[:]), CorrelationID: r.CorrelationID,
		CausationID: r.Meta["causation_id"], Thread: r.Thread, Run: r.ID, Agent: r.Agent,
		Bundle: r.Bundle, Status: r.Status, StartedAt: r.StartedAt.UTC(), EndedAt: r.EndedAt.UTC(),
		Steps: r.Steps, Error: r.Error, Tools: []OutcomeTool{}, Flags: []string{},
	}
	if o.CorrelationID == "" {
		o.CorrelationID = r.ID // stable across the run's outcomes
	}
	if o.StartedAt.IsZero() {
		o.StartedAt = r.CreatedAt.UTC()
	}
	if o.EndedAt.IsZero() {
		o.EndedAt = now.UTC()
	}
	if len(r.Output) > 0 {
		// The output's canonical JSON, in one pass: compacted and escaped
		// as FieldValues encodes it (so it is its own canonical form), or a
		// JSON string when the output is not JSON.
		var err error
		if o.Output, err = canonicalJSON(r.Output); err != nil {
			o.Output = engine.AppendJSONString(nil, string(r.Output))
		}
	}
	p := &pendingOutcome{run: r, o: o}
	var blob []byte
	if len(o.Output) > engine.BlobThreshold {
		p.outputBlob, blob = engine.RefOf(o.Output), o.Output
	}
	flags, ok := commitFlags(c, trail, nil)
	if !ok && view != nil {
		_ = view(func(b *blobs) error {
			flags, ok = commitFlags(c, trail, b)
			return nil
		})
	}
	if ok {
		p.flagsKnown, p.o.Flags = true, flags
	}
	vals, err := p.o.fieldJSON(true)
	if err != nil {
		return nil, nil, err
	}
	p.digests = digestsOf(vals)
	if ok {
		p.body = outcomeBody(vals, p.outputBlob)
	}
	return p, blob, nil
}

// outcomeRecord is an outcome as the ledger stores it: an output above
// engine.BlobThreshold is a blob, named by OutputBlob, like any large value
// (and it shares the run's own output blob when the two are equal).
type outcomeRecord struct {
	Outcome
	OutputBlob string `json:"output_blob,omitempty"`
}

// appendOutcome appends the run's outcome to the ledger in tx, unless its
// latest outcome already records this state. It returns the appended
// record, or nil.
func appendOutcome(tx *bbolt.Tx, p *pendingOutcome) (*Outcome, error) {
	r := p.run
	rb := bucket(tx, bucketRuns)
	idxKey := outcomeIndexKey(r.ID)
	var prev *outcomeRun
	if v := rb.Get(idxKey); v != nil {
		prev = &outcomeRun{}
		if err := decodeJSONRecord(v, outcomeRunVersion, prev); err != nil {
			return nil, corrupt(bucketRuns, idxKey, err)
		}
		if prev.Status == r.Status && (r.Status.Terminal() || prev.Checkpoint == r.Checkpoint) {
			return nil, nil
		}
	}
	o := p.o
	o.Tools = []OutcomeTool{}
	if err := summarizeCalls(tx, &o, engine.RunAttempt(r)); err != nil {
		return nil, err
	}
	body := p.body
	d := p.digests
	if o.CausationID == "" && prev != nil {
		o.CausationID, body = prev.OutcomeID, nil
		if err := setDigest(&d, causationField, o.CausationID); err != nil {
			return nil, err
		}
	}
	if len(o.Tools) > 0 || o.ModelCalls > 0 || o.Tokens > 0 {
		body = nil
		for _, f := range [...]struct {
			i int
			v any
		}{{toolsField, o.Tools}, {modelCallsField, o.ModelCalls}, {tokensField, o.Tokens}} {
			if err := setDigest(&d, f.i, f.v); err != nil {
				return nil, err
			}
		}
	}
	if !p.flagsKnown {
		o.Flags, body = finalFlags(writeBlobs(tx), r), nil
		if err := setDigest(&d, flagsField, o.Flags); err != nil {
			return nil, err
		}
	}

	ob := bucket(tx, bucketOutcomes)
	head, err := ledgerHeadOf(tx, ob)
	if err != nil {
		return nil, err
	}
	o.Seq, o.PrevHash = head.seq+1, head.hash
	if err := setDigest(&d, seqField, o.Seq); err != nil {
		return nil, err
	}
	o.Hash = chainHash(o.PrevHash, &d)
	if body == nil {
		if body, err = encodeOutcomeBody(&o, p.outputBlob); err != nil {
			return nil, fmt.Errorf("append outcome: %w", err)
		}
	}
	rec, err := sealOutcome(o.Seq, o.PrevHash, o.Hash, body)
	if err != nil {
		return nil, fmt.Errorf("append outcome: %w", err)
	}
	if err := ob.Put(seqKey(o.Seq), rec); err != nil {
		return nil, fmt.Errorf("append outcome %d: %w", o.Seq, err)
	}
	head.seq, head.hash = o.Seq, o.Hash
	idx, err := encodeJSONRecord(outcomeRunVersion, &outcomeRun{Seq: o.Seq, OutcomeID: o.OutcomeID, Status: r.Status, Checkpoint: r.Checkpoint})
	if err != nil {
		return nil, err
	}
	if err := rb.Put(idxKey, idx); err != nil {
		return nil, fmt.Errorf("append outcome %d: %w", o.Seq, err)
	}
	return &o, nil
}

// setDigest sets the digest of OutcomeFields[i] to that of v's canonical
// JSON, as FieldValues encodes it.
func setDigest(d *fieldDigests, i int, v any) error {
	b, err := appendFieldJSON(nil, v)
	if err != nil {
		return fmt.Errorf("outcome field %s: %w", OutcomeFields[i], err)
	}
	d[i] = sha256.Sum256(b)
	return nil
}

// summarizeCalls fills in the run's tool calls (keys "<run>:...") and model
// calls (keys "model:<run>:...") from the tool-call records; attempt is
// the run's (engine.MetaAttempt). The tokens are every model call's, as
// the run's budget counted them. The model calls are those of the run's
// path: a call that an earlier attempt made from a checkpoint that was
// never stored (in exit durability, after the run's last commit before a
// crash) is left out, as the run went on without it and called again.
func summarizeCalls(tx *bbolt.Tx, o *Outcome, attempt int) error {
	tb := bucket(tx, bucketToolCalls)
	blobs := writeBlobs(tx)
	valueBytes := func(v engine.Value) []byte {
		if v.Blob.IsZero() {
			return v.Inline
		}
		return blobs.data(v.Blob)
	}
	scan := func(prefix string, fn func(tc *ToolCall)) error {
		c := tb.Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			tc, err := decodeToolCall(v)
			if err != nil {
				return corrupt(bucketToolCalls, k, err)
			}
			fn(tc)
		}
		return nil
	}
	err := scan(o.Run+":", func(tc *ToolCall) {
		// The call log keeps the policy decision beside the arguments
		// (internal/wiring's envelope); a record without one was allowed.
		var env struct {
			Decision string `json:"decision"`
		}
		_ = json.Unmarshal(valueBytes(tc.Args), &env)
		if env.Decision == "" {
			env.Decision = "allow"
		}
		failed := tc.Status == ToolCallDone && tc.Error != ""
		o.Tools = append(o.Tools, OutcomeTool{Name: tc.Tool, Decision: env.Decision, ArgsHash: tc.ArgsHash, Failed: failed})
	})
	if err != nil {
		return err
	}
	ckpts := openCheckpoints(tx)
	return scan("model:"+o.Run+":", func(tc *ToolCall) {
		var ref struct {
			Tokens     int    `json:"tokens"`
			Attempt    int    `json:"attempt"`
			NS         string `json:"ns"`
			Checkpoint string `json:"checkpoint"`
		}
		if tc.Status != ToolCallDone || json.Unmarshal(valueBytes(tc.Result), &ref) != nil {
			o.ModelCalls++
			return
		}
		o.Tokens += max(ref.Tokens, 0)
		cutShort := ref.Attempt < attempt && ref.Checkpoint != "" &&
			ckpts.Get(checkpointKey(o.Thread, ref.NS, ref.Checkpoint)) == nil
		if !cutShort {
			o.ModelCalls++
		}
	})
}

// FlagsChannel is the state channel whose final value an outcome records
// as its flags.
const FlagsChannel = "flags"

// maxFlagWalk bounds the walk up a run's checkpoints for its flags.
const maxFlagWalk = 1024

// finalFlags reads the flags channel of the state the run stopped at, from
// its last checkpoint back along parent links (checkpoints hold changed
// channels only). A missing or unreadable channel yields no flags.
func finalFlags(blobs *blobs, r *engine.Run) []string {
	cb := openCheckpoints(blobs.tx)
	flags, _ := walkFlags(r,
		func(id string) (*engine.Checkpoint, bool) { return storedCheckpoint(cb, r.Thread, id), true },
		blobs.data)
	return flags
}

// commitFlags is finalFlags answered outside the write transaction: from
// the checkpoints of the commit that ends the run, then from the trail of
// those committed lately (flagtrail.go; trail may be nil), and then, when
// blobs is not nil, from those the run committed before (blobs' read
// transaction sees them, since a run's commits follow one another). ok is
// false when the walk needs a checkpoint it cannot read.
func commitFlags(c *engine.Commit, trail *flagTrail, blobs *blobs) (flags []string, ok bool) {
	r := c.Run
	var cb *checkpoints
	if blobs != nil {
		stored := openCheckpoints(blobs.tx)
		cb = &stored
	}
	return walkFlags(r,
		func(id string) (*engine.Checkpoint, bool) {
			for _, cp := range append(slices.Clip(c.Earlier), c.Checkpoint) {
				if cp != nil && cp.ID == id && cp.Thread == r.Thread && cp.NS == "" {
					return cp, true
				}
			}
			if cp := trail.get(r.Thread, id); cp != nil {
				return cp, true
			}
			if cb == nil {
				return nil, false
			}
			return storedCheckpoint(*cb, r.Thread, id), true
		},
		func(ref engine.BlobRef) []byte {
			if data, ok := c.Blobs[ref]; ok || blobs == nil {
				return data
			}
			return blobs.data(ref)
		})
}

// storedCheckpoint reads a checkpoint of the root namespace; nil when it is
// missing or unreadable.
func storedCheckpoint(cb checkpoints, thread, id string) *engine.Checkpoint {
	v := cb.Get(checkpointKey(thread, "", id))
	if v == nil {
		return nil
	}
	c, err := decodeCheckpoint(v)
	if err != nil {
		return nil
	}
	return c
}

// walkFlags walks from r's last checkpoint up its parents until the flags
// channel's value is known. load returns a checkpoint (nil: there is none,
// or it is unreadable), or false when it cannot tell; walkFlags then
// returns false.
func walkFlags(r *engine.Run, load func(id string) (*engine.Checkpoint, bool), blob func(engine.BlobRef) []byte) ([]string, bool) {
	flags := []string{}
	if r.Checkpoint == "" {
		return flags, true
	}
	var tail []string // items of append deltas seen so far, newest first
	id := r.Checkpoint
	for range maxFlagWalk {
		c, known := load(id)
		if !known {
			return nil, false
		}
		if c == nil {
			break
		}
		for _, cv := range c.Channels {
			if cv.Channel != FlagsChannel {
				continue
			}
			raw := cv.Value.Inline
			if !cv.Value.Blob.IsZero() {
				raw = blob(cv.Value.Blob)
			}
			var items []string
			if json.Unmarshal(raw, &items) != nil {
				return flags, true
			}
			if cv.Delta {
				tail = append(items, tail...)
				continue
			}
			return append(append(flags, items...), tail...), true
		}
		if c.ParentID == "" || c.ParentID >= id {
			break
		}
		id = c.ParentID
	}
	return append(flags, tail...), true
}

// Outcomes returns up to limit ledger records with seq greater than
// afterSeq, in order (limit 0: all).
func (d *DB) Outcomes(ctx context.Context, afterSeq uint64, limit int) ([]*Outcome, error) {
	var out []*Outcome
	err := d.view(func(tx *bbolt.Tx) error {
		c, blobs := bucket(tx, bucketOutcomes).Cursor(), openBlobs(tx, &d.tail, nil)
		for k, v := c.Seek(seqKey(afterSeq + 1)); k != nil; k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			o, ref, err := decodeOutcome(v)
			if err != nil {
				return corrupt(bucketOutcomes, k, err)
			}
			if err := resolveOutcome(o, ref, blobs); err != nil {
				return err
			}
			out = append(out, o)
			if limit > 0 && len(out) == limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read outcomes after %d: %w", afterSeq, err)
	}
	return out, nil
}

// LedgerState is where the ledger and its uplink cursor stand.
type LedgerState struct {
	ApplianceID string `json:"appliance_id"`
	// LastSeq is the newest outcome's seq (0: none yet); Head its hash.
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
	// AckedSeq is the uplink cursor: the collector has acknowledged every
	// outcome up to it.
	AckedSeq uint64 `json:"acked_seq"`
}

// Backlog is the number of outcomes not yet acknowledged upstream.
func (s LedgerState) Backlog() uint64 {
	if s.LastSeq < s.AckedSeq {
		return 0
	}
	return s.LastSeq - s.AckedSeq
}

// Ledger reports the ledger's head and the uplink cursor.
func (d *DB) Ledger(ctx context.Context) (LedgerState, error) {
	st := LedgerState{ApplianceID: d.ApplianceID(), Head: GenesisHash}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	err := d.view(func(tx *bbolt.Tx) error {
		if k, v := bucket(tx, bucketOutcomes).Cursor().Last(); k != nil {
			seq, hash, err := outcomeHead(v)
			if err != nil {
				return corrupt(bucketOutcomes, k, err)
			}
			st.LastSeq, st.Head = seq, hash
		}
		acked, err := loadCursor(tx)
		st.AckedSeq = acked
		return err
	})
	if err != nil {
		return st, fmt.Errorf("read ledger state: %w", err)
	}
	return st, nil
}

var cursorKey = []byte("acked_seq")

func loadCursor(tx *bbolt.Tx) (uint64, error) {
	v := bucket(tx, bucketUplink).Get(cursorKey)
	if v == nil {
		return 0, nil
	}
	seq, err := decodeCursor(v)
	if err != nil {
		return 0, corrupt(bucketUplink, cursorKey, err)
	}
	return seq, nil
}

func decodeCursor(v []byte) (uint64, error) {
	payload, err := openRecord(v, cursorVersion)
	if err == nil && len(payload) != 8 {
		err = errTruncated
	}
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(payload), nil
}

// AckOutcomes advances the uplink cursor to seq: the collector has stored
// every outcome up to it. The cursor never moves back (a smaller seq is a
// no-op) and never past the ledger's last record (ErrCursorAhead).
func (d *DB) AckOutcomes(ctx context.Context, seq uint64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("advance uplink cursor: %w", err)
	}
	err := d.q.do(&request{
		validate: func(tx *bbolt.Tx) error {
			k, _ := bucket(tx, bucketOutcomes).Cursor().Last()
			if k == nil || beUint64(k) < seq {
				return fmt.Errorf("%w: %d", ErrCursorAhead, seq)
			}
			return nil
		},
		apply: func(tx *bbolt.Tx) error {
			cur, err := loadCursor(tx)
			if err != nil || seq <= cur {
				return err
			}
			b := beginRecord(cursorVersion, 8)
			return bucket(tx, bucketUplink).Put(cursorKey, seal(binary.BigEndian.AppendUint64(b, seq)))
		},
	})
	if err != nil {
		return fmt.Errorf("advance uplink cursor to %d: %w", seq, err)
	}
	return nil
}

// checkLedger verifies every outcome: its record decodes, its key is its
// seq, seqs are dense from 1, each prev_hash is the hash before, and each
// hash is the record's own. The first broken link is reported with its
// bucket and seq; later records are still decoded. An output kept out of
// line must exist (refs reports a missing blob), and is part of the hash.
func checkLedger(ctx context.Context, tx *bbolt.Tx, rep *CheckReport, add func(string, []byte, string, ...any),
	refs func(bucket string, key []byte) func(engine.BlobRef), blobs *blobs) error {
	want, prevHash := uint64(1), GenesisHash
	chainBroken := false
	brk := func(k []byte, format string, args ...any) {
		if !chainBroken {
			chainBroken = true
			format = "broken chain: " + format
		}
		add(bucketOutcomes, k, format, args...)
	}
	err := forEach(ctx, tx, bucketOutcomes, func(k, v []byte) {
		rep.Records[bucketOutcomes]++
		o, ref, err := decodeOutcome(v)
		if err != nil {
			brk(k, "%v", err)
			prevHash = ""
			want++
			return
		}
		verifiable := true
		if !ref.IsZero() {
			refs(bucketOutcomes, k)(ref)
			verifiable = resolveOutcome(o, ref, blobs) == nil
		}
		switch {
		case len(k) != 8 || beUint64(k) != o.Seq:
			brk(k, "key does not match seq %d", o.Seq)
		case o.Seq != want:
			brk(k, "seq %d follows %d: the ledger has a gap", o.Seq, want-1)
		case prevHash != "" && o.PrevHash != prevHash:
			brk(k, "prev_hash %.12s… does not match the hash %.12s… of seq %d", o.PrevHash, prevHash, o.Seq-1)
		}
		if h, err := o.ComputeHash(); verifiable && (err != nil || h != o.Hash) {
			brk(k, "the record does not match its hash %.12s… (it was altered)", o.Hash)
		}
		want, prevHash = o.Seq+1, o.Hash
	})
	if err != nil {
		return err
	}
	if v := bucket(tx, bucketUplink).Get(cursorKey); v != nil {
		if _, err := decodeCursor(v); err != nil {
			add(bucketUplink, cursorKey, "%v", err)
		}
	}
	// The runs bucket's index entries are checked with the run records
	// (check.go). A file of version 5 opened read-only still has them in
	// their old bucket.
	if tx.Bucket([]byte(bucketOutcomeRuns)) == nil {
		return nil
	}
	return forEach(ctx, tx, bucketOutcomeRuns, func(k, v []byte) { checkOutcomeIndex(rep, add, bucketOutcomeRuns, k, v) })
}

// checkOutcomeIndex checks one outcome index entry, held in bucket name
// under k.
func checkOutcomeIndex(rep *CheckReport, add func(string, []byte, string, ...any), name string, k, v []byte) {
	rep.Records[recordKind(name, k)]++
	var r outcomeRun
	if err := decodeJSONRecord(v, outcomeRunVersion, &r); err != nil {
		add(name, k, "%v", err)
	}
}

// ApplianceID is the id this store's outcomes carry.
func (d *DB) ApplianceID() string {
	d.applianceMu.RLock()
	defer d.applianceMu.RUnlock()
	return d.appliance
}

// SetApplianceID changes the id new outcomes carry. It is allowed only
// while the ledger is empty: records already chained under one id cannot
// move to another (ErrApplianceID).
func (d *DB) SetApplianceID(ctx context.Context, id string) error {
	if id == d.ApplianceID() {
		return nil
	}
	if err := CheckApplianceID(id); err != nil {
		return err
	}
	err := d.q.do(&request{
		apply: func(tx *bbolt.Tx) error {
			return setApplianceID(tx, id)
		},
	})
	if err != nil {
		return fmt.Errorf("set appliance id: %w", err)
	}
	d.applianceMu.Lock()
	d.appliance = id
	d.applianceMu.Unlock()
	return nil
}

var metaAppliance = []byte("appliance_id")

// CheckApplianceID reports an appliance id that no store takes (empty, or
// with spaces or colons), so that a command can refuse it before it opens
// one.
func CheckApplianceID(id string) error {
	if id == "" || strings.ContainsAny(id, " \t\r\n:") {
		return fmt.Errorf("%w: appliance id %q must be non-empty, without spaces or colons", ErrInvalidKey, id)
	}
	return nil
}

// setApplianceID records id in meta, refusing a change once outcomes exist.
func setApplianceID(tx *bbolt.Tx, id string) error {
	meta := bucket(tx, bucketMeta)
	old := string(meta.Get(metaAppliance))
	if old == id {
		return nil
	}
	if old != "" {
		if k, _ := bucket(tx, bucketOutcomes).Cursor().Last(); k != nil {
			return fmt.Errorf("%w: the ledger holds %d outcomes of appliance %q; it cannot become %q (use --appliance-id %s, or start an empty data folder)",
				ErrApplianceID, beUint64(k), old, id, old)
		}
	}
	return meta.Put(metaAppliance, []byte(id))
}

// initApplianceID runs at Open: the id given in Options, else the one
// recorded, else a new one minted now.
func initApplianceID(tx *bbolt.Tx, want string) (string, error) {
	if want != "" {
		if err := CheckApplianceID(want); err != nil {
			return "", err
		}
		return want, setApplianceID(tx, want)
	}
	if old := bucket(tx, bucketMeta).Get(metaAppliance); len(old) > 0 {
		return string(old), nil
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "outpost-" + hex.EncodeToString(b[:])
	return id, setApplianceID(tx, id)
}

// ledgerHead is the newest outcome's seq and hash within one write
// transaction. A group commit appends many outcomes in one transaction, and
// decoding the last record for each of them was most of the append's cost.
type ledgerHead struct {
	seq  uint64
	hash string
}

// ledgerHeadOf returns the ledger head of a commit-queue transaction,
// reading it from the ledger the first time.
func ledgerHeadOf(tx *bbolt.Tx, ob *bbolt.Bucket) (*ledgerHead, error) {
	st := stateOf(tx)
	if st.head != nil {
		return st.head, nil
	}
	lh := &ledgerHead{hash: GenesisHash}
	if k, v := ob.Cursor().Last(); k != nil {
		seq, hash, err := outcomeHead(v)
		if err != nil {
			return nil, fmt.Errorf("append outcome: the ledger's last record: %w", corrupt(bucketOutcomes, k, err))
		}
		lh.seq, lh.hash = seq, hash
	}
	st.head = lh
	return lh, nil
}
