package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

func TestBackupWhileWriting(t *testing.T) {
	d := openTest(t)
	for i := 1; i <= 5; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("base", i)))
	}

	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	var written atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; ctx.Err() == nil; i++ {
				assert.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("w%d", w), i)))
				written.Add(1)
			}
		}()
	}
	// Back up while the writers run, at least twice with commits between.
	dir := t.TempDir()
	var backups []string
	for i := range 3 {
		for written.Load() < int64(10*(i+1)) {
			runtime.Gosched()
		}
		path := filepath.Join(dir, fmt.Sprintf("backup-%d.db", i))
		require.NoError(t, d.BackupFile(bg, path))
		backups = append(backups, path)
	}
	stop()
	wg.Wait()

	for _, path := range backups {
		b, err := Open(path, Options{})
		require.NoError(t, err)
		rep, err := b.Check(bg)
		require.NoError(t, err)
		assert.True(t, rep.OK(), "%s: %v", path, rep.Problems)
		h, err := b.History(bg, "base", "", "", 0)
		require.NoError(t, err)
		assert.Len(t, h, 5)
		// Each writer's run record points at its newest checkpoint in the
		// copy: the copy is one transaction's view.
		for w := range 4 {
			r, err := b.Run(bg, fmt.Sprintf("run-w%d", w))
			if err != nil {
				continue // this writer had not committed yet
			}
			c, err := b.Checkpoint(bg, fmt.Sprintf("w%d", w), "", "")
			require.NoError(t, err)
			assert.Equal(t, c.ID, r.Checkpoint)
		}
		require.NoError(t, b.Close())
	}

	assert.ErrorIs(t, d.BackupFile(bg, backups[0]), os.ErrExist, "a backup never overwrites")
	var buf bytes.Buffer
	n, err := d.Backup(bg, &buf)
	require.NoError(t, err)
	assert.Equal(t, int64(buf.Len()), n)
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	_, err = d.Backup(cancelled, &bytes.Buffer{})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestCompact(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 40; i++ {
		c := stepCommit("t", i)
		c.Checkpoint.Channels[0].Value = engine.Value{Inline: bytes.Repeat([]byte("x"), 400)}
		c.Blobs = nil
		require.NoError(t, d.Commit(bg, c))
	}
	require.NoError(t, d.Commit(bg, &engine.Commit{Run: &engine.Run{ID: "run-t", Thread: "t", Status: engine.StatusCompleted}}))
	rep, err := d.Prune(bg, 0, tc0.AddDate(10, 0, 0))
	require.NoError(t, err)
	require.Equal(t, 39, rep.CheckpointsRemoved)

	dst := filepath.Join(dir, "compacted.db")
	require.NoError(t, d.Compact(bg, dst))
	assert.ErrorIs(t, d.Compact(bg, dst), os.ErrExist)
	c, err := Open(dst, Options{})
	require.NoError(t, err)
	h, err := c.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, 1)
	require.NoError(t, c.Close())
	require.NoError(t, d.Close())

	done, err := CompactFile(bg, path, Options{})
	require.NoError(t, err)
	assert.LessOrEqual(t, done.After, done.Before)
	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	r, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, r.OK(), "%v", r.Problems)
	// Sequences survive compaction: new pending writes sort after old ones.
	require.NoError(t, d.Commit(bg, &engine.Commit{Writes: []engine.CommitWrites{{Thread: "t", CheckpointID: "0040",
		Write: engine.PendingWrite{TaskID: "later", Kind: engine.WriteKindWrites}}}}))
	ws, err := d.Writes(bg, "t", "", "0040")
	require.NoError(t, err)
	require.Len(t, ws, 2)
	assert.Equal(t, "later", ws[1].TaskID)
}

