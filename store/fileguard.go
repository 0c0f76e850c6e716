package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/bits"
	"os"
	"slices"
)

// A store file can be damaged where bbolt does not look before it trusts
// it: cut short by a copy that did not finish, or with a page overwritten.
// Opening it then reads past the end of the mapped file, follows a page ID
// into garbage or finds keys out of order, and bbolt panics, for some
// faults in a goroutine of its own where nothing can recover, which takes
// the whole process down. So before bbolt opens a file, guardFile walks the
// file's page tree the way bbolt will, checking every page it would read
// (IDs, types, bounds, key order) against the file, and refuses a damaged
// file with ErrDamaged.
//
// The walk reads what bbolt's open reads anyway (with NoFreelistSync, bbolt
// rebuilds its free list by visiting every page), so it costs about as much
// again, from the page cache.

// The bbolt file format (version 2), as laid out on disk.
const (
	boltMagic          = 0xED0CDAED
	boltVersion        = 2
	pageHeaderSize     = 16
	branchElementSize  = 16
	leafElementSize    = 16
	inBucketSize       = 16
	branchPageFlag     = 0x01
	leafPageFlag       = 0x02
	freelistPageFlag   = 0x10
	bucketLeafFlag     = 0x01
	pgidNoFreelist     = ^uint64(0)
	metaOffset         = pageHeaderSize
	metaChecksumOffset = metaOffset + 56
	metaSize           = 64
	minPageSize        = 512
	maxPageSize        = 1 << 20
)

type boltMeta struct {
	pageSize       uint64
	root, freelist uint64
	pgid, txid     uint64
	// epochStamp is the stream epoch the file began with (stampEpoch),
	// or a backup's stamp (stampBackup).
	epochStamp uint64
	valid      bool
}

func readMeta(b []byte) boltMeta {
	var m boltMeta
	if len(b) < metaOffset+metaSize {
		return m
	}
	le := binary.LittleEndian
	if le.Uint32(b[metaOffset:]) != boltMagic {
		return m
	}
	if le.Uint32(b[metaOffset+4:]) != boltVersion {
		return m
	}
	h := fnv.New64a()
	_, _ = h.Write(b[metaOffset:metaChecksumOffset])
	if h.Sum64() != le.Uint64(b[metaChecksumOffset:]) {
		return m
	}
	m.pageSize = uint64(le.Uint32(b[metaOffset+8:]))
	m.root = le.Uint64(b[metaOffset+16:])
	m.freelist = le.Uint64(b[metaOffset+32:])
	m.pgid = le.Uint64(b[metaOffset+40:])
	m.txid = le.Uint64(b[metaOffset+48:])
	m.epochStamp = le.Uint64(b[epochStampOffset:])
	m.valid = m.pageSize >= minPageSize && m.pageSize <= maxPageSize && bits.OnesCount64(m.pageSize) == 1
	return m
}

// secondMeta finds the second meta page when the first cannot give the
// page size, as bbolt does: at each power of two from 1 KB to 16 MB that
// lies in the file, the first whole meta page found. It returns the page and
// its offset, or an invalid page.
func secondMeta(f *os.File, size int64) (boltMeta, int64) {
	b := make([]byte, metaOffset+metaSize)
	for i := range 15 {
		off := int64(1024) << i
		if off >= size-1024 {
			break
		}
		if _, err := f.ReadAt(b, off); err != nil {
			continue
		}
		if m := readMeta(b); m.valid {
			return m, off
		}
	}
	return boltMeta{}, 0
}

// damaged reports file damage; Open wraps it in ErrDamaged.
func damaged(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrDamaged}, a...)...)
}

// readMetas reads a store file's two meta pages as bbolt finds them: the
// first gives the page size, and so where the second is; when the first is
// not whole, the second is looked for as secondMeta does. off1 is where the
// second was read, 0 when it was not found.
func readMetas(f *os.File, size int64) (m0, m1 boltMeta, off1 int64) {
	b := make([]byte, metaOffset+metaSize)
	if _, err := f.ReadAt(b, 0); err == nil {
		m0 = readMeta(b)
	}
	if !m0.valid {
		m1, off1 = secondMeta(f, size)
		return m0, m1, off1
	}
	off1 = int64(m0.pageSize)
	if _, err := f.ReadAt(b, off1); err == nil {
		m1 = readMeta(b)
	}
	return m0, m1, off1
}

