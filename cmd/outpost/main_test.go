package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

func outpost(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = execute(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// outpostOK runs outpost with args, which must succeed, and returns its
// stdout.
func outpostOK(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := outpost(t, args...)
	require.Zero(t, code, "%v: %s%s", args, stdout, stderr)
	return stdout
}

func TestUnknownCommandAndHelp(t *testing.T) {
	code, _, stderr := outpost(t, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown command "frobnicate"`)

	code, stdout, _ := outpost(t, "help")
	require.Zero(t, code)
	for _, c := range []string{"run", "resume", "runs", "db", "bench", "version"} {
		require.Contains(t, stdout, "  "+c+" ")
	}

	code, stdout, stderr = outpost(t)
	require.Equal(t, 2, code, "no command is a bad command line")
	require.Empty(t, stdout)
	require.Contains(t, stderr, "  run ", "the usage goes to stderr")
}

func TestRunThenInspect(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--agent", "reference", "--thread", "t1", "I forgot my losartan dose")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "node.completed")
	require.Contains(t, stdout, ": completed")
	require.Contains(t, stdout, "[kb-06]", "the answer cites the first losartan document")

	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var page struct {
		Runs []struct{ ID, Thread, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &page))
	require.Len(t, page.Runs, 1)
	require.Equal(t, "completed", page.Runs[0].Status)

	code, stdout, _ = outpost(t, "runs", "history", "t1", "--data", dir)
	require.Zero(t, code)
	require.Equal(t, 1+7, strings.Count(stdout, "\n"), "header plus input and six steps:\n%s", stdout)

	code, stdout, stderr = outpost(t, "db", "check", "--data", dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
	require.Regexp(t, `checkpoints 7, thread heads 1, branches 0, pending writes \d+, blobs [1-9]\d*, blob index entries 0, runs 1, outcome index entries 1, tool calls \d+, outcomes 1\n`, stdout,
		"the answer and its message are blobs, still in the log's unindexed tail")
	require.Regexp(t, `store file [0-9.]+ MB in pages of 8 KB: [0-9.]+ MB in use, [0-9.]+ MB of free pages \(db compact gives them back\), [0-9.]+ MB room to grow into\n`, stdout)

	bak := filepath.Join(t.TempDir(), "b.db")
	code, stdout, stderr = outpost(t, "db", "backup", "--data", dir, bak)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "checked")
	code, _, stderr = outpost(t, "db", "backup", "--data", dir, bak)
	require.Equal(t, 1, code, "a backup never overwrites")
	require.Contains(t, stderr, "exists")

	code, stdout, stderr = outpost(t, "db", "prune", "--data", dir, "--older-than", "1ns", "--json")
	require.Zero(t, code, stderr)
	var rep store.PruneReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.Equal(t, 1, rep.Threads)
	require.Equal(t, 6, rep.CheckpointsRemoved)

	code, _, stderr = outpost(t, "db", "compact", "--data", dir)
	require.Zero(t, code, stderr)
	code, stdout, _ = outpost(t, "runs", "history", "t1", "--data", dir)
	require.Zero(t, code)
	require.Equal(t, 2, strings.Count(stdout, "\n"), "one checkpoint left:\n%s", stdout)
}

// A store with a damaged page does not open; db salvage copies what can
// be read into a new file, says what was lost and how to use the copy, and
// leaves the store as it was. A sound store is copied whole.
func TestDBSalvage(t *testing.T) {
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	for i := range 60 { // enough runs for the runs bucket to have a page of its own
		id := fmt.Sprintf("%04d", i+1)
		require.NoError(t, db.Commit(context.Background(), &engine.Commit{
			Checkpoint: &engine.Checkpoint{Thread: "t1", ID: id, Created: time.Now()},
			Run:        &engine.Run{ID: "run_" + id, Thread: "t1", Status: engine.StatusQueued, Checkpoint: id},
			Sync:       true,
		}))
	}
	require.NoError(t, db.Close())
	path := filepath.Join(dir, store.FileName)

	code, stdout, stderr := outpost(t, "db", "salvage", "--data", dir, filepath.Join(t.TempDir(), "whole.db"))
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "nothing was lost, and the copy checks clean")

	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	var root uint64
	require.NoError(t, bdb.View(func(tx *bbolt.Tx) error { root = uint64(tx.Bucket([]byte("runs")).Root()); return nil }))
	ps := bdb.Info().PageSize
	require.NoError(t, bdb.Close())
	require.NotZero(t, root, "the runs bucket is still inline")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xEE}, 32), int64(root)*int64(ps))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	damaged, err := os.ReadFile(path)
	require.NoError(t, err)

	code, _, stderr = outpost(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "damaged")
	require.Contains(t, stderr, "outpost db salvage --data "+dir+" FILE", "the refusal does not say what to do")

	out := filepath.Join(t.TempDir(), "salvaged.db")
	code, stdout, stderr = outpost(t, "db", "salvage", "--data", dir, out)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stdout, "LOST runs: page ")
	m := regexp.MustCompile(`\(checkpoints (\d+), recent checkpoints (\d+),`).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	require.Equal(t, 60, atoi(t, m[1])+atoi(t, m[2]), "the checkpoints are not on the damaged page")
	require.Contains(t, stdout, "to use the copy: stop serve")
	require.Contains(t, stderr, "the copy is not whole")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, damaged, after, "salvage changed the store")

	code, _, stderr = outpost(t, "db", "salvage", "--data", dir, "--json", out)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "exists")

	// The copy takes the store's place and serves what it holds.
	require.NoError(t, os.Rename(out, path))
	code, stdout, stderr = outpost(t, "runs", "history", "t1", "--data", dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "0060")
}

// Flags may follow the arguments, as most command-line tools allow; "--"
// ends them. A run's input is free text, so its flags come first and the
// rest is input, dashes and all (one of run's own flags among it only
// after "--": TestRunRefusesItsFlagsAfterTheInput).
func TestFlagsAfterArguments(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "t1", "--", "take", "-3", "units", "--json")
	require.Zero(t, code, stderr)
	code, stdout, stderr := outpost(t, "runs", "list", "--data", dir, "--json")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, `take -3 units --json`, "the input lost words that look like flags")

	backup := filepath.Join(t.TempDir(), "b.db")
	code, stdout, stderr = outpost(t, "db", "backup", backup, "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	require.Equal(t, backup, res["file"])

	code, stdout, stderr = outpost(t, "runs", "history", "t1", "--json", "--data", dir)
	require.Zero(t, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	require.Equal(t, "t1", res["thread"])

	code, _, stderr = outpost(t, "runs", "history", "--data", dir, "--", "--json")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `thread "--json" has no checkpoints`, "-- did not end the flags")

	code, _, stderr = outpost(t, "runs", "history", "t1", "--data", dir, "--no-such-flag")
	require.NotZero(t, code)
	require.Contains(t, stderr, "flag provided but not defined: -no-such-flag")
}

func TestDBCheckReportsCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)

	damageRunRecords(t, dir)

	code, stdout, stderr := outpost(t, "db", "check", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "PROBLEM runs")
	require.Contains(t, stderr, "problem(s) found")

	code, _, stderr = outpost(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, code, "a corrupt record is an error, never a panic")
	require.Contains(t, stderr, "runs")
}

func TestWrongFormatRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, store.FileName), bytes.Repeat([]byte("not a store "), 1000), 0o600))
	code, _, stderr := outpost(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "incompatible outpost version, or is not an outpost store")
}

func TestBenchReferenceJSON(t *testing.T) {
	code, stdout, stderr := outpost(t, "bench", "reference", "--threads", "2", "--turns", "5", "--json")
	require.Zero(t, code, stderr)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	for _, f := range []string{"impl", "saver", "durability", "threads", "turns", "turns_per_s", "seconds", "finals", "db_bytes", "rss_mb"} {
		require.Contains(t, res, f)
	}
	require.EqualValues(t, 10, res["finals"])

	code, stdout, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--threads", "2", "--turns", "3", "--json")
	require.Zero(t, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Greater(t, res["commit_ms"], 0.0)
	require.Greater(t, res["ceiling_turns_per_s"], 0.0)
	require.Greater(t, res["db_bytes"], 0.0)
	require.GreaterOrEqual(t, res["commits"], res["transactions"])
	require.Greater(t, res["commit_wait_ms"], 0.0)
	require.Greater(t, res["transactions"], 0.0)

	code, stdout, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--threads", "4", "--turns", "2")
	require.Zero(t, code, stderr)
	require.Regexp(t, `one fsynced commit [0-9.]+ ms, [0-9.]+ commits/turn, ceiling [0-9.]+ turns/s per thread`, stdout)
	require.Regexp(t, `group commit: [0-9]+ commits in [0-9]+ fsynced transactions, [0-9.]+ per transaction; a commit took [0-9.]+ ms on average`, stdout)

	// --data names a folder that need not exist yet; the store is left there.
	data := filepath.Join(t.TempDir(), "not", "yet")
	code, _, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--threads", "1", "--turns", "2", "--data", data)
	require.Zero(t, code, stderr)
	require.FileExists(t, filepath.Join(data, "bench-reference.db"))
	require.NoFileExists(t, filepath.Join(data, "commit-probe.db"))
}

// --runs N runs the workload N times and prints the medians, with each
// run's figures.
func TestBenchRuns(t *testing.T) {
	code, stdout, stderr := outpost(t, "bench", "reference", "--saver", "bbolt", "--turns", "3", "--runs", "3", "--json")
	require.Zero(t, code, stderr)
	var res struct {
		TurnsPerS  float64 `json:"turns_per_s"`
		CeilingPct float64 `json:"ceiling_pct"`
		Finals     int     `json:"finals"`
		Runs       []struct {
			TurnsPerS  float64 `json:"turns_per_s"`
			CeilingPct float64 `json:"ceiling_pct"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Len(t, res.Runs, 3)
	tps := []float64{res.Runs[0].TurnsPerS, res.Runs[1].TurnsPerS, res.Runs[2].TurnsPerS}
	slices.Sort(tps)
	require.Equal(t, tps[1], res.TurnsPerS)
	require.Positive(t, res.CeilingPct)
	require.Equal(t, 3, res.Finals)

	code, stdout, stderr = outpost(t, "bench", "reference", "--turns", "2", "--runs", "2")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "run 1 of 2: ")
	require.Contains(t, stdout, "run 2 of 2: ")
	require.Contains(t, stdout, "medians of 2 runs")

	code, _, stderr = outpost(t, "bench", "reference", "--runs", "0")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--runs must be at least 1")
	code, _, stderr = outpost(t, "bench", "reference", "--runs", "2", "--cpuprofile", filepath.Join(t.TempDir(), "cpu"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "leave out --runs")
}

// --probe-during adds the commit cost between turns, and the ceiling it
// implies, to the figures; it needs the bbolt saver and one thread.
func TestBenchProbeDuring(t *testing.T) {
	code, stdout, stderr := outpost(t, "bench", "reference", "--saver", "bbolt", "--turns", "20", "--probe-during", "--json")
	require.Zero(t, code, stderr)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	for _, f := range []string{"commit_during_ms", "ceiling_during_turns_per_s", "ceiling_during_pct", "commit_ms", "ceiling_pct"} {
		require.Contains(t, res, f)
		require.Greater(t, res[f], 0.0, f)
	}

	code, stdout, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--turns", "20", "--probe-during")
	require.Zero(t, code, stderr)
	require.Regexp(t, `between turns, while the workload runs: one fsynced commit [0-9.]+ ms, ceiling [0-9.]+ turns/s \([0-9]+% of it\)`, stdout)
	code, stdout, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--turns", "5", "--probe-during")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "between turns: no figure")
	require.Contains(t, stdout, "--turns 20 or more")

	code, stdout, stderr = outpost(t, "bench", "reference", "--saver", "bbolt", "--turns", "20", "--json")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "during", "the probe between turns ran unasked")

	for _, args := range [][]string{{"--probe-during"}, {"--saver", "bbolt", "--threads", "2", "--probe-during"}} {
		code, stdout, stderr = outpost(t, append([]string{"bench", "reference", "--turns", "2"}, args...)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, stderr, "--probe-during needs --saver bbolt and --threads 1")
		require.Empty(t, stdout)
	}
}

// --cpuprofile and --trace write files that go tool pprof and go tool
// trace read; a path that cannot be made fails before the workload runs.
func TestBenchWritesProfiles(t *testing.T) {
	dir := t.TempDir()
	cpu, tr := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "run.trace")
	code, stdout, stderr := outpost(t, "bench", "reference", "--threads", "2", "--turns", "20", "--cpuprofile", cpu, "--trace", tr, "--json")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, `"turns_per_s"`)

	f, err := os.Open(cpu)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f) // a profile is a gzipped protocol buffer
	require.NoError(t, err, "the CPU profile is not gzipped")
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Contains(t, string(raw), "nanoseconds", "the CPU profile names no sample unit")

	trace, err := os.ReadFile(tr)
	require.NoError(t, err)
	require.Regexp(t, `^go 1\.[0-9]+ trace`, string(trace[:min(len(trace), 32)]))
	require.Greater(t, len(trace), 1000)

	bad := filepath.Join(dir, "no-such-folder", "cpu.pprof")
	code, stdout, stderr = outpost(t, "bench", "reference", "--turns", "2", "--cpuprofile", bad)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, bad)
	require.Empty(t, stdout, "the workload ran although its profile could not be written")
}

