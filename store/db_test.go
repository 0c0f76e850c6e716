package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// A second Open of a held store is told within a second that the folder
// is in use: whether another Open holds it (through the lock file), or
// only the store file's own lock is held, as a bbolt tool would hold it.
func TestSecondOpenFailsFast(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()

	start := time.Now()
	_, err = OpenDir(dir, Options{})
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ErrInUse)
	assert.Contains(t, err.Error(), "data folder "+dir+" is in use by another outpost process")
	assert.Less(t, elapsed, 900*time.Millisecond, "the in-use error must come within a second")
	t.Logf("in use reported after %v", elapsed)

	// The timeout can be set.
	start = time.Now()
	_, err = OpenDir(dir, Options{Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse)
	assert.Less(t, time.Since(start), DefaultTimeout)

	// A read-only opener is refused too: the writer holds an exclusive lock.
	_, err = OpenDir(dir, Options{ReadOnly: true, Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, ErrInUse)

	require.NoError(t, d.Close())
	d2, err := OpenDir(dir, Options{})
	require.NoError(t, err, "the lock is released by Close")
	require.NoError(t, d2.Close())

	// Only the store file's lock held: the lock file is had at once, and
	// the open-time check and bbolt share what is left of the wait.
	f, err := os.Open(filepath.Join(dir, FileName))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, flockWithin(f, false, time.Second))
	start = time.Now()
	_, err = OpenDir(dir, Options{})
	elapsed = time.Since(start)
	require.ErrorIs(t, err, ErrInUse)
	assert.Less(t, elapsed, 900*time.Millisecond)
}

func TestOpenRefusesOtherFormats(t *testing.T) {
	rawBolt := func(t *testing.T, fill func(tx *bbolt.Tx) error) string {
		path := filepath.Join(t.TempDir(), "x.db")
		db, err := bbolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, db.Update(fill))
		require.NoError(t, db.Close())
		return path
	}
	meta := func(format, version string) func(tx *bbolt.Tx) error {
		return func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucket([]byte(bucketMeta))
			if err != nil {
				return err
			}
			if err := b.Put(metaFormat, []byte(format)); err != nil {
				return err
			}
			return b.Put(metaVersion, []byte(version))
		}
	}
	tests := []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"not bbolt", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "junk.db")
			require.NoError(t, os.WriteFile(p, []byte(string(make([]byte, 8192))+"junk"), 0o600))
			return p
		}, "not a bbolt file"},
		{"another application's bbolt file", func(t *testing.T) string {
			return rawBolt(t, func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("theirs")); return err })
		}, "no format record"},
		{"other format", func(t *testing.T) string { return rawBolt(t, meta("something-else", "1")) }, `format "something-else"`},
		{"newer version", func(t *testing.T) string { return rawBolt(t, meta(formatName, strconv.Itoa(formatVersion+1))) },
			fmt.Sprintf("format version %q, this binary reads version %d", strconv.Itoa(formatVersion+1), formatVersion)},
		{"version 1 (checkpoints keyed by thread)", func(t *testing.T) string { return rawBolt(t, meta(formatName, "1")) },
			fmt.Sprintf(`format version "1", this binary reads version %d; the file was written by an older outpost and cannot be migrated`, formatVersion)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			_, err := Open(path, Options{})
			require.ErrorIs(t, err, ErrFormat)
			assert.Contains(t, err.Error(), tc.want)
			// The refusal released the file.
			db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 100 * time.Millisecond})
			if err == nil {
				require.NoError(t, db.Close())
			}
		})
	}
}

func TestReopenSeesEverything(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	big := make([]byte, 3*engine.BlobThreshold)
	for i := range big {
		big[i] = byte(i)
	}
	ref := engine.RefOf(big)
	c := &engine.Checkpoint{Thread: "t", ID: "0001", RunID: "r", Created: tc0,
		Channels: []engine.ChannelValue{{Channel: "doc", Version: 1, Value: engine.Value{Blob: ref}}}}
	r := &engine.Run{ID: "r", Thread: "t", Status: engine.StatusInterrupted, CreatedAt: tc0,
		Interrupts: []engine.PendingInterrupt{{ID: "i", Node: "review", Payload: json.RawMessage(`{}`)}}}
	w := engine.PendingWrite{TaskID: "task", Node: "review", Kind: engine.WriteKindInterrupt, Data: json.RawMessage(`[{"id":"i"}]`)}
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: c, Run: r, Sync: true,
		Blobs:  map[engine.BlobRef][]byte{ref: big},
		Writes: []engine.CommitWrites{{Thread: "t", CheckpointID: "0001", Write: w}}}))
	require.NoError(t, d.PutToolIntent(bg, "r/1/task/0", ToolCall{RunID: "r", Tool: "x", ArgsHash: "h"}))
	require.NoError(t, d.Close())

	_, err = d.Checkpoint(bg, "t", "", "")
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, d.Commit(bg, &engine.Commit{Run: r}), ErrClosed)

	d, err = OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	gotC, err := d.Checkpoint(bg, "t", "", "")
	require.NoError(t, err)
	assert.Equal(t, c, gotC)
	gotR, err := d.Run(bg, "r")
	require.NoError(t, err)
	assert.Equal(t, r, gotR)
	ws, err := d.Writes(bg, "t", "", "0001")
	require.NoError(t, err)
	assert.Equal(t, []engine.PendingWrite{w}, ws)
	b, err := d.Blob(bg, ref)
	require.NoError(t, err)
	assert.Equal(t, big, b)
	tc, err := d.ToolCall(bg, "r/1/task/0")
	require.NoError(t, err)
	assert.Equal(t, ToolCallIntent, tc.Status)
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func TestReadOnlyOpen(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, &engine.Commit{Run: &engine.Run{ID: "r", Status: engine.StatusCompleted}}))
	require.NoError(t, d.Close())

	ro, err := OpenDir(dir, Options{ReadOnly: true})
	require.NoError(t, err)
	defer ro.Close()
	_, err = ro.Run(bg, "r")
	require.NoError(t, err)
	err = ro.Commit(bg, &engine.Commit{Run: &engine.Run{ID: "r2"}})
	require.Error(t, err)
}

