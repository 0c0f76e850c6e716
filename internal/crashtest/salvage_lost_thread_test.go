package crashtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// A store whose every checkpoint of thread "w" is lost with the pages that
// held them, while the thread's head, in the root page, is read whole, is
// salvaged into a copy that db check passes: the head named nothing the
// copy holds, and is dropped. The run that was running on the thread, in
// a tool call whose intent was committed, is copied as failed, with its
// outcome: recovery does not resume it, calls no tool, and the thread is
// free for a new run, which starts from an empty state. Before, the copy
// did not check clean, and once its head was dropped the run was resumed
// from nothing and ended as completed, with no output.
func TestSalvagedRunOfAThreadWithNoCheckpointLeft(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	tool := &holdingTool{held: make(chan struct{}), release: make(chan struct{})}
	build := func(db *store.DB, tool agent.Tool) (*engine.Agent, error) {
		return loopAgent(db, loopSpec{name: "writer",
			tools: []policy.Tool{{Name: "append_line", Kind: policy.KindWrite, Description: "append a line"}},
			script: `[
	 {"when_no_tool_result": true, "tool_calls": [{"name": "append_line", "arguments": {"v": "{{input}}"}}]},
	 {"when_tool_result": true, "respond": "appended: {{context}}"}]`,
			impls: map[string]agent.Tool{"append_line": tool},
			rules: []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAllow}},
			// Checkpoints too large for the recent bucket, in the root
			// page: they are stored on pages of their own.
			extra: notes,
		})
	}
	ag, err := build(db, tool)
	require.NoError(t, err)
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, engine.ManagerOptions{Workers: 1})
	started, image := imageInToolCall(t, dir, db, m, tool)

	// The leaf pages of a compacted copy that hold a checkpoint of "w"
	// (keyed by its ID, the thread and the namespace) are lost.
	compacted := compactedCopy(t, writeImage(t, image))
	image, err = os.ReadFile(compacted)
	require.NoError(t, err)
	le := binary.LittleEndian
	ps := int(le.Uint32(image[16+8:]))
	lost := 0
	for p := 2; (p+1)*ps <= len(image); p++ {
		page := image[p*ps : (p+1)*ps]
		if le.Uint16(page[8:]) != 0x02 { // a leaf page
			continue
		}
		for i := range int(le.Uint16(page[10:])) {
			e := page[16+16*i:]
			pos, ksize := int(le.Uint32(e[4:])), int(le.Uint32(e[8:]))
			if off := 16 + 16*i + pos; le.Uint32(e) == 0 && off+ksize <= len(page) && bytes.HasSuffix(page[off:off+ksize], []byte("\x00w\x00")) {
				clear(page)
				lost++
				break
			}
		}
	}
	require.Positive(t, lost, "no page held a checkpoint of the thread")
	copyDir := t.TempDir()
	rep, err := store.Salvage(ctx, writeImage(t, image), filepath.Join(copyDir, store.FileName))
	require.NoError(t, err)
	require.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	assert.Equal(t, 1, rep.OutcomesAppended, "the run copied as failed has no outcome")

	db, err = store.OpenDir(copyDir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	hist, err := db.History(ctx, "w", "", "", 0)
	require.NoError(t, err)
	require.Empty(t, hist)
	tool = &holdingTool{}
	ag, err = build(db, tool)
	require.NoError(t, err)
	m = engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil }, engine.ManagerOptions{Workers: 1})
	defer m.Close()
	_, err = m.Recover(ctx)
	require.NoError(t, err)
	run, err := m.Wait(ctx, started.ID)
	require.NoError(t, err)
	assert.Zero(t, tool.calls.Load(), "the resumed run called the tool again")
	require.Equal(t, engine.StatusFailed, run.Status, "%s %s", run.Status, run.Output)
	assert.Contains(t, run.Error, "every checkpoint of this run's thread was lost")

	// The thread is free, and a new run on it starts from an empty state.
	input, _ := json.Marshal("the second letter")
	again, err := m.Invoke(ctx, engine.RunRequest{Thread: "w", Agent: "writer", Input: input})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, again.Status, again.Error)
	assert.EqualValues(t, 1, tool.calls.Load())
}
