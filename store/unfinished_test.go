package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// historyRunID is the ID of the i-th run of writeHistory's history: IDs
// sort as they are numbered, as engine's time-ordered ones do.
func historyRunID(i int) string { return fmt.Sprintf("run_%016x", i) }

// writeHistory writes a store file at path as a binary of format version 6
// left it: n finished runs, but those numbered in interrupted, which wait
// for review, and no unfinished index. The records go in directly, in one
// transaction, as the runs' commits would have left them.
func writeHistory(t *testing.T, path string, n int, interrupted ...int) {
	t.Helper()
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		runs := bucket(tx, bucketRuns)
		for i := range n {
			r := &engine.Run{ID: historyRunID(i), Thread: fmt.Sprintf("t%d", i), Agent: "med", Status: engine.StatusCompleted,
				Input: json.RawMessage(`"I forgot my dose"`), Output: json.RawMessage(`"take it now"`), Steps: 6,
				CreatedAt: tc0, StartedAt: tc0, EndedAt: tc0}
			if slices.Contains(interrupted, i) {
				r.Status, r.Output, r.EndedAt = engine.StatusInterrupted, nil, tc0
				r.Interrupts = []engine.PendingInterrupt{{ID: "int_1", Node: "review_response", Payload: json.RawMessage(`{"draft":"x"}`)}}
			}
			rec, blobs := encodeRun(r)
			require.Empty(t, blobs)
			if err := runs.Put([]byte(r.ID), rec); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket([]byte(bucketUnfinished)); err != nil {
			return err
		}
		return bucket(tx, bucketMeta).Put(metaVersion, []byte("6"))
	}))
	require.NoError(t, d.Close())
}

// countRunReads counts the run records that listings read until the test
// ends.
func countRunReads(t *testing.T) *int {
	n := new(int)
	probe.runRead = func([]byte) { *n++ }
	t.Cleanup(func() { probe.runRead = nil })
	return n
}

func runIDs(runs []*engine.Run) []string {
	ids := []string{}
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	return ids
}

// The review list of a long history reads the runs waiting for review,
// not the history: 20,000 stored runs, 3 of them interrupted, and the
// listing reads 3 records, whichever way it pages. A file of version 6 has
// no index: read-only, it is listed by walking every record, as before;
// its first writable open builds the index and stamps it version 7.
func TestReviewListingReadsOnlyTheUnfinishedRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	const n = 20000
	waiting := []int{17, 9000, 19998}
	writeHistory(t, path, n, waiting...)
	// A bucket of that name in a version 6 file was not kept by this
	// binary: it is not trusted, and the first writable open replaces it.
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte(bucketUnfinished))
		if err == nil {
			err = b.Put([]byte(historyRunID(1)), []byte("interrupted"))
		}
		return err
	}))
	require.NoError(t, bdb.Close())
	want := []string{historyRunID(17), historyRunID(9000), historyRunID(19998)}
	interrupted := engine.RunFilter{Status: engine.StatusInterrupted}

	reads := countRunReads(t)
	ro, err := Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	got, err := ro.Runs(bg, interrupted)
	require.NoError(t, err)
	assert.Equal(t, want, runIDs(got), "a version 6 file lists as before")
	assert.Equal(t, n, *reads, "without the index, every record is read")
	rep, err := ro.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, ro.Close())

	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		assert.Equal(t, strconv7, string(bucket(tx, bucketMeta).Get(metaVersion)))
		return nil
	}))
	assert.Len(t, indexed(t, d), len(waiting))
	require.NoError(t, d.Close())
	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()

	for _, tc := range []struct {
		name string
		f    engine.RunFilter
		want []string
	}{
		{"all", interrupted, want},
		{"newest first", engine.RunFilter{Status: engine.StatusInterrupted, Desc: true}, []string{want[2], want[1], want[0]}},
		{"a page", engine.RunFilter{Status: engine.StatusInterrupted, Limit: 2}, want[:2]},
		{"the next page", engine.RunFilter{Status: engine.StatusInterrupted, After: want[1]}, want[2:]},
		{"the next page, newest first", engine.RunFilter{Status: engine.StatusInterrupted, After: want[1], Desc: true}, want[:1]},
		{"after an absent id", engine.RunFilter{Status: engine.StatusInterrupted, After: historyRunID(100)}, want[1:]},
		{"and a thread", engine.RunFilter{Status: engine.StatusInterrupted, Thread: "t9000"}, want[1:2]},
		{"running", engine.RunFilter{Status: engine.StatusRunning}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			*reads = 0
			got, err := d.Runs(bg, tc.f)
			require.NoError(t, err)
			assert.Equal(t, tc.want, runIDs(got))
			assert.LessOrEqual(t, *reads, len(waiting), "run records read")
		})
	}
	rep, err = d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	assert.Equal(t, len(waiting), rep.Records[bucketUnfinished])
	assert.Equal(t, n, rep.Records[bucketRuns])
}

