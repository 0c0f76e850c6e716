package crashtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// holdingTool counts its calls. Once hold is set, the next call counts and
// then waits on release, with its side effect done and its result not yet
// recorded: the moment a crash leaves an intent without a result.
type holdingTool struct {
	calls   atomic.Int32
	hold    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (h *holdingTool) Call(context.Context, json.RawMessage, string) (json.RawMessage, error) {
	h.calls.Add(1)
	if h.hold.CompareAndSwap(true, false) {
		h.held <- struct{}{}
		<-h.release
	}
	return json.RawMessage(`{"appended":true}`), nil
}

// A store whose newest transaction, a tool call's intent, loses its root
// page is salvaged from the older tree, and its run, still running there,
// is resumed as after a crash: the tool loop finds the intent with no
// result and asks a person (uncertain_side_effect) instead of calling the
// tool again. Before, the intent was left out with the rest of the lost
// transaction, and the resumed run called the tool a second time.
func TestSalvagedRunAsksAboutAToolCallOfALostTransaction(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	tool := &holdingTool{held: make(chan struct{}), release: make(chan struct{})}
	ag, err := toolAgent(db, tool)
	require.NoError(t, err)
	resolve := func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }
	m := engine.NewManager(db, resolve, engine.ManagerOptions{Workers: 1})
	// Turns that end give the call records pages of their own, outside
	// the root page.
	for i := range 4 {
		input, _ := json.Marshal(fmt.Sprintf("note %d", i))
		run, err := m.Invoke(ctx, engine.RunRequest{Thread: "w", Agent: "writer", Input: input, WaitForThread: true})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, run.Status, run.Error)
	}
	started, image := imageInToolCall(t, dir, db, m, tool)

	// bbolt's meta page: a 16-byte page header, then the page size at 8,
	// the root page at 16 and the transaction at 48.
	le := binary.LittleEndian
	ps := int(le.Uint32(image[16+8:]))
	root := func(meta []byte) (txid, page uint64) { return le.Uint64(meta[16+48:]), le.Uint64(meta[16+16:]) }
	tx0, root0 := root(image)
	tx1, root1 := root(image[ps:])
	newest := root0
	if tx1 > tx0 {
		newest = root1
	}
	clear(image[int(newest)*ps : int(newest+1)*ps])
	damaged := filepath.Join(t.TempDir(), store.FileName)
	require.NoError(t, os.WriteFile(damaged, image, 0o600))
	copyDir := t.TempDir()
	rep, err := store.Salvage(ctx, damaged, filepath.Join(copyDir, store.FileName))
	require.NoError(t, err)
	require.True(t, rep.Check.OK(), "%v", rep.Check.Problems)

	db, err = store.OpenDir(copyDir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	tool = &holdingTool{}
	ag, err = toolAgent(db, tool)
	require.NoError(t, err)
	m = engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, engine.ManagerOptions{Workers: 1})
	defer m.Close()
	n, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the run the copy holds as running was not resumed")
	run, err := m.Wait(ctx, started.ID)
	require.NoError(t, err)
	assert.Zero(t, tool.calls.Load(), "the resumed run called the tool again")
	require.Equal(t, engine.StatusInterrupted, run.Status, "%s %s", run.Status, run.Error)
	require.Len(t, run.Interrupts, 1)
	var ti agent.ToolInterrupt
	require.NoError(t, json.Unmarshal(run.Interrupts[0].Payload, &ti))
	assert.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason)
}

// imageInToolCall starts a run of agent "writer" on thread "w" with m,
// whose tool is tool, and returns it with the bytes of the store file in
// dir while the tool holds its call: the intent is committed, and the
// tool has done its work, so that what the file holds is what a power cut
// leaves. The run then goes on to its end, and m and db are closed.
func imageInToolCall(t *testing.T, dir string, db *store.DB, m *engine.Manager, tool *holdingTool) (*engine.Run, []byte) {
	t.Helper()
	tool.hold.Store(true)
	input, _ := json.Marshal("the letter")
	return imageWhileHeld(t, dir, db, m, engine.RunRequest{Thread: "w", Agent: "writer", Input: input}, tool.held,
		func() { close(tool.release) })
}

