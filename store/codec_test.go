package store

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the seed corpora under testdata/fuzz")

var tc0 = time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC)

func sampleCheckpoints() []*engine.Checkpoint {
	return []*engine.Checkpoint{
		{Thread: "t", ID: "1"},
		{
			Thread: "thread-1", NS: "parent/node:task", ID: "01J00000000000000000000002", ParentID: "01J00000000000000000000001",
			RunID: "run_1", Step: -3, Source: engine.SourceLoop, Nodes: []string{"a", ""},
			Channels: []engine.ChannelValue{
				{Channel: "messages", Version: 1 << 40, Delta: true, Value: engine.Value{Inline: []byte(`["x"]`)}},
				{Channel: "doc", Version: 2, Value: engine.Value{Blob: engine.BlobRef{Hash: 0xdeadbeef, Len: 4096}}},
				{Channel: "nil", Value: engine.Value{}},
				{Channel: "empty", Value: engine.Value{Inline: []byte{}}},
			},
			Next:    []engine.TaskSpec{{ID: "a", Node: "n"}, {ID: "b", Node: "n", Input: []byte{}}, {ID: "c", Node: "m", Input: []byte(`{"i":1}`)}},
			Created: tc0,
		},
		{Thread: "t", ID: "2", Nodes: []string{}, Channels: []engine.ChannelValue{}, Next: []engine.TaskSpec{}},
	}
}

func sampleWrites() []*engine.PendingWrite {
	return []*engine.PendingWrite{
		{},
		{TaskID: "task", Node: "n", Kind: engine.WriteKindWrites, Writes: []engine.ChannelValue{
			{Channel: "c", Version: 3, Value: engine.Value{Inline: []byte(`1`)}},
			{Channel: "d", Delta: true, Value: engine.Value{Blob: engine.BlobRef{Hash: 1, Len: 600}}},
		}},
		{TaskID: "task", Node: "n", Kind: engine.WriteKindInterrupt, Writes: []engine.ChannelValue{}, Data: json.RawMessage(`[{"id":"i"}]`)},
		{Kind: engine.WriteKindError, Data: json.RawMessage{}},
	}
}

func sampleRuns() []*engine.Run {
	return []*engine.Run{
		{ID: "r"},
		{
			ID: "run_1", Thread: "t", Agent: "a", Status: engine.StatusInterrupted,
			Bundle: engine.BundleRef{Name: "b", Version: 2, Digest: "d"}, CorrelationID: "c",
			Input: json.RawMessage(`{ "not": "compacted" }`), Output: json.RawMessage(`not even json`),
			Error: "e", Interrupts: []engine.PendingInterrupt{{ID: "i", Node: "n", NS: "ns", TaskID: "t", Index: 2, Payload: json.RawMessage(`1`)}},
			Decisions:  []engine.DecisionRecord{{Interrupt: "i", Decision: "edit", Value: json.RawMessage(`2`), Reason: "r", By: "me", At: tc0}},
			Checkpoint: "c1", Steps: 4, Durability: engine.DurabilityExit, Meta: map[string]string{"k": "v"},
			CreatedAt: tc0, StartedAt: tc0.Add(time.Second), EndedAt: tc0.Add(time.Hour),
		},
	}
}

