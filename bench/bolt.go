package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// RunBolt runs the workload against a bbolt store in dir (a new temporary
// folder, removed afterwards, when dir is ""; made if it does not exist
// yet). Before the workload it
// measures what one fsynced commit costs on that disk, so the figures can be
// read against the ceiling that the disk allows.
func RunBolt(ctx context.Context, o Options, dir string) (*Result, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "outpost-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The disk's fsync latency drifts on shared machines, so the commit cost
	// is sampled before the workload and again after it, and the median of
	// all samples is reported.
	before, err := sampleCommits(ctx, dir, 40)
	if err != nil {
		return nil, fmt.Errorf("measure commit cost: %w", err)
	}
	path := filepath.Join(dir, "bench-reference.db")
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var during *probeBetween
	if o.ProbeDuring {
		if o.Threads != 1 {
			return nil, fmt.Errorf("the commit probe between turns needs one thread, not %d", o.Threads)
		}
		if during, err = openProbeBetween(ctx, dir); err != nil {
			return nil, fmt.Errorf("measure commit cost between turns: %w", err)
		}
		defer during.close()
		o.Pause = during.pause
	}
	db, err := store.Open(path, store.Options{})
	if err != nil {
		return nil, err
	}
	o.Store = db
	o.Saver = "bbolt"
	res, err := Run(ctx, o)
	if err == nil && during != nil {
		err = during.err
	}
	stats := db.Stats()
	if os.Getenv("OUTPOST_BENCH_DEBUG") != "" {
		w, wt, pa := db.PageStats()
		fmt.Fprintf(os.Stderr, "tx %d, page writes %d (%.1f per tx), write time %s, page alloc %.1f MB\n", stats.Transactions, w, float64(w)/float64(stats.Transactions), wt, float64(pa)/1e6)
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	after, err := sampleCommits(ctx, dir, 40)
	if err != nil {
		return nil, fmt.Errorf("measure commit cost: %w", err)
	}
	commit := median(append(before, after...))
	turns := float64(o.Threads * o.Turns)
	res.DBBytes = st.Size()
	res.CommitMS = round3(float64(commit) / float64(time.Millisecond))
	res.CommitsPerTurn = float64(int64(float64(stats.Commits)/turns*100+0.5)) / 100
	res.Commits, res.Transactions = int64(stats.Commits), int64(stats.Transactions)
	if n := stats.Commits + stats.Failed; n > 0 {
		res.CommitWaitMS = round3(float64(stats.Waited) / float64(n) / float64(time.Millisecond))
	}
	if res.CommitMS > 0 && res.CommitsPerTurn > 0 {
		res.CeilingTurnsPS = round1(1000 / (res.CommitMS * res.CommitsPerTurn))
		res.CeilingPct = figuresOf(res).CeilingPct
	}
	if during != nil && len(during.samples) > 0 {
		res.CommitDuringMS = round3(float64(median(during.samples)) / float64(time.Millisecond))
		if res.CommitsPerTurn > 0 {
			res.CeilingDuringTurnsPS = round1(1000 / (res.CommitDuringMS * res.CommitsPerTurn))
			res.CeilingDuringPct = round1(100 * res.TurnsPerS / res.CeilingDuringTurnsPS)
		}
	}
	res.RSSMB = round1(PeakRSSMB())
	return res, nil
}

// The probe between turns: every ProbeEvery turns the workload waits while
// ProbeBurst small commits go to a scratch store beside it. The first
// commit of each burst is left out, since it pays for the switch from the
// workload's file (about a quarter more than the rest, on the machine the
// figures were taken on), and so is the first burst, which grows the file.
const (
	ProbeEvery = 10
	ProbeBurst = 8
)

type probeBetween struct {
	ctx     context.Context
	db      *store.DB
	path    string
	n       int // commits so far
	bursts  int
	samples []time.Duration
	err     error
}

func openProbeBetween(ctx context.Context, dir string) (*probeBetween, error) {
	path := filepath.Join(dir, "commit-probe-during.db")
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	db, err := store.Open(path, store.Options{})
	if err != nil {
		return nil, err
	}
	return &probeBetween{ctx: ctx, db: db, path: path}, nil
}

// pause is Options.Pause: after every ProbeEvery-th turn, a burst of
// commits, timed one by one. A failed commit ends the probing; RunBolt
// reports it after the workload.
func (p *probeBetween) pause(turn int) time.Duration {
	if (turn+1)%ProbeEvery != 0 || p.err != nil {
		return 0
	}
	start := time.Now()
	for i := range ProbeBurst {
		t := time.Now()
		if err := probeCommit(p.ctx, p.db, p.n); err != nil {
			p.err = fmt.Errorf("measure commit cost between turns: %w", err)
			break
		}
		p.n++
		if p.bursts > 0 && i > 0 {
			p.samples = append(p.samples, time.Since(t))
		}
	}
	p.bursts++
	return time.Since(start)
}

func (p *probeBetween) close() {
	_ = p.db.Close() // a scratch store, removed next
	_ = os.Remove(store.LockFile(p.path))
	_ = os.Remove(p.path)
}

// MeasureCommit returns the median cost of one fsynced commit of a small
// record to a scratch store in dir.
func MeasureCommit(ctx context.Context, dir string, n int) (time.Duration, error) {
	ds, err := sampleCommits(ctx, dir, n)
	if err != nil {
		return 0, err
	}
	return median(ds), nil
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// sampleCommits times n fsynced commits of a small record to a scratch
// store in dir.
func sampleCommits(ctx context.Context, dir string, n int) ([]time.Duration, error) {
	path := filepath.Join(dir, "commit-probe.db")
	defer os.Remove(store.LockFile(path))
	defer os.Remove(path)
	db, err := store.Open(path, store.Options{})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ds := make([]time.Duration, 0, n)
	for i := 0; i < n+5; i++ {
		t := time.Now()
		if err := probeCommit(ctx, db, i); err != nil {
			return nil, err
		}
		if i >= 5 { // the first commits grow the file
			ds = append(ds, time.Since(t))
		}
	}
	return ds, nil
}

// probeCommit commits a queued run, the i-th of the probe: the smallest
// record a run commits, and one that leaves no outcome in the ledger.
func probeCommit(ctx context.Context, db *store.DB, i int) error {
	run := &engine.Run{ID: fmt.Sprintf("run_probe_%04d", i), Thread: "probe", Agent: "probe",
		Status: engine.StatusQueued, CreatedAt: time.Now().UTC()}
	return db.Commit(ctx, &engine.Commit{Run: run, Sync: true})
}
