package main

import (
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
}
