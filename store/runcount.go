package store

import (
	"context"
	"fmt"

	"github.com/outpost-edge/outpost/engine"
)

// countBatch is how many run records CountRuns and PinnedBundles read in
// one read transaction (eachRunRecord). A variable, for tests.
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
	err = d.eachRunRecord(ctx, func(k, v []byte) {
		if skip[string(k)] {
			return
		}
		if st, ok := recordStatus(v); ok {
			counts[st]++
		} else {
			damaged++
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("count runs: %w", err)
	}
	return counts, damaged, nil
}
