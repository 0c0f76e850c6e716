package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// db prune --older-than refuses a flag written where its duration goes
// ("--older-than --data D" took "--data" as the duration) for what it is,
// and a duration longer than it holds as too long, not as a form it does
// not read; both with exit 2 and nothing pruned.
func TestPruneOlderThanRefusesAFlagAndATooLongDuration(t *testing.T) {
	data := storeWithRun(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--older-than", "--data", data}, `--data is a flag, not a duration: the duration goes right after the flag, as in --older-than 720h`},
		{[]string{"--data", data, "--older-than", "-json"}, `-json is a flag, not a duration`},
		{[]string{"--data", data, "--older-than", "99999999999d"}, `"99999999999d" for flag -older-than: too long: at most 106750d (about 292 years)`},
		{[]string{"--data", data, "--older-than", "99999999999999h"}, `too long: at most 106750d`},
		{[]string{"--data", data, "--older-than", "1d9999999999999h"}, `too long: at most 106750d`},
	} {
		code, stdout, stderr := outpostBin(t, "", append([]string{"db", "prune"}, tc.args...)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Empty(t, stdout, tc.args)
		require.Contains(t, stderr, tc.want, tc.args)
		require.NotContains(t, stderr, "want a duration such as", tc.args)
	}
	// The run's checkpoints are all still there for a prune that takes them.
	code, stdout, stderr := outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "pruned 1 thread(s)")
}
