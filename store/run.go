package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// A run is written when it opens and when its status changes, and the
// records of the runs in flight sit side by side at the right edge of the
// runs bucket, so a group commit that ends many runs rewrites every page
// they span: version 2 records are binary, about two fifths of the JSON they
// replace. Version 1 (JSON inside the same envelope) is still read. Either
// way a store gives back the bytes it was given: raw JSON fields are kept
// as bytes, not re-encoded.
const (
	runVersionJSON = 1
	runVersion     = 2
)

type runRecord struct {
	ID            string            `json:"id"`
	Thread        string            `json:"thread"`
	Agent         string            `json:"agent"`
	Status        engine.RunStatus  `json:"status"`
	Bundle        engine.BundleRef  `json:"bundle"`
	CorrelationID string            `json:"correlation_id"`
	Input         []byte            `json:"input"`
	Output        []byte            `json:"output"`
	InputRef      string            `json:"input_ref,omitempty"`
	OutputRef     string            `json:"output_ref,omitempty"`
	Error         string            `json:"error"`
	Interrupts    []interruptRecord `json:"interrupts"`
	Decisions     []decisionRecord  `json:"decisions"`
	Checkpoint    string            `json:"checkpoint"`
	Steps         int               `json:"steps"`
	Durability    engine.Durability `json:"durability"`
	Meta          map[string]string `json:"meta"`
	CreatedAt     time.Time         `json:"created_at"`
	StartedAt     time.Time         `json:"started_at"`
	EndedAt       time.Time         `json:"ended_at"`
}

type interruptRecord struct {
	ID      string `json:"id"`
	Node    string `json:"node"`
	NS      string `json:"ns"`
	TaskID  string `json:"task_id"`
	Index   int    `json:"index"`
	Payload []byte `json:"payload"`
}

type decisionRecord struct {
	Interrupt string    `json:"interrupt"`
	Decision  string    `json:"decision"`
	Value     []byte    `json:"value"`
	Reason    string    `json:"reason"`
	By        string    `json:"by"`
	At        time.Time `json:"at"`
}

// runBlobs names the blobs that hold a stored run's large input and output:
// like any value above engine.BlobThreshold, they are kept out of line (and
// an output equal to the final state's value shares its blob).
// The record keeps a short preview of each in its place (previewOf), for
// listings, which show a run without reading its blobs.
type runBlobs struct {
	input, output               engine.BlobRef
	inputPreview, outputPreview []byte
}

func (rb runBlobs) each(fn func(engine.BlobRef)) {
	for _, ref := range []engine.BlobRef{rb.input, rb.output} {
		if !ref.IsZero() {
			fn(ref)
		}
	}
}

// outOfLine reports whether the run's input or output is a blob.
func (rb runBlobs) outOfLine() bool { return !rb.input.IsZero() || !rb.output.IsZero() }

// previewBytes bounds the text of a preview (previewOf): about two lines,
// more than a list shows of a run.
const previewBytes = 120

// previewOf is a short preview of v, a value kept out of line: a JSON
// string holding about its first previewBytes bytes and "…". Of a JSON
// string it is the string cut short, escapes kept whole; of anything else
// (an object, text that is not JSON), the start of its text, as a string.
// It is computed when the record is written, from v's first bytes only.
func previewOf(v []byte) []byte {
	if p := stringPreview(v); p != nil {
		return p
	}
	n := min(len(v), previewBytes)
	for n > 0 && n < len(v) && !utf8.RuneStart(v[n]) {
		n--
	}
	return engine.AppendJSONString(make([]byte, 0, n+8), string(v[:n])+"…")
}

// stringPreview is previewOf v when v is a JSON string longer than the
// preview, or nil.
func stringPreview(v []byte) []byte {
	if len(v) == 0 || v[0] != '"' {
		return nil
	}
	i := 1
	for i <= previewBytes {
		if i >= len(v) || v[i] == '"' {
			return nil // cut short, or over before the preview is
		}
		switch c := v[i]; {
		case c == '\\' && i+1 < len(v) && v[i+1] == 'u':
			i += 6
		case c == '\\':
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			_, size := utf8.DecodeRune(v[i:])
			i += size
		}
	}
	if i > len(v) {
		return nil
	}
	p := append(append(make([]byte, 0, i+4), v[:i]...), "…\""...)
	if !json.Valid(p) {
		return nil
	}
	return p
}

