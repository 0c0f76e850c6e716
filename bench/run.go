package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

// Options selects a scenario of the reference workload.
type Options struct {
	Saver      string // "memory" or "bbolt"
	Durability engine.Durability
	Threads    int
	Turns      int
	// Store is the store to run against; nil for the in-memory one.
	Store engine.Store
	// Progress, when set, receives a line now and then on long runs.
	Progress io.Writer
	// Measure, when set, is called as the timed part of the workload
	// starts, and the function it returns as that part ends: a profiler
	// started there sees the turns alone, not the set-up or the commit
	// probe.
	Measure func() (end func())
	// Pause, when set, is called after each turn with the turn's index,
	// and the time it returns is left out of the timed part. One thread
	// only: the turns of other threads would go on meanwhile.
	Pause func(turn int) time.Duration
	// ProbeDuring makes RunBolt sample the commit cost between turns too,
	// while the workload runs (one thread; see Result.CommitDuringMS).
	ProbeDuring bool
}

// Result is the workload's figure line, with the same fields as the other
// implementations print, plus the fsync cost for durable runs.
type Result struct {
	Impl           string  `json:"impl"`
	Saver          string  `json:"saver"`
	Durability     string  `json:"durability"`
	Threads        int     `json:"threads"`
	Turns          int     `json:"turns"`
	TurnsPerS      float64 `json:"turns_per_s"`
	Seconds        float64 `json:"seconds"`
	Finals         int     `json:"finals"`
	DBBytes        int64   `json:"db_bytes"`
	RSSMB          float64 `json:"rss_mb"`
	CommitMS       float64 `json:"commit_ms,omitempty"`
	CommitsPerTurn float64 `json:"commits_per_turn,omitempty"`
	CeilingTurnsPS float64 `json:"ceiling_turns_per_s,omitempty"`
	// CeilingPct is turns/s as a percentage of CeilingTurnsPS, for one
	// thread.
	CeilingPct float64 `json:"ceiling_pct,omitempty"`
	// Commits is the number of commits the store took, and Transactions
	// the fsynced bbolt transactions they shared (group commit).
	Commits      int64 `json:"commits,omitempty"`
	Transactions int64 `json:"transactions,omitempty"`
	// CommitWaitMS is what a commit cost its caller during the workload, on
	// average, queueing for a shared transaction included: set beside
	// CommitMS, it shows how much of a turn the disk took.
	CommitWaitMS float64 `json:"commit_wait_ms,omitempty"`
	// CommitDuringMS is the same small commit as CommitMS, sampled between
	// turns while the workload runs (Options.ProbeDuring), with the ceiling
	// it implies and turns/s as a percentage of that ceiling. The disk is
	// busier then than before the workload or after it.
	CommitDuringMS       float64 `json:"commit_during_ms,omitempty"`
	CeilingDuringTurnsPS float64 `json:"ceiling_during_turns_per_s,omitempty"`
	CeilingDuringPct     float64 `json:"ceiling_during_pct,omitempty"`
	// Runs holds each run's figures when the workload ran several times
	// (see Median); the fields above then sum them up.
	Runs []RunFigures `json:"runs,omitempty"`
}

// Run executes the workload: every thread runs its turns one after another,
// all threads at once, each turn a run through the run manager.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Threads < 1 || o.Turns < 1 {
		return nil, fmt.Errorf("threads and turns must be at least 1")
	}
	if o.Pause != nil && o.Threads != 1 {
		return nil, fmt.Errorf("a pause between turns needs one thread, not %d", o.Threads)
	}
	if o.Durability == "" {
		o.Durability = engine.DurabilitySync
	}
	store := o.Store
	if store == nil {
		store = engine.NewMemoryStore()
	}
	agent, err := ReferenceAgent()
	if err != nil {
		return nil, err
	}
	m := engine.NewManager(store, func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil },
		engine.ManagerOptions{Workers: o.Threads, Durability: o.Durability, CacheSize: 2 * o.Threads})
	defer m.Close()

	var finals, done atomic.Int64
	stopProgress := progress(o.Progress, &done, int64(o.Threads*o.Turns))
	endMeasure := func() {}
	if o.Measure != nil {
		endMeasure = o.Measure()
	}
	start := time.Now()
	var paused time.Duration // written by the one thread, read after wg.Wait
	var wg sync.WaitGroup
	errs := make(chan error, o.Threads)
	for t := 0; t < o.Threads; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thread := fmt.Sprintf("thread-%d", t)
			for i := 0; i < o.Turns; i++ {
				r, err := m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: "reference",
					Input: []byte(strconv.Quote(TurnInput(t, i)))})
				if err != nil {
					errs <- err
					return
				}
				if r.Status != engine.StatusCompleted {
					errs <- fmt.Errorf("%s turn %d: run %s ended %s: %s", thread, i, r.ID, r.Status, r.Error)
					return
				}
				if len(r.Output) > 2 {
					finals.Add(1)
				}
				done.Add(1)
				if o.Pause != nil {
					paused += o.Pause(i)
				}
			}
		}()
	}
	wg.Wait()
	secs := (time.Since(start) - paused).Seconds()
	endMeasure()
	stopProgress()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	total := o.Threads * o.Turns
	return &Result{
		Impl: "outpost", Saver: o.Saver, Durability: string(o.Durability), Threads: o.Threads, Turns: o.Turns,
		TurnsPerS: round1(float64(total) / secs), Seconds: round3(secs), Finals: int(finals.Load()),
		RSSMB: round1(PeakRSSMB()),
	}, nil
}

func progress(w io.Writer, done *atomic.Int64, total int64) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				fmt.Fprintf(w, "\r%d/%d turns\n", done.Load(), total)
				return
			case <-t.C:
				fmt.Fprintf(w, "\r%d/%d turns", done.Load(), total)
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// PeakRSSMB reads the process's peak resident set size (VmHWM) in MiB, or 0
// where /proc is not available.
func PeakRSSMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0
			}
			return kb / 1024
		}
	}
	return 0
}
