package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// A durability other than sync or exit is refused before the store is
// opened; it used to run the turn in exit mode, committing once.
func TestRunDurabilityChecked(t *testing.T) {
	for _, bad := range []string{"SYNC", "bogus", ""} {
		dir := filepath.Join(t.TempDir(), "data")
		code, stdout, stderr := outpost(t, "run", "--data", dir, "--thread", "t9", "--durability", bad, "I forgot my metformin")
		require.Equal(t, 2, code, stdout)
		require.Contains(t, stderr, `--durability must be sync or exit, not "`+bad+`"`)
		require.NotContains(t, stdout, "checkpoint")
		_, err := os.Stat(dir)
		require.True(t, os.IsNotExist(err), "the store was opened for %q", bad)
	}

	dir := t.TempDir()
	for _, tt := range []struct {
		durability  string
		checkpoints int
	}{{"sync", 7}, {"exit", 1}} {
		thread := "t-" + tt.durability
		code, _, stderr := outpost(t, "run", "--data", dir, "--thread", thread, "--durability", tt.durability, "I forgot my metformin")
		require.Zero(t, code, stderr)
		code, stdout, stderr := outpost(t, "runs", "history", thread, "--data", dir)
		require.Zero(t, code, stderr)
		require.Equal(t, 1+tt.checkpoints, strings.Count(stdout, "\n"), "%s:\n%s", tt.durability, stdout)
	}
}

// interruptedRun runs a turn that stops for review and returns its stdout
// and the run id.
func interruptedRun(t *testing.T, args ...string) (stdout, runID string) {
	t.Helper()
	code, stdout, stderr := outpost(t, append(append([]string{"run"}, args...), "remind me to refill my metformin")...)
	require.Zero(t, code, stderr)
	m := regexp.MustCompile(`on thread \S+: interrupted`).FindString(stdout)
	require.NotEmpty(t, m, stdout)
	id := regexp.MustCompile(`\nrun (run_\w+) on thread`).FindStringSubmatch(stdout)
	require.Len(t, id, 2, stdout)
	return stdout, id[1]
}

// Commands that only read refuse a folder with no store, as the db
// commands do, and create nothing: not the folder, the store or its lock.
// run still makes the store. The refusal says which it is (no folder, or
// a folder without the store) and what to give, where it said only "stat
// DIR/outpost.db: no such file or directory".
func TestReadOnlyCommandsNeedAStore(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	empty := t.TempDir()
	says := map[string]string{missing: "there is no folder " + missing, empty: "the folder holds no " + store.FileName}
	for _, dir := range []string{missing, empty} {
		for _, args := range [][]string{
			{"runs", "list"},
			{"runs", "show", "run_0000000000000001"},
			{"runs", "history", "t1"},
			{"runs", "fork", "t1", "--checkpoint", "c1"},
			{"runs", "replay", "run_0000000000000001"},
			{"resume", "run_0000000000000001", "--decision", "approve"},
		} {
			code, stdout, stderr := outpost(t, append(args, "--data", dir)...)
			require.Equal(t, 1, code, "%v: %s", args, stdout)
			require.Contains(t, stderr, "no store in "+dir+": "+says[dir]+": give the data folder that serve uses, "+
				"with --data DIR or $OUTPOST_DATA (./outpost-data unless told); only run and serve make a store\n", args)
		}
	}
	_, err := os.Stat(missing)
	require.True(t, os.IsNotExist(err), "a read-only command made the data folder")
	entries, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, entries, "a read-only command wrote into the data folder")

	code, _, stderr := outpost(t, "run", "--data", missing, "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr := outpost(t, "runs", "list", "--data", missing)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "completed")
}

// The resume command that run prints repeats the --data given, by flag or
// $OUTPOST_DATA, quoted when it needs to be; the default folder needs none.
func TestHintsCarryData(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my data")
	stdout, id := interruptedRun(t, "--data", dir, "--thread", "t1")
	require.Contains(t, stdout, "--decision approve|edit|reject --data '"+dir+"'\n")
	code, stdout, stderr := outpost(t, "runs", "show", id, "--data", dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "--data '"+dir+"'\n")

	env := t.TempDir()
	t.Setenv("OUTPOST_DATA", env)
	stdout, _ = interruptedRun(t, "--thread", "t1")
	require.Contains(t, stdout, "--decision approve|edit|reject --data "+env+"\n")

	t.Setenv("OUTPOST_DATA", "")
	t.Chdir(t.TempDir())
	stdout, _ = interruptedRun(t, "--thread", "t1")
	require.Contains(t, stdout, "--decision approve|edit|reject\n")
	require.NotContains(t, stdout, "--data")
}

