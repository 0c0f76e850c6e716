package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// The unfinished bucket (format version 7) indexes the runs that are not
// over: run ID -> the run's status, "queued", "running" or "interrupted"
// (or "unreadable", below). Runs that end leave it. The runs waiting for review (interrupted), and
// those that recovery at start resumes (queued and running), are a few
// among the months of finished runs that an appliance keeps: listed
// through the index, they cost what they number, where a walk of the runs
// bucket costs what the whole history does.
//
// The commit that writes a run record keeps its entry in step, in the same
// transaction, and writes to the index only when the run's status enters,
// changes within or leaves these three: a run that starts and ends costs
// one Put and one Delete. The index is derived from the run records alone,
// so a file without it (version 6 and before, or a salvaged copy) has it
// built by the first writable open, in one walk of the runs bucket; a
// read-only open of such a file lists by walking the records, as before.
// The values are bare status names, like the blob index's sequence
// numbers: no envelope, since a record they might disagree with is at
// hand, and db check compares the two.
const bucketUnfinished = "unfinished"

// unfinishedValues are the index's values, one per status it holds,
// shared so that a commit does not allocate them.
var unfinishedValues = map[engine.RunStatus][]byte{
	engine.StatusQueued:      []byte(engine.StatusQueued),
	engine.StatusRunning:     []byte(engine.StatusRunning),
	engine.StatusInterrupted: []byte(engine.StatusInterrupted),
}

// unfinishedValue is the index value of a run in status s, or nil when a
// run in s is not indexed.
func unfinishedValue(s engine.RunStatus) []byte { return unfinishedValues[s] }

// unreadable is the index value of a run record that could not be read
// when the index was built. Its status is unknown, so a listing of each
// status the index holds reads the record and reports it damaged
// (engine.RunFilter.Damaged), as a walk of the records did: recovery at
// every start, and the review list, name it as they did before the index,
// instead of losing sight of it. A commit that writes the run's record
// (none will, while it cannot be read) replaces the entry as any other.
const unreadable engine.RunStatus = "unreadable"

var unreadableValue = []byte(unreadable)

// indexRun brings run id's index entry in step with its status, whose
// index value is want (unfinishedValue): it writes only when the entry
// changes.
func indexRun(tx *bbolt.Tx, id, want []byte) error {
	b := bucket(tx, bucketUnfinished)
	if b == nil {
		return fmt.Errorf("bucket %s is missing", bucketUnfinished)
	}
	got := b.Get(id)
	switch {
	case want == nil && got == nil:
		return nil
	case want == nil:
		return b.Delete(id)
	case string(got) == string(want):
		return nil
	}
	return b.Put(id, want)
}

// decodeUnfinished reads an index entry: the status it records (or
// unreadable), or an error saying what is wrong with it.
func decodeUnfinished(k, v []byte) (engine.RunStatus, error) {
	if err := validKeyPart("run ID", string(k), true); err != nil {
		return "", err
	}
	st := engine.RunStatus(v)
	if unfinishedValue(st) == nil && st != unreadable {
		return "", fmt.Errorf("malformed entry %q: want queued, running, interrupted or unreadable", v)
	}
	return st, nil
}

// errNoRecord is an index entry's fault when the run it names has no
// record.
var errNoRecord = errors.New("names a run that has no record")

// buildUnfinished makes the index anew from the run records. A record
// that cannot be read is indexed as unreadable: its status is unknown,
// and the listings through the index report it, as db check and the
// listings that walk the records do.
func buildUnfinished(tx *bbolt.Tx) error {
	if tx.Bucket([]byte(bucketUnfinished)) != nil {
		if err := tx.DeleteBucket([]byte(bucketUnfinished)); err != nil {
			return fmt.Errorf("rebuild the %s index: %w", bucketUnfinished, err)
		}
	}
	idx, err := tx.CreateBucket([]byte(bucketUnfinished))
	if err != nil {
		return fmt.Errorf("build the %s index: %w", bucketUnfinished, err)
	}
	runs := tx.Bucket([]byte(bucketRuns))
	if runs == nil {
		return nil
	}
	c := runs.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if isOutcomeIndexKey(k) {
			continue
		}
		want := unreadableValue
		if st, ok := recordStatus(v); ok {
			want = unfinishedValue(st)
		}
		if want != nil {
			if err := idx.Put(k, want); err != nil {
				return fmt.Errorf("build the %s index: %w", bucketUnfinished, err)
			}
		}
	}
	return nil
}

// recordStatus reads a run record's status, from its head when it can
// (see runHead), or by decoding it.
func recordStatus(v []byte) (engine.RunStatus, bool) {
	if h, ok := runHead(v); ok {
		return engine.RunStatus(h.status), true
	}
	r, _, err := decodeRun(v)
	if err != nil {
		return "", false
	}
	return r.Status, true
}

// unfinishedCheck verifies the index against the run records, for Check:
// each run that is queued, running or interrupted has its entry, holding
// its status (run, called for each run record Check reads), and every
// entry names such a run (finish). A record that cannot be read is
// reported by the runs bucket's check, not here again. A file of version
// 6 or before, opened read-only, has no index: nothing is checked.
type unfinishedCheck struct {
	idx, runs *bbolt.Bucket
	add       func(bucket string, key []byte, format string, args ...any)
}

func newUnfinishedCheck(tx *bbolt.Tx, noIndex bool, add func(string, []byte, string, ...any)) *unfinishedCheck {
	u := &unfinishedCheck{runs: bucket(tx, bucketRuns), add: add}
	if !noIndex {
		u.idx = bucket(tx, bucketUnfinished)
	}
	return u
}

// run checks the entry of the run under key k, whose status is st.
func (u *unfinishedCheck) run(k []byte, st engine.RunStatus) {
	if u.idx == nil {
		return
	}
	want, got := unfinishedValue(st), u.idx.Get(k)
	switch {
	case want != nil && got == nil:
		u.add(bucketUnfinished, k, "is missing: the run is %s", st)
	case want != nil && string(got) != string(want) && unfinishedValue(engine.RunStatus(got)) != nil:
		// (A malformed entry is finish's to name.)
		u.add(bucketUnfinished, k, "says %q, but the run is %s", got, st)
	}
}

// finish checks every entry of the index.
func (u *unfinishedCheck) finish(ctx context.Context, tx *bbolt.Tx, rep *CheckReport) error {
	if u.idx == nil {
		return nil
	}
	return forEach(ctx, tx, bucketUnfinished, func(k, v []byte) {
		rep.Records[bucketUnfinished]++
		if _, err := decodeUnfinished(k, v); err != nil {
			u.add(bucketUnfinished, k, "%v", err)
			return
		}
		rec := u.runs.Get(k)
		if rec == nil {
			u.add(bucketUnfinished, k, "%v", errNoRecord)
			return
		}
		st, ok := recordStatus(rec)
		switch {
		case !ok:
			// The runs bucket's check names the record.
		case string(v) == string(unreadableValue):
			u.add(bucketUnfinished, k, "says the record cannot be read, but it can: the run is %s", st)
		case unfinishedValue(st) == nil:
			u.add(bucketUnfinished, k, "names a run that is %s, not queued, running or interrupted", st)
		}
	})
}