func sampleToolCalls() []*ToolCall {
	return []*ToolCall{
		{Key: "k"},
		{Key: "run_1/3/task/0", RunID: "run_1", Node: "n", Tool: "send_sms", ArgsHash: "h",
			Args: engine.Value{Inline: []byte(`{"to":"x"}`)}, Result: engine.Value{Blob: engine.BlobRef{Hash: 9, Len: 900}},
			Error: "boom", Status: ToolCallDone, IntentAt: tc0, DoneAt: tc0.Add(time.Second)},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for i, c := range sampleCheckpoints() {
		t.Run(fmt.Sprintf("checkpoint %d", i), func(t *testing.T) {
			got, err := decodeCheckpoint(encodeCheckpoint(c))
			require.NoError(t, err)
			assert.Equal(t, c, got)
		})
	}
	for i, w := range sampleWrites() {
		t.Run(fmt.Sprintf("write %d", i), func(t *testing.T) {
			got, err := decodePendingWrite(encodePendingWrite(w))
			require.NoError(t, err)
			assert.Equal(t, w, got)
		})
	}
	for i, r := range sampleRuns() {
		t.Run(fmt.Sprintf("run %d", i), func(t *testing.T) {
			rec, blobs := encodeRun(r)
			got, rb, err := decodeRun(rec)
			require.NoError(t, err)
			// A large input or output is named, not held, by the record.
			rb.each(func(ref engine.BlobRef) {
				data, ok := blobs[ref]
				require.True(t, ok, "blob %s not handed to the commit", ref)
				if ref == rb.input {
					got.Input = data
				} else {
					got.Output = data
				}
			})
			assert.Equal(t, r, got)
		})
	}
	for i, tc := range sampleToolCalls() {
		t.Run(fmt.Sprintf("tool call %d", i), func(t *testing.T) {
			rec, err := encodeToolCall(tc)
			require.NoError(t, err)
			got, err := decodeToolCall(rec)
			require.NoError(t, err)
			assert.Equal(t, tc, got)
		})
	}
}

// decoders lists every record decoder with a valid record, for the strict
// decoding tests.
func decoders(t *testing.T) []struct {
	name   string
	valid  []byte
	decode func([]byte) error
} {
	run, _ := encodeRun(sampleRuns()[1])
	tool, err := encodeToolCall(sampleToolCalls()[1])
	require.NoError(t, err)
	return []struct {
		name   string
		valid  []byte
		decode func([]byte) error
	}{
		{"checkpoint", encodeCheckpoint(sampleCheckpoints()[1]), func(b []byte) error { _, err := decodeCheckpoint(b); return err }},
		{"write", encodePendingWrite(sampleWrites()[1]), func(b []byte) error { _, err := decodePendingWrite(b); return err }},
		{"run", run, func(b []byte) error { _, _, err := decodeRun(b); return err }},
		{"toolcall", tool, func(b []byte) error { _, err := decodeToolCall(b); return err }},
		{"blob", encodeBlob([]byte("payload"), tc0), func(b []byte) error { _, _, err := decodeBlob(b); return err }},
		{"head", encodeHead("0190f3a2b4c5d6e7"), func(b []byte) error { _, err := decodeHead(b); return err }},
	}
}

// reseal recomputes the checksum after a deliberate change, so the decoder
// sees a well-sealed record with a bad payload.
func reseal(rec []byte) []byte { return seal(bytes.Clone(rec[:len(rec)-4])) }

func TestDecodeIsStrict(t *testing.T) {
	for _, d := range decoders(t) {
		t.Run(d.name, func(t *testing.T) {
			require.NoError(t, d.decode(d.valid))

			wrongVersion := bytes.Clone(d.valid)
			wrongVersion[0] = 99
			err := d.decode(reseal(wrongVersion))
			assert.ErrorContains(t, err, "version 99")

			for i := range d.valid {
				flipped := bytes.Clone(d.valid)
				flipped[i] ^= 0x10
				assert.Error(t, d.decode(flipped), "byte %d flipped", i)
			}
			for n := range len(d.valid) {
				assert.Error(t, d.decode(d.valid[:n]), "truncated to %d bytes", n)
				// A truncated payload with a fresh checksum still fails.
				// (A blob's payload is its bytes: any length is whole.)
				if n >= 1 && n < len(d.valid)-4 && d.name != "blob" {
					assert.Error(t, d.decode(seal(bytes.Clone(d.valid[:n]))), "payload truncated to %d bytes and resealed", n-1)
				}
			}
			if d.name != "blob" {
				trailing := seal(append(bytes.Clone(d.valid[:len(d.valid)-4]), 0))
				assert.Error(t, d.decode(trailing), "trailing byte")
			}
		})
	}
}

// writeSeed writes one seed corpus file in the format of go test -fuzz.
func writeSeed(t *testing.T, fuzzName, name string, b []byte) {
	dir := filepath.Join("testdata", "fuzz", fuzzName)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
}

// TestWriteSeedCorpus refreshes the checked-in seeds with -update-corpus:
// valid records of each kind, and the edge cases that decoders must reject.
func TestWriteSeedCorpus(t *testing.T) {
	if !*updateCorpus {
		t.Skip("run with -update-corpus to rewrite testdata/fuzz")
	}
	fuzzNames := map[string]string{
		"checkpoint": "FuzzDecodeCheckpoint", "write": "FuzzDecodePendingWrite",
		"run": "FuzzDecodeRun", "toolcall": "FuzzDecodeToolCall", "blob": "FuzzDecodeBlob",
		"head": "FuzzDecodeHead",
	}
	for _, d := range decoders(t) {
		fz := fuzzNames[d.name]
		writeSeed(t, fz, "valid", d.valid)
		writeSeed(t, fz, "truncated-resealed", seal(bytes.Clone(d.valid[:len(d.valid)/2])))
		writeSeed(t, fz, "trailing-resealed", seal(append(bytes.Clone(d.valid[:len(d.valid)-4]), 0)))
	}
	for i, c := range sampleCheckpoints() {
		writeSeed(t, "FuzzDecodeCheckpoint", fmt.Sprintf("sample-%d", i), encodeCheckpoint(c))
	}
	for i, w := range sampleWrites() {
		writeSeed(t, "FuzzDecodePendingWrite", fmt.Sprintf("sample-%d", i), encodePendingWrite(w))
	}
	// A huge element count in a short record must not allocate.
	writeSeed(t, "FuzzDecodeCheckpoint", "huge-count", seal([]byte{checkpointVersion, 1, 't', 0, 1, '1', 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}))
}

// withChecksum returns b as stored, and b taken as version and payload
// with a valid checksum appended: random bytes almost never pass the CRC,
// so without the second form the fuzzer would never reach the field
// decoders.
func withChecksum(b []byte) [][]byte {
	return [][]byte{b, seal(bytes.Clone(b))}
}

func FuzzDecodeCheckpoint(f *testing.F) {
	for _, c := range sampleCheckpoints() {
		rec := encodeCheckpoint(c)
		f.Add(rec)
		f.Add(rec[:len(rec)-4])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, rec := range withChecksum(b) {
			id, parent, linkErr := decodeCheckpointLink(rec)
			c, err := decodeCheckpoint(rec)
			if err != nil {
				continue
			}
			// The walk along parent links reads what a full decode reads.
			if linkErr != nil || id != c.ID || parent != c.ParentID {
				t.Fatalf("link decode: %q %q %v, want %q %q", id, parent, linkErr, c.ID, c.ParentID)
			}
			// What decodes must survive a round trip unchanged.
			again, err := decodeCheckpoint(encodeCheckpoint(c))
			if err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			if !assert.ObjectsAreEqual(c, again) {
				t.Fatalf("round trip changed the checkpoint:\n%#v\n%#v", c, again)
			}
		}
	})
}

