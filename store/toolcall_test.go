package store

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// Blobs a record is stored with go into the record's own commit, and only
// when the record is written.
func TestToolCallBlobsInTheRecordsCommit(t *testing.T) {
	d := openTest(t)
	const key = "run_1/3/task-a/0"
	args := bytes.Repeat([]byte("a"), 2*engine.BlobThreshold)
	intent := ToolCall{RunID: "run_1", Node: "act", Tool: "send_sms", ArgsHash: "h1", Args: engine.Value{Blob: engine.RefOf(args)}}

	before := d.Stats().Commits
	require.NoError(t, d.PutToolIntent(bg, key, intent, args))
	require.Equal(t, 1, int(d.Stats().Commits-before), "the blob and the record in one commit")
	got, err := d.Blob(bg, intent.Args.Blob)
	require.NoError(t, err)
	require.Equal(t, args, got)
	require.NoError(t, d.PutToolIntent(bg, key, intent, args), "the same intent again is a no-op")

	other := intent
	other.ArgsHash = "h2"
	otherArgs := bytes.Repeat([]byte("b"), 2*engine.BlobThreshold)
	other.Args = engine.Value{Blob: engine.RefOf(otherArgs)}
	require.ErrorIs(t, d.PutToolIntent(bg, key, other, otherArgs), ErrToolCallConflict)
	_, err = d.Blob(bg, other.Args.Blob)
	require.ErrorIs(t, err, engine.ErrBlobNotFound, "a record refused stores none of its blobs")

	missing := engine.Value{Blob: engine.RefOf([]byte("not stored"))}
	require.ErrorIs(t, d.PutToolResult(bg, key, ToolCall{Result: missing}, otherArgs), engine.ErrBlobNotFound,
		"a blob neither stored nor carried is still refused")

	result := bytes.Repeat([]byte("r"), 2*engine.BlobThreshold)
	before = d.Stats().Commits
	require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: engine.RefOf(result)}}, result, result))
	require.Equal(t, 1, int(d.Stats().Commits-before))
	tc, err := d.ToolCall(bg, key)
	require.NoError(t, err)
	got, err = d.Blob(bg, tc.Result.Blob)
	require.NoError(t, err)
	require.Equal(t, result, got)

	// A blob stored already is carried again harmlessly.
	require.NoError(t, d.PutToolIntent(bg, "run_1/4/task-b/0", ToolCall{RunID: "run_1", Tool: "send_sms", ArgsHash: "h1", Args: intent.Args}, args))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep)
}

func TestToolCalls(t *testing.T) {
	d := openTest(t)
	const key = "run_1/3/task-a/0"
	intent := ToolCall{RunID: "run_1", Node: "act", Tool: "send_sms", ArgsHash: "h1",
		Args: engine.Value{Inline: []byte(`{"to":"+100"}`)}, IntentAt: tc0}

	_, err := d.ToolCall(bg, key)
	require.ErrorIs(t, err, ErrToolCallNotFound)
	require.ErrorIs(t, d.PutToolResult(bg, key, ToolCall{}), ErrToolCallNotFound, "a result needs its intent")

	require.NoError(t, d.PutToolIntent(bg, key, intent))
	require.NoError(t, d.PutToolIntent(bg, key, intent), "recording the same intent again is a no-op")
	got, err := d.ToolCall(bg, key)
	require.NoError(t, err)
	want := intent
	want.Key, want.Status = key, ToolCallIntent
	assert.Equal(t, &want, got)

	other := intent
	other.ArgsHash = "h2"
	require.ErrorIs(t, d.PutToolIntent(bg, key, other), ErrToolCallConflict)

	big := make([]byte, 2*engine.BlobThreshold)
	ref, err := d.PutBlob(bg, big)
	require.NoError(t, err)
	missing := engine.RefOf([]byte("not stored"))
	require.ErrorIs(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: missing}}), engine.ErrBlobNotFound)

	done := tc0.Add(time.Second)
	require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: ref}, DoneAt: done}))
	require.NoError(t, d.PutToolResult(bg, key, ToolCall{Result: engine.Value{Blob: ref}}), "the same result again is a no-op")
	require.ErrorIs(t, d.PutToolResult(bg, key, ToolCall{Error: "other"}), ErrToolCallConflict)
	require.ErrorIs(t, d.PutToolIntent(bg, key, intent), ErrToolCallDone, "a finished call must be reused, not rerun")

	got, err = d.ToolCall(bg, key)
	require.NoError(t, err)
	want.Status, want.Result, want.DoneAt = ToolCallDone, engine.Value{Blob: ref}, done
	assert.Equal(t, &want, got)

	require.NoError(t, d.PutToolIntent(bg, "run_1/4/task-b/0", ToolCall{RunID: "run_1", Tool: "lookup"}))
	require.NoError(t, d.PutToolIntent(bg, "run_2/1/task-c/0", ToolCall{RunID: "run_2", Tool: "lookup"}))
	list, err := d.ToolCalls(bg, "run_1/")
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, key, list[0].Key)

	require.ErrorIs(t, d.PutToolIntent(bg, "", intent), ErrInvalidKey)
	require.ErrorIs(t, d.PutToolIntent(bg, "k2", ToolCall{Args: engine.Value{Blob: missing}}), engine.ErrBlobNotFound)
}
