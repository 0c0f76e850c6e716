package crashtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
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
	tool.hold.Store(true)
	input, _ := json.Marshal("the letter")
	started, err := m.Start(ctx, engine.RunRequest{Thread: "w", Agent: "writer", Input: input})
	require.NoError(t, err)
	select {
	case <-tool.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the tool was not called")
	}
	// The intent is committed, and the tool has done its work: what the
	// file holds now is what a power cut leaves.
	image, err := os.ReadFile(filepath.Join(dir, store.FileName))
	require.NoError(t, err)
	close(tool.release)
	_, err = m.Wait(ctx, started.ID)
	require.NoError(t, err)
	m.Close()
	require.NoError(t, db.Close())

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
