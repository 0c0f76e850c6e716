package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// flip corrupts one byte of a stored record behind the store's back, as a
// bad disk would.
func flip(t *testing.T, d *DB, bucketName string, key []byte, at int) {
	t.Helper()
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		b := bucket(tx, bucketName)
		v := b.Get(key)
		require.NotNil(t, v, "no record at %q", key)
		v = append([]byte(nil), v...)
		v[at%len(v)] ^= 0x5a
		return b.Put(key, v)
	}))
}

func TestCorruptRecordsAreReported(t *testing.T) {
	d := openTest(t)
	// Thread m's first checkpoints have moved on from the recent bucket
	// to the checkpoints bucket; thread t's one is still recent.
	for i := 1; i <= 40; i++ {
		c := &engine.Checkpoint{Thread: "m", ID: fmt.Sprintf("%04d", i), Created: tc0}
		if i > 1 {
			c.ParentID = fmt.Sprintf("%04d", i-1)
		}
		require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: c}))
	}
	big := make([]byte, 1000)
	ref := engine.RefOf(big)
	c := &engine.Checkpoint{Thread: "t", ID: "0001", Created: tc0,
		Channels: []engine.ChannelValue{{Channel: "doc", Value: engine.Value{Blob: ref}}}}
	require.NoError(t, d.Commit(bg, &engine.Commit{
		Checkpoint: c, Blobs: map[engine.BlobRef][]byte{ref: big},
		Run: &engine.Run{ID: "r1", Thread: "t", Status: engine.StatusCompleted},
		Writes: []engine.CommitWrites{{Thread: "t", CheckpointID: "0001",
			Write: engine.PendingWrite{TaskID: "x", Kind: engine.WriteKindError, Data: json.RawMessage(`{}`)}}},
	}))
	require.NoError(t, d.PutToolIntent(bg, "k", ToolCall{Tool: "x"}))
	require.NoError(t, d.AckOutcomes(bg, 1)) // r1's outcome
	var writeKey, blobLogKey []byte
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		cb := openCheckpoints(tx)
		require.Equal(t, bucketRecent, cb.bucketOf(checkpointKey("t", "", "0001")))
		require.Equal(t, bucketCheckpoints, cb.bucketOf(checkpointKey("m", "", "0001")))
		k, _ := bucket(tx, bucketWrites).Cursor().First()
		writeKey = append([]byte(nil), k...)
		blobLogKey = blobLogKeyOf(t, tx, ref)
		return nil
	}))

	tests := []struct {
		bucket string
		key    []byte
		read   func() error
	}{
		{bucketRecent, checkpointKey("t", "", "0001"), func() error { _, err := d.Checkpoint(bg, "t", "", "0001"); return err }},
		{bucketRecent, checkpointKey("t", "", "0001"), func() error { _, err := d.Checkpoint(bg, "t", "", ""); return err }},
		{bucketRecent, checkpointKey("t", "", "0001"), func() error { _, err := d.History(bg, "t", "", "", 0); return err }},
		{bucketCheckpoints, checkpointKey("m", "", "0001"), func() error { _, err := d.Checkpoint(bg, "m", "", "0001"); return err }},
		{bucketCheckpoints, checkpointKey("m", "", "0001"), func() error { _, err := d.History(bg, "m", "", "", 0); return err }},
		{bucketWrites, writeKey, func() error { _, err := d.Writes(bg, "t", "", "0001"); return err }},
		{bucketRuns, []byte("r1"), func() error { _, err := d.Run(bg, "r1"); return err }},
		{bucketRuns, []byte("r1"), func() error { _, err := d.Runs(bg, engine.RunFilter{}); return err }},
		{bucketBlobLog, blobLogKey, func() error { _, err := d.Blob(bg, ref); return err }},
		{bucketToolCalls, []byte("k"), func() error { _, err := d.ToolCall(bg, "k"); return err }},
		{bucketUplink, cursorKey, func() error { _, err := d.Ledger(bg); return err }},
	}
	for i, tc := range tests {
		t.Run(tc.bucket, func(t *testing.T) {
			require.NoError(t, tc.read(), "before corruption")
			flip(t, d, tc.bucket, tc.key, 7+i)
			defer flip(t, d, tc.bucket, tc.key, 7+i) // flipping back repairs it

			err := tc.read()
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.bucket, ce.Bucket)
			assert.Equal(t, string(tc.key), ce.Key)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, "bucket "+tc.bucket)
			assert.ErrorContains(t, err, renderKey(tc.bucket, tc.key))
			// The error reaches the operator through whatever read the
			// record: it names the way out.
			assert.ErrorContains(t, err, "(run outpost db check; outpost db salvage --data DIR FILE copies what can still be read)")

			rep, err := d.Check(bg)
			require.NoError(t, err)
			require.False(t, rep.OK())
			found := false
			for _, p := range rep.Problems {
				if p.Bucket == tc.bucket && p.Key == renderKey(tc.bucket, tc.key) {
					found = true
				}
				assert.NotContains(t, p.Message, "outpost db", "check names the record, not the way out again")
				assert.NotContains(t, p.Message, "corrupt record in bucket", "check names the record once")
			}
			assert.True(t, found, "check did not name %s %s: %v", tc.bucket, renderKey(tc.bucket, tc.key), rep.Problems)
		})
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func TestCheckFindsDanglingReferences(t *testing.T) {
	d := openTest(t)
	missing := engine.RefOf([]byte("never stored"))
	mentioned := engine.RefOf([]byte("also never stored"))
	require.NoError(t, d.Commit(bg, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t", ID: "0002", ParentID: "0001",
			Channels: []engine.ChannelValue{{Channel: "doc", Value: engine.Value{Blob: missing}}}},
		Run: &engine.Run{ID: "r", Thread: "t", Output: json.RawMessage(`{"ref":"` + mentioned.String() + `"}`)},
	}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	msgs := problemTexts(rep)
	assert.ElementsMatch(t, []string{
		`recent "0002\x00t\x00": parent checkpoint 0001 is missing`,
		`recent "0002\x00t\x00": refers to missing blob ` + missing.String(),
		`runs r: refers to missing blob ` + mentioned.String(),
	}, msgs)
	assert.Equal(t, 1, rep.Records[bucketCheckpoints])
}