var strconv7 = fmt.Sprint(formatVersion)

// indexed returns the unfinished index as a map.
func indexed(t *testing.T, d *DB) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		return bucket(tx, bucketUnfinished).ForEach(func(k, v []byte) error {
			out[string(k)] = string(v)
			return nil
		})
	}))
	return out
}

// A run's commits keep its index entry in step: in while it is queued,
// running or interrupted, out once it ends.
func TestCommitsKeepTheUnfinishedIndex(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	commit := func(id string, st engine.RunStatus, ckpt string) {
		t.Helper()
		require.NoError(t, d.Commit(bg, finalCommit("t-"+id, id, st, ckpt, nil)))
	}
	commit("run_a", engine.StatusQueued, "0001")
	commit("run_b", engine.StatusInterrupted, "0002")
	assert.Equal(t, map[string]string{"run_a": "queued", "run_b": "interrupted"}, indexed(t, d))
	commit("run_a", engine.StatusRunning, "0003")
	assert.Equal(t, map[string]string{"run_a": "running", "run_b": "interrupted"}, indexed(t, d))
	commit("run_a", engine.StatusInterrupted, "0004")
	commit("run_b", engine.StatusRunning, "0005")
	assert.Equal(t, map[string]string{"run_a": "interrupted", "run_b": "running"}, indexed(t, d))
	for st, want := range map[engine.RunStatus][]string{
		engine.StatusInterrupted: {"run_a"}, engine.StatusRunning: {"run_b"}, engine.StatusQueued: {},
	} {
		got, err := d.Runs(bg, engine.RunFilter{Status: st})
		require.NoError(t, err)
		assert.Equal(t, want, runIDs(got), st)
	}
	commit("run_a", engine.StatusCompleted, "0006")
	commit("run_b", engine.StatusFailed, "0007")
	assert.Empty(t, indexed(t, d))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)

	// A listing's summary is not the run: committing it is refused.
	runs, err := d.Runs(bg, engine.RunFilter{Summary: true})
	require.NoError(t, err)
	r := runs[0]
	r.InputTruncated = true
	err = d.Commit(bg, &engine.Commit{Run: r, Sync: true})
	require.ErrorIs(t, err, engine.ErrRunSummary)
}

