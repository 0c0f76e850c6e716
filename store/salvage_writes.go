package store

import (
	"bytes"
	"context"

	"go.etcd.io/bbolt"
)

// dropOrphanWrites leaves out of the copy the pending writes whose
// checkpoint it does not hold, the checkpoint lost with a page or left out
// as unreadable: nothing can apply them, since a run goes on only from a
// checkpoint it holds, and a checkpoint that came to have that key would
// be given them as its own. Each is reported lost by key, and counted in
// WritesLeftOut rather than in Records (nor in Unlinked). It runs once every record the
// copy gets is in, a batch of salvageBatch records to a transaction.
func (w *salvageWalk) dropOrphanWrites(ctx context.Context, out *bbolt.DB) error {
	var after []byte // the last key read, nil before the first
	for done := false; !done; {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := out.Update(func(tx *bbolt.Tx) error {
			wb := tx.Bucket([]byte(bucketWrites))
			if wb == nil {
				done = true
				return nil
			}
			cb := openCheckpoints(tx)
			c := wb.Cursor()
			k, _ := c.First()
			if after != nil {
				if k, _ = c.Seek(after); bytes.Equal(k, after) {
					k, _ = c.Next()
				}
			}
			var orphans [][]byte
			for read := 0; k != nil && read < salvageBatch; k, _ = c.Next() {
				read++
				after = bytes.Clone(k)
				thread, ns, id, ck, ok := writeCheckpoint(k)
				if !ok || cb.Get(ck) != nil {
					continue // malformed (db check of the copy names it), or its checkpoint is there
				}
				orphans = append(orphans, after)
				if w.unreached(bucketWrites, k) && w.rep.Unlinked[bucketWrites] > 0 {
					// Only the page-by-page search finds a record there.
					if w.rep.Unlinked[bucketWrites]--; w.rep.Unlinked[bucketWrites] == 0 {
						delete(w.rep.Unlinked, bucketWrites)
					}
				}
				w.lost(bucketWrites, k, "a pending write of checkpoint %s (thread %q, namespace %q), which the copy does not hold: "+
					"nothing can apply it, and it is left out", id, thread, ns)
			}
			done = k == nil
			for _, o := range orphans {
				if err := wb.Delete(o); err != nil {
					return err
				}
			}
			w.rep.Records[bucketWrites] -= len(orphans)
			w.rep.WritesLeftOut += len(orphans)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
