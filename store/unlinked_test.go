package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// backupFixture is a db backup of salvageFixture's store, whose runs each
// ran for sixty steps before they ended: a copy in which both meta pages
// name one root page, as in every backup. It returns the file's bytes,
// its page size and root page, and every record it holds.
func backupFixture(t *testing.T) (good []byte, ps int, root uint64, want map[string]map[string][]byte) {
	t.Helper()
	src, _ := salvageFixture(t)
	d, err := Open(src, Options{ReadOnly: true})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, d.BackupFile(bg, path))
	require.NoError(t, d.Close())
	good, err = os.ReadFile(path)
	require.NoError(t, err)
	ps = int(binary.LittleEndian.Uint32(good[metaOffset+8:]))
	m0, m1 := readMeta(good), readMeta(good[ps:])
	require.Equal(t, m0.root, m1.root, "the backup's meta pages name different roots")
	return good, ps, m0.root, records(t, path)
}

// bucketRoot returns the root page of bucket name in the store file at
// path, a branch page, and the file's page size.
func bucketRoot(t *testing.T, path, name string) (root uint64, ps int) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		b := bucket(tx, name)
		require.GreaterOrEqual(t, b.Stats().Depth, 2, "bucket %s is a single page", name)
		root = uint64(b.Root())
		return nil
	}))
	return root, db.Info().PageSize
}