// imageWhileHeld starts the run req asks for with m, and returns it with
// the bytes of the store file in dir once held is sent on (a tool holds a
// call, as imageInToolCall's does). It then calls release, waits for the
// run to end, and closes m and db.
func imageWhileHeld(t *testing.T, dir string, db *store.DB, m *engine.Manager, req engine.RunRequest, held <-chan struct{}, release func()) (*engine.Run, []byte) {
	t.Helper()
	ctx := context.Background()
	started, err := m.Start(ctx, req)
	require.NoError(t, err)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the tool was not called")
	}
	image, err := os.ReadFile(filepath.Join(dir, store.FileName))
	require.NoError(t, err)
	release()
	_, err = m.Wait(ctx, started.ID)
	require.NoError(t, err)
	m.Close()
	require.NoError(t, db.Close())
	return started, image
}

// countingTool counts the times it runs: its side effects.
type countingTool struct{ calls atomic.Int32 }

func (c *countingTool) Call(context.Context, json.RawMessage, string) (json.RawMessage, error) {
	c.calls.Add(1)
	return json.RawMessage(`{"done":true}`), nil
}

// letterAgent's node asks the model, which calls record_dose (the tool
// under test, idempotent as declared) and then send_letter, a write tool
// that waits for a person's approval: the run pauses in the node after
// record_dose has run.
func letterAgent(db *store.DB, idempotent bool, dose, letter agent.Tool) (*engine.Agent, error) {
	return loopAgent(db, letterSpec(idempotent, dose, letter))
}

// letterSpec is letterAgent's node, with its notes.
func letterSpec(idempotent bool, dose, letter agent.Tool) loopSpec {
	return loopSpec{name: "letters",
		tools: []policy.Tool{
			{Name: "record_dose", Kind: policy.KindWrite, Idempotent: idempotent, Description: "record a dose"},
			{Name: "send_letter", Kind: policy.KindWrite, Description: "send a letter"}},
		script: `[
	 {"when_no_tool_result": true, "tool_calls": [
	   {"name": "record_dose", "arguments": {"v": "metformin"}},
	   {"name": "send_letter", "arguments": {"v": "to the pharmacy"}}]},
	 {"when_tool_result": true, "respond": "done: {{context}}"}]`,
		impls: map[string]agent.Tool{"record_dose": dose, "send_letter": letter},
		rules: []policy.ApprovalRule{{Tool: "record_dose", Decision: policy.DecisionAllow},
			{Tool: "send_letter", Decision: policy.DecisionAsk}},
		// Notes kept inline in the checkpoint (each below engine's blob
		// threshold) make the run's checkpoint too large for the recent
		// bucket, which lives in the root page (bbolt keeps a bucket of at
		// most a quarter page inline): it is stored where it outlives the
		// root page.
		extra: notes,
	}
}

// notes declares channels, and returns the writes that fill them: notes
// kept inline in a checkpoint (each below engine's blob threshold), which
// make it too large for the recent bucket.
func notes(b *engine.Builder) []engine.Write {
	return noted(noteChannels(b, store.DefaultPageSize/4), "n")
}

// noteChannels declares the channels of notes that fill more than size
// bytes.
func noteChannels(b *engine.Builder, size int) []engine.Chan[string] {
	var cs []engine.Chan[string]
	for i := range size/(engine.BlobThreshold-64) + 1 {
		cs = append(cs, engine.Replace[string](b, fmt.Sprintf("note%d", i)))
	}
	return cs
}

// noted writes each of cs full of s, repeated, below the blob threshold.
func noted(cs []engine.Chan[string], s string) []engine.Write {
	n := engine.BlobThreshold - 64
	var ws []engine.Write
	for _, c := range cs {
		ws = append(ws, c.Set(strings.Repeat(s, n/len(s)+1)[:n]))
	}
	return ws
}