// db check compares the index with the run records, and names each entry
// that disagrees by bucket and key; a listing through the index reports a
// bad entry by bucket and key too, as damaged or as its error, and never
// panics.
func TestCheckAndListingsNameBadIndexEntries(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	for i, st := range []engine.RunStatus{engine.StatusInterrupted, engine.StatusCompleted, engine.StatusInterrupted, engine.StatusRunning} {
		id := fmt.Sprintf("run_%d", i)
		require.NoError(t, d.Commit(bg, finalCommit("t"+id, id, st, fmt.Sprintf("%04d", i), nil)))
	}
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		idx := bucket(tx, bucketUnfinished)
		require.NoError(t, idx.Delete([]byte("run_0")))                   // missing
		require.NoError(t, idx.Put([]byte("run_1"), []byte("running")))   // a completed run
		require.NoError(t, idx.Put([]byte("run_2"), []byte("\xffbogus"))) // malformed
		require.NoError(t, idx.Put([]byte("run_3"), []byte("queued")))    // the wrong status
		require.NoError(t, idx.Put([]byte("run_9"), []byte("interrupted")))
		return nil
	}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	assert.ElementsMatch(t, []string{
		"unfinished run_0: is missing: the run is interrupted",
		"unfinished run_1: names a run that is completed, not queued, running or interrupted",
		`unfinished run_2: malformed entry "\xffbogus": want queued, running, interrupted or unreadable`,
		`unfinished run_3: says "queued", but the run is running`,
		"unfinished run_9: names a run that has no record",
	}, got)

	_, err = d.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), `corrupt record in bucket unfinished, key run_2: malformed entry "\xffbogus"`)
	damaged := map[string]string{}
	runs, err := d.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted, Damaged: func(key string, err error) { damaged[key] = err.Error() }})
	require.NoError(t, err)
	assert.Empty(t, runIDs(runs), "run_0 has no entry, and the entry of run_2 cannot be read")
	assert.Len(t, damaged, 2)
	assert.Contains(t, damaged["run_2"], "bucket unfinished")
	assert.Contains(t, damaged["run_9"], "bucket unfinished, key run_9: names a run that has no record")
	// A damaged record that an entry names is reported as a run record.
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		runs := bucket(tx, bucketRuns)
		v := bytes.Clone(runs.Get([]byte("run_2")))
		v[len(v)/2] ^= 0xff
		require.NoError(t, runs.Put([]byte("run_2"), v))
		return bucket(tx, bucketUnfinished).Put([]byte("run_2"), []byte("interrupted"))
	}))
	clear(damaged)
	_, err = d.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted, Damaged: func(key string, err error) { damaged[key] = err.Error() }})
	require.NoError(t, err)
	assert.Contains(t, damaged["run_2"], "corrupt record in bucket runs, key run_2: checksum mismatch")
	runs, err = d.Runs(bg, engine.RunFilter{Status: engine.StatusRunning, Damaged: func(string, error) {}})
	require.NoError(t, err)
	// An entry is trusted for the status it names, and the record for the
	// rest: run_1's record says completed, and run_3's entry queued.
	assert.Empty(t, runIDs(runs))
}

// The index outlives what the db commands do to a store: a prune (which
// keeps every run record), a compacted copy and a backup carry it as it
// is, and a salvaged copy has it built anew from the records it holds.
func TestDBCommandsKeepTheUnfinishedIndex(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	require.NoError(t, d.Commit(bg, finalCommit("t1", "run_1", engine.StatusCompleted, "0001", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "run_2", engine.StatusInterrupted, "0002", nil)))
	require.NoError(t, d.Commit(bg, finalCommit("t3", "run_3", engine.StatusRunning, "0003", nil)))
	want := map[string]string{"run_2": "interrupted", "run_3": "running"}
	_, err = d.Prune(bg, 0, tc0.AddDate(1, 0, 0))
	require.NoError(t, err)
	assert.Equal(t, want, indexed(t, d))
	backup := filepath.Join(dir, "backup.db")
	require.NoError(t, d.BackupFile(bg, backup))
	compacted := filepath.Join(dir, "compacted.db")
	require.NoError(t, d.Compact(bg, compacted))
	// A stray entry, which the salvaged copy does not keep.
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return bucket(tx, bucketUnfinished).Put([]byte("run_1"), []byte("queued"))
	}))
	require.NoError(t, d.Close())
	salvaged := filepath.Join(dir, "salvaged.db")
	srep, err := Salvage(bg, path, salvaged)
	require.NoError(t, err)
	assert.Empty(t, srep.Lost)
	assert.True(t, srep.Check.OK(), "%v", srep.Check.Problems)

	for _, p := range []string{backup, compacted, salvaged} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			c, err := Open(p, Options{})
			require.NoError(t, err)
			defer c.Close()
			assert.Equal(t, want, indexed(t, c))
			rep, err := c.Check(bg)
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%v", rep.Problems)
			runs, err := c.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted})
			require.NoError(t, err)
			assert.Equal(t, []string{"run_2"}, runIDs(runs))
		})
	}
}

// A summary listing returns an input or output kept out of line whole
// when it is at most SummaryBytes, as listings did before summaries: an
// answer of a few kilobytes is not cut to a preview.
func TestSummaryListingKeepsMidSizedValuesWhole(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	output := json.RawMessage(`"` + strings.Repeat("take it with food; ", 200) + `"`) // 3.8 KB, a blob
	require.Greater(t, len(output), engine.BlobThreshold)
	require.LessOrEqual(t, len(output), SummaryBytes)
	c := finalCommit("t1", "run_mid", engine.StatusCompleted, "0001", nil)
	c.Run.Output = output
	require.NoError(t, d.Commit(bg, c))
	runs, err := d.Runs(bg, engine.RunFilter{Summary: true})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, output, runs[0].Output)
	assert.False(t, runs[0].IsSummary())
}

