package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"
)

// CallsLostThrough returns the mark that salvage left on run id where its
// tool-call records may be lost (MetaCallsLostThrough), "" where it left
// none or the store holds no such run. The tool loop asks before each new
// call of a tool not declared idempotent (through internal/wiring's call
// log), so a store that held no marked run when it opened answers without
// reading the run (see lostCallsMarked).
func (d *DB) CallsLostThrough(ctx context.Context, id string) (string, error) {
	if !d.lostCallsMarked {
		return "", nil
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("load run %s: %w", id, err)
	}
	var through string
	err := d.view(func(tx *bbolt.Tx) error {
		if probe.runRead != nil {
			probe.runRead([]byte(id))
		}
		v := bucket(tx, bucketRuns).Get([]byte(id))
		if v == nil {
			return nil // a run the store does not keep was never salvaged
		}
		r, err := decodeRunRecord(v)
		if err != nil {
			return corrupt(bucketRuns, []byte(id), err)
		}
		through = r.Meta[MetaCallsLostThrough]
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("load run %s: %w", id, err)
	}
	return through, nil
}

// errMarked stops lostCallsMarked's walk at the first run that may carry
// the mark.
var errMarked = errors.New("marked")

// lostCallsMarked reports whether a run of the store may carry
// MetaCallsLostThrough as it opens. Salvage marks only runs it copies
// unfinished, in the copy it writes, before anything opens it, and a run
// that ends is never resumed: while the store is open, only the runs that
// were unfinished when it opened, which the unfinished index names, may
// carry a mark that matters. An index entry or a run record that cannot
// be read may carry one, and so may a file with no index (of version 6 or
// before, opened read-only).
func lostCallsMarked(tx *bbolt.Tx, noIndex bool) bool {
	idx, runs := tx.Bucket([]byte(bucketUnfinished)), tx.Bucket([]byte(bucketRuns))
	if noIndex || idx == nil || runs == nil {
		return true
	}
	err := idx.ForEach(func(k, _ []byte) error {
		r, err := decodeRunRecord(runs.Get(k))
		if err != nil || r.Meta[MetaCallsLostThrough] != "" {
			return errMarked
		}
		return nil
	})
	return err != nil
}
