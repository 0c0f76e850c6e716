package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// foldState rebuilds a namespace's state the way the engine does, from the
// newest checkpoint along its parents: a non-null delta appends its items,
// anything else replaces the value. It is written independently of the
// store's own materialization, so it can judge it.
func foldState(t *testing.T, d *DB, thread, ns string) map[string]any {
	t.Helper()
	head, err := d.Checkpoint(bg, thread, ns, "")
	require.NoError(t, err)
	var chain []*engine.Checkpoint
	for c := head; ; {
		chain = append(chain, c)
		if c.ParentID == "" {
			break
		}
		c, err = d.Checkpoint(bg, thread, ns, c.ParentID)
		require.NoError(t, err)
	}
	vals := map[string]any{}
	for i := len(chain) - 1; i >= 0; i-- {
		for _, cv := range chain[i].Channels {
			raw := cv.Value.Inline
			if !cv.Value.Blob.IsZero() {
				raw, err = d.Blob(bg, cv.Value.Blob)
				require.NoError(t, err)
			}
			var v any
			if len(raw) > 0 {
				require.NoError(t, json.Unmarshal(raw, &v))
			}
			if cv.Delta && v != nil {
				old, _ := vals[cv.Channel].([]any)
				vals[cv.Channel] = append(append([]any{}, old...), v.([]any)...)
			} else {
				vals[cv.Channel] = v
			}
			vals[cv.Channel+"@version"] = cv.Version
		}
	}
	return vals
}

type pruneFixture struct {
	t   *testing.T
	d   *DB
	old time.Time
}

func (f *pruneFixture) blob(s string) engine.BlobRef {
	ref, err := f.d.PutBlob(bg, []byte(s))
	require.NoError(f.t, err)
	return ref
}

// big makes a JSON string longer than the blob threshold.
func big(tag string) string {
	return `"` + tag + strings.Repeat(".", engine.BlobThreshold) + `"`
}

func inline(s string) engine.Value { return engine.Value{Inline: []byte(s)} }

func (f *pruneFixture) ckpt(thread, ns, id, parent string, step int, cvs ...engine.ChannelValue) {
	c := &engine.Checkpoint{Thread: thread, NS: ns, ID: id, ParentID: parent, RunID: "run-" + thread,
		Step: step, Source: engine.SourceLoop, Nodes: []string{"n"}, Channels: cvs,
		Next: []engine.TaskSpec{{ID: "task-" + id, Node: "n"}}, Created: f.old.Add(time.Duration(step) * time.Minute)}
	require.NoError(f.t, f.d.Commit(bg, &engine.Commit{Checkpoint: c,
		Writes: []engine.CommitWrites{{Thread: thread, NS: ns, CheckpointID: id,
			Write: engine.PendingWrite{TaskID: "task-" + id, Kind: engine.WriteKindWrites,
				Writes: []engine.ChannelValue{{Channel: "count", Value: inline("1")}}}}}}))
}

func (f *pruneFixture) run(id, thread string, status engine.RunStatus, output string) {
	require.NoError(f.t, f.d.Commit(bg, &engine.Commit{Run: &engine.Run{ID: id, Thread: thread, Status: status,
		Output: json.RawMessage(output), CreatedAt: f.old}}))
}