// A salvage finds the records below a root or branch page that is lost,
// page by page. Before, a store whose root page was lost (a backup cut by
// a page, about one time in ten) gave nothing back, and a lost branch page
// lost every record below it.
func TestSalvageFindsRecordsNothingLeadsTo(t *testing.T) {
	good, ps, root, want := backupFixture(t)
	pages := len(good) / ps
	defer func(n int) { salvageBatch = n }(salvageBatch)
	salvageBatch = 7 // the scan copies in many transactions
	ckRoot, _ := bucketRoot(t, writeStore(t, good), bucketCheckpoints)
	// A checkpoint on a leaf below the lost branch page, damaged: it fails
	// its checksum and must not come back.
	var damagedKey string
	for k, v := range want[bucketCheckpoints] {
		if bytes.Count(good, v) == 1 {
			damagedKey = k
			break
		}
	}
	require.NotEmpty(t, damagedKey)

	for _, tc := range []struct {
		name    string
		damage  func(b []byte) []byte
		damaged bool // damagedKey's record is damaged
		// keepsLeaves: every leaf page below the lost page is whole (a
		// cut's reach depends on where bbolt put the pages, which varies).
		keepsLeaves bool
	}{
		{"cut at the root page", func(b []byte) []byte { return b[:int(root)*ps] }, false, false},
		{"root page zeroed", func(b []byte) []byte { clear(b[int(root)*ps : int(root+1)*ps]); return b }, false, true},
		{"last three pages cut", func(b []byte) []byte { return b[:(pages-3)*ps] }, false, false},
		{"branch page zeroed", func(b []byte) []byte {
			clear(b[int(ckRoot)*ps : int(ckRoot+1)*ps])
			v := want[bucketCheckpoints][damagedKey]
			i := bytes.Index(b, v)
			b[i+len(v)/2] ^= 0xFF
			return b
		}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept := tc.damage(bytes.Clone(good))
			dst := filepath.Join(t.TempDir(), "salvaged.db")
			rep, err := Salvage(bg, writeStore(t, kept), dst)
			require.NoError(t, err)
			got := records(t, dst)
			t.Logf("copied %v, of which found on unlinked pages %v", rep.Records, rep.Unlinked)
			if tc.keepsLeaves {
				require.NotEmpty(t, rep.Unlinked)
			}
			for name, n := range rep.Unlinked {
				assert.LessOrEqual(t, n, rep.Records[name], "more %s records found unlinked than copied", name)
			}
			assert.Equal(t, len(got[bucketWrites]), rep.Records[bucketWrites], "the writes counted are not the writes copied")

			// A record that is never rewritten comes back exactly when it
			// is still in the file, whole (a leaf page holds a record's key
			// and then its value): nothing else comes back.
			ckpts := func(m map[string]map[string][]byte) map[string][]byte {
				all := map[string][]byte{}
				for _, name := range []string{bucketCheckpoints, bucketRecent} {
					for k, v := range m[name] {
						all[k] = v
					}
				}
				return all
			}
			// Past them, the ledger holds an outcome for each run copied
			// as failed (see below), appended by the salvage.
			appended := map[string][]byte{}
			for k, v := range got[bucketOutcomes] {
				if o, _, err := decodeOutcome(v); err == nil && o.Status == engine.StatusFailed && strings.HasPrefix(o.Error, "salvage: ") {
					appended[k] = v
				}
			}
			assert.Len(t, appended, rep.OutcomesAppended)
			for _, name := range []string{bucketBlobLog, bucketWrites, bucketOutcomes, bucketCheckpoints} {
				wantRecs, gotRecs := want[name], got[name]
				switch name {
				case bucketCheckpoints:
					wantRecs, gotRecs = ckpts(want), ckpts(got)
				case bucketOutcomes:
					gotRecs = maps.Clone(gotRecs)
					maps.DeleteFunc(gotRecs, func(k string, _ []byte) bool { return appended[k] != nil })
				}
				back := 0
				for k, v := range wantRecs {
					g, ok := gotRecs[k]
					// A pending write comes back with its checkpoint.
					orphan := false
					if name == bucketWrites {
						thread, ns, id, _ := splitBranchKey([]byte(k[:len(k)-9]))
						_, held := ckpts(got)[string(checkpointKey(thread, ns, id))]
						orphan = !held
					}
					if bytes.Contains(kept, append([]byte(k), v...)) && !orphan {
						assert.True(t, ok, "%s %q is in the file but did not come back", name, k)
						back++
					} else {
						assert.False(t, ok, "%s %q is not in the file whole, but came back", name, k)
					}
					if ok {
						assert.Equal(t, v, g, "%s %q came back changed", name, k)
					}
				}
				assert.Len(t, gotRecs, back, "%s holds records the store did not", name)
			}
			if tc.damaged {
				_, back := ckpts(got)[damagedKey]
				assert.False(t, back, "a checkpoint that fails its checksum came back")
			}

			// A record that is rewritten may come back as an older version
			// where its newest is lost. Every run ended: one that comes
			// back unfinished is named and copied as failed, so that serve
			// does not resume it from a head that may be older than its
			// last commit, and never while its outcome index entry, which
			// says it ended, is still in the file.
			var held []string
			for k, v := range got[bucketRuns] {
				if isOutcomeIndexKey([]byte(k)) {
					continue
				}
				r, err := decodeRunRecord(v)
				require.NoError(t, err)
				require.True(t, r.Status.Terminal(), "run %s came back %s: serve would resume it", k, r.Status)
				if !strings.HasPrefix(r.Error, "salvage: ") {
					continue
				}
				assert.Equal(t, engine.StatusFailed, r.Status)
				idx := outcomeIndexKey(k)
				assert.False(t, bytes.Contains(kept, append(idx, want[bucketRuns][string(idx)]...)),
					"run %s came back unfinished, though its outcome index entry says it ended", k)
				for seq, o := range want[bucketOutcomes] {
					out, _, err := decodeOutcome(o)
					require.NoError(t, err)
					assert.False(t, out.Run == k && bytes.Contains(kept, append([]byte(seq), o...)),
						"run %s came back unfinished, though its outcome says it ended", k)
				}
				assert.Contains(t, rep.Lost, Problem{Bucket: bucketRuns, Key: k, Message: "came back unfinished from a page that nothing leads to any more, " +
					"where a newer version, and the thread's newest checkpoint, may be lost: resumed, it could run a committed step or a tool call again. " +
					"It is copied as failed, so that serve does not resume it; to go on from where it stood, fork its thread at its " +
					"newest checkpoint (outpost runs fork THREAD --checkpoint ID; outpost runs history THREAD lists the checkpoints, " +
					"or, where the thread's head is lost, db check of the copy names them)"})
				held = append(held, k)
			}
			for k, v := range got[bucketHeads] {
				id, err := decodeHead(v)
				require.NoError(t, err)
				wid, err := decodeHead(want[bucketHeads][k])
				require.NoError(t, err)
				assert.LessOrEqual(t, id, wid, "head %q names a checkpoint newer than the store's", k)
			}

			d, err := Open(dst, Options{})
			require.NoError(t, err)
			defer d.Close()
			for _, id := range held {
				r, err := d.Run(bg, id)
				require.NoError(t, err)
				assert.Equal(t, engine.StatusFailed, r.Status)
			}
			t.Logf("runs copied as failed: %v", held)
		})
	}
}

