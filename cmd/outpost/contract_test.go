package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCommandLineAsDesignNamesIt asks the binary for DESIGN's command line,
// in DESIGN's words: every command and subcommand, --data DIR (default
// ./outpost-data) on every one that touches the store, and serve's and the
// collector's flags with their defaults.
func TestCommandLineAsDesignNamesIt(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := outpostBin(t, dir, "help")
	require.Zero(t, code, stderr)
	for _, c := range []string{"serve", "run", "resume", "runs", "firmware", "eval", "bench", "db", "uplink", "collector", "token", "version"} {
		require.Contains(t, stdout, "  "+c+" ", "help lists %s", c)
	}

	const data = "./outpost-data"
	for _, tc := range []struct {
		args  []string
		flags map[string]string // flag name -> its default as -h shows it ("" for none)
	}{
		{[]string{"serve"}, map[string]string{"data": data, "listen": `"127.0.0.1:7070"`, "model": `"scripted"`,
			"ollama": `"http://127.0.0.1:11434"`, "uplink": "", "appliance-id": "", "uplink-secret": ""}},
		{[]string{"collector"}, map[string]string{"listen": "", "data": "", "secrets": ""}},
		{[]string{"run"}, map[string]string{"data": data, "json": ""}},
		{[]string{"resume"}, map[string]string{"data": data, "decision": "", "value": ""}},
		{[]string{"token"}, map[string]string{"data": data}},
		{[]string{"runs", "list"}, map[string]string{"data": data, "json": ""}},
		{[]string{"runs", "show"}, map[string]string{"data": data}},
		{[]string{"runs", "history"}, map[string]string{"data": data}},
		{[]string{"runs", "fork"}, map[string]string{"data": data, "checkpoint": ""}},
		{[]string{"firmware", "keygen"}, nil},
		{[]string{"firmware", "sign"}, nil},
		{[]string{"firmware", "verify"}, nil},
		{[]string{"firmware", "install"}, map[string]string{"data": data}},
		{[]string{"firmware", "list"}, map[string]string{"data": data, "json": ""}},
		{[]string{"firmware", "activate"}, map[string]string{"data": data}},
		{[]string{"firmware", "export"}, nil},
		{[]string{"eval"}, map[string]string{"json": ""}},
		{[]string{"bench", "reference"}, map[string]string{"json": ""}},
		{[]string{"db", "check"}, map[string]string{"data": data, "json": ""}},
		{[]string{"db", "backup"}, map[string]string{"data": data}},
		{[]string{"db", "compact"}, map[string]string{"data": data}},
		{[]string{"db", "prune"}, map[string]string{"data": data}},
		{[]string{"uplink", "status"}, map[string]string{"data": data, "json": ""}},
		{[]string{"uplink", "flush"}, map[string]string{"data": data}},
		{[]string{"version"}, map[string]string{"json": ""}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := outpostBin(t, dir, append(tc.args, "-h")...)
			require.Zero(t, code, "%s", stderr)
			help := stdout + stderr
			for name, def := range tc.flags {
				desc, ok := flagHelp(help, name)
				require.True(t, ok, "-h does not list --%s:\n%s", name, help)
				if def != "" {
					require.Contains(t, desc, "(default "+def+")", "--%s", name)
				}
			}
		})
	}
}

// flagHelp returns what -h says of flag name: its line and the lines of
// its description, up to the next flag.
func flagHelp(help, name string) (string, bool) {
	lines := strings.Split(help, "\n")
	for i, line := range lines {
		rest, ok := strings.CutPrefix(line, "  -"+name)
		if !ok || (rest != "" && rest[0] != ' ') {
			continue
		}
		desc := []string{line}
		for _, next := range lines[i+1:] {
			if strings.HasPrefix(next, "  -") || !strings.HasPrefix(next, "  ") {
				break
			}
			desc = append(desc, next)
		}
		return strings.Join(desc, "\n"), true
	}
	return "", false
}

// TestHelpNamesACommand asks "outpost help X [SUB]" for every command and
// subcommand, as one would ask git or go: it prints what "outpost X [SUB]
// -h" prints, with exit 0, and names a command that does not exist as
// an unknown command, with exit 2.
func TestHelpNamesACommand(t *testing.T) {
	dir := t.TempDir()
	_, general, _ := outpostBin(t, dir, "help")
	var asked [][]string
	for name, c := range commands {
		asked = append(asked, []string{name})
		for _, sub := range c.subs {
			asked = append(asked, []string{name, sub})
		}
	}
	for _, args := range asked {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			wantCode, want, wantErr := outpostBin(t, dir, append(slices.Clone(args), "-h")...)
			require.Zero(t, wantCode, wantErr)
			code, got, stderr := outpostBin(t, dir, append([]string{"help"}, args...)...)
			require.Zero(t, code, stderr)
			require.Equal(t, want, got, "outpost help %s prints what -h does", strings.Join(args, " "))
			require.NotEqual(t, general, got, "outpost help %s is not the list of commands", strings.Join(args, " "))
		})
	}

	code, stdout, stderr := outpostBin(t, dir, "help", "frobnicate")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `unknown command "frobnicate"`)
}