func FuzzDecodeHead(f *testing.F) {
	for _, id := range []string{"0190f3a2b4c5d6e7", "1", strings.Repeat("9", 300)} {
		rec := encodeHead(id)
		f.Add(rec)
		f.Add(rec[:len(rec)-4])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, rec := range withChecksum(b) {
			id, err := decodeHead(rec)
			if err != nil {
				continue
			}
			if again, err := decodeHead(encodeHead(id)); err != nil || again != id {
				t.Fatalf("round trip: %q %v, want %q", again, err, id)
			}
		}
	})
}

func FuzzDecodePendingWrite(f *testing.F) {
	for _, w := range sampleWrites() {
		rec := encodePendingWrite(w)
		f.Add(rec)
		f.Add(rec[:len(rec)-4])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, rec := range withChecksum(b) {
			w, err := decodePendingWrite(rec)
			if err != nil {
				continue
			}
			again, err := decodePendingWrite(encodePendingWrite(w))
			if err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			if !assert.ObjectsAreEqual(w, again) {
				t.Fatalf("round trip changed the write:\n%#v\n%#v", w, again)
			}
		}
	})
}

func FuzzDecodeRun(f *testing.F) {
	for _, r := range sampleRuns() {
		rec, _ := encodeRun(r)
		f.Add(rec)
		f.Add(rec[:len(rec)-4])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, rec := range withChecksum(b) {
			r, _, err := decodeRun(rec)
			if err != nil {
				continue
			}
			again, _ := encodeRun(r)
			// Encoding is canonical, so a run that survives a second trip
			// encodes to the same bytes (times compare as instants: a
			// version 1 record may carry a zone).
			r2, _, err := decodeRun(again)
			if err != nil {
				t.Fatalf("a re-encoded run does not decode: %v", err)
			}
			if third, _ := encodeRun(r2); !bytes.Equal(again, third) {
				t.Fatalf("a run changed through encode and decode:\n%+v\n%+v", r, r2)
			}
		}
	})
}

func FuzzDecodeToolCall(f *testing.F) {
	for _, tc := range sampleToolCalls() {
		rec, err := encodeToolCall(tc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(rec)
		f.Add(rec[:len(rec)-4])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, rec := range withChecksum(b) {
			tc, err := decodeToolCall(rec)
			if err != nil {
				continue
			}
			if _, err := encodeToolCall(tc); err != nil {
				t.Fatalf("a decoded tool call does not encode: %v", err)
			}
		}
	})
}

