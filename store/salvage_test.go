package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// salvageFixture writes a store of five threads with many steps each,
// finished runs (so outcomes too), and returns its path with every
// record it holds, by bucket and key.
func salvageFixture(t testing.TB) (string, map[string]map[string][]byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	for i := 1; i <= 300; i++ {
		require.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%d", i%5), i)))
	}
	for th := range 5 {
		run := &engine.Run{ID: fmt.Sprintf("run-t%d", th), Thread: fmt.Sprintf("t%d", th), Status: engine.StatusCompleted,
			Checkpoint: fmt.Sprintf("%04d", 295+th), Output: []byte(`"done"`)}
		if th == 0 {
			run.Checkpoint = "0300"
		}
		require.NoError(t, d.Commit(bg, &engine.Commit{Run: run, Sync: true}))
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, d.Close())
	return path, records(t, path)
}

// records reads every record of a sound store file, by bucket and key.
func records(t testing.TB, path string) map[string]map[string][]byte {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	out := map[string]map[string][]byte{}
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			m := map[string][]byte{}
			out[string(name)] = m
			return b.ForEach(func(k, v []byte) error { m[string(k)] = bytes.Clone(v); return nil })
		})
	}))
	return out
}

// runRecords counts the run records and the outcome index entries among
// the runs bucket's records.
func runRecords(recs map[string][]byte) (runs, index int) {
	for k := range recs {
		if isOutcomeIndexKey([]byte(k)) {
			index++
		} else {
			runs++
		}
	}
	return runs, index
}

func first(a, _ int) int { return a }

func copyFile(t *testing.T, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	return writeStore(t, b)
}

