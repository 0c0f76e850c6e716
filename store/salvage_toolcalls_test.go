package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// toolCallsFixture writes a store of threads whose runs are still
// running, ten steps each, each step of which called a tool (an intent,
// then its result), enough of them that the tool calls fill pages of their
// own. last, run on the open store, makes the newest transaction. It
// returns the file's bytes.
func toolCallsFixture(t *testing.T, threads int, last func(d *DB)) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	args := engine.Value{Inline: []byte(`"` + strings.Repeat("a", 300) + `"`)}
	for i := 1; i <= 10*threads; i++ {
		th := fmt.Sprintf("t%d", i%threads)
		require.NoError(t, d.Commit(bg, stepCommit(th, i)))
		key := fmt.Sprintf("run-%s:%d:task:0", th, i)
		require.NoError(t, d.PutToolIntent(bg, key, ToolCall{RunID: "run-" + th, Node: "n", Tool: "send_letter", ArgsHash: "h", Args: args}))
		require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Inline: []byte(`"sent"`)}}))
	}
	last(d)
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// clearNewestRoot clears the root page that the newest meta page of the
// store file b names, and returns the older meta page's transaction.
func clearNewestRoot(b []byte) uint64 {
	ps := int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
	newest, older := readMeta(b), readMeta(b[ps:])
	if older.txid > newest.txid {
		newest, older = older, newest
	}
	clear(b[int(newest.root)*ps : int(newest.root+1)*ps])
	return older.txid
}

// When the newest transaction's root page is lost, salvage copies the
// older meta page's tree, whose runs serve resumes. A tool-call record
// that the lost transaction wrote is kept: an intent (the tool may have
// run since) or a result. Before, it was left out with the rest of that
// transaction, and a resumed run, finding no record under the call's key,
// called the tool again without asking.
func TestSalvageKeepsTheToolCallsOfALostTransaction(t *testing.T) {
	args := engine.Value{Inline: []byte(`"` + strings.Repeat("b", 300) + `"`)}
	for _, tc := range []struct {
		name string
		last func(t *testing.T, d *DB)
		want ToolCallStatus
	}{
		{"an intent with no result", func(t *testing.T, d *DB) {
			require.NoError(t, d.PutToolIntent(bg, "run-t1:31:task:0", ToolCall{RunID: "run-t1", Node: "n", Tool: "send_letter", ArgsHash: "h2", Args: args}))
		}, ToolCallIntent},
		{"the result of an older intent", func(t *testing.T, d *DB) {
			require.NoError(t, d.PutToolIntent(bg, "run-t1:31:task:0", ToolCall{RunID: "run-t1", Node: "n", Tool: "send_letter", ArgsHash: "h2", Args: args}))
			require.NoError(t, d.PutToolResult(bg, "run-t1:31:task:0", ToolCall{Result: engine.Value{Inline: []byte(`"sent"`)}}))
		}, ToolCallDone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := toolCallsFixture(t, 3, func(d *DB) { tc.last(t, d) })
			older := clearNewestRoot(b)
			dst := filepath.Join(t.TempDir(), "salvaged.db")
			rep, err := Salvage(bg, writeStore(t, b), dst)
			require.NoError(t, err)
			require.Equal(t, older, rep.TxID, "the walk did not fall back to the older tree")
			assert.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
			assert.Equal(t, 1, rep.Unlinked[bucketToolCalls], "%v", rep.Unlinked)

			d, err := Open(dst, Options{})
			require.NoError(t, err)
			defer d.Close()
			// serve resumes the run, and its tool loop finds the record under
			// the call's key: a result to reuse, or an intent to ask about.
			r, err := d.Run(bg, "run-t1")
			require.NoError(t, err)
			assert.Equal(t, engine.StatusRunning, r.Status)
			call, err := d.ToolCall(bg, "run-t1:31:task:0")
			require.NoError(t, err, "the tool call of the lost transaction is not in the copy")
			assert.Equal(t, tc.want, call.Status)
			assert.Equal(t, "h2", call.ArgsHash)
			calls, err := d.ToolCalls(bg, "run-")
			require.NoError(t, err)
			assert.Len(t, calls, 31)
		})
	}
}