// echoAgent runs one node that does nothing, and calls no tool.
func echoAgent() (*engine.Agent, error) {
	b := engine.NewGraph("echo")
	b.AddNode("echo", func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil })
	b.AddEdge(engine.Start, "echo")
	b.AddEdge("echo", engine.End)
	g, err := b.Compile()
	return &engine.Agent{Name: "echo", Graph: g}, err
}

// lostCallsStore makes a store whose run waits for a person's approval of
// send_letter, in the node that called record_dose before it paused; the
// store has so few tool-call records that their bucket lives in the root
// page. damage, when set, loses the root pages of a compacted copy of it,
// as a cut file does, and the copy is salvaged; else the store is
// salvaged as it is. It returns the salvaged copy's folder, the run, and
// the salvage's report.
func lostCallsStore(t *testing.T, idempotent, damage bool) (string, *engine.Run, *store.SalvageReport) {
	t.Helper()
	dose, letter := &countingTool{}, &countingTool{}
	dir, run, rep := salvagedRun(t, func(db *store.DB) (*engine.Agent, error) {
		return letterAgent(db, idempotent, dose, letter)
	}, func(t *testing.T, path string) string {
		if !damage {
			return path
		}
		return losePages(t, path, true, false)
	})
	require.EqualValues(t, 1, dose.calls.Load())
	return dir, run, rep
}

// salvagedRun runs one turn of the agent that build makes, on thread "w",
// until it waits for a person, and salvages the store, or the copy of it
// that damage returns the path of (losePages), as lostCallsStore does.
func salvagedRun(t *testing.T, build func(*store.DB) (*engine.Agent, error), damage func(*testing.T, string) string) (string, *engine.Run, *store.SalvageReport) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	ag, err := build(db)
	require.NoError(t, err)
	resolve := func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name == "echo" {
			return echoAgent()
		}
		return ag, nil
	}
	m := engine.NewManager(db, resolve, engine.ManagerOptions{Workers: 1})
	// Turns on other threads that call no tool give the runs and the
	// checkpoints pages of their own, outside the root page.
	for i := range 30 {
		run, err := m.Invoke(ctx, engine.RunRequest{Thread: fmt.Sprintf("e%d", i), Agent: "echo"})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, run.Status, run.Error)
	}
	input, _ := json.Marshal("I took my metformin; please write to the pharmacy.")
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "w", Agent: ag.Name, Input: input})
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, run.Status, run.Error)
	m.Close()
	require.NoError(t, db.Close())
	path := damage(t, filepath.Join(dir, store.FileName))
	copyDir := t.TempDir()
	rep, err := store.Salvage(ctx, path, filepath.Join(copyDir, store.FileName))
	require.NoError(t, err)
	require.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	return copyDir, run, rep
}

// copiedRun reads run id, and the history of thread "w", newest first,
// from the salvaged copy in dir.
func copiedRun(t *testing.T, dir, id string) (*engine.Run, []*engine.Checkpoint) {
	t.Helper()
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	r, err := db.Run(ctx, id)
	require.NoError(t, err)
	hist, err := db.History(ctx, "w", "", "", 0)
	require.NoError(t, err)
	return r, hist
}

// losePages writes a compacted copy of the store at path with pages lost,
// as a cut or damaged file loses them, and returns the copy's path: with
// root, the root pages of both its meta pages; with calls, the page of its
// own that holds the tool-call records. Without calls, those live in the
// root page.
func losePages(t *testing.T, path string, root, calls bool) string {
	t.Helper()
	compacted := compactedCopy(t, path)
	bdb, err := bbolt.Open(compacted, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	var callsPage int
	require.NoError(t, bdb.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("toolcalls"))
		callsPage = int(b.Root())
		if !calls {
			require.Zero(t, callsPage, "the tool calls have a page of their own")
		} else {
			require.NotZero(t, callsPage, "the tool calls live in the root page")
			require.Equal(t, 1, b.Stats().LeafPageN, "the tool calls take more than one page")
		}
		return nil
	}))
	require.NoError(t, bdb.Close())
	image, err := os.ReadFile(compacted)
	require.NoError(t, err)
	// bbolt's meta pages: a 16-byte page header, then the page size at
	// 8 and the root page at 16.
	le := binary.LittleEndian
	ps := int(le.Uint32(image[16+8:]))
	for _, meta := range [][]byte{image, image[ps:]} {
		if root {
			page := int(le.Uint64(meta[16+16:]))
			clear(image[page*ps : (page+1)*ps])
		}
	}
	if calls {
		clear(image[callsPage*ps : (callsPage+1)*ps])
	}
	return writeImage(t, image)
}

