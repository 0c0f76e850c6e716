package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/outcomefields"
)

// finalCommit ends run id on thread with status, committing its last
// checkpoint (which sets the flags channel when flags is not nil).
func finalCommit(thread, id string, status engine.RunStatus, ckpt string, flags []string) *engine.Commit {
	cp := &engine.Checkpoint{Thread: thread, ID: ckpt, RunID: id, Created: tc0}
	if flags != nil {
		raw, _ := json.Marshal(flags)
		cp.Channels = []engine.ChannelValue{{Channel: FlagsChannel, Version: 1, Value: engine.Value{Inline: raw}}}
	}
	r := &engine.Run{ID: id, Thread: thread, Agent: "med", Status: status, CorrelationID: "corr-" + id,
		Bundle: engine.BundleRef{Name: "ref", Version: 3, Digest: "sha256:ab"}, Checkpoint: ckpt, Steps: 4,
		CreatedAt: tc0, StartedAt: tc0, EndedAt: tc0.Add(time.Second)}
	if status == engine.StatusCompleted {
		r.Output = json.RawMessage(`{"answer": "take it <now> & later"}`)
	}
	if status == engine.StatusFailed {
		r.Error = "boom"
	}
	return &engine.Commit{Checkpoint: cp, Run: r, Sync: true}
}

type eventLog struct {
	mu sync.Mutex
	ev []engine.Event
}

func (l *eventLog) Publish(evs ...engine.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, evs...)
}

func TestLedgerAppendsWithTheFinalCommit(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{ApplianceID: "clinic-7"})
	require.NoError(t, err)
	defer d.Close()

	// A tool call and a model call of the run, recorded as the call log does.
	require.NoError(t, d.PutToolIntent(bg, "r1:1:task:0", ToolCall{RunID: "r1", Tool: "lookup", ArgsHash: "h1",
		Args: engine.Value{Inline: []byte(`{"args":{"q":"x"},"decision":"allow"}`)}}))
	require.NoError(t, d.PutToolIntent(bg, "r1:2:task:0", ToolCall{RunID: "r1", Tool: "send_sms", ArgsHash: "h2",
		Args: engine.Value{Inline: []byte(`{"decision":"deny"}`)}}))
	require.NoError(t, d.PutToolIntent(bg, "r1:3:task:0", ToolCall{RunID: "r1", Tool: "schedule", ArgsHash: "h4",
		Args: engine.Value{Inline: []byte(`{"decision":"approve"}`)}}))
	require.NoError(t, d.PutToolResult(bg, "r1:3:task:0", ToolCall{Error: "open /srv/followups.jsonl: is a directory"}))
	require.NoError(t, d.PutToolIntent(bg, "model:r1:1:task:0", ToolCall{RunID: "r1", Tool: "model:m", ArgsHash: "h3"}))
	require.NoError(t, d.PutToolResult(bg, "model:r1:1:task:0", ToolCall{Result: engine.Value{Inline: []byte(`{"tokens":42}`)}}))
	// Another run's calls stay out, even one whose ID extends r1's.
	require.NoError(t, d.PutToolIntent(bg, "r10:1:task:0", ToolCall{RunID: "r10", Tool: "other", ArgsHash: "h"}))

	running := stepCommit("t1", 1)
	running.Run.ID = "r1"
	require.NoError(t, d.Commit(bg, running))
	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a running step leaves no outcome")

	final := finalCommit("t1", "r1", engine.StatusCompleted, "0002", []string{"acute"})
	require.NoError(t, d.Commit(bg, final))
	got, err = d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	o := got[0]
	assert.Equal(t, "clinic-7", o.ApplianceID)
	assert.Equal(t, uint64(1), o.Seq)
	assert.Equal(t, GenesisHash, o.PrevHash)
	assert.Equal(t, "corr-r1", o.CorrelationID)
	assert.Equal(t, engine.StatusCompleted, o.Status)
	assert.Equal(t, []string{"acute"}, o.Flags)
	assert.Equal(t, 42, o.Tokens)
	assert.Equal(t, 1, o.ModelCalls)
	assert.Equal(t, []OutcomeTool{{"lookup", "allow", "h1", false}, {"send_sms", "deny", "h2", false},
		{"schedule", "approve", "h4", true}}, o.Tools)
	vals, err := o.FieldValues()
	require.NoError(t, err)
	assert.NotContains(t, string(vals["tools"]), "followups", "the ledger keeps no tool error")
	assert.JSONEq(t, `{"answer":"take it <now> & later"}`, string(o.Output))
	h, err := o.ComputeHash()
	require.NoError(t, err)
	assert.Equal(t, h, o.Hash)
	// Announced by the commit's maker, after the commit's own events.
	require.Len(t, final.Announce, 1)
	assert.Equal(t, engine.EventOutcomeAppended, final.Announce[0].Type)
	assert.Equal(t, "r1", final.Announce[0].Run)
	assert.Empty(t, running.Announce, "a running step announces nothing")

	// The same final state committed again appends nothing.
	require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0002", []string{"acute"})))

	// An interrupted run leaves one outcome per pause, then its end; the
	// correlation id stays and each outcome names the one before.
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusInterrupted, "0003", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusInterrupted, "0003", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusCompleted, "0004", nil)))
	got, err = d.Outcomes(bg, 1, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, engine.StatusInterrupted, got[0].Status)
	assert.Equal(t, got[0].OutcomeID, got[1].CausationID)
	assert.Equal(t, got[0].CorrelationID, got[1].CorrelationID)
	assert.Equal(t, o.Hash, got[0].PrevHash)
	assert.Equal(t, got[0].Hash, got[1].PrevHash)
	assert.Equal(t, []string{}, got[1].Flags)

	st, err := d.Ledger(bg)
	require.NoError(t, err)
	assert.Equal(t, LedgerState{ApplianceID: "clinic-7", LastSeq: 3, Head: got[1].Hash}, st)
	assert.Equal(t, uint64(3), st.Backlog())

	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.Records[bucketOutcomes])
}

