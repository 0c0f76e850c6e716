package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The time a pause between turns returns is left out of the timed part.
func TestRunLeavesPausesOut(t *testing.T) {
	var turns []int
	var paused time.Duration
	res, err := Run(context.Background(), Options{Saver: "memory", Threads: 1, Turns: 3, Pause: func(turn int) time.Duration {
		turns = append(turns, turn)
		start := time.Now()
		time.Sleep(200 * time.Millisecond)
		// What the pause took, which on a busy machine is more than asked.
		d := time.Since(start)
		paused += d
		return d
	}})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, turns)
	// Three turns in memory take a few milliseconds; the pauses, 600 or more.
	assert.Less(t, res.Seconds, 0.5, "the pauses (%s) were timed with the turns", paused)

	_, err = Run(context.Background(), Options{Saver: "memory", Threads: 2, Turns: 1, Pause: func(int) time.Duration { return 0 }})
	require.ErrorContains(t, err, "one thread")
}

func TestRunBoltProbeDuring(t *testing.T) {
	dir := t.TempDir()
	res, err := RunBolt(context.Background(), Options{Threads: 1, Turns: 2 * ProbeEvery, ProbeDuring: true}, dir)
	require.NoError(t, err)
	require.Positive(t, res.CommitDuringMS)
	assert.InEpsilon(t, 1000/(res.CommitDuringMS*res.CommitsPerTurn), res.CeilingDuringTurnsPS, 0.01)
	assert.InEpsilon(t, 100*res.TurnsPerS/res.CeilingDuringTurnsPS, res.CeilingDuringPct, 0.01)
	assert.Positive(t, res.CeilingPct, "the probe before and after still sets the printed ceiling")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), "probe", "a probe's scratch store (or its lock file) is left behind")
	}

	// Its first burst grows the file and is left out: with fewer turns
	// there is no figure.
	res, err = RunBolt(context.Background(), Options{Threads: 1, Turns: ProbeEvery, ProbeDuring: true}, t.TempDir())
	require.NoError(t, err)
	assert.Zero(t, res.CommitDuringMS)
	assert.Zero(t, res.CeilingDuringPct)

	res, err = RunBolt(context.Background(), Options{Threads: 1, Turns: 2 * ProbeEvery}, t.TempDir())
	require.NoError(t, err)
	assert.Zero(t, res.CommitDuringMS, "no probe between turns unless asked")

	_, err = RunBolt(context.Background(), Options{Threads: 2, Turns: 2, ProbeDuring: true}, t.TempDir())
	require.ErrorContains(t, err, "one thread")
}
