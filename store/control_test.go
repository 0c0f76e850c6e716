package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveControl serves d's control socket in dir until the test ends.
func serveControl(t *testing.T, d *DB, dir string, opts ...ControlOptions) *Control {
	t.Helper()
	ctx, cancel := context.WithCancel(bg)
	served := make(chan error, 1)
	go func() { served <- ServeControl(ctx, d, dir, nil, opts...) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
		assert.NoFileExists(t, filepath.Join(dir, ControlSocket), "the socket is gone when ServeControl returns")
	})
	// The socket's file appears when it is bound, a moment before it
	// listens, so the helper waits for a connection to go through.
	var c *Control
	require.Eventually(t, func() bool {
		var err error
		if c, err = DialControl(dir); err != nil {
			return false
		}
		return withSocketPath(dir, func(addr string) error {
			conn, err := net.Dial("unix", addr)
			if err == nil {
				conn.Close()
			}
			return err
		}) == nil
	}, 5*time.Second, 10*time.Millisecond)
	return c
}

func TestControlBackup(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	c := serveControl(t, d, dir)

	good := filepath.Join(t.TempDir(), "good.db")
	require.NoError(t, c.BackupFile(bg, good))
	b, err := Open(good, Options{ReadOnly: true})
	require.NoError(t, err)
	rep, err := b.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, b.Close())

	// A store that closes under the socket answers with an error, and no
	// file appears: before, an empty answer made an empty "backup".
	require.NoError(t, d.Close())
	bad := filepath.Join(t.TempDir(), "bad.db")
	err = c.BackupFile(bg, bad)
	require.ErrorContains(t, err, "store owner: backup:")
	_, serr := os.Stat(bad)
	assert.ErrorIs(t, serr, os.ErrNotExist)
}

// A backup, local or through the control socket, reports how far its copy
// has got against the store's size, and a stopped one leaves no file.
func TestBackupReportsProgress(t *testing.T) {
	defer func(n int64) { copyProgressEvery = n }(copyProgressEvery)
	copyProgressEvery = 8 << 10
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	for i := 1; i <= 40; i++ {
		c := stepCommit("t", i)
		big := bytes.Repeat([]byte{byte(i)}, 2*engine.BlobThreshold)
		c.Blobs[engine.RefOf(big)] = big
		require.NoError(t, d.Commit(bg, c))
	}
	size, err := d.Size()
	require.NoError(t, err)
	c := serveControl(t, d, dir)
	for name, backup := range map[string]func(context.Context, string) error{"local": d.BackupFile, "control": c.BackupFile} {
		var seen [][2]int64
		ctx := WithCopyProgress(bg, func(copied, total int64) { seen = append(seen, [2]int64{copied, total}) })
		dst := filepath.Join(t.TempDir(), "backup.db")
		require.NoError(t, backup(ctx, dst), name)
		fi, err := os.Stat(dst)
		require.NoError(t, err, name)
		// Reports come at most once a write, and a write may be larger
		// than copyProgressEvery: a few, reaching past half the copy.
		require.GreaterOrEqual(t, len(seen), 2, name)
		assert.Greater(t, seen[len(seen)-1][0], fi.Size()/2, name)
		for i, s := range seen {
			assert.Equal(t, fi.Size(), s[1], "%s: the total is the copy's size", name)
			assert.LessOrEqual(t, s[0], s[1], name)
			if i > 0 {
				assert.Greater(t, s[0], seen[i-1][0], name)
			}
		}
		assert.LessOrEqual(t, fi.Size(), size, name)

		// Stopped at its second report: an error, and no file.
		ctx, cancel := context.WithCancel(bg)
		calls := 0
		ctx = WithCopyProgress(ctx, func(int64, int64) {
			if calls++; calls == 2 {
				cancel()
			}
		})
		stopped := filepath.Join(t.TempDir(), "stopped.db")
		require.ErrorIs(t, backup(ctx, stopped), context.Canceled, name)
		_, err = os.Stat(stopped)
		assert.ErrorIs(t, err, os.ErrNotExist, name)
		cancel()
	}
}

// An answer that does not say how long the copy is cannot be told from a
// copy cut short, so it is refused.
func TestControlBackupNeedsALength(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, ControlSocket))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("not a store"))
		w.(http.Flusher).Flush() // chunked: no length
	}), ReadHeaderTimeout: time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	c, err := DialControl(dir)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "b.db")
	require.ErrorContains(t, c.BackupFile(bg, path), "sent no length")
	_, serr := os.Stat(path)
	assert.ErrorIs(t, serr, os.ErrNotExist)
}