// A large output is kept out of line: the ledger record names its blob
// (the run's own output blob when the bytes are equal), the uplink reads
// it back whole, the hash covers it, and Check reports the blob missing.
func TestLedgerKeepsALargeOutputAsABlob(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{ApplianceID: "clinic-7"})
	require.NoError(t, err)
	output := `{"answer":` + big(strings.Repeat("long", 300)) + `}`
	c := finalCommit("t1", "r1", engine.StatusCompleted, "0001", nil)
	c.Run.Output = json.RawMessage(output)
	require.NoError(t, d.Commit(bg, c))

	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, output, string(got[0].Output))
	h, err := got[0].ComputeHash()
	require.NoError(t, err)
	assert.Equal(t, h, got[0].Hash)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	require.NoError(t, d.Close())

	ref := engine.RefOf([]byte(output))
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		rec := tx.Bucket([]byte(bucketOutcomes)).Get(seqKey(1))
		o, stored, err := decodeOutcome(rec)
		require.NoError(t, err)
		assert.Equal(t, ref, stored, "the record names the output's blob")
		assert.Empty(t, o.Output, "and does not hold the output")
		assert.Less(t, len(rec), len(output), "the record is smaller than the output alone")
		run, rb, err := decodeRun(tx.Bucket([]byte(bucketRuns)).Get([]byte("r1")))
		require.NoError(t, err)
		assert.Equal(t, ref, rb.output, "the run's output shares the blob")
		assert.Empty(t, run.Output)
		return dropBlob(t, tx, ref)
	}))
	require.NoError(t, bdb.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	rep, err = d.Check(bg)
	require.NoError(t, err)
	var msgs []string
	for _, p := range rep.Problems {
		if p.Bucket == bucketOutcomes {
			msgs = append(msgs, p.Message)
		}
	}
	assert.Equal(t, []string{"refers to missing blob " + ref.String()}, msgs)
	_, err = d.Outcomes(bg, 0, 0)
	assert.ErrorIs(t, err, engine.ErrBlobNotFound)
}

