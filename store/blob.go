package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// A blob record is its bytes plus the time it was first stored (or last
// offered again through PutBlob). Prune leaves young unreferenced blobs
// alone: a blob put by a node may not be referenced until that node's step
// commits.
const blobVersion = 1

// blobTouchAfter is how stale a blob's time may get before PutBlob of the
// same bytes refreshes it.
const blobTouchAfter = time.Hour

func encodeBlob(data []byte, created time.Time) []byte {
	b := beginRecord(blobVersion, 8+len(data))
	b = binary.BigEndian.AppendUint64(b, uint64(created.UnixNano()))
	b = append(b, data...)
	return seal(b)
}

// decodeBlob returns the blob's bytes, aliasing rec, and its time.
func decodeBlob(rec []byte) ([]byte, time.Time, error) {
	payload, err := openRecord(rec, blobVersion)
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(payload) < 8 {
		return nil, time.Time{}, errTruncated
	}
	return payload[8:], time.Unix(0, int64(binary.BigEndian.Uint64(payload))).UTC(), nil
}

var errMalformedKey = errors.New("malformed key")

// PutBlob stores data once and returns its reference. Storing the same
// bytes again costs a read; other bytes under the same reference fail with
// engine.ErrBlobCollision.
func (d *DB) PutBlob(ctx context.Context, data []byte) (engine.BlobRef, error) {
	ref := engine.RefOf(data)
	if err := ctx.Err(); err != nil {
		return ref, fmt.Errorf("put blob %s: %w", ref, err)
	}
	now := time.Now()
	fresh := false
	err := d.view(func(tx *bbolt.Tx) error {
		b := openBlobs(tx, &d.tail, nil)
		if _, err := checkBlobCollision(b, ref, data); err != nil {
			return err
		}
		if old := b.get(ref); old != nil {
			_, created, _ := decodeBlob(old) // checkBlobCollision decoded it
			fresh = now.Sub(created) < blobTouchAfter
		}
		return nil
	})
	if err != nil {
		return ref, fmt.Errorf("put blob: %w", err)
	}
	if fresh {
		return ref, nil
	}
	rec := encodeBlob(data, now)
	err = d.q.do(&request{
		validate: func(tx *bbolt.Tx) error {
			_, err := checkBlobCollision(writeBlobs(tx), ref, data)
			return err
		},
		apply: func(tx *bbolt.Tx) error { return writeBlobs(tx).put(ref, rec) },
	})
	if err != nil {
		return ref, fmt.Errorf("put blob: %w", err)
	}
	return ref, nil
}

// checkBlobCollision fails when ref is stored with other bytes than data.
// It reports whether ref is stored.
func checkBlobCollision(b *blobs, ref engine.BlobRef, data []byte) (stored bool, _ error) {
	k := b.locate(ref)
	if k == nil {
		return false, nil
	}
	old, _, err := decodeBlob(b.log.Get(k))
	if err != nil {
		return false, fmt.Errorf("blob %s: %w", ref, corrupt(bucketBlobLog, k, err))
	}
	if !bytes.Equal(old, data) {
		return false, fmt.Errorf("blob %s: %w", ref, engine.ErrBlobCollision)
	}
	return true, nil
}

// Blob returns a blob's bytes, or engine.ErrBlobNotFound.
func (d *DB) Blob(ctx context.Context, ref engine.BlobRef) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load blob %s: %w", ref, err)
	}
	var out []byte
	err := d.view(func(tx *bbolt.Tx) error {
		data, err := openBlobs(tx, &d.tail, nil).load(ref)
		out = bytes.Clone(data)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load blob %s: %w", ref, err)
	}
	return out, nil
}

// load returns a blob's bytes (valid for the transaction), or
// engine.ErrBlobNotFound, or an error naming the corrupt record.
func (b *blobs) load(ref engine.BlobRef) ([]byte, error) {
	if probe.blobLoaded != nil {
		probe.blobLoaded(ref)
	}
	k := b.locate(ref)
	if k == nil {
		return nil, engine.ErrBlobNotFound
	}
	data, _, err := decodeBlob(b.log.Get(k))
	if err == nil && uint32(len(data)) != ref.Len {
		err = fmt.Errorf("blob holds %d bytes, its key says %d", len(data), ref.Len)
	}
	if err != nil {
		return nil, corrupt(bucketBlobLog, k, err)
	}
	return data, nil
}
