package store

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// setFailpoints installs hooks for one test; they are cleared when it ends.
// Tests that use them must not run in parallel.
func setFailpoints(t *testing.T, set func()) {
	t.Helper()
	set()
	t.Cleanup(func() {
		failpoint.beforeCommitTx = nil
		failpoint.midGroupCommit = nil
		failpoint.applyRequest = nil
		failpoint.afterCommitTx = nil
		failpoint.commitWrite = nil
		failpoint.compactCopied = nil
		failpoint.storeMade = nil
	})
}

func (q *committer) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

func waitQueued(t *testing.T, d *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for d.q.queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d commits queued", d.q.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func stepCommit(thread string, i int) *engine.Commit {
	id := fmt.Sprintf("%04d", i)
	data := []byte(fmt.Sprintf("blob of %s step %d", thread, i))
	return &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: thread, ID: id, Step: i, Created: tc0,
			Channels: []engine.ChannelValue{{Channel: "c", Value: engine.Value{Blob: engine.RefOf(data)}}}},
		Blobs:  map[engine.BlobRef][]byte{engine.RefOf(data): data},
		Writes: []engine.CommitWrites{{Thread: thread, CheckpointID: id, Write: engine.PendingWrite{TaskID: "t", Kind: engine.WriteKindWrites}}},
		Run:    &engine.Run{ID: "run-" + thread, Thread: thread, Status: engine.StatusRunning, Checkpoint: id},
		Sync:   true,
	}
}

// holdFirstBatch makes the first group commit, once it is durable, wait
// until n more commits have queued behind it, so that the next batch holds
// exactly those n. Pass what it returns to commitAll, which starts them
// only then: too late to join the first transaction.
func holdFirstBatch(t *testing.T, d *DB, n int) <-chan struct{} {
	held := make(chan struct{})
	var once sync.Once
	setFailpoints(t, func() {
		failpoint.afterCommitTx = func(int) {
			once.Do(func() {
				close(held)
				waitQueued(t, d, n)
			})
		}
	})
	return held
}

// commitAll runs the commits concurrently once first is held (see
// holdFirstBatch), and returns each one's error.
func commitAll(t *testing.T, d *DB, held <-chan struct{}, first *engine.Commit, cs []*engine.Commit) []error {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); require.NoError(t, d.Commit(bg, first)) }()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the first commit was not held")
	}
	for i, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = d.Commit(bg, c) }()
	}
	wg.Wait()
	return errs
}

func TestGroupCommitSharesTransactions(t *testing.T) {
	d := openTest(t)
	const n = 32
	var cs []*engine.Commit
	for i := range n {
		cs = append(cs, stepCommit(fmt.Sprintf("t%d", i), 1))
	}
	held := holdFirstBatch(t, d, n)
	for _, err := range commitAll(t, d, held, stepCommit("first", 1), cs) {
		require.NoError(t, err)
	}
	st := d.Stats()
	assert.Equal(t, uint64(n+1), st.Commits)
	assert.Equal(t, uint64(2), st.Transactions, "one for the first commit, one for the %d queued behind it", n)
	assert.Equal(t, st.Transactions, st.Syncs)
	assert.Equal(t, uint64(n), st.MaxBatch)
	for i := range n {
		_, err := d.Checkpoint(bg, fmt.Sprintf("t%d", i), "", "0001")
		require.NoError(t, err)
	}
}

// joinFirst makes n commits, to threads t0, t1 and so on, queue in that
// order inside the first transaction, after its first request was applied.
// It returns a func that waits for them and returns their errors.
func joinFirst(t *testing.T, d *DB, n int) (wait func() []error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	var once sync.Once
	failpoint.midGroupCommit = func(int) error {
		once.Do(func() {
			for k := range n {
				wg.Add(1)
				go func() { defer wg.Done(); errs[k] = d.Commit(bg, stepCommit(fmt.Sprintf("t%d", k), 1)) }()
				waitQueued(t, d, k+1)
			}
		})
		return nil
	}
	return func() []error { wg.Wait(); return errs }
}

