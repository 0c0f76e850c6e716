package store

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// plantBlob stores rec under ref straight into the file, appended to the
// log and indexed, as a collision or a foreign writer would leave it.
func plantBlob(t *testing.T, bdb *bbolt.DB, ref engine.BlobRef, rec []byte) {
	t.Helper()
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		log := tx.Bucket([]byte(bucketBlobLog))
		seq, err := log.NextSequence()
		require.NoError(t, err)
		require.NoError(t, log.Put(blobLogKey(seq, ref), rec))
		return tx.Bucket([]byte(bucketBlobIndex)).Put(blobKey(ref), binary.BigEndian.AppendUint64(nil, seq))
	}))
}

// blobLogKeyOf finds ref's key in the log by walking it.
func blobLogKeyOf(t *testing.T, tx *bbolt.Tx, ref engine.BlobRef) []byte {
	t.Helper()
	c := tx.Bucket([]byte(bucketBlobLog)).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if _, r, ok := parseBlobLogKey(k); ok && r == ref {
			return append([]byte(nil), k...)
		}
	}
	t.Fatalf("blob %s is not in the log", ref)
	return nil
}

// dropBlob deletes ref's blob from the log and the index behind the
// store's back.
func dropBlob(t *testing.T, tx *bbolt.Tx, ref engine.BlobRef) error {
	t.Helper()
	if err := tx.Bucket([]byte(bucketBlobLog)).Delete(blobLogKeyOf(t, tx, ref)); err != nil {
		return err
	}
	return tx.Bucket([]byte(bucketBlobIndex)).Delete(blobKey(ref))
}

func (t *blobTail) size() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.seqs)
}