func TestInvalidKeys(t *testing.T) {
	d := openTest(t)
	tests := []struct {
		name string
		c    *engine.Commit
	}{
		{"NUL in thread", &engine.Commit{Checkpoint: &engine.Checkpoint{Thread: "a\x00b", ID: "1"}}},
		{"NUL in namespace", &engine.Commit{Checkpoint: &engine.Checkpoint{Thread: "a", NS: "\x00", ID: "1"}}},
		{"empty checkpoint ID", &engine.Commit{Checkpoint: &engine.Checkpoint{Thread: "a"}}},
		{"empty thread", &engine.Commit{Checkpoint: &engine.Checkpoint{ID: "1"}}},
		{"NUL in write's checkpoint", &engine.Commit{Writes: []engine.CommitWrites{{Thread: "a", CheckpointID: "1\x00"}}}},
		{"empty run ID", &engine.Commit{Run: &engine.Run{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, d.Commit(bg, tc.c), ErrInvalidKey)
		})
	}
}

func TestSize(t *testing.T) {
	d := openTest(t)
	n, err := d.Size()
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.Equal(t, FileName, filepath.Base(d.Path()))
}

// A store is mapped large at open (DefaultMmapSize), so that it is not
// remapped as it grows, yet its file grows by growStep, not by bbolt's 16
// MB: a store of a few megabytes stays a few megabytes on disk.
func TestStoreFileGrowsByStep(t *testing.T) {
	assert.Equal(t, DefaultMmapSize, Options{}.bolt().InitialMmapSize)
	assert.Equal(t, 64<<20, Options{InitialMmapSize: 64 << 20}.bolt().InitialMmapSize)

	d := openTest(t)
	ctx := t.Context()
	data := make([]byte, 64<<10)
	var used int64
	for i := 0; used < 5<<20; i++ {
		binary.BigEndian.PutUint64(data, uint64(i)) // a new blob each time
		_, err := d.PutBlob(ctx, data)
		require.NoError(t, err)
		require.NoError(t, d.db.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil }))
		fi, err := os.Stat(d.Path())
		require.NoError(t, err)
		require.LessOrEqual(t, fi.Size(), used+growStep+64<<10, "blob %d: %d bytes of pages in use", i, used)
	}
}

// A format 3 or 4 file is read as it is, read-only too, and stamped with
// the current version when first opened for writing, so that a binary of
// its version refuses what it could not read: run records it cannot decode
// (3), checkpoints in the recent bucket, which it does not know (3 and 4).
// Such a file has no recent bucket until then.
func TestOpenStampsOlderFormats(t *testing.T) {
	for _, old := range []string{"3", "4"} {
		t.Run(old, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			d, err := Open(path, Options{})
			require.NoError(t, err)
			require.NoError(t, d.Commit(bg, &engine.Commit{
				Checkpoint: &engine.Checkpoint{Thread: "t", ID: "0001", Created: tc0},
				Run:        &engine.Run{ID: "r1", Thread: "t", Status: engine.StatusQueued},
				Sync:       true,
			}))
			// What an older binary would have written: the checkpoint in
			// the checkpoints bucket, and no recent bucket.
			require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
				var moved [][2][]byte
				require.NoError(t, bucket(tx, bucketRecent).ForEach(func(k, v []byte) error {
					moved = append(moved, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
					return nil
				}))
				require.Len(t, moved, 1)
				for _, kv := range moved {
					require.NoError(t, bucket(tx, bucketCheckpoints).Put(kv[0], kv[1]))
				}
				require.NoError(t, tx.DeleteBucket([]byte(bucketRecent)))
				return bucket(tx, bucketMeta).Put(metaVersion, []byte(old))
			}))
			require.NoError(t, d.Close())
			version := func(d *DB) (v string, recent bool) {
				require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
					v, recent = string(bucket(tx, bucketMeta).Get(metaVersion)), bucket(tx, bucketRecent) != nil
					return nil
				}))
				return v, recent
			}

			ro, err := Open(path, Options{ReadOnly: true})
			require.NoError(t, err)
			r, err := ro.Run(bg, "r1")
			require.NoError(t, err)
			assert.Equal(t, engine.StatusQueued, r.Status)
			cp, err := ro.Checkpoint(bg, "t", "", "")
			require.NoError(t, err)
			assert.Equal(t, "0001", cp.ID)
			rep, err := ro.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
			v, recent := version(ro)
			assert.Equal(t, old, v, "a read-only open changes nothing")
			assert.False(t, recent)
			require.NoError(t, ro.Close())

			d, err = Open(path, Options{})
			require.NoError(t, err)
			defer d.Close()
			v, recent = version(d)
			assert.Equal(t, strconv.Itoa(formatVersion), v)
			assert.True(t, recent, "the first writable open adds the recent bucket")
			require.NoError(t, d.Commit(bg, &engine.Commit{
				Checkpoint: &engine.Checkpoint{Thread: "t", ID: "0002", ParentID: "0001", Created: tc0}, Sync: true}))
			h, err := d.History(bg, "t", "", "", 0)
			require.NoError(t, err)
			require.Len(t, h, 2)
			assert.Equal(t, []string{"0002", "0001"}, []string{h[0].ID, h[1].ID})
			rep, err = d.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
		})
	}
}