// A pending write whose checkpoint does not exist is named by bucket and
// key: nothing applies it, and a checkpoint that came to have that key
// would be given it. A salvage of an earlier version left such writes
// when it lost their checkpoints; no commit of the engine makes one.
func TestCheckNamesAPendingWriteOfAMissingCheckpoint(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	write := engine.PendingWrite{TaskID: "task", Kind: engine.WriteKindWrites}
	require.NoError(t, d.Commit(bg, &engine.Commit{Writes: []engine.CommitWrites{
		{Thread: "t", CheckpointID: "0001", Write: write}, // its checkpoint is there
		{Thread: "t", CheckpointID: "0002", Write: write},
		{Thread: "t", NS: "sub", CheckpointID: "0001", Write: write},
	}}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	msgs := problemTexts(rep)
	assert.ElementsMatch(t, []string{
		`writes "t\x00\x000002\x00"#3: a pending write of checkpoint 0002 (thread "t", namespace ""), which does not exist`,
		`writes "t\x00sub\x000001\x00"#4: a pending write of checkpoint 0001 (thread "t", namespace "sub"), which does not exist`,
	}, msgs)
	assert.Equal(t, 4, rep.Records[bucketWrites])
}

// problemTexts returns the problems of rep as db check prints them.
func problemTexts(rep *CheckReport) []string {
	msgs := []string{}
	for _, p := range rep.Problems {
		msgs = append(msgs, p.String())
	}
	return msgs
}

func TestBlobCollision(t *testing.T) {
	d := openTest(t)
	data := []byte("the real bytes")
	ref := engine.RefOf(data)
	// No two payloads with one xxhash64 and length are at hand, so store
	// other bytes under data's key, as a collision would.
	plantBlob(t, d.db, ref, encodeBlob([]byte("other bytes, same ref"), tc0))
	_, err := d.PutBlob(bg, data)
	assert.ErrorIs(t, err, engine.ErrBlobCollision)

	err = d.Commit(bg, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t", ID: "1"},
		Blobs:      map[engine.BlobRef][]byte{ref: data},
	})
	assert.ErrorIs(t, err, engine.ErrBlobCollision)
	_, err = d.Checkpoint(bg, "t", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound, "the colliding commit wrote nothing")

	err = d.Commit(bg, &engine.Commit{Blobs: map[engine.BlobRef][]byte{ref: []byte("mismatch")}})
	assert.ErrorIs(t, err, ErrBlobMismatch)
	assert.False(t, errors.Is(err, engine.ErrBlobCollision))
}