// A sound store comes out whole: every record, the bucket sequences (the
// pending writes' keys come from one), and a clean check.
func TestSalvageCopiesASoundStoreWhole(t *testing.T) {
	src, want := salvageFixture(t)
	defer func(n int) { salvageBatch = n }(salvageBatch)
	salvageBatch = 7 // many transactions to a bucket
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	assert.Empty(t, rep.Lost)
	require.NotNil(t, rep.Check)
	assert.True(t, rep.OK(), "%v", rep.Check.Problems)
	assert.Equal(t, want, records(t, dst))
	// Empty lists are lists in JSON, for scripts.
	js, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"lost":[]`)
	assert.Contains(t, string(js), `"problems":[]`)
	entries, err := os.ReadDir(filepath.Dir(dst))
	require.NoError(t, err)
	require.Len(t, entries, 1, "salvage left files beside the copy: %v", entries)
	for name, recs := range want {
		if name != bucketRuns {
			assert.Equal(t, len(recs), rep.Records[name], name)
		}
	}
	// The runs bucket's outcome index entries are reported as before
	// version 6, apart from the run records.
	runs, index := runRecords(want[bucketRuns])
	require.NotZero(t, index)
	assert.Equal(t, runs, rep.Records[bucketRuns])
	assert.Equal(t, index, rep.Records[bucketOutcomeRuns])

	seq := func(path string) (n uint64) {
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
		require.NoError(t, err)
		defer db.Close()
		require.NoError(t, db.View(func(tx *bbolt.Tx) error { n = bucket(tx, bucketWrites).Sequence(); return nil }))
		return n
	}
	assert.Positive(t, seq(dst))
	assert.Equal(t, seq(src), seq(dst))

	d, err := Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	h, err := d.History(bg, "t1", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, 60)
	ls, err := d.Ledger(bg)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), ls.LastSeq)
}

// pageOf returns a page below the root of a bucket: the first child of
// its root branch page.
func pageOf(t *testing.T, path, name string) (id uint64, ps int) {
	t.Helper()
	return rootChild(t, path, name, 0)
}

// rootChild returns the i-th child of a bucket's root branch page,
// counted from the last where i is negative.
func rootChild(t *testing.T, path, name string, i int) (id uint64, ps int) {
	t.Helper()
	root, ps := bucketRoot(t, path, name)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	page := make([]byte, ps)
	_, err = f.ReadAt(page, int64(root)*int64(ps))
	require.NoError(t, err)
	le := binary.LittleEndian
	require.Equal(t, uint16(branchPageFlag), le.Uint16(page[8:]))
	if i < 0 {
		i += int(le.Uint16(page[10:])) // the page's count of elements
	}
	// A branch element: pos and ksize (4 bytes each), then the child's id.
	return le.Uint64(page[pageHeaderSize+16*i+8:]), ps
}

// damageCheckpointPage overwrites the start of a leaf page of the
// checkpoints bucket of the store file at path, and returns its id.
func damageCheckpointPage(t *testing.T, path string) uint64 {
	t.Helper()
	id, ps := pageOf(t, path, bucketCheckpoints)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xEE}, 64), int64(id)*int64(ps))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return id
}

// A damaged leaf page loses the records on it, and only those, with the
// pending writes of the checkpoints it held: the store that Open refuses
// is copied into one that opens, whose check names what the lost records
// leave dangling. Before, those writes were copied, to checkpoints that
// no longer exist.
func TestSalvagePassesOverADamagedPage(t *testing.T) {
	src, want := salvageFixture(t)
	id := damageCheckpointPage(t, src)
	_, err := Open(src, Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrDamaged)
	before, err := os.ReadFile(src)
	require.NoError(t, err)

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	after, err := os.ReadFile(src)
	require.NoError(t, err)
	assert.Equal(t, before, after, "salvage wrote to the damaged file")
	require.NotEmpty(t, rep.Lost)
	assert.Equal(t, bucketCheckpoints, rep.Lost[0].Bucket)
	assert.Contains(t, rep.Lost[0].Message, fmt.Sprintf("page %d says it is page", id))
	assert.False(t, rep.OK())

	got := records(t, dst)
	// The writes of the checkpoints lost are left out, each named.
	var orphans []Problem
	for k := range want[bucketWrites] {
		thread, ns, ckpt, ok := splitBranchKey([]byte(k[:len(k)-9]))
		require.True(t, ok, "%q", k)
		ck := string(checkpointKey(thread, ns, ckpt))
		if got[bucketCheckpoints][ck] != nil || got[bucketRecent][ck] != nil {
			assert.Contains(t, got[bucketWrites], k, "a write of a checkpoint the copy holds is left out")
			continue
		}
		assert.NotContains(t, got[bucketWrites], k, "a write of checkpoint %s, which the copy lacks, is copied", ckpt)
		orphans = append(orphans, Problem{Bucket: bucketWrites, Key: renderKey(bucketWrites, []byte(k)), Message: fmt.Sprintf(
			"a pending write of checkpoint %s (thread %q, namespace %q), which the copy does not hold: nothing can apply it, "+
				"and it is left out", ckpt, thread, ns)})
	}
	require.NotEmpty(t, orphans)
	assert.ElementsMatch(t, orphans, rep.Lost[1:])
	assert.Equal(t, len(orphans), rep.WritesLeftOut)
	assert.Len(t, got[bucketWrites], len(want[bucketWrites])-len(orphans))
	assert.Equal(t, len(got[bucketWrites]), rep.Records[bucketWrites])
	js, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.Contains(t, string(js), fmt.Sprintf(`"writes_left_out":%d`, len(orphans)))
	for name, recs := range want {
		if name == bucketMeta || name == bucketWrites {
			continue
		}
		if name != bucketCheckpoints {
			assert.Equal(t, recs, got[name], "bucket %s", name)
			continue
		}
		lost := 0
		for k, v := range recs {
			if g, ok := got[name][k]; ok {
				assert.Equal(t, v, g)
			} else {
				lost++
			}
		}
		assert.Positive(t, lost)
		assert.Less(t, lost, len(recs)/2)
		assert.Equal(t, len(recs)-lost, rep.Records[name])
	}
	require.NotNil(t, rep.Check)
	assert.False(t, rep.Check.OK(), "check of the copy misses the lost checkpoints")
	for _, p := range rep.Check.Problems {
		assert.NotEqual(t, bucketWrites, p.Bucket, "%v", p)
	}

	d, err := Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	c, err := d.Checkpoint(bg, "t1", "", "")
	require.NoError(t, err)
	assert.Equal(t, "0296", c.ID, "the newest checkpoints were not on the damaged page")
}

// A record whose own bytes are damaged, on a page that is otherwise
// whole, is left out and reported lost by bucket and key, as a record on a
// damaged page is. Before, it was copied as it was, and the copy failed on
// it as the store did (listing runs, starting serve).
func TestSalvageLeavesOutARecordThatFailsItsChecksum(t *testing.T) {
	src, want := salvageFixture(t)
	rec := want[bucketRuns]["run-t1"] // a completed run
	require.NotNil(t, rec)
	// Damage one byte in the middle of the record, wherever the file holds
	// it: its live copy, and any stale one on a free page.
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	damaged := damageRecord(b, rec)
	require.Positive(t, damaged)
	t.Logf("the file holds the record %d time(s)", damaged)
	require.NoError(t, os.WriteFile(src, b, 0o600))

	// The pages are whole: the store opens, and fails on that record.
	d, err := Open(src, Options{ReadOnly: true})
	require.NoError(t, err)
	_, err = d.Runs(bg, engine.RunFilter{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "run-t1", ce.Key)
	require.NoError(t, d.Close())

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	require.Len(t, rep.Lost, 1, "%v", rep.Lost)
	assert.Equal(t, Problem{Bucket: bucketRuns, Key: "run-t1",
		Message: "checksum mismatch: the record cannot be read, and is left out"}, rep.Lost[0])
	require.NotNil(t, rep.Check)
	assert.True(t, rep.Check.OK(), "the copy does not check clean: %v", rep.Check.Problems)
	assert.False(t, rep.OK(), "a record was lost")
	runs, _ := runRecords(want[bucketRuns])
	assert.Equal(t, runs-1, rep.Records[bucketRuns])

	// Exactly that record is missing from the copy.
	got := records(t, dst)
	for name, recs := range want {
		if name == bucketMeta {
			continue
		}
		if name == bucketRuns {
			recs = maps.Clone(recs)
			delete(recs, "run-t1")
		}
		assert.Equal(t, recs, got[name], "bucket %s", name)
	}

	d, err = Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	list, err := d.Runs(bg, engine.RunFilter{})
	require.NoError(t, err, "the copy lists its runs")
	assert.Len(t, list, runs-1)
	crep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, crep.OK(), "%v", crep.Problems)
	js, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"problems":[]`)
}