// encodeRun encodes r, returning the blobs that must be stored with it.
func encodeRun(r *engine.Run) ([]byte, map[engine.BlobRef][]byte) {
	rec, blobs := newRunRecord(r)
	return encodeRunRecord(&rec), blobs
}

// newRunRecord is r as a record holds it: a large input or output is a
// blob, returned with it.
func newRunRecord(r *engine.Run) (runRecord, map[engine.BlobRef][]byte) {
	rec := runRecord{
		ID: r.ID, Thread: r.Thread, Agent: r.Agent, Status: r.Status, Bundle: r.Bundle,
		CorrelationID: r.CorrelationID, Input: r.Input, Output: r.Output, Error: r.Error,
		Checkpoint: r.Checkpoint, Steps: r.Steps, Durability: r.Durability, Meta: r.Meta,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, EndedAt: r.EndedAt,
	}
	var blobs map[engine.BlobRef][]byte
	outOfLine := func(v []byte, field *[]byte, ref *string) {
		if len(v) <= engine.BlobThreshold {
			return
		}
		if blobs == nil {
			blobs = map[engine.BlobRef][]byte{}
		}
		r := engine.RefOf(v)
		blobs[r] = v
		*field, *ref = previewOf(v), r.String()
	}
	outOfLine(r.Input, &rec.Input, &rec.InputRef)
	outOfLine(r.Output, &rec.Output, &rec.OutputRef)
	for _, in := range r.Interrupts {
		rec.Interrupts = append(rec.Interrupts, interruptRecord{
			ID: in.ID, Node: in.Node, NS: in.NS, TaskID: in.TaskID, Index: in.Index, Payload: in.Payload})
	}
	for _, dr := range r.Decisions {
		rec.Decisions = append(rec.Decisions, decisionRecord{
			Interrupt: dr.Interrupt, Decision: dr.Decision, Value: dr.Value, Reason: dr.Reason, By: dr.By, At: dr.At})
	}
	return rec, blobs
}

func encodeRunRecord(r *runRecord) []byte {
	size := len(r.ID) + len(r.Thread) + len(r.Agent) + len(r.Status) + len(r.Bundle.Name) + len(r.Bundle.Digest) +
		len(r.CorrelationID) + len(r.Input) + len(r.Output) + len(r.InputRef) + len(r.OutputRef) + len(r.Error) +
		len(r.Checkpoint) + len(r.Durability) + 96
	for _, in := range r.Interrupts {
		size += len(in.ID) + len(in.Node) + len(in.NS) + len(in.TaskID) + len(in.Payload) + 16
	}
	for _, dr := range r.Decisions {
		size += len(dr.Interrupt) + len(dr.Decision) + len(dr.Value) + len(dr.Reason) + len(dr.By) + 24
	}
	keys := slices.Sorted(maps.Keys(r.Meta))
	for _, k := range keys {
		size += len(k) + len(r.Meta[k]) + 4
	}
	b := beginRecord(runVersion, size)
	for _, s := range []string{r.ID, r.Thread, r.Agent, string(r.Status), r.Bundle.Name} {
		b = appendString(b, s)
	}
	b = binaryAppendVarint(b, r.Bundle.Version)
	b = appendString(b, r.Bundle.Digest)
	b = appendString(b, r.CorrelationID)
	b = appendBytesOpt(b, r.Input)
	b = appendString(b, r.InputRef)
	b = appendBytesOpt(b, r.Output)
	b = appendString(b, r.OutputRef)
	b = appendString(b, r.Error)
	b = appendCount(b, len(r.Interrupts), r.Interrupts == nil)
	for _, in := range r.Interrupts {
		for _, s := range []string{in.ID, in.Node, in.NS, in.TaskID} {
			b = appendString(b, s)
		}
		b = binaryAppendVarint(b, int64(in.Index))
		b = appendBytesOpt(b, in.Payload)
	}
	b = appendCount(b, len(r.Decisions), r.Decisions == nil)
	for _, dr := range r.Decisions {
		b = appendString(b, dr.Interrupt)
		b = appendString(b, dr.Decision)
		b = appendBytesOpt(b, dr.Value)
		b = appendString(b, dr.Reason)
		b = appendString(b, dr.By)
		b = appendTime(b, dr.At)
	}
	b = appendString(b, r.Checkpoint)
	b = binaryAppendVarint(b, int64(r.Steps))
	b = appendString(b, string(r.Durability))
	b = appendCount(b, len(keys), r.Meta == nil)
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, r.Meta[k])
	}
	for _, t := range []time.Time{r.CreatedAt, r.StartedAt, r.EndedAt} {
		b = appendTime(b, t)
	}
	return seal(b)
}

