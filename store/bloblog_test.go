package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// commitBlobs commits n new blobs named by tag, referenced by one
// checkpoint, and returns their references.
func commitBlobs(t *testing.T, d *DB, tag string, n int) []engine.BlobRef {
	t.Helper()
	c := &engine.Commit{Blobs: map[engine.BlobRef][]byte{},
		Checkpoint: &engine.Checkpoint{Thread: "t-" + tag, ID: "0001", Created: tc0}}
	var refs []engine.BlobRef
	for i := range n {
		data := []byte(fmt.Sprintf("blob %s/%d", tag, i))
		ref := engine.RefOf(data)
		c.Blobs[ref] = data
		c.Checkpoint.Channels = append(c.Checkpoint.Channels, engine.ChannelValue{Channel: "c" + strconv.Itoa(i), Value: engine.Value{Blob: ref}})
		refs = append(refs, ref)
	}
	require.NoError(t, d.Commit(bg, c))
	return refs
}

func indexCount(t *testing.T, d *DB) (n int, mark uint64) {
	t.Helper()
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		n = bucket(tx, bucketBlobIndex).Stats().KeyN
		var err error
		mark, err = indexedMark(tx)
		return err
	}))
	return n, mark
}

// freshTail reads the tail back from the file, as Open does.
func freshTail(t *testing.T, d *DB) map[engine.BlobRef]uint64 {
	t.Helper()
	var tail blobTail
	require.NoError(t, d.db.View(tail.load))
	return tail.seqs
}

// New blobs are appended to the log and found through the tail in memory
// until there are blobFlushAt of them; then one transaction indexes them
// all. The tail read back from the file always matches the one in memory,
// and every blob reads back, before and after a reopen.
func TestBlobTailFlushesIntoTheIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)

	refs := commitBlobs(t, d, "a", 600)
	n, mark := indexCount(t, d)
	assert.Equal(t, 0, n, "below blobFlushAt nothing is indexed")
	assert.Equal(t, uint64(0), mark)
	assert.Equal(t, 600, d.tail.size())
	assert.Equal(t, freshTail(t, d), d.tail.seqs)

	refs = append(refs, commitBlobs(t, d, "b", 600)...)
	n, mark = indexCount(t, d)
	assert.Equal(t, 1200, n, "the commit that reached blobFlushAt indexed the tail and its own blobs")
	assert.Equal(t, uint64(1200), mark)
	assert.Equal(t, 0, d.tail.size())
	assert.Equal(t, freshTail(t, d), d.tail.seqs)

	refs = append(refs, commitBlobs(t, d, "c", 10)...)
	assert.Equal(t, 10, d.tail.size())
	for _, ref := range refs {
		_, err := d.Blob(bg, ref)
		require.NoError(t, err, "blob %s", ref)
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	assert.Equal(t, 1210, rep.Records[bucketBlobLog])
	assert.Equal(t, 1200, rep.Records[bucketBlobIndex])
	require.NoError(t, d.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, 10, d.tail.size(), "the tail is read back at open")
	for _, ref := range refs {
		_, err := d.Blob(bg, ref)
		require.NoError(t, err, "blob %s after reopening", ref)
	}
	// A blob already stored is not appended again, indexed or not.
	again := commitBlobs(t, d, "a", 3)
	again = append(again, commitBlobs(t, d, "c", 3)...)
	rep, err = d.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems, "no blob is stored twice")
	assert.Equal(t, 1210, rep.Records[bucketBlobLog], "%v were deduplicated", again)
}