func TestLedgerFailingCommitAppendsNothing(t *testing.T) {
	d := openTest(t)
	boom := errors.New("disk on fire")
	for name, set := range map[string]func(){
		"before the transaction": func() { failpoint.beforeCommitTx = func(int) error { return boom } },
		"inside the transaction": func() { failpoint.midGroupCommit = func(int) error { return boom } },
		"applying the request":   func() { failpoint.applyRequest = func(int) error { return boom } },
	} {
		t.Run(name, func(t *testing.T) {
			setFailpoints(t, set)
			err := d.Commit(bg, finalCommit("t", "r-"+name, engine.StatusCompleted, "0001", nil))
			require.ErrorIs(t, err, boom)
			got, err := d.Outcomes(bg, 0, 0)
			require.NoError(t, err)
			assert.Empty(t, got)
			_, err = d.Run(bg, "r-"+name)
			assert.ErrorIs(t, err, engine.ErrRunNotFound, "the run and its outcome go together")
		})
	}
	// The ledger stays dense: the next outcome is seq 1.
	require.NoError(t, d.Commit(bg, finalCommit("t", "ok", engine.StatusFailed, "0001", nil)))
	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, uint64(1), got[0].Seq)
	assert.Equal(t, "boom", got[0].Error)
}

func TestLedgerConcurrentCommitsStayDense(t *testing.T) {
	d := openTest(t)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, d.Commit(bg, finalCommit(fmt.Sprintf("t%d", i), fmt.Sprintf("r%d", i), engine.StatusCompleted, "0001", nil)))
		}()
	}
	wg.Wait()
	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 200)
	prev := GenesisHash
	for i, o := range got {
		require.Equal(t, uint64(i+1), o.Seq)
		require.Equal(t, prev, o.PrevHash)
		prev = o.Hash
	}
	page, err := d.Outcomes(bg, 50, 10)
	require.NoError(t, err)
	require.Len(t, page, 10)
	assert.Equal(t, uint64(51), page[0].Seq)
}

// tamper rewrites the stored outcome seq in the file at path, re-sealing its
// envelope so only the chain can tell; rehash also fixes its own hash.
func tamper(t *testing.T, path string, seq uint64, rehash bool) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer bdb.Close()
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketOutcomes))
		o, ref, err := decodeOutcome(b.Get(seqKey(seq)))
		require.NoError(t, err)
		require.True(t, ref.IsZero(), "tamper edits inline outputs only")
		o.Status = engine.StatusCompleted
		o.Error = ""
		o.Output = json.RawMessage(`"all fine"`)
		if rehash {
			o.Hash, err = o.ComputeHash()
			require.NoError(t, err)
		}
		rec, err := encodeOutcome(o, engine.BlobRef{})
		require.NoError(t, err)
		return b.Put(seqKey(seq), rec)
	}))
}

func TestCheckNamesTheFirstBrokenLink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := range 5 {
		require.NoError(t, d.Commit(bg, finalCommit("t", fmt.Sprintf("r%d", i), engine.StatusFailed, fmt.Sprintf("%04d", i+1), nil)))
	}
	require.NoError(t, d.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		rehash bool
		want   string
	}{
		{"altered record", false, "seq 3"},
		{"altered and rehashed", true, "seq 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := filepath.Join(t.TempDir(), FileName)
			require.NoError(t, os.WriteFile(cp, raw, 0o600))
			tamper(t, cp, 3, tc.rehash)
			d, err := Open(cp, Options{})
			require.NoError(t, err)
			defer d.Close()
			rep, err := d.Check(bg)
			require.NoError(t, err)
			require.NotEmpty(t, rep.Problems)
			first := rep.Problems[0]
			assert.Equal(t, bucketOutcomes, first.Bucket)
			assert.Equal(t, tc.want, first.Key)
			assert.Contains(t, first.Message, "broken chain")
		})
	}
}