// While another owner holds the store and keeps committing, db backup and
// db check go through its control socket, and the backup is consistent.
func TestBackupWhileOwnerWrites(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "seed", "I forgot my metformin dose")
	require.Zero(t, code, stderr)

	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- store.ServeControl(ctx, db, dir, nil) }()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, store.ControlSocket))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	resolve, err := resolver()
	require.NoError(t, err)
	m := engine.NewManager(db, resolve, engine.ManagerOptions{})
	defer m.Close()
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for i := 0; ctx.Err() == nil && i < 200; i++ {
			_, _ = m.Invoke(ctx, engine.RunRequest{Thread: "busy", Agent: "reference", Input: json.RawMessage(`"I forgot my losartan dose"`)})
		}
	}()

	bak := filepath.Join(t.TempDir(), "online.db")
	code, stdout, stderr := outpost(t, "db", "backup", "--data", dir, bak)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "checked")
	code, stdout, stderr = outpost(t, "db", "check", "--data", dir)
	require.Zero(t, code, stdout+stderr)
	require.Contains(t, stdout, "store is sound")
	code, _, stderr = outpost(t, "db", "compact", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "stop serve first")
	cancel()
	<-writing
	require.NoError(t, <-served)

	// The copy opens on its own and holds the seed run.
	b, err := store.Open(bak, store.Options{ReadOnly: true})
	require.NoError(t, err)
	defer b.Close()
	runs, err := b.Runs(context.Background(), engine.RunFilter{Thread: "seed"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
}

// version takes --json, as every command does.
func TestVersionJSON(t *testing.T) {
	code, stdout, stderr := outpost(t, "version", "--json")
	require.Zero(t, code, stderr)
	var v struct{ Version, Go string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &v), stdout)
	require.Equal(t, version, v.Version)
	require.NotEmpty(t, v.Go)
	code, stdout, _ = outpost(t, "version")
	require.Zero(t, code)
	require.Equal(t, "outpost "+version+"\n", stdout)
}