// A compaction reports the records it copies, and one whose context ends
// stops, leaves the store as it was and no copy behind.
func TestCompactReportsProgressAndStops(t *testing.T) {
	defer func(n int) { progressEvery = n }(progressEvery)
	progressEvery = 4
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 20; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	require.NoError(t, d.Close())
	orig, err := os.ReadFile(path)
	require.NoError(t, err)

	var seen []int
	c, err := CompactFile(WithProgress(bg, func(n int) { seen = append(seen, n) }), path, Options{})
	before, after := c.Before, c.After
	require.NoError(t, err)
	assert.Less(t, after, before)
	require.NotEmpty(t, seen)
	for i, n := range seen {
		assert.Equal(t, 4*(i+1), n)
	}
	d, err = Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	// Every record was copied: the progress count is the records Check reads
	// in the data buckets, give or take the last partial step.
	total := 0
	for _, n := range rep.Records {
		total += n
	}
	assert.GreaterOrEqual(t, 4*len(seen)+4, total-rep.Records["blobindex"])
	// The copy keeps no room beyond its pages.
	require.NoError(t, d.view(func(tx *bbolt.Tx) error {
		assert.Equal(t, after, tx.Size())
		return nil
	}))
	require.NoError(t, d.Close())

	// Stopped on its second report: an error naming the cancellation, the
	// file's pages as before (opening it for writing commits an empty
	// transaction, which rewrites a meta page only), no copy left.
	require.NoError(t, os.WriteFile(path, orig, 0o600))
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	calls := 0
	_, err = CompactFile(WithProgress(ctx, func(int) {
		if calls++; calls == 2 {
			cancel()
		}
	}), path, Options{})
	require.ErrorIs(t, err, context.Canceled)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	metaPages := 2 * DefaultPageSize
	require.Len(t, got, len(orig))
	assert.Equal(t, orig[metaPages:], got[metaPages:])
	_, err = os.Stat(path + ".compact")
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// An Open that waits while a compaction holds the store ends up on the
// compacted copy, not on the file the copy replaced: its writes stay in
// the folder.
func TestOpenWaitingOnACompactionGetsTheCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	require.NoError(t, d.Close())

	type opened struct {
		d   *DB
		err error
	}
	waiter := make(chan opened, 1)
	setFailpoints(t, func() {
		failpoint.compactCopied = func() {
			go func() {
				d, err := Open(path, Options{Timeout: 10 * time.Second})
				waiter <- opened{d, err}
			}()
			// Give it time to reach the lock and wait there; were it
			// late, it would only find the copy in place sooner.
			time.Sleep(300 * time.Millisecond)
		}
	})
	_, err = CompactFile(bg, path, Options{})
	require.NoError(t, err)
	w := <-waiter
	require.NoError(t, w.err)
	require.NoError(t, w.d.Commit(bg, stepCommit("t", 2)))
	require.NoError(t, w.d.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	require.Len(t, h, 2, "the waiting writer's commit is in the store file")
}

// A copy that did not finish leaves its temporary file; the next backup to
// the same path says what is in the way and leaves it alone.
func TestBackupNamesATemporaryFileInTheWay(t *testing.T) {
	d := openTest(t)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	path := filepath.Join(t.TempDir(), "b.db")
	require.NoError(t, os.WriteFile(path+".tmp", []byte("partial"), 0o600))
	err := d.BackupFile(bg, path)
	require.ErrorIs(t, err, os.ErrExist)
	assert.ErrorContains(t, err, path+".tmp is in the way")
	left, rerr := os.ReadFile(path + ".tmp")
	require.NoError(t, rerr)
	assert.Equal(t, "partial", string(left))
	assert.NoFileExists(t, path)

	require.NoError(t, os.Remove(path+".tmp"))
	require.NoError(t, d.BackupFile(bg, path))
}

// Check counts the file's space: pages in use and free pages make up the
// pages below the high-water mark, and compaction gives the free ones back.
func TestCheckCountsSpace(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 20; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	// A bucket of large values, then dropped: its pages become free.
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("scratch"))
		require.NoError(t, err)
		for i := range 40 {
			require.NoError(t, b.Put([]byte(fmt.Sprint(i)), bytes.Repeat([]byte{'x'}, 6000)))
		}
		return nil
	}))
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("scratch")) }))
	// One more commit, so the pages the drop freed are released.
	require.NoError(t, d.Commit(bg, stepCommit("t", 21)))

	space := func(d *DB) *Space {
		t.Helper()
		rep, err := d.Check(bg)
		require.NoError(t, err)
		require.True(t, rep.OK(), "%v", rep.Problems)
		require.NotNil(t, rep.Space)
		var hw int64
		require.NoError(t, d.db.View(func(tx *bbolt.Tx) error { hw = tx.Size(); return nil }))
		sp := rep.Space
		assert.Equal(t, DefaultPageSize, sp.PageSize)
		assert.Equal(t, hw, sp.UsedBytes+sp.FreeBytes, "in use and free make up the pages below the high-water mark")
		assert.GreaterOrEqual(t, sp.FileBytes, hw)
		assert.Zero(t, sp.UsedBytes%int64(sp.PageSize))
		return sp
	}
	before := space(d)
	assert.Greater(t, before.FreeBytes, int64(30*6000), "the dropped bucket's pages are not counted free")
	require.NoError(t, d.Close())

	_, err = CompactFile(bg, path, Options{})
	require.NoError(t, err)
	d, err = Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	defer d.Close()
	after := space(d)
	assert.Less(t, after.FreeBytes, before.FreeBytes/4)
	assert.InDelta(t, before.UsedBytes, after.UsedBytes, float64(before.UsedBytes)/4, "compaction kept what was in use, give or take refilled pages")
}