func TestAckOutcomes(t *testing.T) {
	d := openTest(t)
	require.ErrorIs(t, d.AckOutcomes(bg, 1), ErrCursorAhead)
	for i := range 3 {
		require.NoError(t, d.Commit(bg, finalCommit("t", fmt.Sprintf("r%d", i), engine.StatusCancelled, fmt.Sprintf("%04d", i+1), nil)))
	}
	require.NoError(t, d.AckOutcomes(bg, 2))
	require.NoError(t, d.AckOutcomes(bg, 1)) // never moves back
	st, err := d.Ledger(bg)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), st.AckedSeq)
	assert.Equal(t, uint64(1), st.Backlog())
	require.ErrorIs(t, d.AckOutcomes(bg, 4), ErrCursorAhead)
}

func TestApplianceID(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	minted := d.ApplianceID()
	require.True(t, strings.HasPrefix(minted, "outpost-"), minted)
	require.NoError(t, d.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	assert.Equal(t, minted, d.ApplianceID(), "kept across restarts")
	require.NoError(t, d.SetApplianceID(bg, "site-1"), "free to change while the ledger is empty")
	require.NoError(t, d.Commit(bg, finalCommit("t", "r", engine.StatusCompleted, "0001", nil)))
	require.ErrorIs(t, d.SetApplianceID(bg, "site-2"), ErrApplianceID)
	require.NoError(t, d.Close())

	_, err = Open(path, Options{ApplianceID: "site-2"})
	require.ErrorIs(t, err, ErrApplianceID)
	d, err = Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	assert.Equal(t, "site-1", d.ApplianceID())
	require.NoError(t, d.Close())
}

func FuzzDecodeOutcome(f *testing.F) {
	o := &Outcome{ApplianceID: "a", Seq: 1, OutcomeID: "oc", Status: engine.StatusCompleted,
		Tools: []OutcomeTool{{"t", "allow", "h", false}}, Flags: []string{"x"}, Output: json.RawMessage(`{"a":1}`),
		PrevHash: GenesisHash, Hash: strings.Repeat("ab", 32)}
	// The first format, JSON throughout, is still read.
	v1, err := encodeJSONRecord(outcomeVersionJSON, o)
	require.NoError(f, err)
	f.Add(v1)
	rec, err := encodeOutcome(o, engine.BlobRef{})
	require.NoError(f, err)
	f.Add(rec)
	o.Output = nil
	rec, err = encodeOutcome(o, engine.RefOf([]byte(`"a long output"`)))
	require.NoError(f, err)
	f.Add(rec)
	f.Add([]byte{outcomeVersion})
	f.Add(withChecksum([]byte{outcomeVersion, '{', '}'})[0])
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, b := range withChecksum(in) {
			fuzzOutcome(t, b)
		}
	})
}

func fuzzOutcome(t *testing.T, b []byte) {
	{
		o, ref, err := decodeOutcome(b)
		if err != nil {
			return
		}
		// Whatever decodes encodes again and decodes to the same record.
		rec, err := encodeOutcome(o, ref)
		require.NoError(t, err)
		o2, ref2, err := decodeOutcome(rec)
		require.NoError(t, err)
		require.Equal(t, ref, ref2)
		h1, err1 := o.ComputeHash()
		h2, err2 := o2.ComputeHash()
		require.Equal(t, err1 == nil, err2 == nil)
		require.Equal(t, h1, h2)
	}
}

