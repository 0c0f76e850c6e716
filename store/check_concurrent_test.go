package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Check runs while writers commit: bbolt's page check must not race
// with their freelist changes, and a consistent store reports no problem.
func TestCheckWhileWriting(t *testing.T) {
	db, err := OpenDir(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				big := []byte(fmt.Sprintf("%0600d", i*10+w))
				ref := engine.RefOf(big)
				c := &engine.Commit{Checkpoint: &engine.Checkpoint{Thread: fmt.Sprint("t", w), ID: fmt.Sprintf("%016x", i), Step: i,
					Channels: []engine.ChannelValue{{Channel: "x", Value: engine.Value{Blob: ref}}}}, Blobs: map[engine.BlobRef][]byte{ref: big},
					Run: &engine.Run{ID: fmt.Sprintf("r%d-%d", w, i), Thread: "t", Status: engine.StatusRunning, CreatedAt: time.Now()}}
				if i > 0 {
					c.Checkpoint.ParentID = fmt.Sprintf("%016x", i-1)
				}
				if err := db.Commit(ctx, c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		rep, err := db.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("check %d: %v", i, rep.Problems[:min(3, len(rep.Problems))])
		}
	}
	close(stop)
	wg.Wait()
}

// Under WithProgress, Check reports how many records it has read, rising.
func TestCheckReportsProgress(t *testing.T) {
	defer func(n int) { progressEvery = n }(progressEvery)
	progressEvery = 5
	d := openTest(t)
	for i := 1; i <= 12; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	var seen []int
	rep, err := d.Check(WithProgress(bg, func(n int) { seen = append(seen, n) }))
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Problems)
	// Every record is read once at least (index entries count too).
	total := 0
	for _, n := range rep.Records {
		total += n
	}
	require.GreaterOrEqual(t, len(seen), total/5, "%v", seen)
	for i, n := range seen {
		assert.Equal(t, 5*(i+1), n)
	}
}