// "more:" and "next" appear only when another page follows, and the hint
// keeps the folder and the filters.
func TestRunsListPaging(t *testing.T) {
	dir := t.TempDir()
	for _, th := range []string{"a", "b", "c"} {
		code, _, stderr := outpost(t, "run", "--data", dir, "--thread", th, "I forgot my metformin dose")
		require.Zero(t, code, stderr)
	}
	code, stdout, stderr := outpost(t, "runs", "list", "--data", dir, "--limit", "3")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "more:", "no fourth run follows")
	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--limit", "3", "--json")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, `"next"`)

	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--limit", "2", "--status", "completed")
	require.Zero(t, code, stderr)
	m := regexp.MustCompile(`more: outpost runs list --data (\S+) --status completed --limit 2 --after (run_\w+)\n`).FindStringSubmatch(stdout)
	require.Len(t, m, 3, stdout)
	require.Equal(t, dir, m[1])
	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--status", "completed", "--limit", "2", "--after", m[2])
	require.Zero(t, code, stderr)
	require.Equal(t, 2, strings.Count(stdout, "\n"), "the header and the third run:\n%s", stdout)
	require.NotContains(t, stdout, "more:")

	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--limit", "2", "--json")
	require.Zero(t, code, stderr)
	var page struct {
		Runs []struct{ ID string }
		Next string
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &page))
	require.Len(t, page.Runs, 2)
	require.Equal(t, page.Runs[1].ID, page.Next)
}

func TestRunsFiltersChecked(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)

	code, stdout, stderr := outpost(t, "runs", "list", "--data", dir, "--status", "bogus")
	require.Equal(t, 2, code, stdout)
	require.Contains(t, stderr, `--status "bogus": want one of queued, running, interrupted, completed, failed, cancelled, budget_exceeded`)
	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--status", "completed")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "completed")

	for _, sub := range [][]string{{"list"}, {"history", "t1"}} {
		for _, limit := range []string{"0", "-5"} {
			code, stdout, stderr = outpost(t, append(append([]string{"runs"}, sub...), "--data", dir, "--limit", limit)...)
			require.Equal(t, 2, code, "%v --limit %s: %s", sub, limit, stdout)
			require.Contains(t, stderr, "--limit must be a whole number from 1 to 1000 (a larger one reads as 1000)")
		}
		// A larger one reads as 1000, as the HTTP API reads it
		// (TestRunsListLimitAsTheAPIReadsIt).
		code, stdout, stderr = outpost(t, append(append([]string{"runs"}, sub...), "--data", dir, "--limit", "1001")...)
		require.Zero(t, code, "%v: %s", sub, stderr)
		require.Contains(t, stdout, "run_")
		require.Contains(t, stderr, "--limit 1001 reads as 1000")
	}
	// A cursor that is no run id is refused, as GET /api/v1/runs refuses
	// it: it listed every run (or none) with exit 0, as if it were a page.
	for _, after := range []string{"nope", "run_zzzz", "18ed2c6272c41ccd"} {
		code, stdout, stderr = outpost(t, "runs", "list", "--data", dir, "--after", after)
		require.Equal(t, 2, code, "--after %s: %s", after, stdout)
		require.Contains(t, stderr, `--after "`+after+`" is not a run id: give the --after of the "more:" line`)
	}
	code, stdout, stderr = outpost(t, "runs", "history", "t1", "--data", dir, "--limit", "1")
	require.Zero(t, code, stderr)
	require.Equal(t, 3, strings.Count(stdout, "\n"), "the header, the newest checkpoint and the next page's hint:\n%s", stdout)
	require.Contains(t, stdout, "\nmore: outpost runs history t1 --data "+dir+" --limit 1 --before ")
}