// A run that comes back unfinished from a store whose root pages are lost
// is copied as failed, so nothing resumes it to ask a person about a tool
// call it recorded the intent of and no result, as recovery would; and a
// new run on a fork of its thread calls the tool again under a key of its
// own, without asking. Salvage names each such call, with its run and
// tool. Before, the report said nothing of it.
func TestSalvageNamesTheOpenToolCallsOfTheRunsItFails(t *testing.T) {
	args := engine.Value{Inline: []byte(`"` + strings.Repeat("b", 300) + `"`)}
	b := toolCallsFixture(t, 3, func(d *DB) {
		require.NoError(t, d.PutToolIntent(bg, "run-t1:31:task:0", ToolCall{RunID: "run-t1", Node: "n", Tool: "send_letter", ArgsHash: "h2", Args: args}))
	})
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, stepsCopy(t, b, true), dst)
	require.NoError(t, err)
	assert.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	d, err := Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	r, err := d.Run(bg, "run-t1")
	require.NoError(t, err, "the run did not come back")
	require.Equal(t, engine.StatusFailed, r.Status)
	call, err := d.ToolCall(bg, "run-t1:31:task:0")
	require.NoError(t, err, "the intent did not come back")
	require.Equal(t, ToolCallIntent, call.Status)

	// The calls named; each run copied as failed is also said to have
	// made, perhaps, calls that cannot be named (its ID and a colon).
	var named []string
	for _, p := range rep.Lost {
		if p.Bucket == bucketToolCalls && !strings.HasSuffix(p.Key, ":") {
			named = append(named, p.Key)
		}
	}
	assert.Equal(t, []string{renderKey(bucketToolCalls, []byte("run-t1:31:task:0"))}, named, "%v", rep.Lost)
	assert.Contains(t, rep.Lost, Problem{Bucket: bucketToolCalls, Key: renderKey(bucketToolCalls, []byte("run-t1:31:task:0")),
		Message: "run run-t1, copied as failed, called tool send_letter and recorded no result: the tool may have run. " +
			"Nothing resumes the run to ask about it, and a new run on a fork of its thread calls the tool again without " +
			"asking: find out whether it took effect before going on"})
}

// A run that the walk reads as running, but some of whose tool-call
// records may be lost with a page that cannot be read, is copied as
// failed, with its outcome: resumed, it would find no record under a lost
// call's key and call the tool again without asking. The runs whose
// records lie on no lost page are left to be resumed. Before, every such
// run was copied as running.
func TestSalvageHoldsTheRunsWhoseToolCallsAreLost(t *testing.T) {
	path := writeStore(t, toolCallsFixture(t, 6, func(*DB) {}))
	d, err := Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	compacted := filepath.Join(t.TempDir(), "compacted.db")
	require.NoError(t, d.Compact(bg, compacted))
	require.NoError(t, d.Close())
	want := records(t, compacted)
	id, ps := pageOf(t, compacted, bucketToolCalls)
	b, err := os.ReadFile(compacted)
	require.NoError(t, err)
	clear(b[int(id)*ps : int(id+1)*ps])

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, writeStore(t, b), dst)
	require.NoError(t, err)
	assert.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	got := records(t, dst)
	// A run has lost calls when a record under its ID did not come back.
	lostCalls := map[string]bool{}
	for k := range want[bucketToolCalls] {
		if _, ok := got[bucketToolCalls][k]; !ok {
			lostCalls[k[:strings.IndexByte(k, ':')]] = true
		}
	}
	require.NotEmpty(t, lostCalls, "no tool-call record was lost")

	c, err := Open(dst, Options{})
	require.NoError(t, err)
	defer c.Close()
	held := 0
	for th := range 6 {
		r, err := c.Run(bg, fmt.Sprintf("run-t%d", th))
		require.NoError(t, err)
		if r.Status == engine.StatusRunning {
			assert.False(t, lostCalls[r.ID], "run %s lost calls, but would be resumed", r.ID)
			continue
		}
		assert.Equal(t, engine.StatusFailed, r.Status)
		assert.True(t, strings.HasPrefix(r.Error, "salvage: "), r.Error)
		held++
	}
	assert.Less(t, held, 6, "runs whose calls lie on no lost page are not resumed")
	assert.Equal(t, held, rep.OutcomesAppended)
}

