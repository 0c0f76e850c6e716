package bench

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// RunFigures is one run's figures, when the workload runs several times.
type RunFigures struct {
	TurnsPerS      float64 `json:"turns_per_s"`
	Seconds        float64 `json:"seconds"`
	CommitMS       float64 `json:"commit_ms,omitempty"`
	CeilingTurnsPS float64 `json:"ceiling_turns_per_s,omitempty"`
	// CeilingPct is turns/s as a percentage of the ceiling this run's own
	// commit probe printed; a one-thread figure, since the ceiling is per
	// thread.
	CeilingPct float64 `json:"ceiling_pct,omitempty"`
	// The probe between turns, the ceiling it implies and the share of it
	// (Options.ProbeDuring).
	CommitDuringMS       float64 `json:"commit_during_ms,omitempty"`
	CeilingDuringTurnsPS float64 `json:"ceiling_during_turns_per_s,omitempty"`
	CeilingDuringPct     float64 `json:"ceiling_during_pct,omitempty"`
}

func figuresOf(r *Result) RunFigures {
	f := RunFigures{TurnsPerS: r.TurnsPerS, Seconds: r.Seconds, CommitMS: r.CommitMS, CeilingTurnsPS: r.CeilingTurnsPS,
		CommitDuringMS: r.CommitDuringMS, CeilingDuringTurnsPS: r.CeilingDuringTurnsPS, CeilingDuringPct: r.CeilingDuringPct}
	if r.CeilingTurnsPS > 0 && r.Threads == 1 {
		f.CeilingPct = round1(100 * r.TurnsPerS / r.CeilingTurnsPS)
	}
	return f
}

// Median sums up several runs of one workload, for machines whose speed
// drifts from run to run: turns/s, seconds, the commit probe, the ceiling
// and the share of it (and the probe between turns and its share) are each
// the median of the runs' own (the mean of the middle two for an even
// count), peak RSS is the largest, and the counts (finals, store size,
// commits) are those of the run nearest the median turns/s. Runs lists
// every run's figures, in order.
func Median(runs []*Result) (*Result, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("bench: no runs to sum up")
	}
	figs := make([]RunFigures, len(runs))
	for i, r := range runs {
		figs[i] = figuresOf(r)
	}
	med := func(of func(RunFigures) float64) float64 {
		v := make([]float64, len(figs))
		for i, f := range figs {
			v[i] = of(f)
		}
		slices.Sort(v)
		n := len(v)
		if n%2 == 1 {
			return v[n/2]
		}
		return (v[n/2-1] + v[n/2]) / 2
	}
	tps := med(func(f RunFigures) float64 { return f.TurnsPerS })
	nearest := slices.MinFunc(runs, func(a, b *Result) int {
		return cmp.Compare(math.Abs(a.TurnsPerS-tps), math.Abs(b.TurnsPerS-tps))
	})
	out := *nearest
	out.TurnsPerS = round1(tps)
	out.Seconds = round3(med(func(f RunFigures) float64 { return f.Seconds }))
	out.CommitMS = round3(med(func(f RunFigures) float64 { return f.CommitMS }))
	out.CeilingTurnsPS = round1(med(func(f RunFigures) float64 { return f.CeilingTurnsPS }))
	out.CeilingPct = round1(med(func(f RunFigures) float64 { return f.CeilingPct }))
	out.CommitDuringMS = round3(med(func(f RunFigures) float64 { return f.CommitDuringMS }))
	out.CeilingDuringTurnsPS = round1(med(func(f RunFigures) float64 { return f.CeilingDuringTurnsPS }))
	out.CeilingDuringPct = round1(med(func(f RunFigures) float64 { return f.CeilingDuringPct }))
	for _, r := range runs {
		out.RSSMB = max(out.RSSMB, r.RSSMB)
	}
	out.Runs = figs
	return &out, nil
}
