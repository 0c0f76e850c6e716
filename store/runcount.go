package store

import (
	"bytes"
	"context"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// countBatch is how many run records CountRuns reads in one read
// transaction: one open for a walk of months of runs would hold off a
// commit that must grow the file's mapping, which bbolt remaps only when
// no read transaction is open. A variable, for tests.
var countBatch = 10000

// CountRuns counts the run records by status. It reads the status alone,
// from the head of each record (recordStatus): it decodes no more of a
// record and reads no blob, where a listing reads an input or output of
// up to SummaryBytes kept out of line whole. A record that cannot be read
// is counted in damaged. The records of the runs that skip names are not
// counted, for a caller that counts those runs as it knows them: the run
// manager's runs not stored yet (engine.Manager.Unstored), of which the
// store may hold a record by now.
//
// The walk reads countBatch records to a transaction, so it is not a
// snapshot: a run whose record a commit writes meanwhile may be counted by
// its status before or after, or be missed if it is new.
func (d *DB) CountRuns(ctx context.Context, skip map[string]bool) (counts map[engine.RunStatus]int, damaged int, err error) {
	counts = map[engine.RunStatus]int{}
	var after []byte // the last key counted, nil before the first batch
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("count runs: %w", err)
		}
		err := d.view(func(tx *bbolt.Tx) error {
			c := bucket(tx, bucketRuns).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for n := 0; n < countBatch; k, v = c.Next() {
				if k == nil {
					more = false
					return nil
				}
				if isOutcomeIndexKey(k) || skip[string(k)] {
					continue
				}
				n++
				after = append(after[:0], k...)
				if st, ok := recordStatus(v); ok {
					counts[st]++
				} else {
					damaged++
				}
			}
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("count runs: %w", err)
		}
	}
	return counts, damaged, nil
}
