package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

func trailCheckpoint(thread, id, parent string, flags string) *engine.Checkpoint {
	cp := &engine.Checkpoint{Thread: thread, ID: id, ParentID: parent, Created: tc0,
		Channels: []engine.ChannelValue{{Channel: "draft", Version: 1, Value: engine.Value{Inline: []byte(`"x"`)}}}}
	if flags != "" {
		cp.Channels = append(cp.Channels, engine.ChannelValue{Channel: FlagsChannel, Version: 1, Value: engine.Value{Inline: []byte(flags)}})
	}
	return cp
}

// endRun commits the checkpoint that ends run id on thread and returns the
// flags of the outcome it appended.
func endRun(t *testing.T, d *DB, thread, id string, cp *engine.Checkpoint) []string {
	t.Helper()
	run := &engine.Run{ID: id, Thread: thread, Status: engine.StatusCompleted, Checkpoint: cp.ID, CreatedAt: tc0}
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: cp, Run: run}))
	got, err := d.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	for _, o := range got {
		if o.Run == id {
			return o.Flags
		}
	}
	t.Fatalf("no outcome for run %s", id)
	return nil
}

func trailFlags(t *testing.T, d *DB, thread, id string) []string {
	t.Helper()
	cp := d.trail.get(thread, id)
	if cp == nil {
		return nil
	}
	load := func(want string) (*engine.Checkpoint, bool) {
		if want == id {
			return cp, true
		}
		return nil, true // the trail's own entry alone
	}
	flags, ok := walkFlags(&engine.Run{Checkpoint: id}, load, nil)
	require.True(t, ok)
	return flags
}

func TestFlagTrailHoldsWhatCommitted(t *testing.T) {
	d := openTest(t)
	a := trailCheckpoint("t", "0001", "", `["a"]`)
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: a}))
	a.Channels[1].Value.Inline[2] = 'z' // the caller's bytes change after the commit
	assert.Equal(t, []string{"a"}, trailFlags(t, d, "t", "0001"), "the trail keeps its own copy")

	t.Run("a rewrite replaces its checkpoint", func(t *testing.T) {
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: trailCheckpoint("t", "0002", "0001", `["b"]`)}))
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: trailCheckpoint("t", "0002", "0001", `["c"]`)}))
		assert.Equal(t, []string{"c"}, trailFlags(t, d, "t", "0002"))
		assert.Equal(t, []string{"c"}, endRun(t, d, "t", "r1", trailCheckpoint("t", "0003", "0002", "")))
	})

	bigFlag := fmt.Sprintf("%0*d", engine.BlobThreshold, 7) // its list is stored as a blob
	t.Run("a rewrite to a flags blob leaves the trail, and the store answers", func(t *testing.T) {
		big := `["` + bigFlag + `"]`
		cp := trailCheckpoint("t", "0003", "0002", "")
		cp.Channels = append(cp.Channels, engine.ChannelValue{Channel: FlagsChannel, Version: 2, Value: engine.Value{Blob: engine.RefOf([]byte(big))}})
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: cp, Blobs: map[engine.BlobRef][]byte{engine.RefOf([]byte(big)): []byte(big)}}))
		assert.Nil(t, d.trail.get("t", "0003"))
		assert.Equal(t, []string{bigFlag}, endRun(t, d, "t", "r2", trailCheckpoint("t", "0004", "0003", "")))
	})

	t.Run("a failed commit leaves no trace", func(t *testing.T) {
		bad := trailCheckpoint("t", "0005", "0004", `["x"]`)
		bad.Thread = "t\x00bad" // not a valid key part: refused before the queue
		require.Error(t, d.Commit(bg, &engine.Commit{Checkpoint: bad}))
		assert.Nil(t, d.trail.get(bad.Thread, "0005"))

		failpoint.applyRequest = func(int) error { return errors.New("apply fails") }
		defer func() { failpoint.applyRequest = nil }()
		require.Error(t, d.Commit(bg, &engine.Commit{Checkpoint: trailCheckpoint("t", "0005", "0004", `["x"]`)}))
		assert.Nil(t, d.trail.get("t", "0005"), "rolled back in its transaction")
	})

	t.Run("a prune empties it", func(t *testing.T) {
		require.NotNil(t, d.trail.get("t", "0004"))
		_, err := d.Prune(bg, time.Hour, tc0)
		require.NoError(t, err)
		assert.Nil(t, d.trail.get("t", "0004"))
		assert.Equal(t, []string{bigFlag}, endRun(t, d, "t", "r3", trailCheckpoint("t", "0005", "0004", "")),
			"the store answers for what the trail forgot")
	})
}

// The trail is bounded: trailLen checkpoints a thread, trailThreads
// threads. A walk that goes past what it holds reads the store.
func TestFlagTrailIsBounded(t *testing.T) {
	defer func(n int) { trailThreads = n }(trailThreads)
	trailThreads = 2
	d := openTest(t)
	const n = trailLen + 4
	parent := ""
	for i := 1; i <= n; i++ {
		flags := ""
		if i == 1 {
			flags = `["first"]`
		}
		cp := trailCheckpoint("long", fmt.Sprintf("%04d", i), parent, flags)
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: cp}))
		parent = cp.ID
	}
	assert.Nil(t, d.trail.get("long", "0001"), "the oldest checkpoints left the ring")
	assert.NotNil(t, d.trail.get("long", fmt.Sprintf("%04d", n)))
	fromTrail, ok := commitFlags(&engine.Commit{Run: &engine.Run{Thread: "long", Checkpoint: parent}}, &d.trail, nil)
	assert.False(t, ok, "the trail alone cannot reach the first checkpoint: %v", fromTrail)
	assert.Equal(t, []string{"first"}, endRun(t, d, "long", "r", trailCheckpoint("long", fmt.Sprintf("%04d", n+1), parent, "")))

	for _, th := range []string{"a", "b", "c"} {
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: trailCheckpoint(th, "0001", "", `["f"]`)}))
	}
	d.trail.mu.Lock()
	remembered := len(d.trail.threads)
	d.trail.mu.Unlock()
	assert.Equal(t, 2, remembered)
	assert.NotNil(t, d.trail.get("c", "0001"), "the newest thread is remembered")
}