// Whatever a page holds, reading it for records does not panic, and every
// record it returns reads as the record of the bucket it names, under the
// key that bucket would give it. The corpus holds a leaf page of
// checkpoints and a root page with inline buckets, from a real store.
func FuzzUnlinkedRecords(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, r := range unlinkedRecords(page) {
			require.NoError(t, recordFault(r.bucket, r.k, r.v), "%s %q", r.bucket, r.k)
			require.True(t, keyFits(r.bucket, r.k, r.v), "%s %q", r.bucket, r.k)
			name, ok := recognize(r.k, r.v)
			require.True(t, ok)
			require.Equal(t, r.bucket, name)
		}
	})
}

// A run that comes back unfinished from a page that nothing leads to is
// copied as failed, and named: serve would resume it from the thread's
// head as the copy has it, which may be older than the run's last commit
// or, as here, lost with the root page that held the heads bucket inline,
// so that the run would start over from nothing and run its committed
// steps, and their tool calls, again.
func TestSalvageHoldsRunsThatCameBackUnfinished(t *testing.T) {
	steps, _ := stepsOnly(t)
	// Thread t0's run pauses for a person: it is left to them, named. Its
	// payload is large enough that the runs bucket gets a page of its own
	// rather than live in the root page.
	path := writeStore(t, steps)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	payload := json.RawMessage(`"` + strings.Repeat("x", 3000) + `"`)
	require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-t0", Thread: "t0", Status: engine.StatusInterrupted,
		Checkpoint: "0039", Steps: 13, Interrupts: []engine.PendingInterrupt{{ID: "i", Node: "review", Payload: payload}}}}))
	require.NoError(t, d.Close())
	steps, err = os.ReadFile(path)
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, stepsCopy(t, steps, true), dst)
	require.NoError(t, err)
	got := records(t, dst)
	require.Contains(t, got[bucketRuns], "run-t0", "the paused run did not come back")
	d, err = Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	held := 0
	for k := range got[bucketRuns] {
		if isOutcomeIndexKey([]byte(k)) {
			continue
		}
		r, err := d.Run(bg, k)
		require.NoError(t, err)
		if k == "run-t0" {
			assert.Equal(t, engine.StatusInterrupted, r.Status)
			assert.Contains(t, rep.Lost, Problem{Bucket: bucketRuns, Key: k, Message: "came back interrupted from a page that nothing " +
				"leads to any more; if it had ended since, that is lost. It waits for a person's decision as before; check its " +
				"thread's history before resuming it"})
			continue
		}
		assert.Equal(t, engine.StatusFailed, r.Status, "run %s: serve would resume it", k)
		assert.True(t, strings.HasPrefix(r.Error, "salvage: "), r.Error)
		assert.Contains(t, rep.Lost, Problem{Bucket: bucketRuns, Key: k, Message: "came back unfinished from a page that nothing leads to any more, " +
			"where a newer version, and the thread's newest checkpoint, may be lost: resumed, it could run a committed step or a tool call again. " +
			"It is copied as failed, so that serve does not resume it; to go on from where it stood, fork its thread at its " +
			"newest checkpoint (outpost runs fork THREAD --checkpoint ID; outpost runs history THREAD lists the checkpoints, " +
			"or, where the thread's head is lost, db check of the copy names them)"})
		held++
	}
	require.NotZero(t, held, "no run came back")
	unfinished, err := d.Runs(bg, engine.RunFilter{Status: engine.StatusRunning})
	require.NoError(t, err)
	assert.Empty(t, unfinished)
}

// When the newest transaction's root page is lost and the older meta
// page's tree is whole, salvage copies that tree, as after a crash before
// the newest commit, and names the outcomes the lost transaction appended
// that are still in the file: the uplink may have sent them. Before,
// nothing said so.
func TestSalvageNamesTheOutcomesOfALostTransaction(t *testing.T) {
	src, want := salvageFixture(t)
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	older := clearNewestRoot(b)
	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, writeStore(t, b), dst)
	require.NoError(t, err)
	require.Equal(t, older, rep.TxID)
	all := len(want[bucketOutcomes])
	kept := len(records(t, dst)[bucketOutcomes])
	require.Less(t, kept, all, "the lost transaction appended no outcome")
	assert.Contains(t, rep.Lost, Problem{Bucket: bucketOutcomes, Message: fmt.Sprintf(
		"outcomes %d to %d, after the copy's ledger ends at %d, are on pages that a newer transaction wrote, which is lost "+
			"(or never committed); they are not copied, since the rest of that transaction is lost with them. If the uplink "+
			"sent them (the collector's list of appliances gives the last seq it holds), the collector refuses the copy's "+
			"next outcomes, which take their seqs, as a fork: restore a backup that holds them rather than use this copy, if there is one",
		kept+1, all, kept)})
}

