package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	require.Contains(t, stdout, "-max-suspect-wait")
	require.Contains(t, stdout, "left out, as long as --max-alone-time")

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
	code, _, stderr = outpost(t, "resume", "--data", t.TempDir(), "--max-recoveries", "-1", "run_0000000000000001", "--decision", "approve")
	require.NotZero(t, code)
	require.Contains(t, stderr, "--max-recoveries must not be negative")
	for _, args := range [][]string{{"run", "hello"}, {"serve"}, {"resume", "run_0000000000000001", "--decision", "approve"}} {
		for _, flag := range []string{"--max-alone-time", "--max-suspect-wait"} {
			data := t.TempDir()
			code, _, stderr = outpost(t, append([]string{args[0], "--data", data, flag, "-1s"}, args[1:]...)...)
			require.NotZero(t, code)
			require.Contains(t, stderr, flag+" must not be negative", args[0])
			entries, err := os.ReadDir(data)
			require.NoError(t, err)
			require.Empty(t, entries, "%s made nothing", args[0])
		}
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

// --max-suspect-wait bounds a suspect's wait for its turn on its own; left
// out, the wait is bounded as the turn alone is, and 0 is no bound.
func TestMaxSuspectWaitFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		manager time.Duration // what the run manager is given
		says    string
	}{
		{nil, 2 * time.Minute, "waiting for its turn for 2m0s at most"},
		{[]string{"--max-alone-time", "30s"}, 30 * time.Second, "waiting for its turn for 30s at most"},
		{[]string{"--max-alone-time", "0"}, -1, "waiting for its turn until its turn comes"},
		{[]string{"--max-suspect-wait", "5m"}, 5 * time.Minute, "runs alone for 2m0s at most (--max-alone-time), waiting for its turn for 5m0s at most"},
		{[]string{"--max-alone-time", "0", "--max-suspect-wait", "10s"}, 10 * time.Second, "waiting for its turn for 10s at most"},
		{[]string{"--max-suspect-wait", "0"}, -1, "waiting for its turn until its turn comes"},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		bc := budgetFlags(fs, true)
		require.NoError(t, fs.Parse(tc.args))
		require.Equal(t, tc.manager, bc.maxSuspectWait(), "%v", tc.args)
		require.Contains(t, bc.describe(), tc.says, "%v", tc.args)
	}
}