func TestPrune(t *testing.T) {
	d := openTest(t)
	now := time.Now()
	f := &pruneFixture{t: t, d: d, old: now.Add(-48 * time.Hour)}

	docA, docB, docC := f.blob(big("docA")), f.blob(big("docB")), f.blob(big("docC"))
	bigItem := f.blob(`[` + big("item") + `]`)
	offChain := f.blob(`[` + big("offchain") + `]`)
	unreferenced := f.blob("nobody names me")
	inRunOutput := f.blob("named by a run's output")
	inToolCall := f.blob("a tool's arguments")
	nested := f.blob("named only from inside another blob")
	outer := f.blob(`{"ref":"` + nested.String() + `"` + strings.Repeat(" ", engine.BlobThreshold) + `}`)
	inBusyWrite := f.blob("a busy thread's pending write")

	// Thread "old": a main line 1..5 and a fork from 3 (6, 7), whose head 7
	// is the newest. Checkpoints 4 and 5 are off the head's chain.
	cv := func(ch string, ver uint64, delta bool, v engine.Value) engine.ChannelValue {
		return engine.ChannelValue{Channel: ch, Version: ver, Delta: delta, Value: v}
	}
	blobV := func(r engine.BlobRef) engine.Value { return engine.Value{Blob: r} }
	f.ckpt("old", "", "0001", "", 1,
		cv("messages", 1, true, inline(`["hello"]`)), cv("doc", 1, false, blobV(docA)),
		cv("log", 1, true, inline(`["a"]`)), cv("count", 1, false, inline(`1`)))
	f.ckpt("old", "", "0002", "0001", 2,
		cv("messages", 2, true, blobV(bigItem)), cv("log", 2, true, inline(`null`)))
	f.ckpt("old", "", "0003", "0002", 3,
		cv("messages", 3, true, inline(`[]`)), cv("doc", 3, false, blobV(docB)),
		cv("log", 3, true, inline(`["b"]`)), cv("outer", 3, false, blobV(outer)))
	f.ckpt("old", "", "0004", "0003", 4, cv("messages", 4, true, blobV(offChain)))
	f.ckpt("old", "", "0005", "0004", 5, cv("doc", 5, false, blobV(docC)))
	f.ckpt("old", "", "0006", "0003", 6, cv("messages", 6, true, inline(`["forked"]`)), cv("count", 6, false, inline(`2`)))
	f.ckpt("old", "", "0007", "0006", 7, cv("messages", 7, true, inline(` [ "x" , {"y":1} ] `)))
	f.ckpt("old", "sub", "0002", "", 2, cv("inner", 1, true, inline(`[1]`)))
	f.ckpt("old", "sub", "0003", "0002", 3, cv("inner", 2, true, inline(`[2,3]`)))
	f.run("run-old-1", "old", engine.StatusCompleted, `{"answer":"`+inRunOutput.String()+`"}`)
	f.run("run-old-2", "old", engine.StatusFailed, `null`)
	// The ledger keeps a large output compacted, so this outcome's blob is
	// not the run's (whose bytes keep their spaces): only the outcome names
	// it.
	f.run("run-old-3", "old", engine.StatusCompleted, `{ "long": `+big("outcome")+` }`)
	inOutcome := engine.RefOf([]byte(`{"long":` + big("outcome") + `}`))
	_, err := d.Blob(bg, inOutcome)
	require.NoError(t, err, "the outcome's output is a blob of its own")
	require.NoError(t, d.PutToolIntent(bg, "run-old-1/1/task/0", ToolCall{RunID: "run-old-1", Tool: "t", Args: blobV(inToolCall)}))

	// Thread "busy" is as old but its run is interrupted; "recent" is
	// finished but newer than the cutoff.
	f.ckpt("busy", "", "0001", "", 1, cv("doc", 1, false, blobV(docA)))
	f.ckpt("busy", "", "0002", "0001", 2, cv("count", 1, false, inline(`5`)))
	require.NoError(t, d.Commit(bg, &engine.Commit{Writes: []engine.CommitWrites{{Thread: "busy", CheckpointID: "0002",
		Write: engine.PendingWrite{TaskID: "x", Kind: engine.WriteKindWrites,
			Writes: []engine.ChannelValue{{Channel: "doc", Value: blobV(inBusyWrite)}}}}}}))
	f.run("run-busy", "busy", engine.StatusInterrupted, `null`)
	f.old = now
	f.ckpt("recent", "", "0001", "", 1, cv("count", 1, false, inline(`1`)))
	f.ckpt("recent", "", "0002", "0001", 2, cv("count", 2, false, inline(`2`)))
	f.run("run-recent", "recent", engine.StatusCompleted, `null`)

	before := map[string]map[string]any{}
	for _, key := range []string{"old/", "old/sub", "busy/", "recent/"} {
		thread, ns, _ := strings.Cut(key, "/")
		before[key] = foldState(t, d, thread, ns)
	}
	require.Equal(t, []any{"hello", strings.Trim(big("item"), `"`), "forked", "x", map[string]any{"y": 1.0}}, before["old/"]["messages"])
	require.Equal(t, []any{"b"}, before["old/"]["log"])
	headWrites, err := d.Writes(bg, "old", "", "0007")
	require.NoError(t, err)

	// Blobs put after the cutoff survive even unreferenced, so a blob a
	// node stored for a step that has not committed yet is safe.
	rep, err := d.Prune(bg, 24*time.Hour, now)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Threads, "only the old thread qualifies")
	assert.Equal(t, 0, rep.BlobsRemoved, "every blob is younger than the cutoff")
	assert.Equal(t, 2, rep.Rewritten)
	assert.Equal(t, 7, rep.CheckpointsRemoved)

	rep, err = d.Prune(bg, time.Hour, now.Add(72*time.Hour))
	require.NoError(t, err)
	t.Logf("%+v", rep)
	assert.Equal(t, 1, rep.Threads, "now the recent thread qualifies too")
	assert.Equal(t, 4, rep.BlobsRemoved, "docC, bigItem, offChain, unreferenced")

	for key, want := range before {
		thread, ns, _ := strings.Cut(key, "/")
		assert.Equal(t, want, foldState(t, d, thread, ns), "state of %s changed", key)
	}

	h, err := d.History(bg, "old", "", "", 0)
	require.NoError(t, err)
	require.Len(t, h, 1)
	head := h[0]
	assert.Equal(t, "0007", head.ID)
	assert.Equal(t, "", head.ParentID)
	assert.Equal(t, 7, head.Step)
	assert.Equal(t, []engine.TaskSpec{{ID: "task-0007", Node: "n"}}, head.Next)
	for _, cv := range head.Channels {
		assert.False(t, cv.Delta, cv.Channel)
	}
	h, err = d.History(bg, "old", "sub", "", 0)
	require.NoError(t, err)
	require.Len(t, h, 1)
	h, err = d.History(bg, "busy", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, 2, "a thread with an interrupted run keeps its history")

	ws, err := d.Writes(bg, "old", "", "0007")
	require.NoError(t, err)
	assert.Equal(t, headWrites, ws, "the kept checkpoint keeps its pending writes")
	for _, id := range []string{"0001", "0003", "0005"} {
		ws, err := d.Writes(bg, "old", "", id)
		require.NoError(t, err)
		assert.Empty(t, ws, "pending writes of dropped checkpoint %s", id)
	}

	for _, tc := range []struct {
		name  string
		ref   engine.BlobRef
		alive bool
	}{
		{"doc still current", docB, true},
		{"doc of a dropped checkpoint, still named by the busy thread", docA, true},
		{"doc of an off-chain checkpoint", docC, false},
		{"delta merged into the snapshot", bigItem, false},
		{"delta of an off-chain checkpoint", offChain, false},
		{"never referenced", unreferenced, false},
		{"named in a run's output", inRunOutput, true},
		{"a ledger outcome's output", inOutcome, true},
		{"named by a tool call", inToolCall, true},
		{"named from a live blob", nested, true},
		{"the live blob", outer, true},
		{"named by a busy thread's pending write", inBusyWrite, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Blob(bg, tc.ref)
			if tc.alive {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, engine.ErrBlobNotFound)
			}
		})
	}

	check, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, check.OK(), "%v", check.Problems)
}

