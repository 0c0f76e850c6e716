package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// serveStore holds the store in dir open, as serve does, and serves its
// control socket, until the returned func (also a cleanup) is called.
func serveStore(t *testing.T, dir string) (stop func()) {
	t.Helper()
	return serveStoreWith(t, dir, nil)
}

// serveStoreWith is serveStore, with the options opts makes for the store
// (none where nil).
func serveStoreWith(t *testing.T, dir string, opts func(*store.DB) store.ControlOptions) (stop func()) {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	var o []store.ControlOptions
	if opts != nil {
		o = append(o, opts(db))
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- store.ServeControl(ctx, db, dir, nil, o...) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-served)
		require.NoError(t, db.Close())
	}
	t.Cleanup(stop)
	awaitControl(t, dir)
	return stop
}

// awaitControl waits until the control socket in dir answers a read (its
// file appears a moment before it listens).
func awaitControl(t *testing.T, dir string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := store.DialControl(dir)
		if err != nil {
			return false
		}
		_, err = c.Runs(t.Context(), engine.RunFilter{Limit: 1, Damaged: func(string, error) {}})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
}

// result is what a command printed and how it exited.
type result struct {
	code           int
	stdout, stderr string
}

func outpostResult(t *testing.T, args ...string) result {
	t.Helper()
	code, stdout, stderr := outpost(t, args...)
	return result{code, stdout, stderr}
}

// runsIDs returns the runs' ids on a thread, oldest first.
func runIDs(t *testing.T, dir, thread string) []string {
	t.Helper()
	r := outpostResult(t, "runs", "list", "--data", dir, "--thread", thread, "--json")
	require.Zero(t, r.code, r.stderr)
	var page struct{ Runs []struct{ ID string } }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	var ids []string
	for _, run := range page.Runs {
		ids = append(ids, run.ID)
	}
	return ids
}

