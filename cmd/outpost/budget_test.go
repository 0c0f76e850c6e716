package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// run and serve set a budget of their own on every run: a token and a
// wall-time budget, shown in their help and settable by flag. A run over
// either ends budget_exceeded with a budget.exceeded event.
func TestRunBudgetFlags(t *testing.T) {
	code, stdout, _ := outpost(t, "run", "--help")
	require.Zero(t, code)
	require.Contains(t, stdout, "-max-run-time")
	require.Contains(t, stdout, "(default 15m0s)")
	require.Contains(t, stdout, "-max-tokens")
	require.Contains(t, stdout, "(default 100000)")
	require.Contains(t, stdout, "-max-recoveries")
	require.Contains(t, stdout, "(default 3)")
	require.Contains(t, stdout, "-max-alone-time")
	require.Contains(t, stdout, "(default 2m0s)")

	for _, tc := range []struct {
		flag, value, says string
	}{
		{"--max-tokens", "1", "tokens budget exceeded"},
		{"--max-run-time", "1ns", "wall-time budget exceeded"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			code, stdout, stderr := outpost(t, "run", "--data", t.TempDir(), tc.flag, tc.value, "I forgot my losartan dose")
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stdout, "budget.exceeded")
			require.Contains(t, stdout, ": budget_exceeded")
			require.Contains(t, stdout, tc.says)
		})
	}

	code, _, stderr := outpost(t, "run", "--data", t.TempDir(), "--max-tokens", "-1", "hello")
	require.NotZero(t, code)
	require.Contains(t, stderr, "--max-tokens must not be negative")
	code, _, stderr = outpost(t, "resume", "--data", t.TempDir(), "--max-recoveries", "-1", "run_x", "--decision", "approve")
	require.NotZero(t, code)
	require.Contains(t, stderr, "--max-recoveries must not be negative")
	for _, args := range [][]string{{"run", "hello"}, {"serve"}, {"resume", "run_x", "--decision", "approve"}} {
		data := t.TempDir()
		code, _, stderr = outpost(t, append([]string{args[0], "--data", data, "--max-alone-time", "-1s"}, args[1:]...)...)
		require.NotZero(t, code)
		require.Contains(t, stderr, "--max-alone-time must not be negative", args[0])
		entries, err := os.ReadDir(data)
		require.NoError(t, err)
		require.Empty(t, entries, "%s made nothing", args[0])
	}
}

// eval replayed every turn with no budget at all, so a golden
// conversation could pass on a path the appliance would have stopped: it
// takes run's budget flags, with their defaults and help, and applies
// them to every replayed run.
func TestEvalBudgetFlags(t *testing.T) {
	_, runHelp, _ := outpost(t, "run", "--help")
	code, evalHelp, _ := outpost(t, "eval", "--help")
	require.Zero(t, code)
	for _, flag := range []string{"-max-run-time", "-max-tokens"} {
		require.Equal(t, helpOf(t, runHelp, flag), helpOf(t, evalHelp, flag), "eval's %s is run's", flag)
	}

	ref, err := resolver()
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "g.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(`{"name": "dose", "agent": "`+embeddedAgent(t, ref)+
		`", "turns": [{"input": "I forgot my metformin dose", "expect": {"status": "completed"}}]}`+"\n"), 0o644))
	code, stdout, stderr := outpost(t, "eval", file)
	require.Zero(t, code, "within the default budgets: %s%s", stdout, stderr)
	code, stdout, _ = outpost(t, "eval", "--max-tokens", "1", file)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stdout, "budget_exceeded")
	code, stdout, _ = outpost(t, "eval", "--max-run-time", "1ns", file)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stdout, "budget_exceeded")

	code, _, stderr = outpost(t, "eval", "--max-tokens", "-1", file)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--max-tokens must not be negative")
}

// helpOf returns a flag's lines in a command's help: its name line and
// the description that follows it.
func helpOf(t *testing.T, help, flag string) string {
	t.Helper()
	_, rest, ok := strings.Cut(help, "  "+flag+" ")
	require.True(t, ok, "%s is not in the help:\n%s", flag, help)
	lines := strings.SplitAfter(rest, "\n")
	return lines[0] + lines[1]
}