// checkFile walks f's page tree as bbolt will read it. A file with no whole
// meta page is refused: as damaged when it holds nothing of a store
// (hollow), otherwise as not a store (not bbolt's, of another bbolt
// version, or with both meta pages damaged), with ErrFormat. An empty file
// is never a new store: Open makes those whole (createStore).
func checkFile(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	m0, m1, _ := readMetas(f, size)
	// bbolt uses the valid meta page with the higher transaction ID.
	m := m0
	switch {
	case !m0.valid && !m1.valid:
		if err := hollow(f, size); err != nil {
			return err
		}
		// bbolt would take the page size it is given for the file's, and
		// fail on the file's size with a message that says neither.
		return fmt.Errorf("%w: not a bbolt file of a supported version (no meta page is whole)", ErrFormat)
	case !m0.valid, m1.valid && m1.pageSize == m0.pageSize && m1.txid > m0.txid:
		m = m1
	}
	if m.pgid > uint64(size)/m.pageSize {
		return damaged("the file holds %d bytes, but its pages reach %d: it was cut short", size, m.pgid*m.pageSize)
	}
	w := newPageWalk(f, m.pageSize, m.pgid)
	if m.freelist != pgidNoFreelist {
		if err := w.freelist(m.freelist); err != nil {
			return damaged("%v", err)
		}
	}
	if err := w.bucket(m.root, nil, "the root bucket"); err != nil {
		return damaged("%v", err)
	}
	return nil
}

// hollowError is the damage of a store file that holds nothing of a
// store (see hollow). Open's advice for it differs from other damage's:
// there is nothing to salvage, and a new appliance's file may simply be
// removed.
type hollowError struct{ what string }

func (e *hollowError) Error() string {
	return fmt.Sprintf("%v: %s: there is nothing in it that outpost db salvage could copy", ErrDamaged, e.what)
}

func (e *hollowError) Unwrap() []error { return []error{ErrDamaged, ErrHollow} }

// hollow reports a file with no whole meta page that holds nothing of a
// store: empty, all zeros, or shorter than the two meta pages every store
// file begins with. That is what a restore's copy that failed, a full
// disk, or a file system that lost writes never flushed leaves in a
// store's place, so it is damage, with "restore the last backup" for an
// answer, not another program's file; bbolt would have made an empty file
// a new store, and check would then have called it sound. nil means the
// file holds something else.
func hollow(f *os.File, size int64) error {
	if size == 0 {
		return &hollowError{"the file is empty (0 bytes)"}
	}
	zero, err := allZero(f, size)
	switch {
	case err != nil:
		return err
	case zero:
		return &hollowError{fmt.Sprintf("the file holds %d bytes, all zeros", size)}
	case size < 2*minPageSize:
		return &hollowError{fmt.Sprintf("the file holds only %d bytes, fewer than the two meta pages every store file begins with", size)}
	}
	return nil
}