// While serve owns the store, runs list, show and history ask it through
// its control socket, and print what they print when they read the file
// themselves, to the byte: text and --json, the paging hints, a run that
// is not there, and damaged run records (left out of the list and named,
// with exit 1; named with bucket and key by show). They used to fail with
// "in use by another outpost process".
func TestRunsReadsWhileServeOwnsTheStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my data") // a --data hint that needs quoting
	_, interrupted := interruptedRun(t, "--data", dir, "--thread", "t1")
	for _, th := range []string{"t2", "t3"} {
		r := outpostResult(t, "run", "--data", dir, "--thread", th, "I forgot my metformin dose")
		require.Zero(t, r.code, r.stderr)
	}
	// A decision whose value is spaced as the operator typed it.
	_, edited := interruptedRun(t, "--data", dir, "--thread", "t4")
	r := outpostResult(t, "resume", "--data", dir, edited, "--decision", "edit", "--value", `{"text":  "We will call you.", "n": [1,  2]}`)
	require.Zero(t, r.code, r.stderr)
	doomed := runIDs(t, dir, "t3")
	require.Len(t, doomed, 1)

	commands := [][]string{
		{"runs", "list"},
		{"runs", "list", "--json"},
		{"runs", "list", "--limit", "2"},
		{"runs", "list", "--limit", "2", "--json"},
		{"runs", "list", "--status", "interrupted"},
		{"runs", "list", "--thread", "t2", "--json"},
		{"runs", "list", "--after", interrupted},
		{"runs", "show", interrupted},
		{"runs", "show", interrupted, "--json"},
		{"runs", "show", edited},
		{"runs", "show", edited, "--json"},
		{"runs", "show", "run_0000000000000001"},
		{"runs", "show", "run_0000000000000001", "--json"},
		{"runs", "history", "t1"},
		{"runs", "history", "t1", "--json"},
		{"runs", "history", "t2", "--limit", "3"},
		{"runs", "history", "t2", "--limit", "3", "--json"},
		{"runs", "history", "nothing"},
		{"runs", "history", "t1", "--before", "0000000000000001"},
	}
	// Against the file itself, then through serve: the same results.
	compare := func(commands [][]string) {
		t.Helper()
		local := make([]result, len(commands))
		for i, args := range commands {
			local[i] = outpostResult(t, append(args, "--data", dir)...)
		}
		stop := serveStore(t, dir)
		for i, args := range commands {
			got := outpostResult(t, append(args, "--data", dir)...)
			require.Equal(t, local[i], got, "%v", args)
		}
		stop()
	}
	compare(commands)

	// What was compared is what each command should say.
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"runs", "list"}, 0, interrupted},
		{[]string{"runs", "list", "--limit", "2"}, 0, "more: outpost runs list --data '" + dir + "' --limit 2 --after "},
		{[]string{"runs", "show", edited}, 0, `{"text":  "We will call you.", "n": [1,  2]}`},
		{[]string{"runs", "show", "run_0000000000000001"}, 1, "load run run_0000000000000001: run not found"},
		{[]string{"runs", "history", "t2", "--limit", "3"}, 0, "more: outpost runs history t2 --data '" + dir + "' --limit 3 --before "},
		{[]string{"runs", "history", "nothing"}, 1, `thread "nothing" has no checkpoints`},
		// A cursor that names no checkpoint listed the whole history
		// (or none), with exit 0, as if it were a page.
		{[]string{"runs", "history", "t1", "--before", "0000000000000001"}, 1, `--before "0000000000000001" names no checkpoint of thread "t1": give the --before of the "more:" line`},
		// One that is not a checkpoint id is refused before anything is
		// read, as runs list refuses an --after that is not a run id.
		{[]string{"runs", "history", "t1", "--before", "nope"}, 2, `--before "nope" is not a checkpoint id`},
	} {
		r := outpostResult(t, append(tc.args, "--data", dir)...)
		require.Equal(t, tc.code, r.code, "%v: %s", tc.args, r.stdout+r.stderr)
		require.Contains(t, r.stdout+r.stderr, tc.out, tc.args)
	}

	// A damaged run record: the list leaves it out and names it, show
	// names its bucket and key, whichever process reads it.
	damageRunRecords(t, dir)
	compare([][]string{
		{"runs", "list"},
		{"runs", "list", "--json"},
		{"runs", "show", doomed[0]},
		{"runs", "show", doomed[0], "--json"},
	})
	r = outpostResult(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "left out: corrupt record in bucket runs, key "+doomed[0]+": checksum mismatch")
	require.Contains(t, r.stderr, "run record(s) cannot be read and were left out of the list (run outpost db check)")
	r = outpostResult(t, "runs", "show", doomed[0], "--data", dir)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "load run "+doomed[0]+": corrupt record in bucket runs, key "+doomed[0]+": checksum mismatch")
}

// A store that another process holds, with no control socket, is still
// "in use", and said so.
func TestRunsReadsStoreInUseWithoutControl(t *testing.T) {
	dir := storeWithRun(t)
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	r := outpostResult(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "is in use by another outpost process")
	require.Contains(t, r.stderr, "serves no control socket")
}

// runs list, show and history open the store read-only: no byte of the
// folder changes, and no lock file appears.
func TestRunsReadsWriteNothing(t *testing.T) {
	dir := storeWithRun(t)
	id := runIDs(t, dir, "t1")[0]
	damaged := storeWithRun(t)
	damageRunRecords(t, damaged)
	for _, dir := range []string{dir, damaged} {
		require.NoError(t, os.Remove(filepath.Join(dir, store.LockFile(store.FileName))))
		before := folderFiles(t, dir)
		for _, args := range [][]string{
			{"runs", "list"}, {"runs", "list", "--json"}, {"runs", "show", id}, {"runs", "show", "run_0000000000000001"},
			{"runs", "history", "t1"}, {"runs", "history", "t1", "--limit", "2", "--json"},
		} {
			outpost(t, append(args, "--data", dir)...)
			after := folderFiles(t, dir)
			require.Equal(t, before[store.FileName], after[store.FileName], "%v wrote to the store", args)
			require.Equal(t, before, after, "%v changed the data folder", args)
		}
	}
}