// The final flags are read from the commit that ends the run when it holds
// them, and from the stored checkpoints otherwise; both give the same
// answer. Each case is a chain of checkpoints 0001..000n whose last ends
// the run; split says how many of them are stored before the final commit
// (the rest go into it, as Earlier and Checkpoint).
func TestFinalFlagsFromTheCommitOrTheStore(t *testing.T) {
	flagsCV := func(delta bool, v string) engine.ChannelValue {
		return engine.ChannelValue{Channel: FlagsChannel, Version: 1, Delta: delta, Value: engine.Value{Inline: []byte(v)}}
	}
	other := engine.ChannelValue{Channel: "draft", Version: 1, Value: engine.Value{Inline: []byte(`"x"`)}}
	bigFlags := `["` + strings.Repeat("f", engine.BlobThreshold) + `"]`
	cases := []struct {
		name  string
		chain [][]engine.ChannelValue
		want  []string
	}{
		{"set in the last step", [][]engine.ChannelValue{{flagsCV(false, `["old"]`)}, {flagsCV(false, `["acute"]`)}}, []string{"acute"}},
		{"set earlier", [][]engine.ChannelValue{{flagsCV(false, `["acute"]`)}, {other}, {other}}, []string{"acute"}},
		{"deltas on a value", [][]engine.ChannelValue{{flagsCV(false, `["a"]`)}, {flagsCV(true, `["b"]`)}, {other}, {flagsCV(true, `["c"]`)}}, []string{"a", "b", "c"}},
		{"never set", [][]engine.ChannelValue{{other}, {other}}, []string{}},
		{"unreadable", [][]engine.ChannelValue{{flagsCV(false, `["a"]`)}, {flagsCV(false, `{"not":"a list"}`)}}, []string{}},
		{"a blob", [][]engine.ChannelValue{{{Channel: FlagsChannel, Version: 1, Value: engine.Value{Blob: engine.RefOf([]byte(bigFlags))}}}, {other}},
			[]string{strings.Repeat("f", engine.BlobThreshold)}},
	}
	for _, tc := range cases {
		for split := 0; split < len(tc.chain); split++ {
			t.Run(fmt.Sprintf("%s/%d stored first", tc.name, split), func(t *testing.T) {
				d := openTest(t)
				blobs := map[engine.BlobRef][]byte{engine.RefOf([]byte(bigFlags)): []byte(bigFlags)}
				var cps []*engine.Checkpoint
				for i, cvs := range tc.chain {
					cp := &engine.Checkpoint{Thread: "t", ID: fmt.Sprintf("%04d", i+1), Step: i, Created: tc0, Channels: cvs}
					if i > 0 {
						cp.ParentID = cps[i-1].ID
					}
					cps = append(cps, cp)
				}
				for _, cp := range cps[:split] {
					require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: cp, Blobs: blobs}))
				}
				last := cps[len(cps)-1]
				c := &engine.Commit{Earlier: cps[split : len(cps)-1], Checkpoint: last, Blobs: blobs,
					Run: &engine.Run{ID: "r", Thread: "t", Status: engine.StatusCompleted, Checkpoint: last.ID, CreatedAt: tc0}}
				fromCommit, ok := commitFlags(c, nil, nil)
				assert.Equal(t, split == 0 || tc.name == "set in the last step" || tc.name == "unreadable", ok,
					"the commit alone tells when it holds the chain down to a value")
				if ok {
					assert.Equal(t, tc.want, fromCommit)
				}
				fromTrail, ok := commitFlags(c, &d.trail, nil)
				assert.Equal(t, split == 0 || tc.name != "a blob", ok,
					"the commit and the trail tell, unless the walk needs a flags blob stored before")
				if ok {
					assert.Equal(t, tc.want, fromTrail)
				}
				require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
					for _, trail := range []*flagTrail{nil, &d.trail} {
						withStored, ok := commitFlags(c, trail, openBlobs(tx, &d.tail, nil))
						assert.True(t, ok, "the commit and the checkpoints stored before it tell")
						assert.Equal(t, tc.want, withStored)
					}
					return nil
				}))
				require.NoError(t, d.Commit(bg, c))
				require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
					assert.Equal(t, tc.want, finalFlags(openBlobs(tx, &d.tail, nil), c.Run), "read from the store")
					return nil
				}))
				got, err := d.Outcomes(bg, 0, 0)
				require.NoError(t, err)
				require.Len(t, got, 1)
				assert.Equal(t, tc.want, got[0].Flags)
			})
		}
	}
}

