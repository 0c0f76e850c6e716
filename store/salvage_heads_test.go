package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// chainedSteps writes a store of three threads, each a chain of steps,
// one of which forks at an older step, so that its namespace has a branch
// besides its head. It returns the file's bytes.
func chainedSteps(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	last := map[string]string{}
	for i := 1; i <= 300; i++ {
		thread := fmt.Sprintf("t%d", i%3)
		c := stepCommit(thread, i)
		c.Checkpoint.ParentID = last[thread]
		if i == 150 {
			c.Checkpoint.ParentID = fmt.Sprintf("%04d", 3) // a fork of t0 at its first step
		} else {
			last[thread] = c.Checkpoint.ID
		}
		require.NoError(t, d.Commit(bg, c))
	}
	_, err = d.NextStreamEpoch()
	require.NoError(t, err)
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// A salvage whose root page is lost records each namespace's leaves anew
// from the checkpoints it copies: the heads bucket lives inline in the
// root page and is lost with it. Before, the copy had no head for any
// thread: its history listed nothing, a new run started from an empty
// state, and db check named every leaf "neither recorded in heads or
// branches". It also gives the copy a stream epoch above any the store
// had and a blob index with its mark, both of which were lost.
func TestSalvageRebuildsTheHeadsTheRootHeld(t *testing.T) {
	steps := chainedSteps(t)
	want := records(t, writeStore(t, steps))
	for _, backup := range []bool{false, true} {
		t.Run(fmt.Sprintf("backup=%v", backup), func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "salvaged.db")
			rep, err := Salvage(bg, stepsCopy(t, steps, backup), dst)
			require.NoError(t, err)
			assert.Empty(t, rep.Check.Problems, "db check of the copy")
			assert.Equal(t, len(want[bucketHeads]), rep.HeadsRebuilt)
			got := records(t, dst)

			// Each thread's history lists every checkpoint of it that the
			// copy holds, newest first, from its head: the newest.
			copied := map[string][]string{}
			for _, name := range []string{bucketCheckpoints, bucketRecent} {
				for k := range got[name] {
					thread, _, id, ok := splitCheckpointKey([]byte(k))
					require.True(t, ok)
					copied[thread] = append(copied[thread], id)
				}
			}
			require.Len(t, copied, len(want[bucketHeads]))
			d, err := Open(dst, Options{})
			require.NoError(t, err)
			defer d.Close()
			for thread, ids := range copied {
				slices.Sort(ids)
				slices.Reverse(ids)
				h, err := d.History(bg, thread, "", "", 0)
				require.NoError(t, err)
				var listed []string
				for _, c := range h {
					listed = append(listed, c.ID)
				}
				assert.Equal(t, ids, listed, "thread %s", thread)
				head, err := decodeHead(got[bucketHeads][string(nsKey(thread, ""))])
				require.NoError(t, err)
				assert.Equal(t, ids[0], head, "thread %s", thread)
			}
			// The fork at an older step is a leaf below the head.
			assert.Contains(t, got[bucketBranches], string(branchKey("t0", "", "0150")))

			epoch := got[bucketMeta][string(metaStreamEpoch)]
			require.Len(t, epoch, 8, "the copy's stream epoch")
			assert.GreaterOrEqual(t, binary.BigEndian.Uint64(epoch), uint64(salvageEpochFloor))
			assert.Greater(t, binary.BigEndian.Uint64(epoch), binary.BigEndian.Uint64(want[bucketMeta][string(metaStreamEpoch)]))
			next, err := d.NextStreamEpoch()
			require.NoError(t, err)
			assert.Equal(t, binary.BigEndian.Uint64(epoch)+1, next)

			mark := got[bucketMeta][string(metaBlobIndexed)]
			require.Len(t, mark, 8, "the copy's blob index mark")
			assert.Equal(t, len(got[bucketBlobLog]), len(got[bucketBlobIndex]), "every blob is indexed")
		})
	}
}

// startThrice starts the stream of the store at path three times, as
// serve does, with a commit after each (steps from 400+10*round), and
// returns the epoch reached and the file's bytes.
func startThrice(t *testing.T, path string, round int) (uint64, []byte) {
	t.Helper()
	d, err := Open(path, Options{})
	require.NoError(t, err)
	var reached uint64
	for j := range 3 {
		reached, err = d.NextStreamEpoch()
		require.NoError(t, err)
		require.NoError(t, d.Commit(bg, stepCommit("t1", 400+10*round+j)))
	}
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return reached, b
}