// A listing with RunFilter.Summary shows a run with a large input and
// output from its record alone: previews in their place, marked, and no
// blob read. One run, or a listing without Summary, reads them whole.
func TestSummaryListingReadsNoBlob(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	defer d.Close()
	input := json.RawMessage(`"` + strings.Repeat("I forgot my metformin dose. ", 40000) + `"`) // about 1 MB
	output := json.RawMessage(`{"answer": "` + strings.Repeat("take it now; ", 80000) + `"}`)
	c := finalCommit("t1", "run_big", engine.StatusCompleted, "0001", nil)
	c.Run.Input, c.Run.Output = input, output
	require.NoError(t, d.Commit(bg, c))
	require.NoError(t, d.Commit(bg, finalCommit("t2", "run_small", engine.StatusCompleted, "0002", nil)))

	var loads []engine.BlobRef
	probe.blobLoaded = func(ref engine.BlobRef) { loads = append(loads, ref) }
	defer func() { probe.blobLoaded = nil }()
	runs, err := d.Runs(bg, engine.RunFilter{Summary: true})
	require.NoError(t, err)
	assert.Empty(t, loads, "a summary listing reads no blob")
	require.Len(t, runs, 2)
	big, small := runs[0], runs[1]
	assert.True(t, big.InputTruncated)
	assert.True(t, big.OutputTruncated)
	assert.Equal(t, `"I forgot my metformin dose. I forgot`, string(big.Input[:37]))
	assert.True(t, strings.HasSuffix(string(big.Input), `…"`), "%s", big.Input)
	assert.LessOrEqual(t, len(big.Input), previewBytes+8)
	var text string
	require.NoError(t, json.Unmarshal(big.Output, &text), "the output's preview is a JSON string: %s", big.Output)
	assert.True(t, strings.HasPrefix(text, `{"answer": "take it now; `), text)
	assert.False(t, small.InputTruncated || small.OutputTruncated, "a small input and output are whole")
	assert.Equal(t, json.RawMessage(`{"answer": "take it <now> & later"}`), small.Output)

	whole, err := d.Run(bg, "run_big")
	require.NoError(t, err)
	assert.Equal(t, input, whole.Input)
	assert.Equal(t, output, whole.Output)
	assert.False(t, whole.IsSummary())
	assert.Len(t, loads, 2)
	runs, err = d.Runs(bg, engine.RunFilter{Thread: "t1"})
	require.NoError(t, err)
	assert.Equal(t, input, runs[0].Input)
	assert.False(t, runs[0].IsSummary())
	assert.Len(t, loads, 4)

	// What the check and the collector see of a run is unchanged: the
	// preview is not the input, and the blobs it names are kept.
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func TestPreviewOf(t *testing.T) {
	long := func(s string, n int) []byte { return []byte(strings.Repeat(s, n)) }
	for _, tc := range []struct {
		name   string
		v      []byte
		prefix string
	}{
		{"a string", append(append([]byte(`"`), long("abc ", 300)...), '"'), `"abc abc `},
		{"escapes", append(append([]byte(`"`), long(`\n\u00e9\"`, 200)...), '"'), `"\n\u00e9\"\n`},
		{"multi-byte", append(append([]byte(`"`), long("é☃", 400)...), '"'), `"é☃é☃`},
		{"an object", append(append([]byte(`{"a": "`), long("x", 1000)...), '"', '}'), `"{\"a\": \"xx`},
		{"not JSON", long("plain ☃ text ", 100), `"plain ☃ text`},
		{"a string with a bad escape", append(append([]byte(`"`), long(`\q`, 300)...), '"'), `"\"\\q\\q`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := previewOf(tc.v)
			require.True(t, json.Valid(p), "%s", p)
			var s string
			require.NoError(t, json.Unmarshal(p, &s))
			assert.True(t, utf8.ValidString(s), "%q", s)
			assert.True(t, strings.HasSuffix(s, "…"), "%q", s)
			assert.True(t, bytes.HasPrefix(p, []byte(tc.prefix)), "%s", p)
			assert.LessOrEqual(t, len(s), 2*previewBytes)
		})
	}
}

