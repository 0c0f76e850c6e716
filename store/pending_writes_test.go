package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// writesGraph fans out to three tasks of node work, on "a", "b" and the
// run's mode: "fail" fails, "ask" asks a person, "hold" waits until hold
// is closed (or its run stops), anything else writes. With more than one
// task to a step, each task's writes are saved as it ends, as pending
// writes of the step's checkpoint.
func writesGraph(t *testing.T, hold <-chan struct{}, held chan<- struct{}) (*engine.Graph, engine.Chan[string]) {
	t.Helper()
	b := engine.NewGraph("writes")
	mode := engine.Replace[string](b, "mode")
	done := engine.Append[string](b, "done")
	b.AddNode("plan", func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil })
	b.AddNode("work", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		item, err := engine.InputOf[string](s)
		if err != nil {
			return nil, err
		}
		switch item {
		case "fail":
			return nil, errors.New("the task fails")
		case "ask":
			if _, err := engine.Interrupt(ctx, item); err != nil {
				return nil, err
			}
		case "hold":
			held <- struct{}{}
			select {
			case <-hold:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return []engine.Write{engine.Push(done, item)}, nil
	})
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(s engine.State) []engine.Send {
		return []engine.Send{{Node: "work", Input: "a"}, {Node: "work", Input: "b"}, {Node: "work", Input: mode.Get(s)}}
	}, "work")
	b.AddEdge("work", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	return g, mode
}

// requireCheckClean fails the test unless db check finds nothing wrong
// with the store d, and returns its report.
func requireCheckClean(t *testing.T, d *DB) *CheckReport {
	t.Helper()
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems, "db check of %s", d.Path())
	return rep
}

// No path that removes, replaces or leaves checkpoints leaves a pending
// write whose checkpoint does not exist, which db check reports: runs that
// fail, pause and resume (in both durabilities), a fork and a run on it, a
// recovery after a crash with writes saved, prune of the finished threads'
// older checkpoints, and a compacted copy.
func TestNormalPathsLeaveNoOrphanWrites(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	g, mode := writesGraph(t, hold, held)
	agent := &engine.Agent{Name: "writes", Graph: g}
	resolve := func(string, engine.BundleRef) (*engine.Agent, error) { return agent, nil }

	// A crash while a step's task waits, its siblings' writes saved: the
	// file as it stands then is what a power cut leaves.
	crashed := filepath.Join(t.TempDir(), FileName)
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	m := engine.NewManager(d, resolve, engine.ManagerOptions{})
	run, err := m.Start(bg, engine.RunRequest{Thread: "crash", Agent: "writes", Writes: []engine.Write{mode.Set("hold")}})
	require.NoError(t, err)
	<-held
	require.Eventually(t, func() bool {
		head, err := d.Checkpoint(bg, "crash", "", "")
		if err != nil {
			return false
		}
		ws, err := d.Writes(bg, "crash", "", head.ID)
		return err == nil && len(ws) == 2
	}, 10*time.Second, 10*time.Millisecond, "the siblings' writes were not saved")
	image, err := os.ReadFile(d.Path())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(crashed, image, 0o600))
	m.Close()
	require.NoError(t, d.Close())

	d, err = Open(crashed, Options{})
	require.NoError(t, err)
	defer d.Close()
	close(hold)
	m = engine.NewManager(d, resolve, engine.ManagerOptions{})
	resumed, err := m.Recover(bg)
	require.NoError(t, err)
	require.Equal(t, 1, resumed)
	ended, err := m.Wait(bg, run.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, ended.Status)
	m.Close()
	requireCheckClean(t, d)

	cfg := func(thread string, dur engine.Durability) engine.RunConfig {
		return engine.RunConfig{Thread: thread, Store: d, Durability: dur}
	}
	res, err := g.Invoke(bg, cfg("ok", engine.DurabilitySync), mode.Set("c"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	res, err = g.Invoke(bg, cfg("fail", engine.DurabilitySync), mode.Set("fail"))
	require.Error(t, err)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	for _, dur := range []engine.Durability{engine.DurabilitySync, engine.DurabilityExit} {
		thread := "ask-" + string(dur)
		res, err = g.Invoke(bg, cfg(thread, dur), mode.Set("ask"))
		require.NoError(t, err)
		require.Equal(t, engine.StatusInterrupted, res.Run.Status)
		require.Len(t, res.Run.Interrupts, 1)
		res, err = g.Resume(bg, engine.RunConfig{Thread: thread, Store: d, Durability: dur, Run: res.Run},
			map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Run.Status)
	}
	hist, err := g.History(bg, d, "ok", 0)
	require.NoError(t, err)
	require.Greater(t, len(hist), 1)
	_, err = g.Fork(bg, cfg("ok", engine.DurabilitySync), hist[len(hist)-1].ID)
	require.NoError(t, err)
	res, err = g.Invoke(bg, cfg("ok", engine.DurabilitySync), mode.Set("d"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
	before := requireCheckClean(t, d)
	require.Positive(t, before.Records[bucketWrites])

	pr, err := d.Prune(bg, time.Hour, time.Now().Add(48*time.Hour))
	require.NoError(t, err)
	require.Positive(t, pr.CheckpointsRemoved)
	require.Positive(t, pr.WritesRemoved)
	after := requireCheckClean(t, d)
	assert.Positive(t, after.Records[bucketWrites], "the heads keep their writes")

	compacted := filepath.Join(t.TempDir(), "compacted.db")
	require.NoError(t, d.Compact(bg, compacted))
	c, err := Open(compacted, Options{})
	require.NoError(t, err)
	defer c.Close()
	requireCheckClean(t, c)
}
