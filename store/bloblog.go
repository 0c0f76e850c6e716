package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// Blobs are stored as a log with a lazily written index (since format 3).
//
// A blob's record is appended to the blob log (bucket bloblog) under its
// sequence number and reference, so the new blobs of a group commit land
// together at the right edge of the log's B+tree: a commit of many threads
// writes a few log pages, not one random page per blob, and a blob's
// reference says nothing about where it is.
//
// The index (bucket blobindex) maps a reference to its sequence number. It
// covers every blob up to the indexed mark (meta "blob_indexed"). The blobs
// above the mark, the tail, are few: the store keeps them in memory
// (blobTail), reading them back from the log at open, and writes them into
// the index in one batch once there are blobFlushAt of them. A random page
// of the index is then written once per batch, not once per blob.
//
// Lookups go: the transaction's own new blobs, the index, the tail in
// memory, and, for a reader whose snapshot the tail no longer describes
// (the tail was flushed or pruned after it began), a scan of the snapshot's
// log above its own indexed mark. A writer never needs the scan: the tail
// is brought up to date after each write transaction, before the next one
// starts (see committer.run), and prune takes its turn in the same queue.

// blobFlushAt is how many blobs the tail holds before they are indexed
// (a variable so that tests can flush often).
var blobFlushAt = 1024

var metaBlobIndexed = []byte("blob_indexed")

// blobLogKey is seq (8 bytes) | hash (8) | length (4), all big endian.
func blobLogKey(seq uint64, ref engine.BlobRef) []byte {
	k := make([]byte, 20)
	binary.BigEndian.PutUint64(k, seq)
	binary.BigEndian.PutUint64(k[8:], ref.Hash)
	binary.BigEndian.PutUint32(k[16:], ref.Len)
	return k
}

func parseBlobLogKey(k []byte) (uint64, engine.BlobRef, bool) {
	if len(k) != 20 {
		return 0, engine.BlobRef{}, false
	}
	return binary.BigEndian.Uint64(k), engine.BlobRef{Hash: binary.BigEndian.Uint64(k[8:]), Len: binary.BigEndian.Uint32(k[16:])}, true
}

// blobTail is the unindexed end of the log: each blob above the indexed
// mark, by reference. It describes the newest committed state.
type blobTail struct {
	mu   sync.RWMutex
	seqs map[engine.BlobRef]uint64
}

func (t *blobTail) lookup(ref engine.BlobRef) (uint64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	seq, ok := t.seqs[ref]
	return seq, ok
}

// load reads the tail back from the log. It never fails: a store whose
// mark or keys are damaged still opens, so that Check can name them; an
// unreadable mark makes the whole log the tail.
func (t *blobTail) load(tx *bbolt.Tx) error {
	mark, err := indexedMark(tx)
	if err != nil {
		mark = 0
	}
	seqs := map[engine.BlobRef]uint64{}
	c := bucket(tx, bucketBlobLog).Cursor()
	for k, _ := c.Seek(seqKey(mark + 1)); k != nil; k, _ = c.Next() {
		if seq, ref, ok := parseBlobLogKey(k); ok {
			seqs[ref] = seq
		}
	}
	t.mu.Lock()
	t.seqs = seqs
	t.mu.Unlock()
	return nil
}

// blobChanges are a write transaction's changes to the blob store, applied
// to the tail once the transaction has committed.
type blobChanges struct {
	added   map[engine.BlobRef]uint64
	removed map[engine.BlobRef]bool
	// indexed is the new indexed mark when the transaction flushed the
	// tail (0: it did not).
	indexed uint64
}

func newBlobChanges() *blobChanges {
	return &blobChanges{added: map[engine.BlobRef]uint64{}, removed: map[engine.BlobRef]bool{}}
}

// apply brings the tail up to date with a committed transaction.
func (t *blobTail) apply(ch *blobChanges) {
	if ch == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ch.indexed > 0 {
		for ref, seq := range t.seqs {
			if seq <= ch.indexed {
				delete(t.seqs, ref)
			}
		}
	}
	for ref := range ch.removed {
		delete(t.seqs, ref)
	}
	for ref, seq := range ch.added {
		if seq > ch.indexed { // indexed by this transaction otherwise
			t.seqs[ref] = seq
		}
	}
}

func indexedMark(tx *bbolt.Tx) (uint64, error) {
	v := bucket(tx, bucketMeta).Get(metaBlobIndexed)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, corrupt(bucketMeta, metaBlobIndexed, errTruncated)
	}
	return binary.BigEndian.Uint64(v), nil
}

// blobs is one transaction's access to the blob store.
type blobs struct {
	tx         *bbolt.Tx
	log, index *bbolt.Bucket
	tail       *blobTail
	// ch is a write transaction's changes (nil in a read transaction).
	ch *blobChanges
}

func openBlobs(tx *bbolt.Tx, tail *blobTail, ch *blobChanges) *blobs {
	return &blobs{tx: tx, log: bucket(tx, bucketBlobLog), index: bucket(tx, bucketBlobIndex), tail: tail, ch: ch}
}