// decodeRunRecord reads a run record of either version.
func decodeRunRecord(b []byte) (*runRecord, error) {
	var rec runRecord
	if len(b) > 0 && b[0] == runVersionJSON {
		if err := decodeJSONRecord(b, runVersionJSON, &rec); err != nil {
			return nil, err
		}
		return &rec, nil
	}
	payload, err := openRecord(b, runVersion)
	if err != nil {
		return nil, err
	}
	d := &decoder{b: payload}
	rec.ID, rec.Thread, rec.Agent = d.string(), d.string(), d.string()
	rec.Status = engine.RunStatus(d.string())
	rec.Bundle.Name = d.string()
	rec.Bundle.Version = d.varint()
	rec.Bundle.Digest = d.string()
	rec.CorrelationID = d.string()
	rec.Input, rec.InputRef = d.bytesOpt(), d.string()
	rec.Output, rec.OutputRef = d.bytesOpt(), d.string()
	rec.Error = d.string()
	if n := d.count(); n >= 0 {
		rec.Interrupts = make([]interruptRecord, 0, n)
		for range n {
			in := interruptRecord{ID: d.string(), Node: d.string(), NS: d.string(), TaskID: d.string()}
			in.Index = int(d.varint())
			in.Payload = d.bytesOpt()
			rec.Interrupts = append(rec.Interrupts, in)
		}
	}
	if n := d.count(); n >= 0 {
		rec.Decisions = make([]decisionRecord, 0, n)
		for range n {
			dr := decisionRecord{Interrupt: d.string(), Decision: d.string(), Value: d.bytesOpt()}
			dr.Reason, dr.By, dr.At = d.string(), d.string(), d.time()
			rec.Decisions = append(rec.Decisions, dr)
		}
	}
	rec.Checkpoint = d.string()
	rec.Steps = int(d.varint())
	rec.Durability = engine.Durability(d.string())
	if n := d.count(); n >= 0 {
		rec.Meta = make(map[string]string, n)
		prev := ""
		for i := range n {
			k := d.string()
			if i > 0 && k <= prev && d.err == nil {
				d.fail(errors.New("run meta keys out of order"))
			}
			rec.Meta[k], prev = d.string(), k
		}
	}
	rec.CreatedAt, rec.StartedAt, rec.EndedAt = d.time(), d.time(), d.time()
	if err := d.finish(); err != nil {
		return nil, err
	}
	return &rec, nil
}

// decodeRun decodes a run record. A large input or output comes back empty,
// named by the returned runBlobs: resolveRun fills it in, or summarize
// puts its preview in its place.
func decodeRun(b []byte) (*engine.Run, runBlobs, error) {
	var rb runBlobs
	rec, err := decodeRunRecord(b)
	if err != nil {
		return nil, rb, err
	}
	for _, f := range []struct {
		s       string
		ref     *engine.BlobRef
		inline  *[]byte
		preview *[]byte
	}{{rec.InputRef, &rb.input, &rec.Input, &rb.inputPreview}, {rec.OutputRef, &rb.output, &rec.Output, &rb.outputPreview}} {
		if f.s == "" {
			continue
		}
		ref, err := engine.ParseBlobRef(f.s)
		if err != nil {
			return nil, rb, err
		}
		// What the record holds beside a reference is the value's preview
		// (nil in a record of an older binary), not the value.
		*f.ref, *f.preview, *f.inline = ref, *f.inline, nil
	}
	r := &engine.Run{
		ID: rec.ID, Thread: rec.Thread, Agent: rec.Agent, Status: rec.Status, Bundle: rec.Bundle,
		CorrelationID: rec.CorrelationID, Input: rec.Input, Output: rec.Output, Error: rec.Error,
		Checkpoint: rec.Checkpoint, Steps: rec.Steps, Durability: rec.Durability, Meta: rec.Meta,
		CreatedAt: rec.CreatedAt, StartedAt: rec.StartedAt, EndedAt: rec.EndedAt,
	}
	for _, in := range rec.Interrupts {
		r.Interrupts = append(r.Interrupts, engine.PendingInterrupt{
			ID: in.ID, Node: in.Node, NS: in.NS, TaskID: in.TaskID, Index: in.Index, Payload: in.Payload})
	}
	for _, dr := range rec.Decisions {
		r.Decisions = append(r.Decisions, engine.DecisionRecord{
			Interrupt: dr.Interrupt, Decision: dr.Decision, Value: dr.Value, Reason: dr.Reason, By: dr.By, At: dr.At})
	}
	return r, rb, nil
}

