package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"

	"github.com/outpost-edge/outpost/bench"
	"github.com/outpost-edge/outpost/engine"
)

func init() {
	register("bench", "run the reference workload and print its figures", runBench, benchWorkloads...)
}

// benchWorkloads are bench's workloads; "reference" is the only one.
var benchWorkloads = []string{"reference"}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "Usage: outpost bench reference [flags]  (the only workload is \"reference\"; outpost bench reference -h lists its flags)"
	if err := subFirst("bench", usage, "workload", benchWorkloads, args); err != nil {
		return err
	}
	switch {
	case isHelp(args[0]):
		return groupHelp(usage, stdout)
	case args[0] != "reference":
		return unknownSub(usage, "unknown workload %q", args[0])
	}
	fs := newCmdFlags("bench reference", "bench reference [--saver memory|bbolt] [--durability sync|exit] [--threads N] [--turns N] [--runs N] [--probe-during] [--data DIR] [--cpuprofile FILE] [--trace FILE] [--json]", stdout, stderr)
	saver := fs.String("saver", "memory", "the checkpointer, `memory|bbolt`: in memory, or a bbolt file")
	durability := fs.String("durability", "sync", "when to commit, `sync|exit`: sync, every step; exit, at run end")
	threads := fs.Int("threads", 1, "threads run concurrently")
	turns := fs.Int("turns", 200, "turns per thread")
	dataDir := fs.String("data", "", "folder `DIR` for the bbolt file, made if need be (default: a new temporary folder, removed after)")
	asJSON := fs.Bool("json", false, "print one JSON line")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the turns (not the set-up or the commit probe) to `FILE`, for go tool pprof")
	traceFile := fs.String("trace", "", "write an execution trace of the turns to `FILE`, for go tool trace")
	runs := fs.Int("runs", 1, "run the workload `N` times and print the medians (a shared machine's speed drifts from run to run)")
	probeDuring := fs.Bool("probe-during", false, fmt.Sprintf("bbolt, one thread: also time the commit probe between turns, while the workload runs (every %d turns it waits for %d small commits, left out of turns/s), and print the ceiling that implies", bench.ProbeEvery, bench.ProbeBurst))
	if err := fs.parse(args[1:], false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	if *probeDuring && (*saver != "bbolt" || *threads != 1) {
		return usageError("--probe-during needs --saver bbolt and --threads 1")
	}
	if *threads < 1 || *turns < 1 {
		return badUsage("--threads and --turns must be at least 1, not %d and %d", *threads, *turns)
	}
	if *runs < 1 {
		return badUsage("--runs must be at least 1, not %d", *runs)
	}
	if *runs > 1 && (*cpuProfile != "" || *traceFile != "") {
		return usageError("--cpuprofile and --trace profile one run: leave out --runs")
	}
	opts := bench.Options{Saver: *saver, Durability: engine.Durability(*durability), Threads: *threads, Turns: *turns,
		ProbeDuring: *probeDuring}
	if *durability != "sync" && *durability != "exit" {
		return badUsage("--durability must be sync or exit, not %q", *durability)
	}
	if *saver != "memory" && *saver != "bbolt" {
		return badUsage("--saver must be memory or bbolt, not %q", *saver)
	}
	if isTerminal(stderr) {
		opts.Progress = stderr
	}
	prof, err := newProfiler(*cpuProfile, *traceFile)
	if err != nil {
		return err
	}
	defer prof.close()
	if prof != nil {
		opts.Measure = prof.start
	}
	var all []*bench.Result
	for i := range *runs {
		var res *bench.Result
		if *saver == "memory" {
			res, err = bench.Run(ctx, opts)
		} else {
			res, err = benchBolt(ctx, opts, *dataDir, stderr)
		}
		if err != nil {
			if *runs > 1 {
				return fmt.Errorf("run %d of %d: %w", i+1, *runs, err)
			}
			return err
		}
		if *runs > 1 && !*asJSON {
			fmt.Fprintf(stdout, "run %d of %d: %.1f turns/s", i+1, *runs, res.TurnsPerS)
			if res.CeilingPct > 0 {
				fmt.Fprintf(stdout, ", %.0f%% of the ceiling of %.1f", res.CeilingPct, res.CeilingTurnsPS)
			}
			if res.CeilingDuringPct > 0 {
				fmt.Fprintf(stdout, ", %.0f%% of the one between turns, %.1f", res.CeilingDuringPct, res.CeilingDuringTurnsPS)
			}
			fmt.Fprintln(stdout)
		}
		all = append(all, res)
	}
	res := all[0]
	if len(all) > 1 {
		if res, err = bench.Median(all); err != nil {
			return err
		}
	}
	if err := prof.close(); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "reference workload: %d thread(s) x %d turn(s), saver %s, durability %s\n", res.Threads, res.Turns, res.Saver, res.Durability)
	if len(res.Runs) > 1 {
		fmt.Fprintf(stdout, "  medians of %d runs (peak RSS: the largest)\n", len(res.Runs))
	}
	fmt.Fprintf(stdout, "  %.1f turns/s (%.3f s), %d finals, peak RSS %.1f MB\n", res.TurnsPerS, res.Seconds, res.Finals, res.RSSMB)
	if res.Saver == "bbolt" {
		fmt.Fprintf(stdout, "  store on disk %.2f MB; one fsynced commit %.3f ms, %.2f commits/turn, ceiling %.1f turns/s per thread",
			float64(res.DBBytes)/1e6, res.CommitMS, res.CommitsPerTurn, res.CeilingTurnsPS)
		if res.CeilingPct > 0 {
			fmt.Fprintf(stdout, " (%.0f%% of it)", res.CeilingPct)
		}
		fmt.Fprintln(stdout)
		if res.CommitDuringMS > 0 {
			fmt.Fprintf(stdout, "  between turns, while the workload runs: one fsynced commit %.3f ms, ceiling %.1f turns/s (%.0f%% of it)\n",
				res.CommitDuringMS, res.CeilingDuringTurnsPS, res.CeilingDuringPct)
		} else if *probeDuring {
			fmt.Fprintf(stdout, "  between turns: no figure (the probe runs every %d turns and leaves out its first burst: give --turns %d or more)\n",
				bench.ProbeEvery, 2*bench.ProbeEvery)
		}
		if res.Transactions > 0 {
			fmt.Fprintf(stdout, "  group commit: %d commits in %d fsynced transactions, %.1f per transaction; a commit took %.3f ms on average, queueing included\n",
				res.Commits, res.Transactions, float64(res.Commits)/float64(res.Transactions), res.CommitWaitMS)
		}
	}
	return nil
}

