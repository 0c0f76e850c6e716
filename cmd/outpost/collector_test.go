package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/internal/pgtest"
	"github.com/outpost-edge/outpost/uplink"
)

// Two collectors that store into one PostgreSQL agree on one bearer token
// for GET /v1/appliances, though each came with a token of its own in its
// data folder: the second takes the first's, keeps it in its folder (where
// "outpost token --collector" reads it), and says so; the list answers it
// from either.
func TestCollectorsOnOnePostgresShareTheirToken(t *testing.T) {
	dsn := pgtest.DSN(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	db := fmt.Sprintf("outpost_cli_%d", time.Now().UnixNano())
	_, err = conn.Exec(context.Background(), "CREATE DATABASE "+db)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE "+db+" WITH (FORCE)")
		conn.Close(context.Background())
	})
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	dbDSN := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)

	bin := builtOutpost(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.WriteFile(secrets, []byte("clinic-1 hunter2-but-longer\n"), 0o600))
	var urls, toks, heads []string
	for i := range 2 {
		data := t.TempDir()
		// Each folder holds a token of its own, as a collector that ran on
		// bbolt before would have made.
		own := fmt.Sprintf("%064x", time.Now().UnixNano()+int64(i))
		require.NoError(t, os.WriteFile(filepath.Join(data, uplink.TokenFile), []byte(own+"\n"), 0o600))

		url, head := startCollectorBin(t, bin, data, secrets, dbDSN)
		urls, heads = append(urls, url), append(heads, head)
		code, tok, stderr := outpostBin(t, "", "token", "--collector", "--data", data)
		require.Zero(t, code, stderr)
		toks = append(toks, strings.TrimSpace(tok))
		if i == 0 {
			require.Equal(t, own, toks[0], "the first collector stores its own token")
		}
	}
	require.Equal(t, toks[0], toks[1], "the collectors on one database share one token")
	require.NotContains(t, heads[0], "share")
	require.Contains(t, heads[1], "the bearer token for GET /v1/appliances is the one the database's collectors share")
	for _, url := range urls {
		req, err := http.NewRequest(http.MethodGet, url+uplink.AppliancesPath, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+toks[0])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, url)
	}
}

var collectorLine = regexp.MustCompile(`^collector listening on (http://127\.0\.0\.1:\d+) `)

// startCollectorBin runs the binary's collector on PostgreSQL at dsn until
// the test ends, and returns its URL and what it printed at start.
func startCollectorBin(t *testing.T, bin, data, secrets, dsn string) (url, head string) {
	t.Helper()
	cmd := exec.Command(bin, "collector", "--listen", "127.0.0.1:0", "--data", data, "--secrets", secrets, "--postgres", dsn)
	out, stderr := startBin(t, cmd)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 10)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var printed []string
	deadline := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "collector exited early:\n%s\nstderr:\n%s", strings.Join(printed, "\n"), stderr.String())
			printed = append(printed, line)
			if m := collectorLine.FindStringSubmatch(line); m != nil {
				url = m[1]
			}
			if url != "" && strings.Contains(line, "needs it: outpost token") {
				return url, strings.Join(printed, "\n")
			}
		case <-deadline:
			t.Fatalf("collector did not start in 20s:\n%s\nstderr:\n%s", strings.Join(printed, "\n"), stderr.String())
		}
	}
}

// An empty --data (an unset variable, --data "$DIR") is refused by the
// collector as a bad command line that names the flag, before it makes
// its token or store in the current folder; it, and "outpost token
// --collector", name the collector's default folder, not the appliance's.
func TestCollectorEmptyDataIsRefused(t *testing.T) {
	secrets := filepath.Join(t.TempDir(), "secrets")
	require.NoError(t, os.WriteFile(secrets, []byte("clinic-1 s3cret\n"), 0o600))
	const empty = "flag -data: an empty folder name: name the data folder, or leave --data out for "
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"collector", "--data", "", "--secrets", secrets}, empty + defaultCollectorData + "\n"},
		{[]string{"collector", "--secrets", secrets, "--data", " "}, empty + defaultCollectorData + "\n"},
		{[]string{"token", "--collector", "--data", ""}, empty + defaultCollectorData + "\n"},
		// Read before --collector, --data names both defaults.
		{[]string{"token", "--data", "", "--collector"}, empty + "./outpost-data (" + defaultCollectorData + " with --collector)\n"},
	} {
		dir := t.TempDir()
		requireRefused(t, dir, tc.args)
		_, _, stderr := outpostBin(t, dir, tc.args...)
		require.Contains(t, stderr, tc.says, tc.args)
	}
}