func TestPruneCounts(t *testing.T) {
	d := openTest(t)
	now := time.Now()
	f := &pruneFixture{t: t, d: d, old: now.Add(-48 * time.Hour)}
	for i := 1; i <= 5; i++ {
		f.ckpt("t", "", fmt.Sprintf("%04d", i), fmt.Sprintf("%04d", i-1)[:4], i,
			engine.ChannelValue{Channel: "m", Version: uint64(i), Delta: true, Value: inline(fmt.Sprintf("[%d]", i))})
	}
	// The first checkpoint's parent "0000" does not exist: the thread is
	// skipped, not half rebuilt.
	rep, err := d.Prune(bg, time.Hour, now)
	require.NoError(t, err)
	assert.Equal(t, 0, rep.Threads)
	require.Len(t, rep.Skipped, 1)
	assert.Contains(t, rep.Skipped[0].Message, "parent 0000 is missing")

	d2 := openTest(t)
	f = &pruneFixture{t: t, d: d2, old: now.Add(-48 * time.Hour)}
	for i := 1; i <= 5; i++ {
		parent := ""
		if i > 1 {
			parent = fmt.Sprintf("%04d", i-1)
		}
		f.ckpt("t", "", fmt.Sprintf("%04d", i), parent, i,
			engine.ChannelValue{Channel: "m", Version: uint64(i), Delta: true, Value: inline(fmt.Sprintf("[%d]", i))})
	}
	rep, err = d2.Prune(bg, time.Hour, now)
	require.NoError(t, err)
	assert.Equal(t, PruneReport{Threads: 1, Rewritten: 1, CheckpointsRemoved: 4, WritesRemoved: 4}, *rep)
	c, err := d2.Checkpoint(bg, "t", "", "")
	require.NoError(t, err)
	assert.Equal(t, []engine.ChannelValue{{Channel: "m", Version: 5, Value: inline("[1,2,3,4,5]")}}, c.Channels)
}