// A run that salvage copies as failed gets its outcome, as any run that
// ends does, chained to the copy's ledger: the collector learns that it
// ended, and db check of the copy verifies the chain. Before, it ended
// without one, and nothing upstream heard of it.
func TestSalvageAppendsTheOutcomesOfTheRunsItFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	const threads, ended = 40, 10
	for i := range threads {
		require.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%02d", i), i+1)))
	}
	for i := range ended {
		th := fmt.Sprintf("t%02d", i)
		require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-" + th, Thread: th,
			Status: engine.StatusCompleted, Checkpoint: fmt.Sprintf("%04d", i+1), Output: []byte(`"done"`)}}))
	}
	require.NoError(t, d.Close())
	steps, err := os.ReadFile(path)
	require.NoError(t, err)

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, stepsCopy(t, steps, true), dst)
	require.NoError(t, err)
	assert.True(t, rep.Check.OK(), "db check of the copy: %v", rep.Check.Problems)
	d, err = Open(dst, Options{})
	require.NoError(t, err)
	defer d.Close()
	failed, err := d.Runs(bg, engine.RunFilter{Status: engine.StatusFailed})
	require.NoError(t, err)
	require.NotEmpty(t, failed, "no run came back unfinished")
	assert.Equal(t, len(failed), rep.OutcomesAppended)
	outcomes, err := d.Outcomes(bg, 0, 1000)
	require.NoError(t, err)
	require.Len(t, outcomes, ended+len(failed))
	byRun := map[string]*Outcome{}
	prev := GenesisHash
	for _, o := range outcomes {
		assert.Equal(t, prev, o.PrevHash, "seq %d", o.Seq)
		prev = o.Hash
		byRun[o.Run] = o
	}
	for _, r := range failed {
		o := byRun[r.ID]
		require.NotNil(t, o, "run %s has no outcome", r.ID)
		assert.Equal(t, engine.StatusFailed, o.Status)
		assert.Equal(t, r.Error, o.Error)
		assert.Greater(t, o.Seq, uint64(ended), "run %s's outcome is not after the ledger it was chained to", r.ID)
		assert.Equal(t, d.ApplianceID(), o.ApplianceID)
	}
	st, err := d.Ledger(bg)
	require.NoError(t, err)
	assert.Equal(t, uint64(ended+len(failed)), st.LastSeq)
}