// A reader's snapshot keeps finding the blobs it holds after a flush has
// moved them from the tail in memory into an index the snapshot cannot see.
func TestBlobReaderSnapshotOutlivesAFlush(t *testing.T) {
	// No remap while the reader holds the file's map.
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{InitialMmapSize: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	early := commitBlobs(t, d, "early", 10)

	old, err := d.db.Begin(false)
	require.NoError(t, err)
	defer old.Rollback()
	commitBlobs(t, d, "flood", blobFlushAt)
	require.Equal(t, 0, d.tail.size(), "the flood flushed the tail")
	late := commitBlobs(t, d, "late", 1)

	b := openBlobs(old, &d.tail, nil)
	for _, ref := range early {
		data, err := b.load(ref)
		require.NoError(t, err, "blob %s in the old snapshot", ref)
		assert.Equal(t, ref, engine.RefOf(data))
	}
	_, err = b.load(late[0])
	assert.ErrorIs(t, err, engine.ErrBlobNotFound, "a blob newer than the snapshot is not in it")
}

// Prune removes unreferenced blobs from the log, from the index when they
// were indexed, and from the tail in memory.
func TestPruneRemovesIndexedAndTailBlobs(t *testing.T) {
	d := openTest(t)
	kept := commitBlobs(t, d, "kept", 2)
	var loose []engine.BlobRef
	for i := range 4 {
		ref, err := d.PutBlob(bg, []byte(fmt.Sprintf("nobody names me %d", i)))
		require.NoError(t, err)
		loose = append(loose, ref)
		if i == 1 {
			// Index what is there so far.
			require.NoError(t, d.q.do(&request{
				apply: func(tx *bbolt.Tx) error { return writeBlobs(tx).flush(true) },
			}))
			n, _ := indexCount(t, d)
			require.Equal(t, 4, n)
		}
	}
	require.Equal(t, 2, d.tail.size())

	rep, err := d.Prune(bg, time.Hour, time.Now().Add(2*blobGrace))
	require.NoError(t, err)
	assert.Equal(t, 4, rep.BlobsRemoved)
	for _, ref := range loose {
		_, err := d.Blob(bg, ref)
		assert.ErrorIs(t, err, engine.ErrBlobNotFound, "pruned %s", ref)
	}
	for _, ref := range kept {
		_, err := d.Blob(bg, ref)
		assert.NoError(t, err)
	}
	n, _ := indexCount(t, d)
	assert.Equal(t, 2, n, "the pruned indexed blobs left the index")
	assert.Equal(t, 0, d.tail.size())
	assert.Equal(t, freshTail(t, d), d.tail.seqs)
	check, err := d.Check(bg)
	require.NoError(t, err)
	assert.Empty(t, check.Problems)
	// A pruned blob offered again is stored anew.
	ref, err := d.PutBlob(bg, []byte("nobody names me 0"))
	require.NoError(t, err)
	assert.Equal(t, loose[0], ref)
	_, err = d.Blob(bg, ref)
	assert.NoError(t, err)
}

// A format 2 file, whose blobs bucket is keyed by reference, is upgraded
// when it is first opened for writing; a read-only open refuses it.
func TestOpenUpgradesFormat2(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	refs := commitBlobs(t, d, "old", 5)
	want := maps.Clone(freshTail(t, d))
	require.NoError(t, d.Close())

	// Rewrite the file as format 2 wrote it.
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		old, err := tx.CreateBucket([]byte("blobs"))
		require.NoError(t, err)
		c := tx.Bucket([]byte(bucketBlobLog)).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			_, ref, ok := parseBlobLogKey(k)
			require.True(t, ok)
			require.NoError(t, old.Put(blobKey(ref), append([]byte(nil), v...)))
		}
		require.NoError(t, tx.DeleteBucket([]byte(bucketBlobLog)))
		require.NoError(t, tx.DeleteBucket([]byte(bucketBlobIndex)))
		meta := tx.Bucket([]byte(bucketMeta))
		require.NoError(t, meta.Delete(metaBlobIndexed))
		return meta.Put(metaVersion, []byte("2"))
	}))
	require.NoError(t, bdb.Close())

	_, err = Open(path, Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrFormat)
	assert.Contains(t, err.Error(), fmt.Sprintf("format version 2 is upgraded to version %d the first time it is opened for writing", formatVersion))

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	for _, ref := range refs {
		_, err := d.Blob(bg, ref)
		require.NoError(t, err, "blob %s after the upgrade", ref)
	}
	n, mark := indexCount(t, d)
	assert.Equal(t, len(want), n, "the upgrade indexes every blob")
	assert.Equal(t, uint64(len(want)), mark)
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		assert.Equal(t, strconv.Itoa(formatVersion), string(bucket(tx, bucketMeta).Get(metaVersion)))
		assert.Nil(t, tx.Bucket([]byte("blobs")))
		return nil
	}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
}