// damageRecord flips one byte in the middle of rec wherever the file image
// b holds it, and returns how many times it does.
func damageRecord(b, rec []byte) int {
	damaged := 0
	for at := 0; ; {
		i := bytes.Index(b[at:], rec)
		if i < 0 {
			return damaged
		}
		b[at+i+len(rec)/2] ^= 0xFF
		at += i + len(rec)
		damaged++
	}
}

// With the newer meta page damaged, the walk starts from the older one;
// with both damaged, nothing can be found and Salvage says so.
func TestSalvageWithADamagedMetaPage(t *testing.T) {
	src, want := salvageFixture(t)
	good, err := os.ReadFile(src)
	require.NoError(t, err)
	ps := int(binary.LittleEndian.Uint32(good[metaOffset+8:]))
	newer := 0
	if readMeta(good[ps:]).txid > readMeta(good).txid {
		newer = ps
	}
	b := bytes.Clone(good)
	b[newer+metaOffset+20] ^= 0xFF
	rep, err := Salvage(bg, writeStore(t, b), filepath.Join(t.TempDir(), "salvaged.db"))
	require.NoError(t, err)
	// The newest transaction, whose meta page is damaged, appended the
	// last outcome; the copy is the older one's tree, and names it.
	require.Len(t, rep.Lost, 2)
	assert.Contains(t, rep.Lost[0].Message, "is not whole")
	n := len(want[bucketOutcomes])
	assert.Contains(t, rep.Lost[1].Message, fmt.Sprintf("outcomes %d to %d, after the copy's ledger ends at %d", n, n, n-1))
	assert.Equal(t, readMeta(good[ps-newer:]).txid, rep.TxID)
	assert.Equal(t, first(runRecords(want[bucketRuns])), rep.Records[bucketRuns])

	b[ps-newer+metaOffset+20] ^= 0xFF
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	_, err = Salvage(bg, writeStore(t, b), dst)
	require.ErrorIs(t, err, ErrDamaged)
	assert.NoFileExists(t, dst)
}

func TestSalvageRefusals(t *testing.T) {
	src, _ := salvageFixture(t)
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	require.NoError(t, os.WriteFile(dst, []byte("keep"), 0o600))
	_, err := Salvage(bg, src, dst)
	require.ErrorIs(t, err, os.ErrExist)
	kept, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(kept))

	d, err := Open(src, Options{})
	require.NoError(t, err)
	defer d.Close()
	dst = filepath.Join(t.TempDir(), "salvaged.db")
	_, err = Salvage(bg, src, dst)
	require.ErrorIs(t, err, ErrInUse)
	assert.NoFileExists(t, dst)
}

