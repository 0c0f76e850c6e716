package store

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// stepCheckpoint is a checkpoint about the size of a reference-workload
// step's (some 170 bytes encoded).
func stepCheckpoint(thread string, i int) *engine.Checkpoint {
	c := &engine.Checkpoint{Thread: thread, ID: fmt.Sprintf("%06d", i), RunID: "run-" + thread, Step: i,
		Source: engine.SourceLoop, Nodes: []string{"generate_response"}, Created: tc0,
		Channels: []engine.ChannelValue{{Channel: "draft", Version: uint64(i), Value: inline(`"` + strings.Repeat("x", 60) + `"`)}},
		Next:     []engine.TaskSpec{{ID: fmt.Sprintf("task-%06d", i), Node: "guardrail_post"}}}
	if i > 1 {
		c.ParentID = fmt.Sprintf("%06d", i-1)
	}
	return c
}

// recentState reports whether the recent bucket is stored inline, and
// which keys sit in it and in the checkpoints bucket.
func recentState(t *testing.T, d *DB) (inline bool, recent, main map[string]bool) {
	t.Helper()
	recent, main = map[string]bool{}, map[string]bool{}
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		rb := bucket(tx, bucketRecent)
		inline = rb.Root() == 0
		require.NoError(t, rb.ForEach(func(k, _ []byte) error { recent[string(k)] = true; return nil }))
		return bucket(tx, bucketCheckpoints).ForEach(func(k, _ []byte) error { main[string(k)] = true; return nil })
	}))
	return inline, recent, main
}

// A lone thread's checkpoints pass through the recent bucket, which stays
// inline; each is in exactly one bucket, the newest always in recent, and
// all of them read back, in History too.
func TestRecentCheckpointsStayInline(t *testing.T) {
	d := openTest(t)
	const n = 40
	moved := 0
	for i := 1; i <= n; i++ {
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: stepCheckpoint("t", i), Sync: true}))
		inline, recent, main := recentState(t, d)
		require.True(t, inline, "after commit %d the recent bucket is no longer inline", i)
		newest := string(checkpointKey("t", "", fmt.Sprintf("%06d", i)))
		require.True(t, recent[newest], "commit %d: the newest checkpoint is not in recent", i)
		require.Len(t, recent, i-len(main), "commit %d", i)
		for k := range recent {
			require.False(t, main[k], "commit %d: %q is in both buckets", i, k)
		}
		moved = len(main)
	}
	assert.Greater(t, moved, n/2, "checkpoints never moved on from the recent bucket")

	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	require.Len(t, h, n)
	for i, c := range h {
		assert.Equal(t, stepCheckpoint("t", n-i).ID, c.ID)
		assert.Equal(t, stepCheckpoint("t", n-i).Channels, c.Channels)
	}
	for _, id := range []string{"000001", "000039", "000040"} {
		c, err := d.Checkpoint(bg, "t", "", id)
		require.NoError(t, err)
		assert.Equal(t, id, c.ID)
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	assert.Equal(t, n, rep.Records[bucketCheckpoints], "check counts recent checkpoints as checkpoints")
}

// What the recent bucket is for: once the checkpoints bucket is a tree of
// several pages, a lone thread's step commit writes fewer pages than the
// four (meta, root, the right-edge leaf and the branch above it) that a
// checkpoint put straight into that bucket costs.
func TestRecentCheckpointsSavePageWrites(t *testing.T) {
	d := openTest(t)
	i := 0
	for ; i < 200; i++ { // a tree of several leaves
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: stepCheckpoint("t", i+1)}))
	}
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		require.GreaterOrEqual(t, bucket(tx, bucketCheckpoints).Stats().Depth, 2)
		return nil
	}))
	w0, _, _ := d.PageStats()
	tx0 := d.Stats().Transactions
	for range 50 {
		i++
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: stepCheckpoint("t", i)}))
	}
	w1, _, _ := d.PageStats()
	perTx := float64(w1-w0) / float64(d.Stats().Transactions-tx0)
	t.Logf("%.2f pages per step commit", perTx)
	assert.Less(t, perTx, 3.0)
}

// Prune reaches checkpoints in both buckets: a finished thread keeps only
// its newest, wherever it was.
func TestPruneReachesRecentCheckpoints(t *testing.T) {
	d := openTest(t)
	now := time.Now()
	f := &pruneFixture{t: t, d: d, old: now.Add(-48 * time.Hour)}
	const n = 30
	for i := 1; i <= n; i++ {
		parent := ""
		if i > 1 {
			parent = fmt.Sprintf("%04d", i-1)
		}
		f.ckpt("t", "", fmt.Sprintf("%04d", i), parent, i,
			engine.ChannelValue{Channel: "m", Version: uint64(i), Delta: true, Value: inline(fmt.Sprintf("[%d]", i))})
	}
	_, recent, main := recentState(t, d)
	require.NotEmpty(t, recent)
	require.NotEmpty(t, main)

	rep, err := d.Prune(bg, time.Hour, now)
	require.NoError(t, err)
	assert.Equal(t, n-1, rep.CheckpointsRemoved)
	_, recent, main = recentState(t, d)
	assert.Equal(t, 1, len(recent)+len(main), "recent %v, checkpoints %v", recent, main)
	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	require.Len(t, h, 1)
	assert.Equal(t, fmt.Sprintf("%04d", n), h[0].ID)
	chk, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, chk.OK(), "%v", chk.Problems)
}

// Check reports a key held by both buckets, naming the recent one.
func TestCheckFindsCheckpointInBothBuckets(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: stepCheckpoint("t", 1)}))
	key := checkpointKey("t", "", "000001")
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return bucket(tx, bucketCheckpoints).Put(key, bucket(tx, bucketRecent).Get(key))
	}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	assert.Contains(t, got, fmt.Sprintf("%s %s: the checkpoints bucket holds this key too", bucketRecent, renderKey(bucketRecent, key)))
}

// A large group commit puts its checkpoints straight into the checkpoints
// bucket; one it rewrites leaves recent, so no key is ever in both.
func TestLargeBatchBypassesRecent(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: stepCheckpoint("t", 1)}))
	k1, k2 := checkpointKey("t", "", "000001"), checkpointKey("t", "", "000002")
	_, recent, _ := recentState(t, d)
	require.True(t, recent[string(k1)])

	put := func(batch int, key []byte, rec string) {
		require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
			beginTxState(tx, &d.tail, batch)
			defer endTxState(tx)
			return openCheckpoints(tx).Put(key, []byte(rec))
		}))
	}
	put(directBatch, k1, "rewritten")
	put(directBatch, k2, "new")
	_, recent, main := recentState(t, d)
	assert.Empty(t, recent)
	assert.True(t, main[string(k1)] && main[string(k2)])
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		assert.Equal(t, "rewritten", string(openCheckpoints(tx).Get(k1)))
		return nil
	}))

	put(directBatch-1, checkpointKey("t", "", "000003"), "small batch")
	_, recent, _ = recentState(t, d)
	assert.True(t, recent[string(checkpointKey("t", "", "000003"))], "a small batch uses recent")
}
