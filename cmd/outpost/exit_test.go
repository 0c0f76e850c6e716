package main

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// commandLines is every command, and every subcommand of the commands that
// have them, as "outpost" is called for it.
func commandLines() [][]string {
	var lines [][]string
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		if subs := commands[name].subs; len(subs) > 0 {
			for _, sub := range slices.Sorted(slices.Values(subs)) {
				lines = append(lines, []string{name, sub})
			}
			continue
		}
		lines = append(lines, []string{name})
	}
	return lines
}

// helpFlags are the flags a command's -h lists, split into those that
// take no value (bool) and those that do.
func helpFlags(help string) (bools, valued []string) {
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)( \S+)?$`).FindAllStringSubmatch(help, -1) {
		if m[2] == "" {
			bools = append(bools, m[1])
		} else {
			valued = append(valued, m[1])
		}
	}
	return bools, valued
}

// usageHint is what a refused command line says of how to call it.
var usageHint = regexp.MustCompile(`usage: outpost |Usage: outpost |\(outpost [a-z ]+ -h lists its flags\)`)

// requireRefused runs outpost with args in the empty folder dir and
// checks that it refuses them as a bad command line: exit 2, nothing on
// stdout, a usage hint on stderr, and nothing made in dir.
func requireRefused(t *testing.T, dir string, args []string) {
	t.Helper()
	code, stdout, stderr := outpostBin(t, dir, args...)
	require.Equal(t, 2, code, "%v: %s", args, stderr)
	require.Empty(t, stdout, args)
	require.Regexp(t, usageHint, stderr, args)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "%v: nothing is made", args)
}

// Every command and subcommand exits 2 for a bad command line (an unknown
// flag, a flag value it cannot take, a flag with no value, an argument too
// many), says how it is called on stderr, and does nothing: the folder it
// runs in stays empty. The lines come from the commands the binary
// registers, so a command added later is tried too. run takes free text and
// eval any number of files, so no argument is one too many for them.
func TestBadCommandLineExits2(t *testing.T) {
	code, help, _ := outpostBin(t, "", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "\nExit status: 0 done; 1 the work failed", "-h says what the exit codes mean")
	variadic := map[string]bool{"run": true, "eval": true}
	for _, line := range commandLines() {
		t.Run(strings.Join(line, " "), func(t *testing.T) {
			dir := t.TempDir()
			code, help, stderr := outpostBin(t, dir, append(slices.Clone(line), "-h")...)
			require.Zero(t, code, stderr)
			bools, valued := helpFlags(help)
			require.NotEmpty(t, append(bools, valued...), "-h lists the flags:\n%s", help)

			bad := [][]string{{"--no-such-flag"}}
			if len(bools) > 0 { // not a boolean
				bad = append(bad, []string{"--" + bools[0] + "=maybe"})
			}
			if len(valued) > 0 { // no value
				bad = append(bad, []string{"--" + valued[0]})
			}
			if !variadic[line[0]] { // arguments too many
				bad = append(bad, []string{"a1", "a2", "a3"})
			}
			for _, args := range bad {
				requireRefused(t, dir, append(slices.Clone(line), args...))
			}
		})
	}
}

// No command, an unknown command or subcommand, a flag value a command
// checks itself, a required flag or argument left out, and a pair of flags
// given apart exit 2 as well, with a usage hint; a failure of the work
// itself (no store to read) exits 1.
func TestFlagValuesRefusedExit2(t *testing.T) {
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"runs"}, {"runs", "lisst"}, {"db", "nope"}, {"firmware", "nope"}, {"uplink", "nope"}, {"bench", "nope"},
		{"runs", "list", "--limit", "0"},
		{"runs", "list", "--status", "sleeping"},
		{"runs", "show"},
		{"runs", "fork", "t1"},
		{"db", "backup"},
		{"db", "prune"},
		{"db", "prune", "--older-than", "-1h"},
		{"db", "check", "--data", "d", "--file", "f"},
		{"run", "--max-tokens", "-1", "hello"},
		{"run", "--model", "gpt", "hello"},
		{"run"},
		{"resume", "r1", "--decision", "maybe"},
		{"resume", "r1", "--decision", "edit", "--value", "{"},
		{"serve", "--workers", "0"},
		{"serve", "--uplink", "http://127.0.0.1:1"},
		{"collector"},
		{"uplink", "flush"},
		{"firmware", "sign", "bundle"},
		{"firmware", "activate", "name", "latest"},
		{"firmware", "install", "--allow-downgrade", "bundle"},
		{"bench", "reference", "--runs", "0"},
		{"bench", "reference", "--saver", "disk"},
		{"eval", "--parallel", "0", "g.jsonl"},
	} {
		requireRefused(t, t.TempDir(), args)
	}

	code, _, stderr := outpostBin(t, t.TempDir(), "runs", "show", "--data", t.TempDir(), "r1")
	require.Equal(t, 1, code, "no store is a failure of the work, not of the command line: %s", stderr)
	require.NotRegexp(t, usageHint, stderr)
}
