package store

import (
	"context"
	"fmt"

	"github.com/outpost-edge/outpost/engine"
)

// RunFlags returns the flags of each of runs, by run ID: the value of the
// flags channel (FlagsChannel) at the run's newest checkpoint, read as the
// run's outcome records it (finalFlags). A run with no checkpoint yet, or
// whose checkpoints cannot be read, has none. It reads in one transaction,
// so that a page of runs costs one.
func (d *DB) RunFlags(ctx context.Context, runs []*engine.Run) (map[string][]string, error) {
	out := make(map[string][]string, len(runs))
	err := d.viewBlobs(func(b *blobs) error {
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return err
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
