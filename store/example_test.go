package store_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// A store is opened once per process; a second opener of the same data
// folder gets ErrInUse. Commit makes a step durable; reads see it at once.
func Example() {
	dir, err := os.MkdirTemp("", "outpost-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	err = db.Commit(ctx, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t1", ID: "0001", RunID: "run_1", Source: engine.SourceInput,
			Channels: []engine.ChannelValue{{Channel: "question", Version: 1, Value: engine.Value{Inline: []byte(`"hello"`)}}}},
		Run:  &engine.Run{ID: "run_1", Thread: "t1", Agent: "demo", Status: engine.StatusRunning, CreatedAt: time.Now()},
		Sync: true,
	})
	if err != nil {
		log.Fatal(err)
	}

	c, err := db.Checkpoint(ctx, "t1", "", "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.ID, string(c.Channels[0].Value.Inline))

	_, err = store.OpenDir(dir, store.Options{Timeout: 100 * time.Millisecond})
	fmt.Println(err != nil && errors.Is(err, store.ErrInUse))

	rep, err := db.Check(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("check ok:", rep.OK())
	// Output:
	// 0001 "hello"
	// true
	// check ok: true
}