// Each salvage moves the stream epoch past the one the store it copies had
// reached: a copy of a salvaged copy whose root pages are lost (with them,
// as a rule, every record of the epoch: bbolt reuses the pages it frees),
// a backup of one that still holds an older copy of the meta records, and
// a sound copy. Before, a salvage whose meta records were lost set the
// floor, 2^20, every time, below the starts the copy it salvaged had
// counted since, so that a console client was given new events under
// numbers it had seen.
func TestSalvageMovesTheStreamEpochOnEachTime(t *testing.T) {
	defer func(c func() time.Time) { salvageClock = c }(salvageClock)
	now := time.Date(2026, 12, 1, 19, 0, 0, 0, time.UTC)
	salvageClock = func() time.Time { return now }
	src := stepsCopy(t, chainedSteps(t), true)
	var reached uint64 // the epoch the store salvaged last had reached
	for i, next := range []string{"roots lost, a day on", "a backup, roots lost, the same hour", "sound", ""} {
		dst := filepath.Join(t.TempDir(), FileName)
		rep, err := Salvage(bg, src, dst)
		require.NoError(t, err)
		assert.Empty(t, rep.Check.Problems, "db check of the copy")
		epoch := binary.BigEndian.Uint64(records(t, dst)[bucketMeta][string(metaStreamEpoch)])
		t.Logf("salvage %d: the store had reached %d, the copy's epoch is %d", i+1, reached, epoch)
		assert.GreaterOrEqual(t, epoch, uint64(salvageEpochFloor))
		assert.Greater(t, epoch, reached, "salvage %d", i+1)
		if next == "" {
			break
		}

		var b []byte
		reached, b = startThrice(t, dst, i)
		switch next {
		case "roots lost, a day on":
			b = zeroRoots(b)
			now = now.Add(24 * time.Hour)
		case "a backup, roots lost, the same hour":
			src = stepsCopy(t, b, true)
			continue
		}
		src = writeStore(t, b)
	}
}

// A copy that salvage made, started and then damaged, its root pages
// lost, is salvaged again in the same hour, or with the clock set back:
// each salvage's epoch passes every one the copy before it counted. The
// salvage stamps the epoch it sets in the copy's meta pages, which a
// salvage reads whole whatever else is lost, and a compaction stamps the
// epoch it copies. Before, with no older copy of the meta records left in
// the file (a compacted copy has none), a salvage in the same hour set the
// epoch the salvage before it had set, below the starts counted since.
func TestSalvageMovesTheStreamEpochWhateverTheClock(t *testing.T) {
	defer func(c func() time.Time) { salvageClock = c }(salvageClock)
	now := time.Date(2026, 12, 1, 19, 0, 0, 0, time.UTC)
	salvageClock = func() time.Time { return now }
	for _, backup := range []bool{false, true} {
		t.Run(fmt.Sprintf("backup=%v", backup), func(t *testing.T) {
			src := stepsCopy(t, chainedSteps(t), backup)
			// The epoch the store salvaged last had reached.
			var reached uint64
			for i, clock := range []string{"now", "the same hour", "set back a year", "the same hour"} {
				switch clock {
				case "set back a year":
					now = now.AddDate(-1, 0, 0)
				case "the same hour":
					now = now.Add(time.Minute)
				}
				if i > 0 {
					// A backup is stamped as one, with the count it
					// holds (stampBackup), and compaction stamps the
					// count it copies.
					b, err := os.ReadFile(src)
					require.NoError(t, err)
					stamp := readMeta(b).epochStamp
					if count, _, ok := backupOf(stamp); backup {
						assert.True(t, ok, "the backup is not stamped as one")
						stamp = count
					}
					assert.Equal(t, reached, stamp, "the stamp of the store salvaged")
				}
				dst := filepath.Join(t.TempDir(), FileName)
				rep, err := Salvage(bg, src, dst)
				require.NoError(t, err)
				assert.Empty(t, rep.Check.Problems, "db check of the copy")
				epoch := binary.BigEndian.Uint64(records(t, dst)[bucketMeta][string(metaStreamEpoch)])
				t.Logf("salvage %d (%s): the store had reached %d, the copy's epoch is %d", i+1, clock, reached, epoch)
				assert.GreaterOrEqual(t, epoch, uint64(salvageEpochFloor))
				require.Greater(t, epoch, reached, "salvage %d, %s", i+1, clock)
				require.Less(t, epoch, uint64(1)<<21, "event numbers are not exact in a JavaScript number")

				// Then its root pages are lost, on a backup of it or on a
				// compacted copy, which holds no older meta records.
				var b []byte
				reached, b = startThrice(t, dst, i)
				src = stepsCopy(t, b, backup)
			}
		})
	}
}