// Check reports a blob stored twice (its index entry names the other copy),
// a blob below the indexed mark that is not indexed, and an index entry
// that names no record.
func TestCheckVerifiesTheBlobIndex(t *testing.T) {
	d := openTest(t)
	refs := commitBlobs(t, d, "x", 3)
	require.NoError(t, d.q.do(&request{
		apply: func(tx *bbolt.Tx) error { return writeBlobs(tx).flush(true) },
	}))
	seqOf := map[engine.BlobRef]uint64{}
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		for _, ref := range refs {
			seqOf[ref], _, _ = parseBlobLogKey(blobLogKeyOf(t, tx, ref))
		}
		return nil
	}))
	plantBlob(t, d.db, refs[0], encodeBlob([]byte("blob x/0"), tc0)) // stored again as #4, index moved
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte(bucketBlobIndex)).Delete(blobKey(refs[1]))
	}))
	require.NoError(t, d.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte(bucketBlobIndex)).Put(blobKey(refs[2]), binary.BigEndian.AppendUint64(nil, 99))
	}))
	rep, err := d.Check(bg)
	require.NoError(t, err)
	var msgs []string
	for _, p := range rep.Problems {
		msgs = append(msgs, p.Bucket+": "+p.Key+": "+p.Message)
	}
	assert.ElementsMatch(t, []string{
		fmt.Sprintf("%s: %s #%d: stores blob %[2]s again (the index names #99)", bucketBlobLog, refs[2], seqOf[refs[2]]),
		fmt.Sprintf("%s: %s: names #99, which does not hold blob %[2]s", bucketBlobIndex, refs[2]),
		fmt.Sprintf("%s: %s #%d: stores blob %[2]s again (the index names #4)", bucketBlobLog, refs[0], seqOf[refs[0]]),
		fmt.Sprintf("%s: %s #%d: blob %[2]s is below the indexed mark #3 but not indexed", bucketBlobLog, refs[1], seqOf[refs[1]]),
		// Lookups, which go through the index, do not find either.
		fmt.Sprintf(`%s: "0001\x00t-x\x00": refers to missing blob %s`, bucketRecent, refs[1]),
		fmt.Sprintf(`%s: "0001\x00t-x\x00": refers to missing blob %s`, bucketRecent, refs[2]),
	}, msgs)
}

