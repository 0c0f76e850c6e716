package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A page cursor that is not an id of its kind is a flag value refused
// before the store is read: exit 2, with the usage hint, for runs history
// --before as for runs list --after. A well-formed one that names no
// checkpoint of the thread is found only by reading the store: exit 1.
func TestRunsCursorsOfTheWrongFormExitTwo(t *testing.T) {
	data := storeWithRun(t)

	code, _, stderr := outpostBin(t, "", "runs", "list", "--data", data, "--after", "bogus")
	require.Equal(t, 2, code, stderr)
	code, stdout, stderr := outpostBin(t, "", "runs", "history", "t1", "--data", data, "--before", "bogus")
	require.Equal(t, 2, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `--before "bogus" is not a checkpoint id`)
	require.Contains(t, stderr, "outpost runs history -h")

	code, _, stderr = outpostBin(t, "", "runs", "history", "t1", "--data", data, "--before", "0000000000000001")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, `names no checkpoint of thread "t1"`)
	// As a run id that names no run does, it names the folder it read.
	require.Contains(t, stderr, "(looked in the data folder "+data+")")
}
