package store

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A key is shown as it is when it is printable text, and quoted only when
// it holds other bytes, or could pass for a quoted key or another bucket's
// own form.
func TestRenderKey(t *testing.T) {
	for _, tc := range []struct {
		bucket, key, want string
	}{
		{bucketRuns, "run_18ed08621e3344b8", "run_18ed08621e3344b8"},
		{bucketToolCalls, "run_1/3/task-a/0", "run_1/3/task-a/0"},
		{bucketRuns, "run é", "run é"},
		{bucketRuns, "run_1\x00o", `"run_1\x00o"`},
		{bucketHeads, "t\x00", `"t\x00"`},
		{bucketRuns, "\xff\xfe", `"\xff\xfe"`},
		{bucketRuns, "tab\there", `"tab\there"`},
		{bucketRuns, `"run_1"`, `"\"run_1\""`},
		{bucketRuns, "", `""`},
		{bucketOutcomes, "\x00\x00\x00\x00\x00\x00\x00\x07", "seq 7"},
		{bucketOutcomes, "seq 7", `"seq 7"`},
		{bucketWrites, "t\x00\x00c1\x00\x00\x00\x00\x00\x00\x00\x00\x02", `"t\x00\x00c1\x00"#2`},
		{bucketWrites, "short", `"short"`},
	} {
		assert.Equal(t, tc.want, renderKey(tc.bucket, []byte(tc.key)), "%s %q", tc.bucket, tc.key)
	}
}

// db check --json shows a run's key as the plain string, not quoted a
// second time inside the JSON string; the error a read meets names it
// the same way.
func TestCorruptRunKeyInJSON(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t", ID: "0001", Created: tc0},
		Run:        &engine.Run{ID: "run_18ed08621e3344b8", Thread: "t", Status: engine.StatusCompleted},
	}))
	flip(t, d, bucketRuns, []byte("run_18ed08621e3344b8"), 9)

	_, err := d.Run(bg, "run_18ed08621e3344b8")
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "corrupt record in bucket runs, key run_18ed08621e3344b8: checksum mismatch "+
		"(run outpost db check; outpost db salvage --data DIR FILE copies what can still be read)")

	rep, err := d.Check(bg)
	require.NoError(t, err)
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	var got struct {
		Problems []Problem `json:"problems"`
	}
	require.NoError(t, json.Unmarshal(b, &got))
	require.NotEmpty(t, got.Problems, "%s", b)
	assert.Equal(t, bucketRuns, got.Problems[0].Bucket)
	assert.Equal(t, "run_18ed08621e3344b8", got.Problems[0].Key, "%s", b)
	assert.Contains(t, string(b), `"key":"run_18ed08621e3344b8"`)
}
