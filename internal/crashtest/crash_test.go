// Package crashtest kills a process that runs many threads on a bbolt
// store with SIGKILL at random moments, restarts it each time, and then
// checks that every run finished with the right state, that no node ran
// again after its step (or its own pending write) was committed, and that
// the store is sound.
package crashtest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

const (
	threads = 12
	rounds  = 3 // per turn: a -> fan-out of b -> c, three times
	fanout  = 3
)

// turns scales the work with the number of kills, so that every kill lands
// while runs are in flight.
func turns() int {
	n, err := strconv.Atoi(os.Getenv("OUTPOST_CRASH_TURNS"))
	if err != nil || n < 1 {
		return 3
	}
	return n
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("OUTPOST_CRASH_CHILD"); dir != "" {
		if err := child(dir); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sideLog appends one line per event with a single write call, so lines from
// concurrent tasks never interleave and their order is the order of events.
type sideLog struct {
	mu sync.Mutex
	f  *os.File
}

func (l *sideLog) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.WriteString(fmt.Sprintf(format, args...) + "\n"); err != nil {
		panic(err)
	}
}

// recordingStore logs, after each successful commit, the checkpoint and the
// pending writes it made durable.
type recordingStore struct {
	*store.DB
	log *sideLog
}

func (r *recordingStore) Commit(ctx context.Context, c *engine.Commit) error {
	var lines []string
	if c.Checkpoint != nil {
		lines = append(lines, fmt.Sprintf("committed %s %s %s", c.Checkpoint.Thread, c.Checkpoint.ID, c.Checkpoint.ParentID))
	}
	for _, w := range c.Writes {
		if w.Write.Kind == engine.WriteKindWrites {
			lines = append(lines, fmt.Sprintf("saved %s %s", w.CheckpointID, w.Write.TaskID))
		}
	}
	if err := r.DB.Commit(ctx, c); err != nil {
		return err
	}
	for _, l := range lines {
		r.log.line("%s", l)
	}
	return nil
}

func crashGraph(log *sideLog) (*engine.Graph, engine.Chan[[]string], engine.Chan[int], error) {
	b := engine.NewGraph("crash")
	trace := engine.Append[string](b, "trace")
	count := engine.Sum[int](b, "count")
	round := engine.Sum[int](b, "round")
	node := func(name string) engine.NodeFunc {
		return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			info, _ := engine.InfoFrom(ctx)
			log.line("exec %s %s %s %s", info.Thread, info.Checkpoint, info.Task, name)
			time.Sleep(time.Duration(2+rand.IntN(8)) * time.Millisecond)
			ws := []engine.Write{engine.Push(trace, info.Checkpoint+"/"+info.Task), count.Set(1)}
			if name == "c" {
				ws = append(ws, round.Set(1))
			}
			return ws, nil
		}
	}
	b.AddNode("a", node("a"))
	b.AddNode("b", node("b"))
	b.AddNode("c", node("c"))
	b.AddEdge(engine.Start, "a")
	b.AddFanout("a", func(s engine.State) []engine.Send {
		out := make([]engine.Send, fanout)
		for i := range out {
			out[i] = engine.Send{Node: "b", Input: i}
		}
		return out
	}, "b")
	b.AddEdge("b", "c")
	b.AddConditionalEdge("c", func(s engine.State) []string {
		if round.Get(s)%rounds == 0 {
			return []string{engine.End}
		}
		return []string{"a"}
	}, "a", engine.End)
	g, err := b.Compile()
	return g, trace, count, err
}

// child runs (or finishes) every thread's turns, then exits.
func child(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "side.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	log := &sideLog{f: f}
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return err
	}
	rs := &recordingStore{DB: db, log: log}
	g, _, _, err := crashGraph(log)
	if err != nil {
		return err
	}
	agent := &engine.Agent{Name: "crash", Graph: g, StepLimit: 100}
	// The kills are the test's, not the runs' (see toolChild).
	m := engine.NewManager(rs, func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil },
		engine.ManagerOptions{Workers: 6, MaxRecoveries: -1})
	ctx := context.Background()
	if _, err := m.Recover(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	for t := 0; t < threads; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thread := fmt.Sprintf("t%02d", t)
			for {
				runs, err := db.Runs(ctx, engine.RunFilter{Thread: thread})
				if err != nil {
					errs <- err
					return
				}
				done := 0
				for _, r := range runs {
					if r.Status == engine.StatusCompleted {
						done++
					} else if !r.Status.Terminal() {
						// Recovered and still in flight: wait for it.
						if _, err := m.Wait(ctx, r.ID); err != nil {
							errs <- err
							return
						}
						done = -1
						break
					} else {
						errs <- fmt.Errorf("run %s ended %s: %s", r.ID, r.Status, r.Error)
						return
					}
				}
				if done == -1 {
					continue
				}
				if done >= turns() {
					return
				}
				run, err := m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: "crash", WaitForThread: true})
				if err != nil {
					errs <- err
					return
				}
				if run.Status != engine.StatusCompleted {
					errs <- fmt.Errorf("run %s ended %s: %s", run.ID, run.Status, run.Error)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	m.Close()
	return db.Close()
}