// A run found only as an older version, from before it ended, whose
// outcome the copy holds, is copied as the outcome says it ended, and the
// report names it and the outcome it was inferred from: the commit that
// ends a run writes its outcome with its last record. Before, it was left
// out, though its outcome proved how it ended. A run whose outcome is lost
// too is copied as failed, as before: nothing proves that it completed.
func TestSalvageEndsARunFromItsOutcome(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	// Runs that ended, enough that the runs and outcomes buckets have
	// pages of their own rather than live in the root page.
	output := func(i int) []byte { return []byte(fmt.Sprintf(`{"answer":"%s %d"}`, strings.Repeat("y", 200), i)) }
	for i := 1; i <= 12; i++ {
		c := stepCommit(fmt.Sprintf("t%d", i), i)
		c.Run.ID, c.Run.Status, c.Run.Output, c.Run.EndedAt = fmt.Sprintf("run-%02d", i), engine.StatusCompleted, output(i), tc0
		require.NoError(t, d.Commit(bg, c))
	}
	// run-x takes three steps, then completes; a reader holds the file as
	// it stood before it ended, so that the page with the run's older
	// record is not reused, as a free page often is not.
	var older []byte
	for i := 20; i < 23; i++ {
		c := stepCommit("tx", i)
		c.Run.ID, c.Run.Steps = "run-x", i-19
		require.NoError(t, d.Commit(bg, c))
	}
	pin, err := d.db.Begin(false)
	require.NoError(t, err)
	older = bytes.Clone(pin.Bucket([]byte(bucketRuns)).Get([]byte("run-x")))
	end := stepCommit("tx", 23)
	end.Run.ID, end.Run.Steps, end.Run.Status, end.Run.Output, end.Run.EndedAt = "run-x", 4, engine.StatusCompleted, output(99), tc0.Add(time.Minute)
	require.NoError(t, d.Commit(bg, end))
	backup := filepath.Join(t.TempDir(), "backup.db")
	require.NoError(t, d.BackupFile(bg, backup))
	require.NoError(t, pin.Rollback())
	require.NoError(t, d.Close())
	want := records(t, backup)
	var outcome *Outcome
	for _, v := range want[bucketOutcomes] {
		if o, _, err := decodeOutcome(v); err == nil && o.Run == "run-x" {
			outcome = o
		}
	}
	require.NotNil(t, outcome, "run-x left no outcome")

	b, err := os.ReadFile(backup)
	require.NoError(t, err)
	require.True(t, bytes.Contains(b, append([]byte("run-x"), older...)), "the file holds no older record of run-x")
	// The root pages are lost, and with them run-x's newest record: the
	// page that holds it, or its bytes, which rot in place, leaving the
	// rest of its page (its outcome index entry, which names its final
	// checkpoint, among them) whole; or its page and its outcome's.
	ps := int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
	b = zeroRoots(b)
	newest := append([]byte("run-x"), want[bucketRuns]["run-x"]...)
	index := append(outcomeIndexKey("run-x"), want[bucketRuns][string(outcomeIndexKey("run-x"))]...)
	clearPages := func(b, rec []byte) {
		for off := 2 * ps; off < len(b); off += ps {
			if bytes.Contains(b[off:off+ps], rec) {
				clear(b[off : off+ps])
			}
		}
		require.False(t, bytes.Contains(b, rec))
	}
	for _, damage := range []string{"page lost", "record rotted", "outcome lost"} {
		t.Run(damage, func(t *testing.T) {
			b := bytes.Clone(b)
			switch damage {
			case "record rotted":
				at := bytes.Index(b, newest) + len(newest) - 1
				b[at] ^= 0xff
			case "outcome lost":
				clearPages(b, append(seqKey(outcome.Seq), want[bucketOutcomes][string(seqKey(outcome.Seq))]...))
				fallthrough
			default:
				clearPages(b, newest)
			}
			lostOutcome := damage == "outcome lost"
			final := "0022" // the checkpoint of the older record
			if bytes.Contains(b, index) {
				final = "0023"
			}
			src := writeStore(t, b)
			dst := filepath.Join(t.TempDir(), "salvaged.db")
			rep, err := Salvage(bg, src, dst)
			require.NoError(t, err)
			assert.Empty(t, rep.Check.Problems, "db check of the copy")
			c, err := Open(dst, Options{})
			require.NoError(t, err)
			defer c.Close()
			r, err := c.Run(bg, "run-x")
			require.NoError(t, err, "run-x did not come back")
			if lostOutcome {
				assert.Equal(t, engine.StatusFailed, r.Status, "nothing the copy holds proves run-x completed")
				assert.NotContains(t, rep.Inferred, "run-x")
				return
			}
			assert.Equal(t, engine.StatusCompleted, r.Status, "run-x: %s", r.Error)
			assert.JSONEq(t, string(output(99)), string(r.Output))
			assert.True(t, r.EndedAt.Equal(outcome.EndedAt), "ended at %v, not %v", r.EndedAt, outcome.EndedAt)
			assert.Equal(t, outcome.Steps, r.Steps)
			assert.Empty(t, r.Error)
			assert.Equal(t, map[string]string{"run-x": fmt.Sprintf("outcome %d", outcome.Seq)}, rep.Inferred)
			assert.Equal(t, final, r.Checkpoint, "run-x's checkpoint")
			if final == "0023" {
				assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
					return p.Key == "run-x" && strings.Contains(p.Message, "the final checkpoint its outcome index entry names, 0023")
				}), "%v", rep.Lost)
			}
			assert.True(t, slices.ContainsFunc(rep.Lost, func(p Problem) bool {
				return p.Bucket == bucketRuns && p.Key == "run-x" && strings.Contains(p.Message,
					fmt.Sprintf("its outcome (seq %d), which the copy holds, says it ended completed", outcome.Seq))
			}), "the report does not say run-x's status was inferred: %v", rep.Lost)
			running, err := c.Runs(bg, engine.RunFilter{Status: engine.StatusRunning})
			require.NoError(t, err)
			assert.Empty(t, running)
		})
	}
}