func TestJoinArrays(t *testing.T) {
	tests := []struct{ a, b, want, err string }{
		{`[1]`, `[2]`, `[1,2]`, ""},
		{`[]`, `[2]`, `[2]`, ""},
		{` [ 1 ] `, `[ ]`, `[1]`, ""},
		{`[]`, `[]`, `[]`, ""},
		{`{"a":1}`, `[2]`, "", "not a JSON array"},
		{`[1`, `[2]`, "", "not a JSON array"},
		{`[1]`, `[2]]`, "", "not a JSON array"},
	}
	for _, tc := range tests {
		t.Run(tc.a+"+"+tc.b, func(t *testing.T) {
			got, err := joinArrays([]byte(tc.a), []byte(tc.b))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

// A short --older-than does not reach the blobs a running step may have
// stored and not yet referenced: an unreferenced blob younger than
// blobGrace stays, one older than both the grace and the cutoff goes.
func TestPruneKeepsYoungBlobsWhateverTheCutoff(t *testing.T) {
	d := openTest(t)
	young, err := d.PutBlob(bg, []byte("a model answer whose step has not committed"))
	require.NoError(t, err)

	rep, err := d.Prune(bg, time.Minute, time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Zero(t, rep.BlobsRemoved)
	_, err = d.Blob(bg, young)
	require.NoError(t, err, "a blob an hour old went with a one-minute cutoff")

	rep, err = d.Prune(bg, time.Minute, time.Now().Add(blobGrace+time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, rep.BlobsRemoved)
	_, err = d.Blob(bg, young)
	require.ErrorIs(t, err, engine.ErrBlobNotFound)
}

// Under WithProgress, Prune reports the records it has read, as Check does.
func TestPruneReportsProgress(t *testing.T) {
	defer func(n int) { progressEvery = n }(progressEvery)
	progressEvery = 3
	d := openTest(t)
	for i := 1; i <= 6; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	var seen []int
	_, err := d.Prune(WithProgress(bg, func(n int) { seen = append(seen, n) }), time.Hour, time.Now())
	require.NoError(t, err)
	require.NotEmpty(t, seen)
	for i, n := range seen {
		assert.Equal(t, 3*(i+1), n)
	}
}

// A run in exit durability that a crash cuts short before it stores
// anything leaves the records of its model calls, and their answers as
// blobs, and no run record: no recovery resumes it, and nothing collected
// them. Prune removes such records once they are as old as an
// unreferenced blob must be, and then the blobs only they named; those of
// a stored run stay, and so do a young run's, which may still be running.
func TestPruneRemovesTheCallsOfRunsLostInACrash(t *testing.T) {
	d := openTest(t)
	now := time.Now()
	call := func(run, key, answer string) engine.BlobRef {
		t.Helper()
		ref, err := d.PutBlob(bg, []byte(answer))
		require.NoError(t, err)
		require.NoError(t, d.PutToolIntent(bg, key, ToolCall{RunID: run, Tool: "model:m", ArgsHash: "h"}))
		require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: ref}}))
		return ref
	}
	require.NoError(t, d.Commit(bg, finalCommit("t1", "run_kept", engine.StatusCompleted, "0001", nil)))
	kept := call("run_kept", "model:run_kept:1:a:0", `{"text": "`+strings.Repeat("kept ", 200)+`"}`)
	lost := call("run_lost", "model:run_lost:1:b:0", `{"text": "`+strings.Repeat("lost ", 200)+`"}`)
	call("run_lost", "model:run_lost:2:c:0", `{"text": "`+strings.Repeat("also lost ", 200)+`"}`)

	rep, err := d.Prune(bg, time.Hour, now.Add(2*time.Hour))
	require.NoError(t, err)
	assert.Zero(t, rep.CallsRemoved, "within blobGrace, the run may still be running")
	// The owner's prune (through its control socket) keeps the records
	// of the runs its manager runs, however old.
	rep, err = d.prune(bg, time.Hour, now.Add(48*time.Hour), map[string]bool{"run_lost": true})
	require.NoError(t, err)
	assert.Zero(t, rep.CallsRemoved, "a run in flight")

	rep, err = d.Prune(bg, time.Hour, now.Add(48*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 2, rep.CallsRemoved)
	assert.Equal(t, 2, rep.BlobsRemoved, "the lost run's answers")
	_, err = d.ToolCall(bg, "model:run_lost:1:b:0")
	require.ErrorIs(t, err, ErrToolCallNotFound)
	_, err = d.Blob(bg, lost)
	require.ErrorIs(t, err, engine.ErrBlobNotFound)
	tc, err := d.ToolCall(bg, "model:run_kept:1:a:0")
	require.NoError(t, err)
	assert.Equal(t, kept, tc.Result.Blob)
	_, err = d.Blob(bg, kept)
	require.NoError(t, err)
	check, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, check.OK(), "%v", check.Problems)
}

// A run whose record is gone but whose checkpoints and outcome remain (db
// salvage leaves out a record it cannot read, and a page lost takes the
// records on it) was stored: its call records are the evidence of what
// its tools did, and Prune keeps them, however old.
func TestPruneKeepsTheCallsOfARunWhoseRecordIsLost(t *testing.T) {
	d := openTest(t)
	now := time.Now()
	require.NoError(t, d.Commit(bg, finalCommit("t1", "run_damaged", engine.StatusCompleted, "0001", nil)))
	ref, err := d.PutBlob(bg, []byte(`{"text": "`+strings.Repeat("sent ", 200)+`"}`))
	require.NoError(t, err)
	key := "tool:run_damaged:1:a:0"
	require.NoError(t, d.PutToolIntent(bg, key, ToolCall{RunID: "run_damaged", Tool: "send_mail", ArgsHash: "h"}))
	require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: ref}}))
	// The record is lost, as salvage loses it.
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return bucket(tx, bucketRuns).Delete([]byte("run_damaged"))
	}))

	rep, err := d.Prune(bg, time.Hour, now.Add(48*time.Hour))
	require.NoError(t, err)
	assert.Zero(t, rep.CallsRemoved, "the run was stored: its checkpoint and outcome name it")
	tc, err := d.ToolCall(bg, key)
	require.NoError(t, err)
	assert.Equal(t, ref, tc.Result.Blob)
	_, err = d.Blob(bg, ref)
	require.NoError(t, err)
}
