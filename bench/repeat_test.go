package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	_, err := Median(nil)
	require.Error(t, err)

	run := func(tps, secs, commitMS, ceiling, rss float64, dbBytes int64) *Result {
		return &Result{Impl: "outpost", Saver: "bbolt", Threads: 1, TurnsPerS: tps, Seconds: secs, CommitMS: commitMS,
			CeilingTurnsPS: ceiling, RSSMB: rss, DBBytes: dbBytes}
	}
	// Odd: each figure is its own median, not the median run's.
	runs := []*Result{
		run(300, 0.70, 0.30, 400, 20, 1),
		run(100, 2.00, 0.50, 500, 30, 2),
		run(200, 1.00, 0.40, 300, 25, 3),
	}
	m, err := Median(runs)
	require.NoError(t, err)
	assert.Equal(t, 200.0, m.TurnsPerS)
	assert.Equal(t, 1.0, m.Seconds)
	assert.Equal(t, 0.4, m.CommitMS)
	assert.Equal(t, 400.0, m.CeilingTurnsPS)
	// The runs' own shares of their ceilings: 75, 20, 66.7.
	assert.Equal(t, 66.7, m.CeilingPct)
	assert.Equal(t, 30.0, m.RSSMB, "peak RSS is the largest")
	assert.EqualValues(t, 3, m.DBBytes, "counts come from the run nearest the median")
	require.Len(t, m.Runs, 3)
	assert.Equal(t, 300.0, m.Runs[0].TurnsPerS, "runs are listed in order")
	assert.Equal(t, 75.0, m.Runs[0].CeilingPct)
	assert.Equal(t, 300.0, runs[0].TurnsPerS, "the runs are left as they were")

	// Even: the mean of the middle two.
	m, err = Median(runs[:2])
	require.NoError(t, err)
	assert.Equal(t, 200.0, m.TurnsPerS)
	assert.InDelta(t, 1.35, m.Seconds, 1e-9)

	// The probe between turns: its cost, ceiling and share are each their
	// own median too, not the figures of the run nearest the median
	// turns/s (the third).
	for i, d := range []struct{ ms, ceiling, pct float64 }{{0.30, 700, 80}, {0.50, 400, 90}, {0.60, 800, 70}} {
		runs[i].CommitDuringMS, runs[i].CeilingDuringTurnsPS, runs[i].CeilingDuringPct = d.ms, d.ceiling, d.pct
	}
	m, err = Median(runs)
	require.NoError(t, err)
	assert.Equal(t, 0.5, m.CommitDuringMS)
	assert.Equal(t, 700.0, m.CeilingDuringTurnsPS)
	assert.Equal(t, 80.0, m.CeilingDuringPct)
	assert.Equal(t, 0.5, m.Runs[1].CommitDuringMS)
	assert.Equal(t, 400.0, m.Runs[1].CeilingDuringTurnsPS)

	// Several threads: the ceiling is per thread, so no share.
	m, err = Median([]*Result{{Threads: 64, TurnsPerS: 3000, CeilingTurnsPS: 400}})
	require.NoError(t, err)
	assert.Zero(t, m.CeilingPct)

	// No ceiling (the memory saver): no share.
	m, err = Median([]*Result{{TurnsPerS: 5}, {TurnsPerS: 7}, {TurnsPerS: 6}})
	require.NoError(t, err)
	assert.Equal(t, 6.0, m.TurnsPerS)
	assert.Zero(t, m.CeilingPct)
	assert.Zero(t, m.Runs[0].CeilingPct)
}