// A ledger written in the first record format (JSON throughout) reads and
// chains on: new outcomes follow its last hash, and Check verifies both.
func TestLedgerReadsTheFirstRecordFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{ApplianceID: "clinic-7"})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0001", []string{"acute"})))
	require.NoError(t, d.Close())
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketOutcomes))
		o, ref, err := decodeOutcome(b.Get(seqKey(1)))
		require.NoError(t, err)
		require.True(t, ref.IsZero())
		v1, err := encodeJSONRecord(outcomeVersionJSON, o)
		require.NoError(t, err)
		return b.Put(seqKey(1), v1)
	}))
	require.NoError(t, bdb.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusFailed, "0002", nil)))
	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, []string{"acute"}, got[0].Flags)
	assert.Equal(t, got[0].Hash, got[1].PrevHash)
	assert.Equal(t, uint64(2), got[1].Seq)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
	st, err := d.Ledger(bg)
	require.NoError(t, err)
	assert.Equal(t, got[1].Hash, st.Head)
}

// The ledger builds each field's canonical JSON (for digests and record
// bodies) field by field. Checked here against encoding/json's encoding of
// the whole struct, whose tags name the fields, and against the record
// body's decoding.
func TestOutcomeFieldJSONMatchesTheStruct(t *testing.T) {
	o := &Outcome{ApplianceID: "clinic <7>", Seq: 42, OutcomeID: "oc_1", CorrelationID: "corr & co", CausationID: "oc_0",
		Thread: "t\u2028", Run: "r1", Agent: "med", Bundle: engine.BundleRef{Name: "ref", Version: 3, Digest: "sha256:ab"},
		Status: engine.StatusCompleted, StartedAt: tc0, EndedAt: tc0.Add(time.Second), Steps: 6, Tokens: 7, ModelCalls: 2,
		Tools: []OutcomeTool{{"lookup", "allow", "h", false}, {"schedule", "approve", "h2", true}}, Flags: []string{"acute"}, Output: json.RawMessage(`{"a": "<b>"}`),
		Error: "boom", PrevHash: GenesisHash, Hash: strings.Repeat("cd", 32)}
	whole, err := json.Marshal(o)
	require.NoError(t, err)
	var byName map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(whole, &byName))
	vals, err := o.FieldValues()
	require.NoError(t, err)
	require.Len(t, vals, len(OutcomeFields))
	for _, f := range OutcomeFields {
		assert.Equal(t, string(byName[f]), string(vals[f]), f)
	}

	for _, ref := range []engine.BlobRef{{}, engine.RefOf([]byte(`"out of line"`))} {
		body, err := encodeOutcomeBody(o, ref)
		require.NoError(t, err)
		var rec outcomeRecord
		require.NoError(t, decodeJSONPayload(body, &rec))
		want := *o
		want.Seq, want.PrevHash, want.Hash = 0, "", ""
		if !ref.IsZero() {
			want.Output = json.RawMessage("null")
			assert.Equal(t, ref.String(), rec.OutputBlob)
		} else {
			want.Output = json.RawMessage(byName["output"])
		}
		assert.Equal(t, want, rec.Outcome)
	}
}