// A data folder whose path is too long for a unix socket address still
// serves its control socket (reached through a descriptor of the folder).
func TestControlSocketInALongPath(t *testing.T) {
	dir := t.TempDir()
	for len(filepath.Join(dir, ControlSocket)) <= maxSocketPath+20 {
		dir = filepath.Join(dir, "a-rather-long-folder-name")
	}
	require.NoError(t, os.MkdirAll(dir, 0o700))
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	c := serveControl(t, d, dir)
	rep, err := c.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NotNil(t, rep.Space, "the space count is lost on the way")
	assert.Equal(t, DefaultPageSize, rep.Space.PageSize)
	fi, err := os.Stat(filepath.Join(dir, ControlSocket))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

// The reads that runs list, show and history make give through the control
// socket what they give on the store itself: the same runs, byte for byte
// (a JSON value's spacing too), the same checkpoints, and errors that read
// the same and match the same sentinel or *CorruptError.
func TestControlReads(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	big := []byte(`{"text": "` + string(bytes.Repeat([]byte("x"), 2*SummaryBytes)) + `"}`)
	for i, th := range []string{"a", "b", "c"} {
		c := stepCommit(th, i+1)
		c.Run.Agent = "agent-" + th
		c.Run.CreatedAt = tc0.Add(time.Duration(i) * time.Minute)
		c.Run.Input = json.RawMessage(`{"spaced":  [1, 2],  "html": "<b>"}`)
		if th == "b" {
			c.Run.Output = big // out of line, as a blob
			c.Run.Status = engine.StatusCompleted
			c.Run.Decisions = []engine.DecisionRecord{{Interrupt: "i1", Decision: "edit", Value: json.RawMessage(`{ "a" : 1 }`), By: "nurse", At: tc0}}
		}
		require.NoError(t, d.Commit(bg, c))
	}
	for i := 2; i <= 5; i++ {
		c := stepCommit("a", i)
		c.Checkpoint.ParentID = fmt.Sprintf("%04d", i-1)
		c.Checkpoint.Nodes = []string{"n"}
		c.Checkpoint.Next = []engine.TaskSpec{{ID: "x", Node: "next"}}
		c.Run = nil
		require.NoError(t, d.Commit(bg, c))
	}
	c := serveControl(t, d, dir)

	for _, f := range []engine.RunFilter{{}, {Limit: 2}, {After: "run-a"}, {Status: engine.StatusCompleted}, {Agent: "agent-c"}, {Thread: "a"},
		{Desc: true, Limit: 2}, {Desc: true, After: "run-c"}, {Summary: true}, {Summary: true, Status: engine.StatusCompleted}} {
		want, err := d.Runs(bg, f)
		require.NoError(t, err)
		got, err := c.Runs(bg, f)
		require.NoError(t, err)
		require.Equal(t, want, got, "%+v", f)
	}
	// A summary across the socket is marked as the local one is.
	sum, err := c.Runs(bg, engine.RunFilter{Summary: true, Thread: "b"})
	require.NoError(t, err)
	require.Len(t, sum, 1)
	assert.True(t, sum[0].OutputTruncated)
	assert.False(t, sum[0].InputTruncated)
	want, err := d.Run(bg, "run-b")
	require.NoError(t, err)
	require.Equal(t, big, []byte(want.Output))
	got, err := c.Run(bg, "run-b")
	require.NoError(t, err)
	require.Equal(t, want, got)

	for _, limit := range []int{0, 2} {
		cps, err := d.History(bg, "a", "", "0004", limit)
		require.NoError(t, err)
		wantH := make([]HistoryEntry, len(cps))
		for i, cp := range cps {
			wantH[i] = NewHistoryEntry(cp)
		}
		gotH, err := c.History(bg, "a", "", "0004", limit)
		require.NoError(t, err)
		require.Equal(t, wantH, gotH)
		require.Len(t, gotH, map[int]int{0: 3, 2: 2}[limit], "below 0004")
		require.Equal(t, []string{"next"}, gotH[0].Next)
	}

	// Errors keep their meaning and their words.
	sameError := func(local, remote error, target error) {
		t.Helper()
		require.Error(t, local)
		require.Error(t, remote)
		require.Equal(t, local.Error(), remote.Error())
		require.ErrorIs(t, remote, target)
	}
	_, lerr := d.Run(bg, "run-nope")
	_, rerr := c.Run(bg, "run-nope")
	sameError(lerr, rerr, engine.ErrRunNotFound)
	require.ErrorContains(t, rerr, "run not found")

	flip(t, d, bucketRuns, []byte("run-b"), 20)
	_, lerr = d.Run(bg, "run-b")
	_, rerr = c.Run(bg, "run-b")
	sameError(lerr, rerr, ErrCorrupt)
	var ce *CorruptError
	require.ErrorAs(t, rerr, &ce)
	require.Equal(t, bucketRuns, ce.Bucket)
	require.Equal(t, "run-b", ce.Key)
	_, lerr = d.Runs(bg, engine.RunFilter{})
	_, rerr = c.Runs(bg, engine.RunFilter{})
	sameError(lerr, rerr, ErrCorrupt)

	// With Damaged set, the damaged record is left out and named.
	type damaged struct{ key, err string }
	list := func(rs func(context.Context, engine.RunFilter) ([]*engine.Run, error)) ([]*engine.Run, []damaged) {
		var ds []damaged
		runs, err := rs(bg, engine.RunFilter{Damaged: func(key string, err error) {
			require.ErrorIs(t, err, ErrCorrupt)
			ds = append(ds, damaged{key, err.Error()})
		}})
		require.NoError(t, err)
		return runs, ds
	}
	wantRuns, wantDamaged := list(d.Runs)
	gotRuns, gotDamaged := list(c.Runs)
	require.Len(t, wantRuns, 2)
	require.Equal(t, []damaged{{"run-b", wantDamaged[0].err}}, wantDamaged)
	require.Equal(t, wantRuns, gotRuns)
	require.Equal(t, wantDamaged, gotDamaged)
}

// The owner refuses a request it would misread, and the client refuses an
// answer it cannot read strictly.
func TestControlReadsRefuseWhatTheyWouldMisread(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Commit(bg, stepCommit("a", 1)))
	c := serveControl(t, d, dir)
	for path, want := range map[string]string{
		"/runs?limit=-1":         `store owner: list runs: limit "-1"`,
		"/runs?limit=x":          `limit "x"`,
		"/runs?stauts=completed": `unknown parameter "stauts"`,
		"/runs?agent=a&agent=b":  `parameter "agent" given 2 times`,
		"/history?thread=a&x=1":  `unknown parameter "x"`,
		"/run?id=a&id=b":         `parameter "id" given 2 times`,
		"/nothing":               "it does not serve GET /nothing",
	} {
		var out struct{}
		require.ErrorContains(t, c.do(bg, http.MethodGet, path, &out), want, path)
	}
	// A field the client does not know is an error, not ignored.
	var partial struct {
		Checkpoints []struct{ ID string } `json:"checkpoints"`
	}
	require.ErrorContains(t, c.do(bg, http.MethodGet, "/history?thread=a", &partial), "unknown field")
}