func TestResumeMessages(t *testing.T) {
	dir := t.TempDir()
	_, id := interruptedRun(t, "--data", dir, "--thread", "t1")

	code, _, stderr := outpost(t, "resume", "--data", dir, id, "--decision", "edit")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--decision edit needs --value JSON")
	code, _, stderr = outpost(t, "resume", "--data", dir, id, "--decision", "edit", "--value", "plain text")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `--value is not valid JSON; a text is quoted twice, as in --value '"new text"'`)

	code, _, stderr = outpost(t, "resume", "--data", dir, id, "--decision", "approve")
	require.Zero(t, code, stderr)
	want := "run is not interrupted: run " + id + " is completed"
	code, _, stderr = outpost(t, "resume", "--data", dir, id, "--decision", "approve")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, want, "without --interrupt")
	code, _, stderr = outpost(t, "resume", "--data", dir, id, "--interrupt", "int_x", "--decision", "approve")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, want, "with --interrupt")
}

// Arguments a subcommand would ignore are refused, naming its usage.
func TestExtraArgumentsRefused(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	for _, tt := range []struct {
		args  []string
		extra string
		usage string
	}{
		{[]string{"runs", "list", "extra"}, "extra", "outpost runs list [flags]"},
		{[]string{"runs", "show", "run_a", "run_b"}, "run_b", "outpost runs show [flags] RUN"},
		{[]string{"runs", "history", "t1", "junk"}, "junk", "outpost runs history [flags] THREAD"},
		{[]string{"runs", "replay", "run_a", "run_b"}, "run_b", "outpost runs replay [flags] RUN"},
		{[]string{"runs", "fork", "t1", "t2", "--checkpoint", "c"}, "t2", "outpost runs fork [flags] THREAD --checkpoint ID"},
		{[]string{"resume", "run_a", "run_b", "--decision", "approve"}, "run_b", "outpost resume [flags] RUN"},
	} {
		code, stdout, stderr := outpost(t, append(tt.args, "--data", dir)...)
		require.Equal(t, 2, code, "%v: %s", tt.args, stdout)
		require.Contains(t, stderr, `unexpected argument "`+tt.extra+`" (usage: `+tt.usage, tt.args)
	}
	code, _, stderr = outpost(t, "runs", "show", "--data", dir)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "missing RUN (usage: outpost runs show [flags] RUN)")

	// Commands that take no argument: "outpost serve /srv/outpost" served
	// ./outpost-data, and "outpost token DIR" read it, as if no folder had
	// been named.
	keys := t.TempDir()
	for _, tt := range []struct {
		args  []string
		usage string
	}{
		{[]string{"token", "--data", dir, "extra"}, "outpost token [--data DIR]"},
		{[]string{"firmware", "list", "--data", dir, "extra"}, "outpost firmware list [flags]"},
		{[]string{"firmware", "keygen", "--out", keys, "extra"}, "outpost firmware keygen [--out DIR]"},
		{[]string{"collector", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--secrets", "nothing", "extra"}, "outpost collector --listen ADDR"},
		{[]string{"serve", "--data", dir, "--listen", "127.0.0.1:0", "extra"}, "outpost serve [--data DIR]"},
	} {
		code, stdout, stderr := outpost(t, tt.args...)
		require.Equal(t, 2, code, "%v: %s", tt.args, stdout)
		require.Contains(t, stderr, `unexpected argument "extra" (usage: `+tt.usage, tt.args)
	}
	entries, err := os.ReadDir(keys)
	require.NoError(t, err)
	require.Empty(t, entries, "keygen made a key pair despite the extra argument")
}

// An unknown runs subcommand is a usage error, exit 2 as for an unknown
// command. Help goes to stdout, exits 0, and lists only the subcommand's
// own flags under a usage line naming its arguments.
func TestRunsHelpAndExitCodes(t *testing.T) {
	t.Chdir(t.TempDir()) // where ./outpost-data would go, if anything opened it
	code, stdout, stderr := outpost(t, "runs", "frob")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `unknown runs subcommand "frob"`)
	code, _, _ = outpost(t, "runs")
	require.Equal(t, 2, code)

	code, stdout, stderr = outpost(t, "runs", "-h")
	require.Zero(t, code)
	require.Empty(t, stderr)
	require.Contains(t, stdout, "<list|show|history|fork|replay>")
	// Every flag of list: --newest-first, which README names, was
	// missing.
	require.Contains(t, stdout, "list [--status S] [--agent A] [--thread T] [--limit N] [--after RUN] [--newest-first]")

	all := []string{"-data", "-json", "-status", "-agent", "-thread", "-limit", "-after", "-before", "-checkpoint"}
	for _, tt := range []struct {
		args  []string
		usage string
		flags []string
	}{
		{[]string{"runs", "list", "-h"}, "Usage: outpost runs list [flags]\n", []string{"-data", "-json", "-status", "-agent", "-thread", "-limit", "-after"}},
		{[]string{"runs", "show", "RUN", "--help"}, "Usage: outpost runs show [flags] RUN\n", []string{"-data", "-json"}},
		{[]string{"runs", "history", "-h"}, "Usage: outpost runs history [flags] THREAD\n", []string{"-data", "-json", "-limit", "-before"}},
		{[]string{"runs", "fork", "-h"}, "Usage: outpost runs fork [flags] THREAD --checkpoint ID\n", []string{"-data", "-json", "-checkpoint"}},
		{[]string{"runs", "replay", "-h"}, "Usage: outpost runs replay [flags] RUN\n", []string{"-data", "-json"}},
		{[]string{"resume", "-h"}, "Usage: outpost resume [flags] RUN", []string{"-data", "-decision", "-value", "-interrupt"}},
		{[]string{"run", "-h"}, "Usage: outpost run [flags] INPUT\n", []string{"-data", "-durability", "-thread"}},
	} {
		code, stdout, stderr := outpost(t, tt.args...)
		require.Zero(t, code, tt.args)
		require.Empty(t, stderr, tt.args)
		require.True(t, strings.HasPrefix(stdout, tt.usage), "%v:\n%s", tt.args, stdout)
		listed := func(f string) bool { return regexp.MustCompile(`(?m)^  ` + f + `( |$)`).MatchString(stdout) }
		for _, f := range tt.flags {
			require.True(t, listed(f), "%v does not list %s", tt.args, f)
		}
		if tt.args[0] == "runs" {
			for _, f := range all {
				require.Equal(t, slices.Contains(tt.flags, f), listed(f), "%v and %s", tt.args, f)
			}
		}
	}

	// A flag mistake is one message on stderr, with the usage line and
	// where the flags are listed (as db's commands say it).
	code, stdout, stderr = outpost(t, "runs", "show", "--after", "x", "run_a")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "outpost runs: flag provided but not defined: -after\nusage: outpost runs show [flags] RUN (outpost runs show -h lists its flags)\n", stderr)
}