// firmware checks a bundle's redaction fields against outcomefields.Names,
// as it may not import store: that list is OutcomeFields, and both are the
// record's JSON members but the two of the chain. A field added to the
// record, or renamed, without the list would be refused in every policy
// that names it, or let through in one that no outcome can match.
func TestOutcomeFieldsAreTheNamesBundlesAreCheckedAgainst(t *testing.T) {
	require.Equal(t, OutcomeFields, outcomefields.Names)
	whole, err := json.Marshal(&Outcome{})
	require.NoError(t, err)
	var byName map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(whole, &byName))
	delete(byName, "prev_hash")
	delete(byName, "hash")
	members := make([]string, 0, len(byName))
	for k := range byName {
		members = append(members, k)
	}
	require.ElementsMatch(t, members, outcomefields.Names)
}

// FieldValues encodes without reflection; whatever the values, it must
// give encoding/json's bytes, which the outcome hash is defined by.
func FuzzOutcomeFieldsMatchEncodingJSON(f *testing.F) {
	f.Add("clinic <7>", "t\u2028", "\xff", `"plain output"`, uint64(42), int64(3), int64(-1), true)
	f.Add("", "", "", `{"a": "<b>"}`, uint64(0), int64(0), int64(1<<40), false)
	f.Add("a\"b", "\\", "\n", `"bad \q"`, uint64(1), int64(-5), int64(0), true)
	f.Fuzz(func(t *testing.T, s1, s2, s3, output string, seq uint64, n, ver int64, lists bool) {
		o := &Outcome{ApplianceID: s1, Seq: seq, OutcomeID: s2, CorrelationID: s3, CausationID: s1 + s2,
			Thread: s2, Run: s3, Agent: s1, Bundle: engine.BundleRef{Name: s2, Version: ver, Digest: s3},
			Status: engine.RunStatus(s3), StartedAt: time.Unix(n%(1<<35), n%1e9).UTC(), EndedAt: time.Unix(0, n).In(time.FixedZone("x", 3600)),
			Steps: int(n), Tokens: int(ver), ModelCalls: int(n ^ ver), Output: json.RawMessage(output), Error: s1}
		if lists {
			o.Tools = []OutcomeTool{{s1, s2, s3, n%2 == 0}, {}}
			o.Flags = []string{s3, "", s1}
		} else if n%2 == 0 {
			o.Tools, o.Flags = []OutcomeTool{}, []string{}
		}
		if output == "" && n%3 == 0 {
			o.Output = nil
		}
		whole, wantErr := json.Marshal(o)
		vals, err := o.FieldValues()
		if wantErr != nil {
			if err == nil {
				t.Fatalf("encoding/json refuses %+v (%v), FieldValues does not", o, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("FieldValues: %v, encoding/json encodes %+v", err, o)
		}
		var byName map[string]json.RawMessage
		if err := json.Unmarshal(whole, &byName); err != nil {
			t.Fatal(err)
		}
		for _, name := range OutcomeFields {
			if string(byName[name]) != string(vals[name]) {
				t.Fatalf("%s: %s, encoding/json gives %s", name, vals[name], byName[name])
			}
		}
	})
}

// Before version 6 each run's outcome index had a bucket of its own. Such a
// file reads as it is, and its first writable open moves the index beside
// the run records, where the next commits find it.
func TestOpenMigratesTheOutcomeIndex(t *testing.T) {
	for _, old := range []string{"4", "5"} {
		t.Run(old, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			d, err := Open(path, Options{})
			require.NoError(t, err)
			require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0001", nil)))
			require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusInterrupted, "0002", nil)))
			// What an older binary would have written.
			require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
				outcomeIndexOfVersion5(t, tx, "r1", "r2")
				return bucket(tx, bucketMeta).Put(metaVersion, []byte(old))
			}))
			require.NoError(t, d.Close())
			layout := func(d *DB) (version string, legacy, moved int) {
				require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
					version = string(bucket(tx, bucketMeta).Get(metaVersion))
					if b := tx.Bucket([]byte(bucketOutcomeRuns)); b != nil {
						legacy = b.Stats().KeyN
					}
					return bucket(tx, bucketRuns).ForEach(func(k, _ []byte) error {
						if isOutcomeIndexKey(k) {
							moved++
						}
						return nil
					})
				}))
				return version, legacy, moved
			}

			ro, err := Open(path, Options{ReadOnly: true})
			require.NoError(t, err)
			rep, err := ro.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
			assert.Equal(t, 2, rep.Records[bucketOutcomeRuns])
			assert.Equal(t, 2, rep.Records[bucketRuns])
			v, legacy, moved := layout(ro)
			assert.Equal(t, []any{old, 2, 0}, []any{v, legacy, moved}, "a read-only open changes nothing")
			require.NoError(t, ro.Close())

			d, err = Open(path, Options{})
			require.NoError(t, err)
			defer d.Close()
			v, legacy, moved = layout(d)
			assert.Equal(t, []any{strconv.Itoa(formatVersion), 0, 2}, []any{v, legacy, moved})
			runs, err := d.Runs(bg, engine.RunFilter{})
			require.NoError(t, err)
			require.Len(t, runs, 2, "the index entries are not runs")
			assert.Equal(t, []string{"r1", "r2"}, []string{runs[0].ID, runs[1].ID})
			rep, err = d.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
			assert.Equal(t, 2, rep.Records[bucketOutcomeRuns])
			assert.Equal(t, 2, rep.Records[bucketRuns])

			// The moved index still dedupes and chains: r1's end again
			// appends nothing, and r2's end names its pause as its cause.
			require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0001", nil)))
			require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusCompleted, "0003", nil)))
			got, err := d.Outcomes(bg, 0, 0)
			require.NoError(t, err)
			require.Len(t, got, 3)
			assert.Equal(t, []string{"r1", "r2", "r2"}, []string{got[0].Run, got[1].Run, got[2].Run})
			assert.Equal(t, got[1].OutcomeID, got[2].CausationID)
			_, legacy, moved = layout(d)
			assert.Equal(t, []int{0, 2}, []int{legacy, moved})
		})
	}
}