// A random mix of commits (new blobs and ones already stored), loose puts,
// prunes, flushes of a small tail, reopenings and reads from a snapshot
// taken earlier keeps every referenced blob readable with its bytes, the
// tail in memory equal to the one read back from the file, and Check clean.
func TestBlobLogRandomHistory(t *testing.T) {
	defer func(n int) { blobFlushAt = n }(blobFlushAt)
	blobFlushAt = 7
	rng := rand.New(rand.NewPCG(3, 7))
	path := filepath.Join(t.TempDir(), FileName)
	open := func() *DB {
		d, err := Open(path, Options{InitialMmapSize: 64 << 20})
		require.NoError(t, err)
		return d
	}
	d := open()
	defer func() { d.Close() }()

	referenced := map[engine.BlobRef][]byte{} // named by a checkpoint
	loose := map[engine.BlobRef][]byte{}      // put, named by nothing
	thread := 0
	for step := range 300 {
		switch op := rng.IntN(10); {
		case op < 5: // a commit of a few blobs, some of them known already
			c := &engine.Commit{Blobs: map[engine.BlobRef][]byte{},
				Checkpoint: &engine.Checkpoint{Thread: fmt.Sprintf("t%d", thread), ID: "0001", Created: tc0}}
			thread++
			for i := range 1 + rng.IntN(5) {
				data := []byte(fmt.Sprintf("blob %d", rng.IntN(400)))
				ref := engine.RefOf(data)
				c.Blobs[ref] = data
				c.Checkpoint.Channels = append(c.Checkpoint.Channels,
					engine.ChannelValue{Channel: fmt.Sprintf("c%d", i), Value: engine.Value{Blob: ref}})
				referenced[ref] = data
				delete(loose, ref)
			}
			require.NoError(t, d.Commit(bg, c))
		case op < 7: // a loose blob
			data := []byte(fmt.Sprintf("loose %d", rng.IntN(100)))
			ref, err := d.PutBlob(bg, data)
			require.NoError(t, err)
			if _, named := referenced[ref]; !named {
				loose[ref] = data
			}
		case op < 8: // prune everything unreferenced
			_, err := d.Prune(bg, time.Hour, time.Now().Add(2*blobGrace))
			require.NoError(t, err)
			clear(loose)
		case op < 9: // reopen
			require.NoError(t, d.Close())
			d = open()
		default: // a reader that began before more commits and a flush
			snap, err := d.db.Begin(false)
			require.NoError(t, err)
			commitBlobs(t, d, fmt.Sprintf("flood%d", step), blobFlushAt)
			b := openBlobs(snap, &d.tail, nil)
			for ref, data := range referenced {
				got, err := b.load(ref)
				require.NoError(t, err, "step %d: blob %s in an older snapshot", step, ref)
				require.Equal(t, data, got)
			}
			require.NoError(t, snap.Rollback())
			// The flood's blobs are referenced too (commitBlobs names them).
			require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
				return tx.Bucket([]byte(bucketBlobLog)).ForEach(func(k, v []byte) error {
					_, ref, _ := parseBlobLogKey(k)
					if _, ok := referenced[ref]; !ok {
						if _, ok := loose[ref]; !ok {
							data, _, err := decodeBlob(v)
							require.NoError(t, err)
							referenced[ref] = bytes.Clone(data)
						}
					}
					return nil
				})
			}))
		}
		for ref, data := range referenced {
			got, err := d.Blob(bg, ref)
			require.NoError(t, err, "step %d: blob %s", step, ref)
			require.Equal(t, data, got)
		}
		for ref, data := range loose {
			got, err := d.Blob(bg, ref)
			require.NoError(t, err, "step %d: loose blob %s", step, ref)
			require.Equal(t, data, got)
		}
		require.Equal(t, freshTail(t, d), d.tail.seqs, "step %d: the tail in memory", step)
		if step%25 == 0 {
			rep, err := d.Check(bg)
			require.NoError(t, err)
			require.Empty(t, rep.Problems, "step %d", step)
		}
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	n, mark := indexCount(t, d)
	t.Logf("%d blobs named, %d indexed, mark #%d, tail %d", len(referenced), n, mark, d.tail.size())
	assert.Positive(t, n, "the small tail was flushed")
}

// A store whose blob log holds a malformed key, or whose indexed mark is
// damaged, still opens, and Check names the damage.
func TestDamagedBlobLogStillOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	refs := commitBlobs(t, d, "x", 3)
	require.NoError(t, d.Close())
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		require.NoError(t, tx.Bucket([]byte(bucketBlobLog)).Put([]byte("short"), []byte("x")))
		return tx.Bucket([]byte(bucketMeta)).Put(metaBlobIndexed, []byte{1, 2, 3})
	}))
	require.NoError(t, bdb.Close())

	d, err = Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	for _, ref := range refs {
		_, err := d.Blob(bg, ref)
		assert.NoError(t, err)
	}
	rep, err := d.Check(bg)
	require.NoError(t, err)
	var msgs []string
	for _, p := range rep.Problems {
		msgs = append(msgs, p.Bucket+": "+p.Message)
	}
	assert.Contains(t, msgs, bucketBlobLog+": malformed key")
	assert.Contains(t, msgs, bucketMeta+": the blob index's mark is not an 8-byte sequence number")
}