// runs history says how to see the checkpoints below a page when more
// follow (text: a "more:" line to paste; --json: "next"), and only then;
// following the hints pages through the whole history.
func TestRunsHistoryNextPage(t *testing.T) {
	dir := storeWithRun(t) // seven checkpoints on t1
	r := outpostResult(t, "runs", "history", "t1", "--data", dir, "--limit", "7")
	require.Zero(t, r.code, r.stderr)
	require.NotContains(t, r.stdout, "more:", "no eighth checkpoint follows")
	// Rows by their fields: a page's columns are as wide as its own rows.
	fields := func(lines []string) (out []string) {
		for _, l := range lines {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
		return out
	}
	all := fields(strings.Split(strings.TrimSpace(r.stdout), "\n")[1:])
	require.Len(t, all, 7)
	r = outpostResult(t, "runs", "history", "t1", "--data", dir, "--limit", "7", "--json")
	require.Zero(t, r.code, r.stderr)
	var last map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &last))
	require.NotContains(t, last, "next")
	require.Contains(t, last, "checkpoints")

	var rows []string
	args := []string{"runs", "history", "t1", "--data", dir, "--limit", "3"}
	for pages := 1; ; pages++ {
		require.LessOrEqual(t, pages, 3, "the hints go round")
		r := outpostResult(t, args...)
		require.Zero(t, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.True(t, strings.HasPrefix(lines[0], "CHECKPOINT"), r.stdout)
		more := regexp.MustCompile(`(?m)^more: outpost (runs history t1 --data (\S+) --limit 3 --before (\w+))$`).FindStringSubmatch(r.stdout)
		if more == nil {
			require.NotContains(t, r.stdout, "more:")
			rows = append(rows, fields(lines[1:])...)
			require.Equal(t, 3, pages)
			break
		}
		require.Equal(t, dir, more[2])
		rows = append(rows, fields(lines[1:len(lines)-1])...)
		require.True(t, strings.HasPrefix(lines[len(lines)-2], more[3]+" "), "--before names the page's oldest:\n%s", r.stdout)

		// --json says the same with "next".
		var page struct {
			Thread      string
			Checkpoints []struct{ ID string }
			Next        string
		}
		j := outpostResult(t, append(args, "--json")...)
		require.Zero(t, j.code, j.stderr)
		require.NoError(t, json.Unmarshal([]byte(j.stdout), &page))
		require.Len(t, page.Checkpoints, 3)
		require.Equal(t, more[3], page.Next)
		args = strings.Fields(more[1])
	}
	require.Equal(t, all, rows, "the pages are the whole history, in order")

	oldest := strings.Fields(all[len(all)-1])[0]
	r = outpostResult(t, "runs", "history", "t1", "--data", dir, "--before", oldest)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `thread "t1" has no checkpoints before `+oldest)
	r = outpostResult(t, "runs", "history", "t1", "--data", dir, "--before", "0000000000000000")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `--before "0000000000000000" names no checkpoint of thread "t1"`)
}

// fork and replay need the store to themselves: while serve owns it, they
// say to stop serve, and fork names the HTTP API's call that does the
// same.
func TestRunsForkAndReplayWhileServeOwnsTheStore(t *testing.T) {
	dir := storeWithRun(t)
	id := runIDs(t, dir, "t1")[0]
	serveStore(t, dir)
	r := outpostResult(t, "runs", "fork", "t1", "--checkpoint", "c1", "--data", dir)
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "is in use by another outpost process")
	require.Contains(t, r.stderr, `stop serve, or fork through its HTTP API: POST /api/v1/threads/t1/fork with {"checkpoint":"c1"} and the bearer token that outpost token --data `+dir+` prints`)
	r = outpostResult(t, "runs", "replay", id, "--data", dir)
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "is in use by another outpost process")
	require.Contains(t, r.stderr, "stop serve, then replay the run (the HTTP API has no replay)")
}