func FuzzDecodeBlob(f *testing.F) {
	f.Add(encodeBlob([]byte("payload"), tc0))
	f.Add(encodeBlob(nil, time.Time{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		data, _, err := decodeBlob(b)
		if err != nil {
			return
		}
		if len(data) > len(b) {
			t.Fatal("blob longer than its record")
		}
	})
}

func FuzzScanRefs(f *testing.F) {
	f.Add([]byte(`{"ref":"xxh64:00000000deadbeef:42"}`))
	f.Add([]byte(`xxh64:xxh64:0123456789abcdef:4294967296`))
	f.Fuzz(func(t *testing.T, b []byte) {
		scanRefs(b, func(ref engine.BlobRef) {
			if !bytes.Contains(b, []byte(fmt.Sprintf("%016x", ref.Hash))) &&
				!bytes.Contains(bytes.ToLower(b), []byte(fmt.Sprintf("%016x", ref.Hash))) {
				t.Fatalf("found %s, which b does not hold", ref)
			}
		})
	})
}

func TestScanRefs(t *testing.T) {
	a := engine.BlobRef{Hash: 0xdeadbeef, Len: 42}
	b := engine.BlobRef{Hash: 0x0123456789abcdef, Len: 7}
	tests := []struct {
		in   string
		want []engine.BlobRef
	}{
		{"", nil},
		{`{"x":"` + a.String() + `"}`, []engine.BlobRef{a}},
		{a.String() + "," + b.String(), []engine.BlobRef{a, b}},
		{"xxh64:" + b.String(), []engine.BlobRef{b}},
		{"xxh64:0123456789abcdeg:7", nil},
		{"xxh64:0123456789abcdef:", nil},
		{"xxh64:0123456789abcdef:4294967296", nil},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var got []engine.BlobRef
			scanRefs([]byte(tc.in), func(r engine.BlobRef) { got = append(got, r) })
			assert.Equal(t, tc.want, got)
		})
	}
}

// Stores written before run records were binary hold version 1 (JSON)
// records, and read them back unchanged.
func TestDecodeRunVersion1(t *testing.T) {
	want := sampleRuns()[1]
	rec, blobs := newRunRecord(want)
	require.Empty(t, blobs, "the sample run is small enough to be held whole")
	v1, err := encodeJSONRecord(runVersionJSON, &rec)
	require.NoError(t, err)
	require.Equal(t, byte(runVersionJSON), v1[0])
	got, _, err := decodeRun(v1)
	require.NoError(t, err)
	assert.Equal(t, want, got)

	v2, _ := encodeRun(want)
	assert.Equal(t, byte(runVersion), v2[0])
	assert.Less(t, len(v2), len(v1), "the binary record is the smaller")
}

func TestDecodeRunRejectsUnorderedMeta(t *testing.T) {
	r := &runRecord{ID: "r", Meta: map[string]string{"a": "1", "b": "2"}}
	rec := encodeRunRecord(r)
	// Swap the two meta entries, whose encodings have the same length,
	// and reseal.
	payload := bytes.Clone(rec[:len(rec)-4])
	i := bytes.Index(payload, []byte("\x01a\x011"))
	j := bytes.Index(payload, []byte("\x01b\x012"))
	require.True(t, i > 0 && j == i+4, "meta entries not found side by side")
	copy(payload[i:], "\x01b\x012\x01a\x011")
	_, _, err := decodeRun(seal(payload))
	require.ErrorContains(t, err, "out of order")

	_, _, err = decodeRun(rec)
	require.NoError(t, err)
}

// A store written before run records were binary holds version 1 records:
// they read, list and check as before, and the run's next commit rewrites
// its record as version 2.
func TestStoreReadsVersion1Runs(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	run := &engine.Run{ID: "run_old", Thread: "t1", Agent: "a", Status: engine.StatusRunning,
		Input: json.RawMessage(`"hello"`), CreatedAt: tc0, StartedAt: tc0}
	rec, _ := newRunRecord(run)
	v1, err := encodeJSONRecord(runVersionJSON, &rec)
	require.NoError(t, err)
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		if err := bucket(tx, bucketRuns).Put([]byte(run.ID), v1); err != nil {
			return err
		}
		return buildUnfinished(tx) // as the store's first writable open does
	}))

	got, err := d.Run(bg, run.ID)
	require.NoError(t, err)
	assert.Equal(t, run, got)
	list, err := d.Runs(bg, engine.RunFilter{})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, run, list[0])
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)

	run.Steps = 1
	require.NoError(t, d.Commit(bg, &engine.Commit{Run: run, Sync: true}))
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		assert.Equal(t, byte(runVersion), bucket(tx, bucketRuns).Get([]byte(run.ID))[0])
		return nil
	}))
	got, err = d.Run(bg, run.ID)
	require.NoError(t, err)
	assert.Equal(t, run, got)
}