// runs show is for people by default; --json has the record.
func TestRunsShowReadable(t *testing.T) {
	dir := t.TempDir()
	_, id := interruptedRun(t, "--data", dir, "--thread", "t1")
	code, stdout, stderr := outpost(t, "runs", "show", id, "--data", dir)
	require.Zero(t, code, stderr)
	require.False(t, json.Valid([]byte(stdout)), "still JSON:\n%s", stdout)
	for _, re := range []string{
		`(?m)^run +` + id + `$`, `(?m)^thread +t1$`, `(?m)^agent +medication-adherence$`, `(?m)^status +interrupted$`,
		`(?m)^created +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, `(?m)^durability +sync$`, `(?m)^checkpoint +\w+$`,
		`(?m)^input +remind me to refill my metformin$`,
		`(?m)^waiting for a decision on int_\w+ at review_response: \{"draft"`,
		`(?m)^  outpost resume ` + id + ` --interrupt int_\w+ --decision approve\|edit\|reject --data \S+$`,
	} {
		require.Regexp(t, re, stdout)
	}

	code, _, stderr = outpost(t, "resume", "--data", dir, id, "--decision", "edit", "--value", `"We will call you."`, "--by", "nurse")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpost(t, "runs", "show", id, "--data", dir)
	require.Zero(t, code, stderr)
	for _, re := range []string{`(?m)^status +completed$`, `(?m)^ended +\d{4}-`, `(?m)^output +We will call you\.`,
		`(?m)^decided edit on int_\w+ by nurse at [^:]+:\d\d:\d\d: We will call you\.$`} {
		require.Regexp(t, re, stdout)
	}
	require.NotContains(t, stdout, "waiting for a decision")

	code, stdout, stderr = outpost(t, "runs", "show", id, "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var run struct{ ID, Status string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &run), stdout)
	require.Equal(t, id, run.ID)
	require.Equal(t, "completed", run.Status)
}
