package uplink

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/pgtest"
	"github.com/outpost-edge/outpost/store"
)

var bg = context.Background()

var testSecret = []byte("s3cret-of-clinic")

// testToken is the bearer token of the test collectors' GET /v1/appliances.
const testToken = "collector-token-0123456789abcdef0123456789abcdef"

func openAppliance(t testing.TB, dir, id string) *store.DB {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{ApplianceID: id, Timeout: 5 * time.Second})
	require.NoError(t, err)
	return db
}

var runCounter atomic.Int64

// makeOutcomes ends n runs through ordinary store commits, concurrently so
// that they share group commits (and fsyncs).
func makeOutcomes(t testing.TB, db *store.DB, n int) {
	t.Helper()
	const workers = 256
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, workers)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				i := runCounter.Add(1)
				id := fmt.Sprintf("run-%08d", i)
				thread := fmt.Sprintf("thread-%d", i%97)
				status := []engine.RunStatus{engine.StatusCompleted, engine.StatusCompleted, engine.StatusFailed,
					engine.StatusBudgetExceeded, engine.StatusCancelled}[i%5]
				flags, _ := json.Marshal([]string{"f" + strconv.Itoa(int(i%3))})
				r := &engine.Run{ID: id, Thread: thread, Agent: "medication-adherence", Status: status,
					Bundle:        engine.BundleRef{Name: "reference", Version: 1, Digest: "sha256:0011"},
					CorrelationID: "corr-" + id, Checkpoint: id, Steps: 3, CreatedAt: time.Now(),
					StartedAt: time.Now(), EndedAt: time.Now(),
					Output: json.RawMessage(`{"answer":"call 555-123-4567 if it hurts"}`)}
				if status != engine.StatusCompleted {
					r.Output, r.Error = nil, "stopped: "+string(status)
				}
				c := &engine.Commit{Run: r, Sync: true, Checkpoint: &engine.Checkpoint{Thread: thread, ID: id, RunID: id,
					Created: time.Now(), Channels: []engine.ChannelValue{{Channel: store.FlagsChannel, Version: 1, Value: engine.Value{Inline: flags}}}}}
				if err := db.Commit(bg, c); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// keepAll is a redaction policy that lets every field out, masking nothing.
type keepAll struct{}

func (keepAll) RedactJSON(b json.RawMessage) json.RawMessage { return b }

func pgDSN(t testing.TB) string { return pgtest.DSN(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}