// A bad index entry is an error naming it, whatever its bytes.
func FuzzDecodeUnfinished(f *testing.F) {
	f.Add([]byte("run_1"), []byte("interrupted"))
	f.Add([]byte("run\x001"), []byte("queued"))
	f.Add([]byte(""), []byte("completed"))
	f.Fuzz(func(t *testing.T, k, v []byte) {
		st, err := decodeUnfinished(k, v)
		if err == nil && (unfinishedValue(st) == nil || bytes.IndexByte(k, 0) >= 0 || len(k) == 0) {
			t.Fatalf("entry %q -> %q accepted as %q", k, v, st)
		}
	})
}

// A run record that cannot be read when the index is built (here cut
// short, in a version 6 file) is indexed as unreadable: its status is
// unknown. Before the index, recovery and the listings by status walked
// the records and named it at every start; they still do, through the
// index, and db check names the record (and not its entry).
func TestIndexKeepsAnUnreadableRecordInSight(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	writeHistory(t, path, 6, 2)
	cut := historyRunID(4)
	var whole []byte
	putRecord := func(v func() []byte) {
		bdb, err := bbolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
			runs := tx.Bucket([]byte(bucketRuns))
			if whole == nil {
				whole = bytes.Clone(runs.Get([]byte(cut)))
			}
			return runs.Put([]byte(cut), v())
		}))
		require.NoError(t, bdb.Close())
	}
	putRecord(func() []byte { return whole[:len(whole)/2] })

	// What each start sees: the listings of the statuses the index holds,
	// recovery and db check.
	named := func(d *DB) {
		t.Helper()
		for _, st := range []engine.RunStatus{engine.StatusQueued, engine.StatusRunning, engine.StatusInterrupted} {
			var keys []string
			runs, err := d.Runs(bg, engine.RunFilter{Status: st, Damaged: func(key string, err error) {
				keys = append(keys, key)
				assert.Contains(t, err.Error(), "corrupt record in bucket runs, key "+cut)
			}})
			require.NoError(t, err)
			assert.Equal(t, []string{cut}, keys, st)
			if st == engine.StatusInterrupted {
				assert.Equal(t, []string{historyRunID(2)}, runIDs(runs))
			}
		}
		rep, err := d.Check(bg)
		require.NoError(t, err)
		var problems []string
		for _, p := range rep.Problems {
			problems = append(problems, p.Bucket+" "+p.Key)
		}
		assert.Equal(t, []string{bucketRuns + " " + cut}, problems)
	}
	ro, err := Open(path, Options{ReadOnly: true})
	require.NoError(t, err)
	named(ro) // version 6, read by walking the records
	require.NoError(t, ro.Close())

	for start := 1; start <= 2; start++ {
		d, err := Open(path, Options{}) // the first builds the index
		require.NoError(t, err)
		assert.Equal(t, map[string]string{historyRunID(2): "interrupted", cut: "unreadable"}, indexed(t, d), "start %d", start)
		named(d)
		m := engine.NewManager(d, func(string, engine.BundleRef) (*engine.Agent, error) {
			return nil, errors.New("no agent is needed: the one readable unfinished run is paused")
		}, engine.ManagerOptions{})
		_, err = m.Recover(bg)
		var dmg *engine.DamagedRunsError
		require.ErrorAs(t, err, &dmg, "start %d", start)
		assert.Equal(t, []string{cut}, dmg.Keys)
		m.Close()
		require.NoError(t, d.Close())
	}

	// Were the record whole again, db check would name the entry, and the
	// listings go by the record.
	putRecord(func() []byte { return whole })
	d, err := Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.Len(t, rep.Problems, 1)
	assert.Equal(t, "unfinished "+cut+": says the record cannot be read, but it can: the run is completed", rep.Problems[0].String())
	runs, err := d.Runs(bg, engine.RunFilter{Status: engine.StatusInterrupted})
	require.NoError(t, err)
	assert.Equal(t, []string{historyRunID(2)}, runIDs(runs))
}