// A branches page that is lost under heads that are read loses the older
// leaves of the namespaces it held: salvage records their leaves anew from
// the checkpoints copied, as it does where the heads are lost. Before, db
// check of the copy named each checkpoint of that page "neither recorded
// in heads or branches", and the history of its thread did not list it.
func TestSalvageRebuildsTheBranchesOfALostPage(t *testing.T) {
	// No checkpoint has a parent, so every one is a leaf: enough of them
	// that the branches bucket has pages of its own below a branch page.
	src := filepath.Join(t.TempDir(), FileName)
	d, err := Open(src, Options{})
	require.NoError(t, err)
	const threads, steps = 3, 300
	for i := 1; i <= threads*steps; i++ {
		c := stepCommit(fmt.Sprintf("t%d", i%threads), i)
		c.Sync = i == threads*steps
		require.NoError(t, d.Commit(bg, c))
	}
	require.NoError(t, d.Close())
	want := records(t, src)
	id, ps := pageOf(t, src, bucketBranches)
	f, err := os.OpenFile(src, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(make([]byte, ps), int64(id)*int64(ps))
	require.NoError(t, err)
	require.NoError(t, f.Close())

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Lost)
	assert.Equal(t, bucketBranches, rep.Lost[0].Bucket, "%v", rep.Lost)
	assert.Empty(t, rep.Check.Problems, "db check of the copy")
	assert.Zero(t, rep.HeadsRebuilt)
	assert.Positive(t, rep.BranchesRebuilt)
	got := records(t, dst)
	assert.Equal(t, want[bucketHeads], got[bucketHeads], "the heads read were changed")
	assert.Equal(t, want[bucketBranches], got[bucketBranches], "the branches entries are not those the store had")

	d, err = Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	for th := range threads {
		h, err := d.History(bg, fmt.Sprintf("t%d", th), "", "", 0)
		require.NoError(t, err)
		assert.Len(t, h, steps, "thread t%d", th)
	}
}

// Where the root page is lost, the recent bucket it held, with each
// thread's newest checkpoints, is lost with it. Salvage copies the newest
// of them that an older copy of the bucket still holds, and heads each
// thread at the newest checkpoint copied; and since the newest ones are
// as a rule on no other page, it says, for each thread, that its head may
// be behind. Before, the report said nothing of it, and a new turn went
// on from the head as if it were the thread's last step.
func TestSalvageSaysAHeadMayBeBehind(t *testing.T) {
	steps := chainedSteps(t)
	for _, backup := range []bool{false, true} {
		t.Run(fmt.Sprintf("backup=%v", backup), func(t *testing.T) {
			src := stepsCopy(t, steps, backup)
			kept, err := os.ReadFile(src)
			require.NoError(t, err)
			dst := filepath.Join(t.TempDir(), "salvaged.db")
			rep, err := Salvage(bg, src, dst)
			require.NoError(t, err)
			assert.Empty(t, rep.Check.Problems, "db check of the copy")
			got := records(t, dst)
			require.NotEmpty(t, got[bucketHeads])
			want := records(t, writeStore(t, steps))
			for k, v := range got[bucketHeads] {
				thread, ns, _ := splitNSKey([]byte(k))
				head, err := decodeHead(v)
				require.NoError(t, err)
				// The head is the newest checkpoint of the thread that the
				// file still holds whole, in a page of its own or in an
				// older copy of the recent bucket.
				newest := ""
				for _, name := range []string{bucketCheckpoints, bucketRecent} {
					for ck, cv := range want[name] {
						th, n, id, _ := splitCheckpointKey([]byte(ck))
						if th == thread && n == ns && id > newest && bytes.Contains(kept, append([]byte(ck), cv...)) {
							newest = id
						}
					}
				}
				assert.Equal(t, newest, head, "thread %s", thread)
				var said bool
				for _, p := range rep.Lost {
					said = said || p.Bucket == bucketHeads && p.Key == renderKey(bucketHeads, []byte(k)) &&
						strings.HasPrefix(p.Message, "recorded anew at checkpoint "+head+", the newest of the ") &&
						strings.Contains(p.Message, "the head may be behind the thread's last step, by a number of steps that cannot be told")
				}
				assert.True(t, said, "the report does not say that thread %s's head may be behind: %v", thread, rep.Lost)
			}
		})
	}
}