// Commits that queue while a batch is being applied join its transaction
// instead of waiting for its fsyncs and then for their own.
func TestCommitsJoinTheBatchBeingApplied(t *testing.T) {
	d := openTest(t)
	const n = 8
	var wait func() []error
	setFailpoints(t, func() { wait = joinFirst(t, d, n) })
	require.NoError(t, d.Commit(bg, stepCommit("first", 1)))
	for _, err := range wait() {
		require.NoError(t, err)
	}
	st := d.Stats()
	assert.Equal(t, uint64(n+1), st.Commits)
	assert.Equal(t, uint64(1), st.Transactions, "the queued commits joined the first one's transaction")
	assert.Equal(t, uint64(n+1), st.MaxBatch)
	for k := range n {
		_, err := d.Checkpoint(bg, fmt.Sprintf("t%d", k), "", "0001")
		require.NoError(t, err)
	}
}

// A commit that joined a batch and fails is dropped like any other; the
// batch, joiners included, is retried without it.
func TestFailedJoinerIsRetriedWithoutIt(t *testing.T) {
	d := openTest(t)
	boom := errors.New("disk says no")
	var wait func() []error
	setFailpoints(t, func() {
		wait = joinFirst(t, d, 3)
		failed := false
		failpoint.applyRequest = func(i int) error {
			if i == 2 && !failed { // t1, the second to join
				failed = true
				return boom
			}
			return nil
		}
	})
	require.NoError(t, d.Commit(bg, stepCommit("first", 1)))
	errs := wait()
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], boom)
	require.NoError(t, errs[2])
	_, err := d.Checkpoint(bg, "t1", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound, "the failed commit left nothing")
	for _, thread := range []string{"first", "t0", "t2"} {
		_, err := d.Checkpoint(bg, thread, "", "0001")
		assert.NoError(t, err, thread)
	}
	st := d.Stats()
	assert.Equal(t, uint64(1), st.Retries)
	assert.Equal(t, uint64(1), st.Failed)
	assert.Equal(t, uint64(3), st.Commits)
	assert.Equal(t, uint64(1), st.Transactions)
}

func TestGroupCommitUnderLoad(t *testing.T) {
	d := openTest(t)
	const workers, each = 16, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= each; i++ {
				assert.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%d", w), i)))
			}
		}()
	}
	wg.Wait()
	st := d.Stats()
	assert.Equal(t, uint64(workers*each), st.Commits)
	assert.Less(t, st.Transactions, st.Commits, "concurrent committers must share transactions")
	t.Logf("%d commits in %d transactions (largest batch %d)", st.Commits, st.Transactions, st.MaxBatch)
}

func TestOneBadCommitFailsOnlyItself(t *testing.T) {
	d := openTest(t)
	// A blob collision (other bytes already stored under a reference).
	collide := stepCommit("collide", 1)
	for ref := range collide.Blobs {
		plantBlob(t, d.db, ref, encodeBlob([]byte("other"), tc0))
	}
	cs := []*engine.Commit{stepCommit("a", 1), collide, stepCommit("b", 1), stepCommit("c", 1)}
	held := holdFirstBatch(t, d, len(cs))
	errs := commitAll(t, d, held, stepCommit("first", 1), cs)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], engine.ErrBlobCollision)
	assert.NoError(t, errs[2])
	assert.NoError(t, errs[3])
	for _, thread := range []string{"a", "b", "c"} {
		_, err := d.Checkpoint(bg, thread, "", "")
		assert.NoError(t, err, thread)
	}
	_, err := d.Checkpoint(bg, "collide", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
	_, err = d.Run(bg, "run-collide")
	assert.ErrorIs(t, err, engine.ErrRunNotFound)
	assert.Equal(t, uint64(2), d.Stats().Transactions, "a failed validation needs no retry")
}

func TestFailedApplyIsRetriedWithoutIt(t *testing.T) {
	d := openTest(t)
	cs := []*engine.Commit{stepCommit("a", 1), stepCommit("b", 1), stepCommit("c", 1)}
	held := holdFirstBatch(t, d, len(cs))
	boom := errors.New("disk says no")
	var mu sync.Mutex
	failed := false
	failpoint.applyRequest = func(i int) error {
		mu.Lock()
		defer mu.Unlock()
		// Fail the second request of the batch of three, once: its writes
		// are already in the transaction, so the batch must roll back.
		if !failed && d.q.maxBatch.Load() == 3 && i == 1 {
			failed = true
			return boom
		}
		return nil
	}
	errs := commitAll(t, d, held, stepCommit("first", 1), cs)
	failedAt := -1
	for i, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, boom)
			require.Equal(t, -1, failedAt, "only one commit may fail")
			failedAt = i
		}
	}
	require.NotEqual(t, -1, failedAt)
	for i, thread := range []string{"a", "b", "c"} {
		_, err := d.Checkpoint(bg, thread, "", "")
		if i == failedAt {
			assert.ErrorIs(t, err, engine.ErrCheckpointNotFound, "the failed commit left nothing")
		} else {
			assert.NoError(t, err, thread)
		}
	}
	st := d.Stats()
	assert.Equal(t, uint64(1), st.Retries)
	assert.Equal(t, uint64(1), st.Failed)
}

