package store

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A prune report's lists are [] when empty, never null or left out, so a
// script reading db prune --json gets a list either way; the field names
// stay as they were (kept_removed was added beside them: null where no
// one looked at the kept copies, as the store's Prune alone does not).
func TestPruneReportJSONLists(t *testing.T) {
	d := openTest(t)
	rep, err := d.Prune(bg, 0, tc0)
	require.NoError(t, err)
	for _, v := range []any{rep, *rep, &PruneReport{}} {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		assert.JSONEq(t, `{"threads":0,"rewritten":0,"checkpoints_removed":0,"writes_removed":0,
			"blobs_removed":0,"blob_bytes_removed":0,"calls_removed":0,"kept_removed":null,"skipped":[]}`, string(b))
	}

	kept := 2
	full := PruneReport{Threads: 1, KeptRemoved: &kept, Skipped: []Problem{{Bucket: bucketCheckpoints, Key: "t1", Message: "namespace \"\": why"}}}
	b, err := json.Marshal(full)
	require.NoError(t, err)
	var back PruneReport
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, full, back)
}

// A skipped thread is named as keys are: plain when it is printable text,
// quoted when it holds a control byte.
func TestPruneSkippedThreadKey(t *testing.T) {
	for thread, want := range map[string]string{"t1": "t1", "t\t1": `"t\t1"`} {
		d := openTest(t)
		now := time.Now()
		f := &pruneFixture{t: t, d: d, old: now.Add(-48 * time.Hour)}
		for i := 1; i <= 3; i++ {
			// The first checkpoint's parent "0000" does not exist.
			f.ckpt(thread, "", fmt.Sprintf("%04d", i), fmt.Sprintf("%04d", i-1), i,
				engine.ChannelValue{Channel: "m", Version: uint64(i), Value: inline(fmt.Sprintf("[%d]", i))})
		}
		rep, err := d.Prune(bg, time.Hour, now)
		require.NoError(t, err)
		require.Len(t, rep.Skipped, 1)
		assert.Equal(t, want, rep.Skipped[0].Key)
		b, err := json.Marshal(rep)
		require.NoError(t, err)
		var back map[string]any
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Len(t, back["skipped"], 1, "%s", b)
	}
}
