package store

import (
	"context"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// RunFlags returns the flags of each of runs, by run ID: those its newest
// outcome records, when that outcome is of the run as it stands (at the same
// checkpoint), which costs one record however long the thread; otherwise
// (a run still going, or one whose outcome is not there) the value of the
// flags channel (FlagsChannel) at the run's newest checkpoint, read as an
// outcome reads it (finalFlags), a walk up the thread's checkpoints. That
// walk stops at the first checkpoint of an earlier run that its outcome
// was left at, and takes that outcome's flags as the value there: a run
// whose agent never writes the channel then costs its own checkpoints and
// one outcome, not the thread's whole history. A run with no checkpoint
// yet, or whose checkpoints cannot be read, has none. It reads in one
// transaction, so that a page of runs costs one.
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
			out[r.ID] = liveFlags(b, r)
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

// liveFlags is finalFlags for a run still going, from its newest
// checkpoint (newestOf), whose walk ends at the
// newest checkpoint of an earlier run of the thread that that run's
// outcome records flags for (as outcomeFlags reads them): the walk is
// handed a checkpoint holding those flags as the channel's whole value,
// which ends it there. A checkpoint no outcome vouches for (a fork's, a
// run's whose outcome is gone) is read and walked past as before.
func liveFlags(b *blobs, r *engine.Run) []string {
	cb := openCheckpoints(b.tx)
	flags, _ := walkFlags(newestOf(b.tx, r), func(id string) (*engine.Checkpoint, bool) {
		c := storedCheckpoint(cb, r.Thread, id)
		if c == nil || c.RunID == "" || c.RunID == r.ID {
			return c, true
		}
		earlier, ok := outcomeFlags(b.tx, &engine.Run{ID: c.RunID, Checkpoint: c.ID})
		if !ok {
			return c, true
		}
		raw, err := json.Marshal(earlier)
		if err != nil {
			return c, true
		}
		return &engine.Checkpoint{Thread: c.Thread, ID: c.ID, RunID: c.RunID,
			Channels: []engine.ChannelValue{{Channel: FlagsChannel, Value: engine.Value{Inline: raw}}}}, true
	}, b.data)
	return flags
}

// newestOf returns r, or a copy of it at the head of its thread when that
// head is a later checkpoint of r's own: a run going on is not stored
// again at each step (the engine saves that write), so its record names
// an older checkpoint than the one it stands at.
func newestOf(tx *bbolt.Tx, r *engine.Run) *engine.Run {
	t, err := openNSTree(tx, r.Thread, "")
	if err != nil || t.head == "" || t.head <= r.Checkpoint {
		return r
	}
	if c := storedCheckpoint(t.cb, r.Thread, t.head); c == nil || c.RunID != r.ID {
		return r
	}
	at := *r
	at.Checkpoint = t.head
	return &at
}