// A page of checkpoints that cannot be read, holding the checkpoints that
// heads read through the tree name, leaves those heads naming checkpoints
// the copy lacks: each is recorded anew at the newest checkpoint of its
// thread that the copy holds, and named, as a head lost with the root page
// is. Before, the copy's heads named the lost checkpoints, db check of the
// copy said so, and the threads could be neither resumed nor gone on from.
func TestSalvageRecordsAnewAHeadWhoseCheckpointIsLost(t *testing.T) {
	fixture, _ := salvageFixture(t)
	d, err := Open(fixture, Options{})
	require.NoError(t, err)
	// A last step of four threads, whose runs have ended.
	src, want := loseLastSteps(t, d, []string{"t1", "t2", "t3", "t4"}, "")

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	got := records(t, dst)
	anew := 0
	for k, v := range want[bucketHeads] {
		thread, ns, _ := splitNSKey([]byte(k))
		head, err := decodeHead(got[bucketHeads][k])
		require.NoError(t, err)
		newest := ""
		for _, name := range []string{bucketCheckpoints, bucketRecent} {
			for ck := range got[name] {
				if th, n, id, _ := splitCheckpointKey([]byte(ck)); th == thread && n == ns && id > newest {
					newest = id
				}
			}
		}
		assert.Equal(t, newest, head, "thread %s", thread)
		if string(v) == string(got[bucketHeads][k]) {
			continue
		}
		anew++
		old, err := decodeHead(v)
		require.NoError(t, err)
		assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
			return p.Bucket == bucketHeads && p.Key == renderKey(bucketHeads, []byte(k)) &&
				strings.HasPrefix(p.Message, "named checkpoint "+old+", which was lost (on a page that cannot be read, or failing its "+
					"checks); recorded anew at checkpoint "+head)
		}), "the report does not say that thread %s's head was recorded anew: %v", thread, rep.Lost)
	}
	require.Positive(t, anew, "no head named a checkpoint of the lost page")
	assert.False(t, slices.ContainsFunc(rep.Check.Problems, func(p Problem) bool { return p.Bucket == bucketHeads }),
		"db check of the copy: %v", rep.Check.Problems)
}

// A thread of which the copy keeps no checkpoint at all has nothing to
// record its head anew at: the head that named a lost checkpoint is
// dropped, so that the copy passes db check and the thread reads as one
// that has not begun; the thread's unfinished run, which would go on
// from nothing, is copied as failed.
func TestSalvageDropsAHeadWhoseCheckpointsAreAllLost(t *testing.T) {
	fixture, _ := salvageFixture(t)
	d, err := Open(fixture, Options{})
	require.NoError(t, err)
	// The last steps of four threads with older steps, and the first and
	// only one of a thread whose run is still going.
	src, _ := loseLastSteps(t, d, []string{"t1", "t2", "t3", "t4", "lone"}, "lone")

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, src, dst)
	require.NoError(t, err)
	got := records(t, dst)
	lone := nsKey("lone", "")
	for _, name := range []string{bucketCheckpoints, bucketRecent} {
		for ck := range got[name] {
			th, _, _, _ := splitCheckpointKey([]byte(ck))
			require.NotEqual(t, "lone", th, "the lost page did not hold the thread's only checkpoint")
		}
	}
	assert.NotContains(t, got[bucketHeads], string(lone))
	assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
		return p.Bucket == bucketHeads && p.Key == renderKey(bucketHeads, lone) &&
			strings.HasPrefix(p.Message, "named checkpoint 0305, which was lost with every other checkpoint of its namespace")
	}), "the report does not say that thread lone's head was dropped: %v", rep.Lost)
	assert.False(t, slices.ContainsFunc(rep.Check.Problems, func(p Problem) bool {
		return p.Bucket == bucketHeads || p.Bucket == bucketBranches
	}), "db check of the copy: %v", rep.Check.Problems)

	c, err := Open(dst, Options{})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Checkpoint(bg, "lone", "", "")
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound, "a run resumed on the thread, or a new one, reads its head")
	run, err := c.Run(bg, "run-lone")
	require.NoError(t, err)
	assert.Equal(t, engine.StatusFailed, run.Status, "resumed from nothing, it would end as completed")
	assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
		return p.Bucket == bucketRuns && p.Key == "run-lone" && strings.Contains(p.Message, "every checkpoint of its thread \"lone\" is lost")
	}), "the report does not say that run-lone was copied as failed: %v", rep.Lost)
	assert.Equal(t, 1, rep.OutcomesAppended)
}