// profiler writes a CPU profile, an execution trace or both, of the part
// of the workload that bench.Options.Measure brackets. A nil profiler
// writes nothing.
type profiler struct {
	cpu, trace *os.File
	err        error
}

// newProfiler creates the files first, so a bad path fails before the
// workload runs rather than after it.
func newProfiler(cpuPath, tracePath string) (*profiler, error) {
	if cpuPath == "" && tracePath == "" {
		return nil, nil
	}
	p := &profiler{}
	for _, f := range []struct {
		path string
		to   **os.File
	}{{cpuPath, &p.cpu}, {tracePath, &p.trace}} {
		if f.path == "" {
			continue
		}
		file, err := os.Create(f.path)
		if err != nil {
			_ = p.close()
			return nil, fmt.Errorf("bench: %w", err)
		}
		*f.to = file
	}
	return p, nil
}

func (p *profiler) start() (end func()) {
	if p.cpu != nil {
		if err := pprof.StartCPUProfile(p.cpu); err != nil {
			p.err = fmt.Errorf("bench: start the CPU profile: %w", err)
			p.cpu.Close()
			p.cpu = nil
		}
	}
	if p.trace != nil {
		if err := trace.Start(p.trace); err != nil {
			p.err = errors.Join(p.err, fmt.Errorf("bench: start the trace: %w", err))
			p.trace.Close()
			p.trace = nil
		}
	}
	return func() {
		if p.cpu != nil {
			pprof.StopCPUProfile()
		}
		if p.trace != nil {
			trace.Stop()
		}
	}
}

// close closes the files, reporting a profile that could not be started
// or written. It may be called more than once.
func (p *profiler) close() error {
	if p == nil {
		return nil
	}
	err := p.err
	p.err = nil
	for _, f := range []**os.File{&p.cpu, &p.trace} {
		if *f != nil {
			if cerr := (*f).Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("bench: %w", cerr))
			}
			*f = nil
		}
	}
	return err
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