// -h prints a command's help on stdout and exits 0, for every command
// built on cmdFlags.
func TestHelpOnStdout(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "-h"}, {"bench", "reference", "-h"}, {"eval", "-h"}, {"token", "-h"}, {"collector", "-h"},
		{"run", "-h"}, {"resume", "-h"}, {"version", "-h"}, {"db", "check", "-h"}, {"runs", "list", "-h"},
		{"firmware", "install", "-h"}, {"firmware", "sign", "-h"}, {"uplink", "status", "-h"},
	} {
		code, stdout, stderr := outpost(t, args...)
		require.Zero(t, code, "%v: %s", args, stderr)
		require.Empty(t, stderr, "%v", args)
		require.Contains(t, stdout, "Usage: outpost "+args[0], "%v", args)
		require.Contains(t, stdout, "Flags:", "%v", args)
	}
}

// Every command of subcommands answers help, -h and --help where the
// subcommand goes alike: its usage on stdout, nothing on stderr, exit 0,
// and flag.ErrHelp from the command, as a flag set's -h gives; "outpost
// help NAME" says the same.
func TestEveryCommandOfSubcommandsHelpsAlike(t *testing.T) {
	var groups []string
	for name, cmd := range commands {
		if len(cmd.subs) > 0 {
			groups = append(groups, name)
		}
	}
	require.Subset(t, groups, []string{"runs", "db", "firmware", "uplink", "bench"})
	for _, name := range groups {
		var usage string
		for _, args := range [][]string{{name, "help"}, {name, "-h"}, {name, "--help"}, {"help", name}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, stdout, stderr := outpost(t, args...)
				require.Zero(t, code, stderr)
				require.Empty(t, stderr)
				require.True(t, strings.HasPrefix(stdout, "Usage: outpost "+name+" "), stdout)
				require.True(t, strings.HasSuffix(stdout, "\n"), stdout)
				if usage == "" {
					usage = stdout
				}
				require.Equal(t, usage, stdout, "the same help each way")

				var out, errb bytes.Buffer
				sub := args[1:]
				if args[0] == "help" {
					sub = []string{"-h"}
				}
				err := commands[name].run(context.Background(), sub, &out, &errb)
				require.ErrorIs(t, err, flag.ErrHelp)
				require.Equal(t, usage, out.String())
				require.Empty(t, errb.String())
			})
		}
	}
}