// A prune through the control socket whose AfterPrune fails has committed
// all the same: the client gets the report, with what AfterPrune did
// before it failed, along with the owner's error, as db prune says it
// without serve. A client that does not ask for the report (an older
// binary's) gets the error as it did, with nothing its strict decoding
// refuses.
func TestControlPruneReportsBeforeAFailureAfterIt(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	// A finished thread of five checkpoints, two days old.
	f := &pruneFixture{t: t, d: d, old: time.Now().Add(-48 * time.Hour)}
	for i := 1; i <= 5; i++ {
		parent := ""
		if i > 1 {
			parent = fmt.Sprintf("%04d", i-1)
		}
		f.ckpt("t", "", fmt.Sprintf("%04d", i), parent, i, engine.ChannelValue{Channel: "m", Version: uint64(i), Value: inline("1")})
	}
	c := serveControl(t, d, dir, ControlOptions{AfterPrune: func(_ context.Context, rep *PruneReport) error {
		removed := 2
		rep.KeptRemoved = &removed
		return fmt.Errorf("kept bundles: the third copy cannot be removed")
	}})

	rep, err := c.Prune(bg, 0)
	require.EqualError(t, err, "store owner: kept bundles: the third copy cannot be removed")
	require.NotNil(t, rep, "the report of a prune that committed is lost")
	assert.Equal(t, 1, rep.Threads)
	assert.Equal(t, 4, rep.CheckpointsRemoved)
	require.NotNil(t, rep.KeptRemoved)
	assert.Equal(t, 2, *rep.KeptRemoved)

	resp, err := c.send(bg, http.MethodPost, "/prune?older_than=0s")
	if err == nil {
		resp.Body.Close()
	}
	require.EqualError(t, err, "store owner: kept bundles: the third copy cannot be removed")
	var re *reportedError
	assert.False(t, errors.As(err, &re), "a report sent to a client that did not ask for it")

	// An error before anything committed comes with no report.
	require.NoError(t, d.Close())
	rep, err = c.Prune(bg, 0)
	require.ErrorContains(t, err, "store owner: prune store")
	assert.Nil(t, rep)
}