// locate returns ref's log key, or nil when the blob is not stored.
func (b *blobs) locate(ref engine.BlobRef) []byte {
	if b.ch != nil {
		if b.ch.removed[ref] {
			return nil
		}
		if seq, ok := b.ch.added[ref]; ok {
			return blobLogKey(seq, ref)
		}
	}
	if v := b.index.Get(blobKey(ref)); len(v) == 8 {
		return blobLogKey(binary.BigEndian.Uint64(v), ref)
	}
	if seq, ok := b.tail.lookup(ref); ok {
		if k := blobLogKey(seq, ref); b.log.Get(k) != nil {
			return k
		}
	}
	if b.ch != nil || b.tx.Writable() {
		return nil // the tail describes a writer's snapshot exactly
	}
	// A reader's snapshot may hold blobs the tail has moved past.
	mark, err := indexedMark(b.tx)
	if err != nil {
		return nil
	}
	want := blobKey(ref)
	c := b.log.Cursor()
	for k, _ := c.Seek(seqKey(mark + 1)); k != nil; k, _ = c.Next() {
		if len(k) == 20 && bytes.Equal(k[8:], want) {
			return slices.Clone(k)
		}
	}
	return nil
}

// get returns ref's stored record (valid for the transaction), or nil.
func (b *blobs) get(ref engine.BlobRef) []byte {
	if k := b.locate(ref); k != nil {
		return b.log.Get(k)
	}
	return nil
}

// data returns ref's bytes (valid for the transaction), or nil when the
// blob is missing or unreadable.
func (b *blobs) data(ref engine.BlobRef) []byte {
	if rec := b.get(ref); rec != nil {
		data, _, err := decodeBlob(rec)
		if err == nil {
			return data
		}
	}
	return nil
}

// put stores rec for ref: in place of its record when the blob is stored
// already, else appended to the log.
func (b *blobs) put(ref engine.BlobRef, rec []byte) error {
	if k := b.locate(ref); k != nil {
		return b.log.Put(k, rec)
	}
	return b.add(ref, rec)
}

// add appends ref's blob, which the caller found not stored.
func (b *blobs) add(ref engine.BlobRef, rec []byte) error {
	seq, err := b.log.NextSequence()
	if err != nil {
		return err
	}
	if err := b.log.Put(blobLogKey(seq, ref), rec); err != nil {
		return err
	}
	b.ch.added[ref] = seq
	delete(b.ch.removed, ref)
	return nil
}

// remove deletes ref's blob.
func (b *blobs) remove(ref engine.BlobRef) error {
	k := b.locate(ref)
	if k == nil {
		return nil
	}
	if err := b.log.Delete(k); err != nil {
		return err
	}
	if err := b.index.Delete(blobKey(ref)); err != nil {
		return err
	}
	b.ch.removed[ref] = true
	delete(b.ch.added, ref)
	return nil
}

// flush indexes the tail (and this transaction's new blobs) when it has
// grown to blobFlushAt.
func (b *blobs) flush(force bool) error {
	b.tail.mu.RLock()
	n := len(b.tail.seqs)
	if !force && n+len(b.ch.added) < blobFlushAt {
		b.tail.mu.RUnlock()
		return nil
	}
	pending := make(map[engine.BlobRef]uint64, n+len(b.ch.added))
	for ref, seq := range b.tail.seqs {
		pending[ref] = seq
	}
	b.tail.mu.RUnlock()
	for ref, seq := range b.ch.added {
		pending[ref] = seq
	}
	var mark uint64
	for ref, seq := range pending {
		if b.ch.removed[ref] {
			continue
		}
		if err := b.index.Put(blobKey(ref), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
			return fmt.Errorf("index blob %s: %w", ref, err)
		}
		mark = max(mark, seq)
	}
	if mark == 0 {
		return nil
	}
	if err := bucket(b.tx, bucketMeta).Put(metaBlobIndexed, binary.BigEndian.AppendUint64(nil, mark)); err != nil {
		return err
	}
	b.ch.indexed = mark
	return nil
}

// migrateBlobs upgrades a format 2 file to the current format: the blobs bucket,
// keyed by reference, moves into the log and the index, all of it indexed.
func migrateBlobs(tx *bbolt.Tx) error {
	log, err := tx.CreateBucketIfNotExists([]byte(bucketBlobLog))
	if err != nil {
		return err
	}
	index, err := tx.CreateBucketIfNotExists([]byte(bucketBlobIndex))
	if err != nil {
		return err
	}
	const oldBlobs = "blobs"
	if old := tx.Bucket([]byte(oldBlobs)); old != nil {
		c := old.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			ref, ok := parseBlobKey(k)
			if !ok {
				return corrupt(oldBlobs, k, errMalformedKey)
			}
			seq, err := log.NextSequence()
			if err != nil {
				return err
			}
			if err := log.Put(blobLogKey(seq, ref), slices.Clone(v)); err != nil {
				return err
			}
			if err := index.Put(blobKey(ref), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
				return err
			}
		}
		if err := tx.DeleteBucket([]byte(oldBlobs)); err != nil {
			return err
		}
	}
	meta := bucket(tx, bucketMeta)
	if err := meta.Put(metaBlobIndexed, binary.BigEndian.AppendUint64(nil, log.Sequence())); err != nil {
		return err
	}
	return meta.Put(metaVersion, []byte(strconv.Itoa(formatVersion)))
}