// A store with few tool-call records keeps them in its root page: lost
// with it, they are gone whole, and salvage can name none of the calls of
// the runs it copies. Salvage says plainly, of each run copied as failed,
// that it may have called tools that cannot be named, and of each run that
// waits for a person, that resuming it runs again the node it paused in,
// which asks a person before it calls again a tool whose record is lost.
// Neither is resumed at start. The run that waits is marked
// (MetaCallsLostThrough) as one whose every step may repeat a call whose
// record is lost (CallsLostInAnyStep): with the root page, its newest
// record and its thread's newest checkpoints may be lost, and nothing
// tells how far it got; the runs copied as failed, which nothing resumes,
// are not. Before, the report named no call of
// them, and read as though they had made none, and nothing marked the run
// that waits, whose resumed node called the tool again without asking.
func TestSalvageSaysTheToolCallsLostWithTheRoot(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 40; i++ {
		require.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%d", i%3), i)))
	}
	call := ToolCall{Node: "n", Tool: "send_letter", ArgsHash: "h", Args: engine.Value{Inline: []byte(`"to the pharmacy"`)}}
	// run-t0 called the tool, then paused for a person in the same node;
	// its payload is large enough that the runs bucket has a page of its
	// own rather than live in the root page.
	call.RunID = "run-t0"
	require.NoError(t, d.PutToolIntent(bg, "run-t0:39:task:0", call))
	require.NoError(t, d.PutToolResult(bg, "run-t0:39:task:0", ToolCall{Result: engine.Value{Inline: []byte(`"sent"`)}}))
	payload := json.RawMessage(`"` + strings.Repeat("x", 3000) + `"`)
	require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-t0", Thread: "t0", Status: engine.StatusInterrupted,
		Checkpoint: "0039", Steps: 13, Interrupts: []engine.PendingInterrupt{{ID: "i", Node: "n", TaskID: "task", Payload: payload}}}}))
	// run-t1 recorded its intent, and no result: the tool may have run.
	call.RunID = "run-t1"
	require.NoError(t, d.PutToolIntent(bg, "run-t1:40:task:0", call))
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		require.Zero(t, tx.Bucket([]byte(bucketToolCalls)).Root(), "the tool calls have a page of their own")
		return nil
	}))
	require.NoError(t, db.Close())

	// A compacted copy of the store holds no older root page to find them on.
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, stepsCopy(t, b, false), dst)
	require.NoError(t, err)
	assert.Empty(t, records(t, dst)[bucketToolCalls], "tool-call records came back")
	said := func(key, text string) bool {
		return slices.ContainsFunc(rep.Lost, func(p Problem) bool {
			return p.Bucket == bucketToolCalls && p.Key == renderKey(bucketToolCalls, []byte(key)) && strings.Contains(p.Message, text)
		})
	}
	c, err := Open(dst, Options{})
	require.NoError(t, err)
	defer c.Close()
	for _, id := range []string{"run-t1", "run-t2"} {
		r, err := c.Run(bg, id)
		require.NoError(t, err)
		assert.Equal(t, engine.StatusFailed, r.Status, "run %s would be resumed", id)
		assert.True(t, said(id+":", "copied as failed, may have made tool calls whose records are lost, with the root page"),
			"the report does not say that run %s's calls cannot be named: %v", id, rep.Lost)
		assert.NotContains(t, r.Meta, MetaCallsLostThrough, "run %s, which nothing resumes, is marked", id)
	}
	r, err := c.Run(bg, "run-t0")
	require.NoError(t, err)
	assert.Equal(t, engine.StatusInterrupted, r.Status)
	assert.True(t, said("run-t0:", "each call it makes of a tool not declared idempotent that has no record, in any step, "+
		"waits for a person's decision (uncertain_side_effect)"), "the report does not say what resuming run-t0 does: %v", rep.Lost)
	assert.Equal(t, "0039", r.Checkpoint)
	assert.Equal(t, CallsLostInAnyStep, r.Meta[MetaCallsLostThrough], "the run that waits is not marked: %v", r.Meta)
	through, err := c.CallsLostThrough(bg, "run-t0")
	require.NoError(t, err)
	assert.Equal(t, CallsLostInAnyStep, through, "the copy does not answer with the mark")
	assert.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	running, err := c.Runs(bg, engine.RunFilter{Status: engine.StatusRunning})
	require.NoError(t, err)
	assert.Empty(t, running, "runs that serve would resume at start")
}