func kills(t *testing.T) int {
	if s := os.Getenv("OUTPOST_CRASH_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		return n
	}
	if testing.Short() {
		return 10
	}
	return 50
}

func TestCrashKill9(t *testing.T) {
	dir := t.TempDir()
	n := kills(t)
	nturns := 4 + n/2
	start := childStarter(t, "OUTPOST_CRASH_CHILD="+dir, "OUTPOST_CRASH_TURNS="+strconv.Itoa(nturns))
	// On a fast machine the children may finish the work before the last
	// kill: then there is more work, in the same store, until every kill
	// has landed. The child does each thread's turns up to the number it
	// is given, whatever earlier lives did.
	for killed := killAtRandom(t, start, n); killed < n; {
		nturns += 4 + (n-killed)/2
		t.Logf("the work finished after %d of %d kills: %d turns a thread now", killed, n, nturns)
		start = childStarter(t, "OUTPOST_CRASH_CHILD="+dir, "OUTPOST_CRASH_TURNS="+strconv.Itoa(nturns))
		killed += killAtRandom(t, start, n-killed)
	}
	// Let it finish.
	cmd := start()
	require.NoError(t, cmd.Wait(), "final child failed")

	verify(t, dir, nturns)
}

// childStarter returns a function that starts this test binary again as a
// child with env added.
func childStarter(t *testing.T, env ...string) func() *exec.Cmd {
	self, err := os.Executable()
	require.NoError(t, err)
	return func() *exec.Cmd {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		return cmd
	}
}

// killAtRandom starts a child n times and SIGKILLs it 30 to 150 ms later. It
// returns the number of kills that landed before a child finished its work
// by itself (n when every one did); a child that fails fails the test.
func killAtRandom(t *testing.T, start func() *exec.Cmd, n int) int {
	for killed := 0; killed < n; killed++ {
		cmd := start()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			require.NoError(t, err, "child failed")
			return killed
		case <-time.After(time.Duration(30+rand.IntN(120)) * time.Millisecond):
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
	}
	return n
}

func verify(t *testing.T, dir string, turns int) {
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()

	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "db check: %v", rep.Problems)

	log := &sideLog{}
	g, trace, count, err := crashGraph(log)
	require.NoError(t, err)
	for th := 0; th < threads; th++ {
		thread := fmt.Sprintf("t%02d", th)
		runs, err := db.Runs(ctx, engine.RunFilter{Thread: thread})
		require.NoError(t, err)
		require.Len(t, runs, turns, "thread %s", thread)
		for _, r := range runs {
			require.Equal(t, engine.StatusCompleted, r.Status, "run %s: %s", r.ID, r.Error)
		}
		snap, err := g.StateAt(ctx, engine.RunConfig{Thread: thread, Store: db}, "")
		require.NoError(t, err)
		want := turns * rounds * (2 + fanout)
		require.Equal(t, want, count.Get(snap), "thread %s: node writes applied", thread)
		tr := trace.Get(snap)
		require.Len(t, tr, want)
		seen := map[string]bool{}
		for _, e := range tr {
			require.False(t, seen[e], "thread %s: task %s applied twice", thread, e)
			seen[e] = true
		}
	}

	// Read the side log in order. A task is identified by the checkpoint it
	// was scheduled from plus its task id. Once the checkpoint that follows
	// it is committed, or its own writes are saved, it must never run again.
	f, err := os.Open(filepath.Join(dir, "side.log"))
	require.NoError(t, err)
	defer f.Close()
	sealed := map[string]bool{}  // "ckpt/task" whose result is durable
	childOf := map[string]bool{} // checkpoints that have a committed child
	execs, reruns := 0, 0
	ran := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Fields(sc.Text())
		switch p[0] {
		case "exec":
			execs++
			key := p[2] + "/" + p[3]
			require.False(t, sealed[key], "task %s (%s on %s) ran after its writes were saved", key, p[4], p[1])
			require.False(t, childOf[p[2]], "task %s (%s on %s) ran after its step was committed", key, p[4], p[1])
			ran[key]++
			if ran[key] > 1 {
				reruns++
			}
		case "saved":
			sealed[p[1]+"/"+p[2]] = true
		case "committed":
			if len(p) > 3 {
				childOf[p[3]] = true
			}
		}
	}
	require.NoError(t, sc.Err())
	t.Logf("%d node executions, %d re-executions of unfinished steps after kills", execs, reruns)
	require.Equal(t, threads*turns*rounds*(2+fanout), execs-reruns)
}
