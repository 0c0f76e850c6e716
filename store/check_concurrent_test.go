package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
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