// A run's outcome index entry sorts right after the run's record, so a
// run's end rewrites one leaf of the runs bucket for both.
func TestOutcomeIndexSortsBesideItsRun(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, finalCommit("t1", "r1", engine.StatusCompleted, "0001", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "r2", engine.StatusCompleted, "0002", nil)))
	var keys []string
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		return bucket(tx, bucketRuns).ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil })
	}))
	assert.Equal(t, []string{"r1", "r1\x00o", "r2", "r2\x00o"}, keys)
}

// The chain's preimage is part of the uplink's contract: a collector
// recomputes it. This spells it out by hand, field by field.
func TestOutcomeHashPreimage(t *testing.T) {
	digests := map[string]string{}
	var pre strings.Builder
	pre.WriteString("outpost-outcome/1\nprev_hash=p0\n")
	for i, f := range []string{
		"appliance_id", "seq", "outcome_id", "correlation_id", "causation_id", "thread", "run", "agent",
		"bundle", "status", "started_at", "ended_at", "steps", "tokens", "model_calls", "tools", "flags",
		"output", "error",
	} {
		digests[f] = FieldDigest(fmt.Appendf(nil, "v%02d", i))
		fmt.Fprintf(&pre, "%s=%s\n", f, digests[f])
	}
	sum := sha256.Sum256([]byte(pre.String()))
	got, err := OutcomeHash("p0", digests)
	require.NoError(t, err)
	assert.Equal(t, hex.EncodeToString(sum[:]), got)

	upper := strings.ToUpper(digests["tools"])
	digests["tools"] = upper
	_, err = OutcomeHash("p0", digests)
	assert.ErrorContains(t, err, "the digest of field tools is not 64 lowercase hex digits")

	delete(digests, "tools")
	_, err = OutcomeHash("p0", digests)
	assert.ErrorContains(t, err, "no digest for field tools")
}
