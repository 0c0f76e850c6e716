package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// A run's output above the blob threshold is kept out of line, shares the
// blob of an equal channel value, comes back whole, and keeps its blob
// through a prune.
func TestRunOutputOutOfLine(t *testing.T) {
	ctx := context.Background()
	db, err := OpenDir(t.TempDir(), Options{})
	require.NoError(t, err)
	defer db.Close()

	answer, _ := json.Marshal(strings.Repeat("take it when remembered. ", 40))
	ref := engine.RefOf(answer)
	old := time.Now().Add(-48 * time.Hour).UTC()
	cp := &engine.Checkpoint{Thread: "t", ID: "0190000000000001", Step: 1, Source: engine.SourceLoop, Created: old,
		Channels: []engine.ChannelValue{{Channel: "final", Version: 1, Value: engine.Value{Blob: ref}}}}
	run := &engine.Run{ID: "run_1", Thread: "t", Agent: "a", Status: engine.StatusCompleted, Output: answer,
		Input: json.RawMessage(`"hi"`), CreatedAt: old, EndedAt: old}
	require.NoError(t, db.Commit(ctx, &engine.Commit{Checkpoint: cp, Run: run, Blobs: map[engine.BlobRef][]byte{ref: answer}, Sync: true}))

	var raw []byte
	require.NoError(t, db.db.View(func(tx *bbolt.Tx) error {
		raw = append([]byte(nil), bucket(tx, bucketRuns).Get([]byte("run_1"))...)
		return nil
	}))
	require.Less(t, len(raw), 600, "the record holds a reference, not the output")
	require.Contains(t, string(raw), ref.String())

	got, err := db.Run(ctx, "run_1")
	require.NoError(t, err)
	require.Equal(t, string(answer), string(got.Output))
	runs, err := db.Runs(ctx, engine.RunFilter{Thread: "t"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, string(answer), string(runs[0].Output))
	require.Equal(t, 1, db.blobCount(t), "the output shares the channel value's blob")

	check, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, check.OK(), "%v", check.Problems)
	var rep *PruneReport
	// A second run whose output no checkpoint refers to: only the run
	// keeps its blob alive.
	lone, _ := json.Marshal(strings.Repeat("call your pharmacist. ", 40))
	run2 := &engine.Run{ID: "run_2", Thread: "u", Agent: "a", Status: engine.StatusCompleted, Output: lone, CreatedAt: old, EndedAt: old}
	require.NoError(t, db.Commit(ctx, &engine.Commit{Run: run2, Sync: true}))
	require.Equal(t, 2, db.blobCount(t))

	rep, err = db.Prune(ctx, time.Hour, time.Now().Add(72*time.Hour))
	require.NoError(t, err)
	require.Zero(t, rep.BlobsRemoved)
	for id, want := range map[string][]byte{"run_1": answer, "run_2": lone} {
		got, err = db.Run(ctx, id)
		require.NoError(t, err, "the run's blob survives a prune")
		require.Equal(t, string(want), string(got.Output))
	}
}

func (d *DB) blobCount(t *testing.T) int {
	n := 0
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		n = bucket(tx, bucketBlobLog).Stats().KeyN
		return nil
	}))
	return n
}

// TestFilteredListDecodesOnlyMatches: a filtered listing reads each
// record's status, agent and thread from its head and decodes only the
// runs it returns: passing 300 runs of other threads costs no allocation
// per run, where decoding each whole record cost a dozen.
func TestFilteredListDecodesOnlyMatches(t *testing.T) {
	d := openTest(t)
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &engine.Run{ID: fmt.Sprintf("run-%04d", i), Thread: fmt.Sprintf("t%d", i%3), Agent: "a", Status: engine.StatusQueued,
				Input: json.RawMessage(`{"question": "how much?"}`), Meta: map[string]string{"k": "v"}, CreatedAt: tc0}
			errs <- d.Commit(bg, &engine.Commit{Run: r, Sync: true})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, f := range []engine.RunFilter{{Thread: "t1"}, {Status: engine.StatusCompleted}, {Agent: "b"}} {
		want := 0
		if f.Thread != "" {
			want = n / 3
		}
		runs, err := d.Runs(bg, f)
		require.NoError(t, err)
		require.Len(t, runs, want, "%+v", f)
		if want == 0 {
			allocs := testing.AllocsPerRun(3, func() { d.Runs(bg, f) })
			assert.Less(t, allocs, float64(n), "allocations to list no run of %d, with %+v", n, f)
		}
	}
}
