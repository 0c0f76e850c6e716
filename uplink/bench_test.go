package uplink

import (
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

var benchLedger struct {
	sync.Once
	dir string
	n   int
}

// BenchmarkDrain drains a backlog of 100,000 outcomes
// ($OUTPOST_BENCH_OUTCOMES) to a bbolt collector on loopback, through the
// reference bundle's redaction policy, and reports records/s. The backlog
// is built once, through ordinary store commits, and copied for each
// iteration.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./uplink
func BenchmarkDrain(b *testing.B) {
	benchLedger.Do(func() {
		benchLedger.n = 100000
		if v := os.Getenv("OUTPOST_BENCH_OUTCOMES"); v != "" {
			benchLedger.n, _ = strconv.Atoi(v)
		}
		dir, err := os.MkdirTemp("", "outpost-bench-ledger-")
		require.NoError(b, err)
		benchLedger.dir = dir
		db := openAppliance(b, dir, "bench-1")
		start := time.Now()
		makeOutcomes(b, db, benchLedger.n)
		require.NoError(b, db.Close())
		b.Logf("built a ledger of %d outcomes in %s", benchLedger.n, time.Since(start).Round(time.Millisecond))
	})
	n := benchLedger.n
	// firmware/reference/bundle/redaction.json's fields (uplink may not
	// import firmware to read them).
	red, err := policy.NewRedactor(policy.RedactionPolicy{Fields: []string{"correlation_id", "causation_id", "thread", "run",
		"agent", "bundle", "status", "started_at", "ended_at", "steps", "tokens", "model_calls", "tools", "flags", "output", "error"}})
	require.NoError(b, err)
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		copyFile(b, filepath.Join(benchLedger.dir, store.FileName), filepath.Join(dir, store.FileName))
		db := openAppliance(b, dir, "bench-1")
		st, err := OpenBoltStore(b.TempDir())
		require.NoError(b, err)
		srv := httptest.NewServer(NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"bench-1": testSecret}}))
		u, err := New(db, Config{URL: srv.URL, Secret: testSecret, Redactor: red})
		require.NoError(b, err)
		b.StartTimer()
		start := time.Now()
		require.NoError(b, u.Flush(bg))
		total += time.Since(start)
		b.StopTimer()
		require.Zero(b, u.Status().Backlog)
		srv.Close()
		st.Close()
		db.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
}

func copyFile(b *testing.B, src, dst string) {
	in, err := os.Open(src)
	require.NoError(b, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(b, err)
	_, err = io.Copy(out, in)
	require.NoError(b, err)
	require.NoError(b, out.Close())
}