// Each uplink subcommand lists its own flags only.
func TestUplinkHelpListsItsOwnFlags(t *testing.T) {
	_, stdout, _ := outpost(t, "uplink", "status", "-h")
	require.Contains(t, stdout, "Usage: outpost uplink status")
	require.NotContains(t, stdout, "-timeout")
	_, stdout, _ = outpost(t, "uplink", "flush", "-h")
	require.Contains(t, stdout, "-secret-file")
	require.Contains(t, stdout, "-timeout")
	code, _, stderr := outpost(t, "uplink", "flush", "--data", t.TempDir())
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "flush needs --url (or --uplink) and --secret-file (or --uplink-secret) (usage: outpost uplink flush --url URL --secret-file FILE [flags])")
}

// bench names its one workload: -h on stdout with exit 0, an unknown one
// is a usage error that says so.
func TestBenchUsage(t *testing.T) {
	code, stdout, stderr := outpost(t, "bench", "-h")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "Usage: outpost bench reference [flags]")
	code, _, stderr = outpost(t, "bench", "nope")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown workload "nope"`)
	code, stdout, stderr = outpost(t, "firmware", "list", "--data", t.TempDir(), "--json")
	require.Zero(t, code, stderr)
	require.JSONEq(t, `{"installed": [], "kept": [], "log": []}`, stdout, "empty lists, not null")
	typo := filepath.Join(t.TempDir(), "typo")
	code, _, stderr = outpost(t, "firmware", "list", "--data", typo)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no data folder "+typo)
	require.NoDirExists(t, typo, "a listing makes nothing")
}

// runs list --newest-first lists the newest runs first, and --after pages
// on towards older ones.
func TestRunsListNewestFirst(t *testing.T) {
	dir := t.TempDir()
	for _, th := range []string{"a", "b", "c"} {
		code, _, stderr := outpost(t, "run", "--data", dir, "--thread", th, "hello")
		require.Zero(t, code, stderr)
	}
	ids := func(args ...string) ([]string, string) {
		code, stdout, stderr := outpost(t, append([]string{"runs", "list", "--data", dir, "--json"}, args...)...)
		require.Zero(t, code, stderr)
		var page struct {
			Runs []struct{ ID, Thread string } `json:"runs"`
			Next string                        `json:"next"`
		}
		require.NoError(t, json.Unmarshal([]byte(stdout), &page), stdout)
		var out []string
		for _, r := range page.Runs {
			out = append(out, r.Thread)
		}
		return out, page.Next
	}
	all, _ := ids()
	require.Equal(t, []string{"a", "b", "c"}, all)
	newest, next := ids("--newest-first", "--limit", "2")
	require.Equal(t, []string{"c", "b"}, newest)
	rest, _ := ids("--newest-first", "--after", next)
	require.Equal(t, []string{"a"}, rest)
}

// An empty --data, most often an unset variable ("--data $DIR"), is
// refused: it would name the current folder, and run would make a store
// there.
func TestEmptyDataFolderIsRefused(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	for _, args := range [][]string{
		{"run", "--data", "", "hello"},
		{"runs", "list", "--data", ""},
		{"db", "check", "--data", " "},
	} {
		code, _, stderr := outpost(t, args...)
		require.NotZero(t, code, "%v", args)
		require.Contains(t, stderr, "an empty folder name", "%v", args)
	}
	entries, err := os.ReadDir(cwd)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing is made in the current folder")
}

// serve's usage line names every flag it takes: it is the line an
// operator reads first.
func TestServeUsageNamesEveryFlag(t *testing.T) {
	code, stdout, stderr := outpost(t, "serve", "-h")
	require.Zero(t, code)
	help := stdout + stderr
	usage, _, _ := strings.Cut(help, "\n")
	n := 0
	for _, line := range strings.Split(help, "\n") {
		if name, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ = strings.Cut(name, " ")
			require.Contains(t, usage, "--"+name+" ", "the usage line leaves out --%s", name)
			n++
		}
	}
	require.Greater(t, n, 10, "the flags were listed")
}