// compactedCopy writes a compacted copy of the store at path, which holds
// no older versions of its pages, and returns its path.
func compactedCopy(t *testing.T, path string) string {
	t.Helper()
	ro, err := store.Open(path, store.Options{ReadOnly: true})
	require.NoError(t, err)
	compacted := filepath.Join(t.TempDir(), store.FileName)
	require.NoError(t, ro.Compact(context.Background(), compacted))
	require.NoError(t, ro.Close())
	return compacted
}

// writeImage writes image as a store file, and returns its path.
func writeImage(t *testing.T, image []byte) string {
	t.Helper()
	damaged := filepath.Join(t.TempDir(), store.FileName)
	require.NoError(t, os.WriteFile(damaged, image, 0o600))
	return damaged
}

// resumeCopy opens the salvaged copy in dir and resumes run with the
// decisions that decide returns for each interrupt it waits on, until it
// waits no more or decide returns none. It returns the run, the payloads
// of the interrupts it was asked, in order, and the tools' counts.
func resumeCopy(t *testing.T, dir string, idempotent bool, run *engine.Run, decide func(agent.ToolInterrupt) string) (*engine.Run, []agent.ToolInterrupt, int32, int32) {
	t.Helper()
	// The tools count from the calls they made before the salvage.
	dose, letter := &countingTool{}, &countingTool{}
	dose.calls.Store(1)
	final, asked := resumeSalvaged(t, dir, run, func(db *store.DB) (*engine.Agent, error) {
		return letterAgent(db, idempotent, dose, letter)
	}, decide)
	return final, asked, dose.calls.Load(), letter.calls.Load()
}

// resumeSalvaged resumes run from the salvaged copy in dir with the agent
// that build makes, as resumeCopy does, and returns the run and the
// payloads of the interrupts it was asked, in order.
func resumeSalvaged(t *testing.T, dir string, run *engine.Run, build func(*store.DB) (*engine.Agent, error), decide func(agent.ToolInterrupt) string) (*engine.Run, []agent.ToolInterrupt) {
	t.Helper()
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	ag, err := build(db)
	require.NoError(t, err)
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, engine.ManagerOptions{Workers: 1})
	defer m.Close()
	_, err = m.Recover(ctx)
	require.NoError(t, err)
	var asked []agent.ToolInterrupt
	for run.Status == engine.StatusInterrupted {
		require.Len(t, run.Interrupts, 1)
		var ti agent.ToolInterrupt
		require.NoError(t, json.Unmarshal(run.Interrupts[0].Payload, &ti))
		asked = append(asked, ti)
		kind := decide(ti)
		if kind == "" {
			break
		}
		run, err = m.Resume(ctx, run.ID, map[string]engine.Decision{run.Interrupts[0].ID: {Kind: kind, By: "nurse"}})
		require.NoError(t, err)
		run, err = m.Wait(ctx, run.ID)
		require.NoError(t, err)
	}
	return run, asked
}

// approveLetters approves send_letter, and answers the question about
// record_dose with onDose.
func approveLetters(onDose string) func(agent.ToolInterrupt) string {
	return func(ti agent.ToolInterrupt) string {
		if ti.Tool == "send_letter" {
			return engine.Approve
		}
		return onDose
	}
}