// A store opening hands its newest ids to the engine, so ids stay
// increasing when the clock was set back while the appliance was off.
func TestOpenKeepsIDsIncreasing(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	ahead := fmt.Sprintf("%016x", time.Now().Add(time.Hour).UnixNano()) // written before the clock went back
	require.NoError(t, d.Commit(bg, &engine.Commit{
		Checkpoint: &engine.Checkpoint{Thread: "t", ID: ahead, Created: tc0},
		Run:        &engine.Run{ID: "run_" + ahead, Thread: "t", Status: engine.StatusCompleted, Checkpoint: ahead},
		Sync:       true,
	}))
	require.NoError(t, d.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.Greater(t, engine.NewRunID(), "run_"+ahead)
}

// A new store, and every folder made for it, is named durably: the folder
// that holds each is fsynced, since fsyncing a file does not make its name
// durable.
func TestNewStoreIsDurableInItsFolder(t *testing.T) {
	var synced []string
	defer fsync.Observe(func(dir string) { synced = append(synced, dir) })()
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "data")
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	// Each new folder's parent, top down, then the store file's folder.
	assert.Equal(t, []string{base, filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir}, synced)

	// A writable open fsyncs the folder again (the process that made the
	// file may have stopped before it could); a read-only one does not.
	synced = nil
	d, err = OpenDir(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.Equal(t, []string{dir}, synced)
	synced = nil
	d, err = OpenDir(dir, Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	assert.Empty(t, synced)
}

// A new store file is made under a temporary name and renamed into place
// once whole and fsynced: a crash before the rename leaves no store file
// (which the next start makes), never an empty one (which it refuses), and
// the temporary file such a crash leaves does not stop the next start.
func TestNewStoreIsMadeWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	crash := errors.New("crash")
	setFailpoints(t, func() {
		failpoint.storeMade = func(tmp string) error {
			assert.Equal(t, dir, filepath.Dir(tmp), "made beside the store, for the rename")
			assert.NoFileExists(t, path, "the store file appeared before it was whole")
			b, err := os.ReadFile(tmp)
			require.NoError(t, err)
			m0 := readMeta(b)
			require.True(t, m0.valid, "the first meta page is not whole")
			assert.Equal(t, uint64(4096), m0.pageSize, "made with the page size asked for")
			assert.True(t, readMeta(b[m0.pageSize:]).valid, "the second meta page is not whole")
			return crash
		}
	})
	_, err := Open(path, Options{PageSize: 4096})
	require.ErrorIs(t, err, crash)
	assert.NoFileExists(t, path)
	assert.NoFileExists(t, path+".create")

	// What a crash part-way through leaves: a temporary file, cut short.
	failpoint.storeMade = nil
	require.NoError(t, os.WriteFile(path+".create", make([]byte, 100), 0o600))
	d, err := Open(path, Options{PageSize: 4096})
	require.NoError(t, err)
	assert.Equal(t, 4096, d.db.Info().PageSize)
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	require.NoError(t, d.Close())
	assert.NoFileExists(t, path+".create")
	d, err = Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	defer d.Close()
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	assert.Equal(t, 1, rep.Records[bucketCheckpoints])
}

// The event stream's starts are counted in the file: the count goes on
// across reopening, and check reads it.
func TestNextStreamEpoch(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	for want := uint64(1); want <= 2; want++ {
		n, err := d.NextStreamEpoch()
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	require.NoError(t, d.Close())
	d, err = OpenDir(dir, Options{})
	require.NoError(t, err)
	n, err := d.NextStreamEpoch()
	require.NoError(t, err)
	require.Equal(t, uint64(3), n, "the count survives reopening")
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, d.Close())
	_, err = d.NextStreamEpoch()
	require.ErrorIs(t, err, ErrClosed)
}