// SummaryBytes is the largest input or output a listing with
// RunFilter.Summary returns whole: a larger one comes back as its preview.
// A model's answer is seldom longer, so list items keep their values as
// they were; a page of runs with megabytes of input each is what it
// keeps small.
const SummaryBytes = 8 << 10

// summarize fills in a listed run's out-of-line input and output: each one
// of at most SummaryBytes from its blob, as resolveRun does, and a larger
// one as its preview, marked so (engine.Run.InputTruncated), without
// reading its blob.
func summarize(r *engine.Run, rb runBlobs, blobs *blobs) error {
	whole := rb
	if rb.input.Len > SummaryBytes {
		r.Input, r.InputTruncated = rb.inputPreview, true
		whole.input = engine.BlobRef{}
	}
	if rb.output.Len > SummaryBytes {
		r.Output, r.OutputTruncated = rb.outputPreview, true
		whole.output = engine.BlobRef{}
	}
	return resolveRun(r, whole, blobs)
}

// Summarize makes r, a run that no store holds yet (one the run manager
// has opened and not stored, engine.Manager.Unstored), what a listing
// with RunFilter.Summary would return of it: an input or output over
// SummaryBytes is replaced by its preview and marked so. r is changed in
// place; its Input and Output are replaced, never modified.
func Summarize(r *engine.Run) {
	if len(r.Input) > SummaryBytes {
		r.Input, r.InputTruncated = previewOf(r.Input), true
	}
	if len(r.Output) > SummaryBytes {
		r.Output, r.OutputTruncated = previewOf(r.Output), true
	}
}

// resolveRun reads a run's out-of-line input and output from blobs.
func resolveRun(r *engine.Run, rb runBlobs, blobs *blobs) error {
	for _, f := range []struct {
		ref engine.BlobRef
		dst *json.RawMessage
	}{{rb.input, &r.Input}, {rb.output, &r.Output}} {
		if f.ref.IsZero() {
			continue
		}
		data, err := blobs.load(f.ref)
		if err != nil {
			return fmt.Errorf("run %s: blob %s: %w", r.ID, f.ref, err)
		}
		*f.dst = bytes.Clone(data)
	}
	return nil
}

func encodeJSONRecord(version byte, v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	b := beginRecord(version, len(payload))
	return seal(append(b, payload...)), nil
}

// decodeJSONRecord is strict: unknown fields and trailing data are errors,
// because a record this binary only half understands must not be trusted.
func decodeJSONRecord(b []byte, version byte, v any) error {
	payload, err := openRecord(b, version)
	if err != nil {
		return err
	}
	return decodeJSONPayload(payload, v)
}

// decodeJSONPayload decodes a record's JSON payload as strictly.
func decodeJSONPayload(payload []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errTrailing
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errTrailing
	}
	return nil
}

// Run returns one run, or engine.ErrRunNotFound.
func (d *DB) Run(ctx context.Context, id string) (*engine.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load run %s: %w", id, err)
	}
	var out *engine.Run
	err := d.view(func(tx *bbolt.Tx) error {
		v := bucket(tx, bucketRuns).Get([]byte(id))
		if v == nil {
			return engine.ErrRunNotFound
		}
		r, rb, err := decodeRun(v)
		if err != nil {
			return corrupt(bucketRuns, []byte(id), err)
		}
		if err := resolveRun(r, rb, openBlobs(tx, &d.tail, nil)); err != nil {
			return err
		}
		out = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load run %s: %w", id, err)
	}
	return out, nil
}

// runHeadFields are the fields at the head of a version 2 run record,
// aliasing it.
type runHeadFields struct{ thread, agent, status []byte }

// runHead reads the head of the run record v (ID, thread, agent and status
// come first) with nothing decoded or copied. It fails (false) for a
// record it cannot read so: version 1, a failed checksum, a head cut
// short. One whose checksum holds is as it was written, so its head can
// be trusted.
func runHead(v []byte) (runHeadFields, bool) {
	if len(v) == 0 || v[0] != runVersion {
		return runHeadFields{}, false
	}
	payload, err := openRecord(v, runVersion)
	if err != nil {
		return runHeadFields{}, false
	}
	d := decoder{b: payload}
	d.raw(d.uvarint()) // the ID
	h := runHeadFields{thread: d.raw(d.uvarint()), agent: d.raw(d.uvarint()), status: d.raw(d.uvarint())}
	return h, d.err == nil
}