func TestMidGroupCommitFailureRollsBackTheBatch(t *testing.T) {
	d := openTest(t)
	cs := []*engine.Commit{stepCommit("a", 1), stepCommit("b", 1), stepCommit("c", 1), stepCommit("d", 1)}
	held := holdFirstBatch(t, d, len(cs))
	crash := errors.New("power cut")
	failpoint.midGroupCommit = func(i int) error {
		if d.q.maxBatch.Load() == uint64(len(cs)) && i == 2 {
			return crash
		}
		return nil
	}
	errs := commitAll(t, d, held, stepCommit("first", 1), cs)
	for i, err := range errs {
		assert.ErrorIs(t, err, crash, "commit %d", i)
	}
	for _, thread := range []string{"a", "b", "c", "d"} {
		_, err := d.Checkpoint(bg, thread, "", "")
		assert.ErrorIs(t, err, engine.ErrCheckpointNotFound, "nothing of the batch is visible: %s", thread)
		_, err = d.Run(bg, "run-"+thread)
		assert.ErrorIs(t, err, engine.ErrRunNotFound)
		ws, err := d.Writes(bg, thread, "", "0001")
		require.NoError(t, err)
		assert.Empty(t, ws)
	}
	_, err := d.Checkpoint(bg, "first", "", "")
	assert.NoError(t, err, "the batch before is untouched")

	// The store carries on.
	failpoint.midGroupCommit = nil
	require.NoError(t, d.Commit(bg, stepCommit("a", 1)))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func TestBeforeCommitTxFailure(t *testing.T) {
	d := openTest(t)
	boom := errors.New("no space")
	setFailpoints(t, func() { failpoint.beforeCommitTx = func(int) error { return boom } })
	require.ErrorIs(t, d.Commit(bg, stepCommit("a", 1)), boom)
	_, err := d.PutBlob(bg, []byte("x"))
	require.ErrorIs(t, err, boom)
	failpoint.beforeCommitTx = nil
	_, err = d.Checkpoint(bg, "a", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
	st := d.Stats()
	assert.Equal(t, uint64(2), st.Failed)
	assert.Equal(t, uint64(0), st.Transactions)
}

func TestAfterCommitTxRunsBeforeWake(t *testing.T) {
	d := openTest(t)
	var seen []string
	setFailpoints(t, func() {
		failpoint.afterCommitTx = func(int) {
			// The commit is durable by now: a fresh read sees it.
			_, err := d.Checkpoint(bg, "a", "", "")
			seen = append(seen, fmt.Sprint(err))
		}
	})
	require.NoError(t, d.Commit(bg, stepCommit("a", 1)))
	assert.Equal(t, []string{"<nil>"}, seen)
}

// A failed write or fsync stops the store's writes for good: what the
// transaction wrote may or may not be on disk, and bbolt's free-page list
// may disagree with the file. Reads go on; reopening the file writes again.
func TestWriteFailureStopsWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	require.NoError(t, d.WriteErr())

	eio := errors.New("fdatasync: input/output error")
	setFailpoints(t, func() { failpoint.commitWrite = func() error { return eio } })
	err = d.Commit(bg, stepCommit("t", 2))
	require.ErrorIs(t, err, ErrWriteFailed)
	assert.ErrorContains(t, err, "input/output error")
	failpoint.commitWrite = nil
	require.ErrorIs(t, d.WriteErr(), ErrWriteFailed)

	// Later writes fail at once, however they come.
	require.ErrorIs(t, d.Commit(bg, stepCommit("t", 3)), ErrWriteFailed)
	_, err = d.PutBlob(bg, bytes.Repeat([]byte("b"), 600))
	require.ErrorIs(t, err, ErrWriteFailed)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.ErrorIs(t, d.Commit(bg, stepCommit(fmt.Sprintf("c%d", i), 1)), ErrWriteFailed)
		}()
	}
	wg.Wait()

	// Reads go on.
	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	assert.NotEmpty(t, h)
	require.NoError(t, d.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.WriteErr())
	require.NoError(t, d.Commit(bg, stepCommit("t", 3)), "a reopened store writes again")
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}
