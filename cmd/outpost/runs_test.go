package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A durability other than sync or exit is refused before the store is
// opened; it used to run the turn in exit mode, committing once.
func TestRunDurabilityChecked(t *testing.T) {
	for _, bad := range []string{"SYNC", "bogus", ""} {
		dir := filepath.Join(t.TempDir(), "data")
		code, stdout, stderr := outpost(t, "run", "--data", dir, "--thread", "t9", "--durability", bad, "I forgot my metformin")
		require.Equal(t, 1, code, stdout)
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