// Whatever the damage, Salvage does not panic, and a copy it reports
// written opens.
func FuzzSalvage(f *testing.F) {
	good, _ := damageFixture(f)
	f.Add(uint32(0), []byte{0xFF})
	f.Add(uint32(4096*3+20), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(uint32(len(good)/2), bytes.Repeat([]byte{0}, 4096))
	f.Fuzz(func(t *testing.T, at uint32, junk []byte) {
		b := bytes.Clone(good)
		if int(at) < len(b) {
			copy(b[at:], junk)
		}
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		rep, err := Salvage(bg, writeStore(t, b), dst)
		if err != nil {
			return
		}
		require.NotNil(t, rep.Check)
		d, err := Open(dst, Options{ReadOnly: true})
		require.NoError(t, err)
		require.NoError(t, d.Close())
	})
}

// Salvage reports the records it has copied, and stops when its context
// ends, leaving no file behind.
func TestSalvageReportsProgressAndStops(t *testing.T) {
	defer func(n int) { progressEvery = n }(progressEvery)
	progressEvery = 50
	src, want := salvageFixture(t)
	total := 0
	for _, recs := range want {
		total += len(recs)
	}
	var seen []int
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	_, err := Salvage(WithProgress(bg, func(n int) { seen = append(seen, n) }), src, dst)
	require.NoError(t, err)
	require.Len(t, seen, total/50, "the check of the copy counted as progress, or records went uncounted")
	for i, n := range seen {
		assert.Equal(t, 50*(i+1), n)
	}

	ctx, cancel := context.WithCancel(bg)
	dst = filepath.Join(t.TempDir(), "salvaged.db")
	_, err = Salvage(WithProgress(ctx, func(n int) {
		if n >= 100 {
			cancel()
		}
	}), src, dst)
	require.ErrorIs(t, err, context.Canceled)
	assert.NoFileExists(t, dst)
	assert.NoFileExists(t, dst+".salvage")
}

// Where the lock file cannot be made, as on a disk mounted read-only,
// Salvage takes a shared lock instead: it still runs, and a writer still
// stops it.
func TestSalvageWithoutWritableLockFile(t *testing.T) {
	src, want := salvageFixture(t)
	require.NoError(t, os.Remove(LockFile(src)))
	require.NoError(t, os.Mkdir(LockFile(src), 0o700)) // opening it for writing fails
	rep, err := Salvage(bg, src, filepath.Join(t.TempDir(), "salvaged.db"))
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v %v", rep.Lost, rep.Check.Problems)
	assert.Equal(t, first(runRecords(want[bucketRuns])), rep.Records[bucketRuns])

	// A writer's exclusive lock on what is there still stops it.
	f, err := os.Open(LockFile(src))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, flockWithin(f, false, time.Second))
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	_, err = Salvage(bg, src, dst)
	require.ErrorIs(t, err, ErrInUse)
	assert.NoFileExists(t, dst)
}

// Values on overflow pages (a blob larger than a page) come out whole.
func TestSalvageCopiesOverflowPages(t *testing.T) {
	good, ps := damageFixture(t)
	src := writeStore(t, good)
	want := records(t, src)
	big := 0
	for _, v := range want[bucketBlobLog] {
		big = max(big, len(v))
	}
	require.Greater(t, big, ps, "the fixture has no value larger than a page")
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v %v", rep.Lost, rep.Check.Problems)
	assert.Equal(t, want, records(t, dst))
}

// A salvage to a folder it cannot write in says why, and only that: it
// said also that it could not remove the copy it never made ("remove
// DIR/s.db.salvage: read-only file system").
func TestSalvageToAReadOnlyFolderSaysOnlyWhy(t *testing.T) {
	src, _ := salvageFixture(t)
	ro := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "ro,size=4096", "tmpfs", ro).CombinedOutput(); err != nil {
		t.Skipf("a read-only tmpfs cannot be mounted here (%v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", ro).Run() })
	_, err := Salvage(bg, src, filepath.Join(ro, "s.db"))
	require.ErrorIs(t, err, syscall.EROFS)
	assert.NotContains(t, err.Error(), "remove", "the error speaks of removing a copy that was never made")
}