// filteredOut reports whether the run record v fails f's status, agent or
// thread, read from the record's head (runHead): a filtered listing of a
// long history (one thread's runs) then decodes only the runs it returns,
// not every record it passes. A record whose head cannot be read is not
// filtered out here: the full decode reads it, or reports it as damaged.
func filteredOut(v []byte, f engine.RunFilter) bool {
	if f.Status == "" && f.Agent == "" && f.Thread == "" {
		return false
	}
	h, ok := runHead(v)
	if !ok {
		return false
	}
	return (f.Thread != "" && string(h.thread) != f.Thread) || (f.Agent != "" && string(h.agent) != f.Agent) ||
		(f.Status != "" && string(h.status) != string(f.Status))
}

// Runs lists runs in ID order (oldest first) that pass f's status, agent and
// thread, starting after f.After, at most f.Limit (0 for all). With f.Desc
// it walks the same keys backwards from the newest (run IDs are
// time-ordered), or from the last one before f.After: the newest runs of a
// long history cost what the oldest do. Runs in status queued, running or
// interrupted are listed through the unfinished index, at the cost of the
// unfinished runs alone, when the file has it (unfinished.go). With
// f.Summary, a run's input and output over SummaryBytes are left as
// their previews (summarize), and no blob of theirs is read.
func (d *DB) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var out []*engine.Run
	err := d.view(func(tx *bbolt.Tx) error {
		runs := bucket(tx, bucketRuns)
		// damaged reports a record or an index entry that cannot be read,
		// or fails the listing when f has no Damaged.
		damaged := func(err *CorruptError) error {
			if f.Damaged == nil {
				return err
			}
			f.Damaged(err.Key, err)
			return nil
		}
		// A file of version 6 or before, opened read-only, holds no index
		// this binary kept (d.noIndex): its records are walked.
		idx := bucket(tx, bucketUnfinished)
		viaIndex := idx != nil && !d.noIndex && unfinishedValue(f.Status) != nil
		var c *bbolt.Cursor
		if viaIndex {
			c = idx.Cursor()
		} else {
			c = runs.Cursor()
		}
		k, v, next := seekRuns(c, f)
		for ; k != nil; k, v = next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if viaIndex {
				st, err := decodeUnfinished(k, v)
				if err != nil {
					if err := damaged(corrupt(bucketUnfinished, k, err)); err != nil {
						return err
					}
					continue
				}
				if st != f.Status && st != unreadable {
					continue
				}
				if v = runs.Get(k); v == nil {
					if err := damaged(corrupt(bucketUnfinished, k, errNoRecord)); err != nil {
						return err
					}
					continue
				}
			}
			if probe.runRead != nil {
				probe.runRead(k)
			}
			if isOutcomeIndexKey(k) || filteredOut(v, f) {
				continue
			}
			r, rb, err := decodeRun(v)
			if err != nil {
				if err := damaged(corrupt(bucketRuns, k, err)); err != nil {
					return err
				}
				continue
			}
			// Through the index, a run whose record disagrees with its
			// entry is left to its record (db check names the entry).
			if !f.Match(r) {
				continue
			}
			resolve := resolveRun
			if f.Summary {
				resolve = summarize
			}
			if err := resolve(r, rb, openBlobs(tx, &d.tail, nil)); err != nil {
				return err
			}
			out = append(out, r)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

// seekRuns positions c, a cursor on a bucket keyed by run ID, on the first
// key f lists, and returns it with the step to the next.
func seekRuns(c *bbolt.Cursor, f engine.RunFilter) (k, v []byte, next func() ([]byte, []byte)) {
	next = c.Next
	switch {
	case f.Desc && f.After == "":
		k, v = c.Last()
		next = c.Prev
	case f.Desc:
		// Seek lands on the first key at or past After (or nothing, when
		// every key is below it): the one before it is the first below.
		if k, _ = c.Seek([]byte(f.After)); k == nil {
			k, v = c.Last()
		} else {
			k, v = c.Prev()
		}
		next = c.Prev
	case f.After == "":
		k, v = c.First()
	default:
		if k, v = c.Seek([]byte(f.After)); k != nil && string(k) == f.After {
			k, v = c.Next()
		}
	}
	return k, v, next
}