// allZero reports whether the first size bytes of f are all zero. It
// stops at the first byte that is not, which in any file but a zeroed one
// comes within the first few.
func allZero(f *os.File, size int64) (bool, error) {
	b := make([]byte, 64<<10)
	for off := int64(0); off < size; off += int64(len(b)) {
		n, err := f.ReadAt(b[:min(int64(len(b)), size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if slices.ContainsFunc(b[:n], func(c byte) bool { return c != 0 }) {
			return false, nil
		}
		if n == 0 {
			break
		}
	}
	return true, nil
}

// pageWalk reads a store file's pages without bbolt, checking each one it
// reaches; what it finds wrong is an error, which checkFile reports as
// damage and Salvage as a part lost.
type pageWalk struct {
	f    *os.File
	ps   uint64
	pgid uint64   // the high-water mark: every page in use is below it
	seen []uint64 // a bit per page reached
}

func newPageWalk(f *os.File, ps, pgid uint64) *pageWalk {
	return &pageWalk{f: f, ps: ps, pgid: pgid, seen: make([]uint64, pgid/64+1)}
}

func (w *pageWalk) reached(id uint64) bool { return w.seen[id/64]&(1<<(id%64)) != 0 }
func (w *pageWalk) reach(id uint64)        { w.seen[id/64] |= 1 << (id % 64) }

// page reads page id with its overflow, checking that it lies in the file
// and that no other page or bucket reaches it too.
func (w *pageWalk) page(id uint64, from string) ([]byte, error) {
	if id < 2 || id >= w.pgid {
		return nil, fmt.Errorf("%s names page %d, outside the file's pages 2 to %d", from, id, w.pgid-1)
	}
	if w.reached(id) {
		return nil, fmt.Errorf("%s names page %d, which another page names too", from, id)
	}
	b := make([]byte, w.ps)
	if _, err := w.f.ReadAt(b, int64(id*w.ps)); err != nil {
		return nil, fmt.Errorf("page %d: %v", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(b); got != id {
		return nil, fmt.Errorf("page %d says it is page %d", id, got)
	}
	overflow := uint64(le.Uint32(b[12:]))
	if overflow >= w.pgid-id {
		return nil, fmt.Errorf("page %d runs %d pages on, past the file's pages", id, overflow)
	}
	for i := id; i <= id+overflow; i++ {
		if w.reached(i) {
			return nil, fmt.Errorf("page %d runs over page %d, which another page names", id, i)
		}
		w.reach(i)
	}
	if overflow > 0 {
		b = make([]byte, (overflow+1)*w.ps)
		if _, err := w.f.ReadAt(b, int64(id*w.ps)); err != nil {
			return nil, fmt.Errorf("page %d: %v", id, err)
		}
	}
	return b, nil
}

func (w *pageWalk) freelist(id uint64) error {
	b, err := w.page(id, "the meta page's free list")
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	if flags := le.Uint16(b[8:]); flags != freelistPageFlag {
		return fmt.Errorf("page %d holds the free list, but its type is %#x", id, flags)
	}
	count, at := uint64(le.Uint16(b[10:])), uint64(pageHeaderSize)
	if count == 0xFFFF { // the real count is the first element
		if len(b) < pageHeaderSize+8 {
			return fmt.Errorf("free list page %d is cut short", id)
		}
		count, at = le.Uint64(b[pageHeaderSize:]), at+8
	}
	if count > (uint64(len(b))-at)/8 {
		return fmt.Errorf("free list page %d lists %d pages, more than it holds", id, count)
	}
	return nil
}

// bucket walks a bucket: the page tree from root, or its inline page.
func (w *pageWalk) bucket(root uint64, inline []byte, from string) error {
	if root == 0 {
		_, err := w.nodes(inline, "an inline bucket in "+from, true, nil, nil)
		return err
	}
	b, err := w.page(root, from)
	if err != nil {
		return err
	}
	_, err = w.nodes(b, fmt.Sprintf("page %d", root), false, nil, nil)
	return err
}

// nodes checks the elements of a branch or leaf page held in b, then walks
// what they name, and returns the greatest key below it. An inline page
// must be a leaf. Keys are checked as bbolt checks them when it opens a
// file (and panics if they are out of order): ascending within a page, and
// every key below a branch element from its key up to the next element's.
func (w *pageWalk) nodes(b []byte, what string, inline bool, minKey, maxKey []byte) ([]byte, error) {
	if len(b) < pageHeaderSize {
		return nil, fmt.Errorf("%s is cut short", what)
	}
	le := binary.LittleEndian
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	branch := flags == branchPageFlag && !inline
	elemSize := leafElementSize
	if branch {
		elemSize = branchElementSize
	} else if flags != leafPageFlag {
		return nil, fmt.Errorf("%s: page type %#x where a branch or leaf page belongs", what, flags)
	}
	if pageHeaderSize+count*elemSize > len(b) {
		return nil, fmt.Errorf("%s has %d elements, more than it holds", what, count)
	}
	key := func(i int) ([]byte, error) {
		e := pageHeaderSize + i*elemSize
		if branch {
			pos, ksize := int(le.Uint32(b[e:])), int(le.Uint32(b[e+4:]))
			if e+pos+ksize > len(b) {
				return nil, fmt.Errorf("%s: element %d's key lies outside the page", what, i)
			}
			return b[e+pos : e+pos+ksize], nil
		}
		pos, ksize, vsize := int(le.Uint32(b[e+4:])), int(le.Uint32(b[e+8:])), int(le.Uint32(b[e+12:]))
		if e+pos+ksize+vsize > len(b) {
			return nil, fmt.Errorf("%s: element %d's key or value lies outside the page", what, i)
		}
		return b[e+pos : e+pos+ksize], nil
	}
	prev := minKey
	for i := range count {
		k, err := key(i)
		if err != nil {
			return nil, err
		}
		if prev != nil && (bytes.Compare(prev, k) > 0 || i > 0 && bytes.Equal(prev, k)) {
			return nil, fmt.Errorf("%s: element %d's key is out of order", what, i)
		}
		if maxKey != nil && bytes.Compare(k, maxKey) >= 0 {
			return nil, fmt.Errorf("%s: element %d's key is beyond its branch's range", what, i)
		}
		e := pageHeaderSize + i*elemSize
		if branch {
			next := maxKey
			if i+1 < count {
				if next, err = key(i + 1); err != nil {
					return nil, err
				}
			}
			child := le.Uint64(b[e+8:])
			cb, err := w.page(child, what)
			if err != nil {
				return nil, err
			}
			if prev, err = w.nodes(cb, fmt.Sprintf("page %d", child), false, k, next); err != nil {
				return nil, err
			}
			continue
		}
		prev = k
		if le.Uint32(b[e:])&bucketLeafFlag == 0 {
			continue
		}
		pos, ksize, vsize := int(le.Uint32(b[e+4:])), int(le.Uint32(b[e+8:])), int(le.Uint32(b[e+12:]))
		v := b[e+pos+ksize : e+pos+ksize+vsize]
		if len(v) < inBucketSize {
			return nil, fmt.Errorf("%s: element %d is a bucket too short to name its root", what, i)
		}
		if err := w.bucket(le.Uint64(v), v[inBucketSize:], fmt.Sprintf("bucket %q (%s)", k, what)); err != nil {
			return nil, err
		}
	}
	return prev, nil
}

// startCount is the stream count the file began with, by its stamp
// (stampEpoch): for a backup's (stampBackup), the count it goes on from
// once restored and started.
func (m boltMeta) startCount() uint64 {
	if count, hour, ok := backupOf(m.epochStamp); ok {
		return restoredEpoch(count, hour)
	}
	return m.epochStamp
}
