package store

import (
	"context"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// RunFlags returns the flags of each of runs, by run ID: those its newest
// outcome records, when that outcome is of the run as it stands (at the same
// checkpoint), which costs one record however long the thread; otherwise
// (a run still going, or one whose outcome is not there) the value of the
// flags channel (FlagsChannel) at the run's newest checkpoint, read as an
// outcome reads it (finalFlags), a walk up the thread's checkpoints. A run
// with no checkpoint yet, or whose checkpoints cannot be read, has none. It
// reads in one transaction, so that a page of runs costs one.
func (d *DB) RunFlags(ctx context.Context, runs []*engine.Run) (map[string][]string, error) {
	out := make(map[string][]string, len(runs))
	err := d.viewBlobs(func(b *blobs) error {
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return err
			}
			if flags, ok := outcomeFlags(b.tx, r); ok {
				out[r.ID] = flags
				continue
			}
			out[r.ID] = finalFlags(b, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the flags of %d runs: %w", len(runs), err)
	}
	return out, nil
}

// outcomeFlags returns the flags of r's newest outcome, and false when r
// has none, it was left at another checkpoint than r's, or it cannot be
// read.
func outcomeFlags(tx *bbolt.Tx, r *engine.Run) ([]string, bool) {
	v := bucket(tx, bucketRuns).Get(outcomeIndexKey(r.ID))
	if v == nil {
		return nil, false
	}
	var idx outcomeRun
	if decodeJSONRecord(v, outcomeRunVersion, &idx) != nil || idx.Checkpoint != r.Checkpoint {
		return nil, false
	}
	rec := bucket(tx, bucketOutcomes).Get(seqKey(idx.Seq))
	if rec == nil {
		return nil, false
	}
	o, _, err := decodeOutcome(rec)
	if err != nil || o.Run != r.ID {
		return nil, false
	}
	return o.Flags, true
}
