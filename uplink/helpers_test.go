package uplink

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
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

// pgDSN returns a PostgreSQL to test against: $OUTPOST_PG_DSN, or a
// throwaway server started from the Debian packages. It skips, loudly, only
// when neither exists.
func pgDSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("OUTPOST_PG_DSN"); dsn != "" {
		return dsn
	}
	dsn, err := startPostgres(t)
	if err != nil {
		msg := "\n" +
			"##########################################################################\n" +
			"## SKIPPING THE POSTGRESQL COLLECTOR TESTS: no PostgreSQL could be started\n" +
			"## (" + err.Error() + ")\n" +
			"## Install it (apt-get install -y postgresql) or set OUTPOST_PG_DSN.\n" +
			"##########################################################################"
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	return dsn
}

var pgOnce struct {
	sync.Once
	dsn string
	err error
}

// startPostgres runs initdb and pg_ctl in a temporary folder, as the
// postgres user when running as root; the server lives until the test
// binary exits (TestMain stops it).
func startPostgres(t testing.TB) (string, error) {
	pgOnce.Do(func() { pgOnce.dsn, pgOnce.err = bootPostgres() })
	return pgOnce.dsn, pgOnce.err
}

var pgStop func()

func bootPostgres() (string, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return "", fmt.Errorf("initdb not found under /usr/lib/postgresql")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "outpost-pg-")
	if err != nil {
		return "", err
	}
	run := func(args ...string) *exec.Cmd { return exec.Command(args[0], args[1:]...) }
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return "", fmt.Errorf("running as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return "", err
		}
		run = func(args ...string) *exec.Cmd {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	data := filepath.Join(dir, "data")
	if out, err := run(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres").CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	if out, err := run(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start").CombinedOutput(); err != nil {
		return "", fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	pgStop = func() {
		_ = run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop").Run()
		os.RemoveAll(dir)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pgStop != nil {
		pgStop()
	}
	os.Exit(code)
}