// loseLastSteps commits to d a step of each of threads in turn, numbered
// from 301, whose checkpoint is too large for the recent bucket, so that
// the checkpoints are at the right edge of the checkpoints bucket; only
// the run of thread running goes on, the others have ended. It closes d,
// and returns a compacted copy of it whose last page of checkpoints is
// damaged, and the records the copy held before. A compacted copy holds
// no older copies of the pages, on free pages, for the salvage to find
// the lost records on.
func loseLastSteps(t *testing.T, d *DB, threads []string, running string) (string, map[string]map[string][]byte) {
	t.Helper()
	for i, thread := range threads {
		c := stepCommit(thread, 301+i)
		if thread != running {
			c.Run = nil
		}
		for i := range 8 {
			c.Checkpoint.Channels = append(c.Checkpoint.Channels, engine.ChannelValue{Channel: fmt.Sprintf("note%d", i),
				Value: engine.Value{Inline: []byte(`"` + strings.Repeat("n", 400) + `"`)}})
		}
		require.NoError(t, d.Commit(bg, c))
	}
	src := filepath.Join(t.TempDir(), FileName)
	require.NoError(t, d.Compact(bg, src))
	require.NoError(t, d.Close())
	want := records(t, src)
	id, ps := rootChild(t, src, bucketCheckpoints, -1)
	f, err := os.OpenFile(src, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xEE}, 64), int64(id)*int64(ps))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return src, want
}

// Two salvages of one damaged store, each copy served in turn from the
// store's place, never give out the same stream count: whatever copy
// starts there, and however often the one before it started, its events
// are numbered past every number the other gave a console client. Before,
// both copies came out with the same count, and started in the same hour
// they counted the same numbers.
func TestTwoSalvagesOfOneStoreNeverShareAStreamCount(t *testing.T) {
	defer func(c func() time.Time) { salvageClock = c }(salvageClock)
	now := time.Now()
	salvageClock = func() time.Time { return now }
	src, _ := salvageFixture(t)
	d, err := Open(src, Options{})
	require.NoError(t, err)
	for range 3 {
		_, err := d.NextStreamEpoch()
		require.NoError(t, err)
	}
	require.NoError(t, d.Close())
	damageCheckpointPage(t, src)

	var copies []string
	for i := range 2 {
		dst := filepath.Join(t.TempDir(), fmt.Sprintf("salvaged-%d.db", i))
		_, err := Salvage(bg, src, dst)
		require.NoError(t, err)
		copies = append(copies, dst)
	}
	// Served from the data folder in turn: the first copy starts twice,
	// is moved aside, and the second takes its place.
	live := filepath.Join(t.TempDir(), FileName)
	seen := map[uint64]string{}
	for i, starts := range []int{2, 1} {
		if i > 0 {
			require.NoError(t, os.Rename(live, live+".aside"))
		}
		require.NoError(t, os.Rename(copies[i], live))
		for range starts {
			d, err := Open(live, Options{})
			require.NoError(t, err)
			e, err := d.NextStreamEpoch()
			require.NoError(t, err)
			require.NoError(t, d.Close())
			assert.Empty(t, seen[e], "copy %d starts at count %d, which %s gave out", i, e, seen[e])
			seen[e] = fmt.Sprintf("copy %d", i)
		}
	}
}

// A stream mark that does not hold a count stops the start with an error
// that names it and says what removing it costs, and the count stays as
// it was; removed, the count goes on from the store file's own.
func TestADamagedStreamMarkStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	first, err := d.NextStreamEpoch()
	require.NoError(t, err)
	mark := streamMarkFile(d.Path())
	b, err := os.ReadFile(mark)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d\n", first), string(b))

	require.NoError(t, os.WriteFile(mark, []byte("12x\n"), 0o600))
	_, err = d.NextStreamEpoch()
	require.ErrorContains(t, err, mark+` holds "12x\n", not the event stream's count: remove it`)
	require.NoError(t, os.Remove(mark))
	next, err := d.NextStreamEpoch()
	require.NoError(t, err)
	assert.Equal(t, first+1, next, "the refused start counted")
}