// A backup restored in place of its store goes on counting the event
// stream's starts past every count the store gave out after the backup
// was taken, so that no event number a console client saw is given again;
// from its second start it counts by one. The same backup restored again
// later goes on past the first restore's counts. Backups taken by the
// store's owner over its control socket are stamped the same way; a
// compacted copy of a restored backup that has not started keeps the
// stamp, and a salvage of one goes on from the count it would go on from.
func TestARestoredBackupGoesOnPastItsStoresStreamCount(t *testing.T) {
	defer func(c func() time.Time) { salvageClock = c }(salvageClock)
	now := time.Now()
	salvageClock = func() time.Time { return now }
	restore := func(t *testing.T, backup string) *DB {
		t.Helper()
		b, err := os.ReadFile(backup)
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, FileName), b, 0o600))
		d, err := OpenDir(dir, Options{})
		require.NoError(t, err)
		return d
	}
	starts := func(t *testing.T, d *DB, n int) (first, last uint64) {
		t.Helper()
		for i := range n {
			e, err := d.NextStreamEpoch()
			require.NoError(t, err)
			if i == 0 {
				first = e
			} else {
				require.Equal(t, last+1, e, "a start after the first counts by one")
			}
			last = e
		}
		return first, last
	}
	for _, tc := range []struct {
		how        string
		aboveFloor bool
	}{{"local", false}, {"control", false}, {"compacted", false}, {"salvaged", false}, {"local", true}} {
		how := tc.how
		t.Run(fmt.Sprintf("%s,above-floor=%v", how, tc.aboveFloor), func(t *testing.T) {
			dir := t.TempDir()
			d, err := OpenDir(dir, Options{})
			require.NoError(t, err)
			defer d.Close()
			require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
			if tc.aboveFloor {
				// A store whose count a salvage set above the floor, to
				// the hour (lostEpoch).
				require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
					return bucket(tx, bucketMeta).Put(metaStreamEpoch,
						binary.BigEndian.AppendUint64(nil, salvageEpochFloor+epochHours()))
				}))
			}
			starts(t, d, 3)
			backup := filepath.Join(t.TempDir(), "backup.db")
			switch how {
			case "control":
				require.NoError(t, serveControl(t, d, dir).BackupFile(bg, backup))
			default:
				require.NoError(t, d.BackupFile(bg, backup))
			}
			switch how {
			case "compacted":
				r := restore(t, backup)
				backup = filepath.Join(t.TempDir(), "compacted.db")
				require.NoError(t, r.Compact(bg, backup))
				require.NoError(t, r.Close())
			case "salvaged":
				salvaged := filepath.Join(t.TempDir(), "salvaged.db")
				_, err := Salvage(bg, backup, salvaged)
				require.NoError(t, err)
				backup = salvaged
			}
			_, last := starts(t, d, 5) // the store goes on after the backup

			r := restore(t, backup)
			first, again := starts(t, r, 2)
			assert.Greater(t, first, last, "the restored store counts from a count its store gave out")
			assert.Less(t, again, uint64(1)<<21, "event numbers are not exact in a JavaScript number")
			require.NoError(t, r.Close())
			r, err = OpenDir(filepath.Dir(r.path), Options{})
			require.NoError(t, err)
			next, _ := starts(t, r, 1)
			assert.Equal(t, again+1, next, "a restored store that has started goes on by one")
			require.NoError(t, r.Close())

			if how == "salvaged" {
				return // a salvage's copy is not a backup: it is used once
			}
			now = now.Add(4 * time.Hour) // restored again, later
			r = restore(t, backup)
			first, _ = starts(t, r, 1)
			assert.Greater(t, first, next, "the backup restored again counts from a count the first restore gave out")
			require.NoError(t, r.Close())
		})
	}
}

// A compaction whose copy cannot be begun, on a full disk (a tmpfs with
// one page free), leaves no file at its destination: bbolt makes the file
// before it fails to write its first pages.
func TestCompactOnAFullDiskLeavesNoFile(t *testing.T) {
	d := openTest(t)
	full := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4096", "tmpfs", full).CombinedOutput(); err != nil {
		t.Skipf("a small tmpfs cannot be mounted here (%v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", full).Run() })
	dst := filepath.Join(full, "compacted.db")
	require.ErrorIs(t, d.Compact(bg, dst), syscall.ENOSPC)
	_, err := os.Stat(dst)
	require.ErrorIs(t, err, os.ErrNotExist, "the failed compaction left a file behind")
}