// A run that waits for a person in a store whose tool-call records are
// lost with its root page, and whose node called record_dose (not
// idempotent) before it paused, is resumed from the salvaged copy: the
// node runs again, finds no record of its record_dose call, and asks a
// person (uncertain_side_effect) instead of calling the tool again.
// Approved, it runs it again (twice in all, by a person's decision);
// rejected, not. The approval of send_letter that resumed the run answers
// that question, not this one, and send_letter is asked about again after
// it; and since nothing tells its call, made now, from one whose record
// was lost, it is asked about as a call that may have run as well.
// Before, the resumed node called record_dose a second time without
// asking.
func TestSalvagedRunAsksAboutAToolCallWhoseRecordIsLost(t *testing.T) {
	for _, tc := range []struct {
		decision string
		want     int32
		reply    string
	}{
		{engine.Approve, 2, `{\"done\":true}`},
		{engine.Reject, 1, "was not run again (declined by the operator)"},
	} {
		t.Run(tc.decision, func(t *testing.T) {
			dir, run, rep := lostCallsStore(t, false, true)
			r, _ := copiedRun(t, dir, run.ID)
			require.Equal(t, engine.StatusInterrupted, r.Status)
			// With the root page, the copy may have lost the run's newest
			// state: the mark covers every step.
			assert.Equal(t, store.CallsLostInAnyStep, r.Meta[store.MetaCallsLostThrough], "the run is not marked: %v", r.Meta)
			assert.Empty(t, recordsOf(t, dir, run.ID), "tool-call records came back: %v", rep.Lost)

			final, asked, doses, letters := resumeCopy(t, dir, false, r, approveLetters(tc.decision))
			assert.Equal(t, tc.want, doses, "record_dose ran %d times", doses)
			assert.Equal(t, []string{"send_letter", "record_dose", "send_letter", "send_letter"}, tools(asked))
			assert.Equal(t, []string{agent.ReasonApproval, agent.ReasonUncertainSideEffect, agent.ReasonApproval,
				agent.ReasonUncertainSideEffect}, reasons(asked))
			require.Len(t, asked, 4)
			assert.Contains(t, asked[1].Detail, "may have been lost when the store was salvaged")
			assert.EqualValues(t, 1, letters)
			require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
			assert.Contains(t, string(final.Output), tc.reply)
		})
	}
}

// A tool declared idempotent is called again, with the key of its first
// call, without asking: a repeated call is harmless by its declaration.
func TestSalvagedRunCallsAnIdempotentToolAgain(t *testing.T) {
	dir, run, _ := lostCallsStore(t, true, true)
	final, asked, doses, letters := resumeCopy(t, dir, true, run, approveLetters(""))
	assert.Equal(t, []string{"send_letter", "send_letter"}, tools(asked))
	assert.Equal(t, []string{agent.ReasonApproval, agent.ReasonUncertainSideEffect}, reasons(asked))
	assert.EqualValues(t, 2, doses)
	assert.EqualValues(t, 1, letters)
	require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
}

// A run salvaged from a store that lost nothing carries no mark, and
// resumes as it would have: its record_dose call's record is reused.
func TestSalvagedRunWithItsRecordsResumesAsBefore(t *testing.T) {
	dir, run, rep := lostCallsStore(t, false, false)
	require.Empty(t, rep.Lost)
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	r, err := db.Run(context.Background(), run.ID)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	assert.NotContains(t, r.Meta, store.MetaCallsLostThrough)
	final, asked, doses, letters := resumeCopy(t, dir, false, r, approveLetters(""))
	assert.Equal(t, []string{"send_letter"}, tools(asked))
	assert.EqualValues(t, 1, doses)
	assert.EqualValues(t, 1, letters)
	require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
}

func reasons(asked []agent.ToolInterrupt) []string {
	var out []string
	for _, ti := range asked {
		out = append(out, ti.Reason)
	}
	return out
}

func tools(asked []agent.ToolInterrupt) []string {
	var out []string
	for _, ti := range asked {
		out = append(out, ti.Tool)
	}
	return out
}

// recordsOf lists the keys of the tool-call records of run that the store
// in dir holds.
func recordsOf(t *testing.T, dir, run string) []string {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	return recordsOfDB(t, db, run)
}
