package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/internal/fsync"
)

// SalvageReport says what Salvage copied out of a damaged store and what
// it could not.
type SalvageReport struct {
	// TxID is the transaction whose meta page the walk started from.
	TxID uint64 `json:"txid"`
	// Records counts the records copied, by bucket.
	Records map[string]int `json:"records"`
	// Lost lists what could not be read: a meta page, a page and the part
	// of a bucket below it, a bucket the file no longer names.
	Lost []Problem `json:"lost"`
	// Check is db check of the new store: the references that the lost
	// records leave dangling, a broken outcome chain, records whose own
	// checksum fails.
	Check *CheckReport `json:"check"`
}

// OK reports whether everything was copied and the new store checks
// clean.
func (r *SalvageReport) OK() bool { return len(r.Lost) == 0 && r.Check != nil && r.Check.OK() }

// Salvage copies every record it can still read from the store file src,
// which may be damaged beyond what Open accepts (ErrDamaged), into a new
// store file dst. It reads the file page by page without bbolt, from the
// newest meta page that is whole (the older one when that walk cannot
// reach the root), and passes over a page that is not whole together with
// what lies below it, so one bad page loses the records it holds rather
// than the store. The records themselves are copied as they are; db check
// of the new store, part of the report, names those that fail their own
// checksum and the references that the lost ones leave dangling.
//
// src is locked as Open locks it, so a process writing to it makes
// Salvage fail with ErrInUse; it is never written. dst must not exist; it
// appears whole or not at all.
func Salvage(ctx context.Context, src, dst string) (*SalvageReport, error) {
	if _, err := os.Stat(dst); err == nil {
		return nil, fmt.Errorf("salvage into %s: %w", dst, os.ErrExist)
	}
	lock, err := lockStore(src, false, time.Second)
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("salvage %s: %w: stop the process that owns it first", src, ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}
	if lock != nil {
		defer lock.Close()
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("salvage %s: %w", src, err)
	}

	rep := &SalvageReport{Records: map[string]int{}}
	metas := salvageMetas(f, rep)
	if len(metas) == 0 {
		return rep, fmt.Errorf("salvage %s: %w: neither meta page is whole, so nothing in the file can be found", src, ErrDamaged)
	}
	var buckets []salvagedBucket
	for i, m := range metas {
		w := &salvageWalk{f: f, ps: m.pageSize, pgid: min(m.pgid, uint64(fi.Size())/m.pageSize), seen: map[uint64]bool{}, rep: rep}
		rootLost := len(rep.Lost)
		buckets = w.root(ctx, m.root)
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("salvage %s: %w", src, err)
		}
		if buckets != nil || i == len(metas)-1 {
			rep.TxID = m.txid
			break
		}
		// The root is unreadable from this meta page: try the older one.
		rep.Lost = append(rep.Lost[:rootLost], Problem{Message: fmt.Sprintf(
			"the root page of transaction %d cannot be read; the older meta page (transaction %d) is used instead", m.txid, metas[i+1].txid)})
	}
	if buckets == nil {
		return rep, fmt.Errorf("salvage %s: %w: the root page cannot be read from either meta page", src, ErrDamaged)
	}
	for _, name := range append([]string{bucketMeta}, dataBuckets...) {
		if !slices.ContainsFunc(buckets, func(b salvagedBucket) bool { return b.name == name }) {
			rep.Lost = append(rep.Lost, Problem{Bucket: name, Message: "the root bucket does not name this bucket: its records are lost"})
		}
	}
	buckets = keepFormat(buckets, rep)

	tmp := dst + ".salvage"
	_ = os.Remove(tmp) // a leftover of a salvage that did not finish
	if err := writeSalvaged(ctx, tmp, buckets, rep); err != nil {
		return rep, errors.Join(fmt.Errorf("salvage %s: write %s: %w", src, tmp, err), os.Remove(tmp))
	}
	if err := os.Rename(tmp, dst); err != nil {
		return rep, errors.Join(fmt.Errorf("salvage %s: %w", src, err), os.Remove(tmp))
	}
	if err := fsync.Dir(filepath.Dir(dst)); err != nil {
		return rep, fmt.Errorf("salvage %s: %w", src, err)
	}
	// Open adds what the copy lacks (a lost bucket, the appliance ID) and
	// upgrades an older format, as it would for the original.
	d, err := Open(dst, Options{})
	if err != nil {
		return rep, fmt.Errorf("salvage %s: the copy %s does not open: %w", src, dst, err)
	}
	rep.Check, err = d.Check(ctx)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("salvage %s: check the copy %s: %w", src, dst, err)
	}
	return rep, nil
}

// salvageMetas returns the whole meta pages, newest first.
func salvageMetas(f *os.File, rep *SalvageReport) []boltMeta {
	var metas []boltMeta
	for _, off := range []int64{0, -1} {
		if off < 0 {
			// The second meta page is one page in; its size is the first
			// one's, or the OS page size when the first is damaged.
			off = int64(os.Getpagesize())
			if len(metas) > 0 {
				off = int64(metas[0].pageSize)
			}
		}
		b := make([]byte, metaOffset+metaSize)
		if _, err := f.ReadAt(b, off); err == nil {
			if m := readMeta(b); m.valid {
				metas = append(metas, m)
				continue
			}
		}
		rep.Lost = append(rep.Lost, Problem{Message: fmt.Sprintf("the meta page at byte %d is not whole", off)})
	}
	slices.SortFunc(metas, func(a, b boltMeta) int {
		switch {
		case a.txid > b.txid:
			return -1
		case a.txid < b.txid:
			return 1
		}
		return 0
	})
	return metas
}

// keepFormat makes sure the copy names its format, which Open needs: when
// the format records are lost, the copy is stamped with this binary's
// version (the records of versions 3 and 4 are all read by it). A lost
// appliance ID is reported: Open makes a new one, and the collector then
// sees a new appliance.
func keepFormat(buckets []salvagedBucket, rep *SalvageReport) []salvagedBucket {
	i := slices.IndexFunc(buckets, func(b salvagedBucket) bool { return b.name == bucketMeta })
	if i < 0 {
		buckets = append(buckets, salvagedBucket{name: bucketMeta})
		i = len(buckets) - 1
	}
	meta := &buckets[i]
	has := func(k []byte) bool {
		return slices.ContainsFunc(meta.records, func(r [2][]byte) bool { return bytes.Equal(r[0], k) })
	}
	if !has(metaFormat) || !has(metaVersion) {
		meta.records = slices.DeleteFunc(meta.records, func(r [2][]byte) bool {
			return bytes.Equal(r[0], metaFormat) || bytes.Equal(r[0], metaVersion)
		})
		meta.records = append(meta.records, [2][]byte{metaFormat, []byte(formatName)},
			[2][]byte{metaVersion, []byte(strconv.Itoa(formatVersion))})
		rep.Lost = append(rep.Lost, Problem{Bucket: bucketMeta, Message: fmt.Sprintf(
			"the format records are lost; the copy is stamped format version %d", formatVersion)})
	}
	if !has(metaAppliance) {
		rep.Lost = append(rep.Lost, Problem{Bucket: bucketMeta, Message: "the appliance ID is lost; the copy gets a new one, " +
			"and a collector will see a new appliance"})
	}
	return buckets
}

type salvagedBucket struct {
	name    string
	seq     uint64
	records [][2][]byte
}

// salvageWalk reads pages like pageWalk (fileguard.go), but passes over a
// page that is not whole instead of stopping.
type salvageWalk struct {
	f    *os.File
	ps   uint64
	pgid uint64
	seen map[uint64]bool
	rep  *SalvageReport
	// bucket names the bucket being read, "" for the root bucket.
	bucket string
}

// root reads the root bucket's entries, then each known bucket they name.
// It returns nil when the root page itself cannot be read.
func (w *salvageWalk) root(ctx context.Context, root uint64) []salvagedBucket {
	var entries []salvageEntry
	w.bucket = ""
	if err := w.tree(ctx, root, "the meta page", &entries); err != nil {
		return nil
	}
	out := []salvagedBucket{}
	known := append([]string{bucketMeta}, dataBuckets...)
	for _, e := range entries {
		name := string(e.k)
		if !e.bucket || !slices.Contains(known, name) {
			w.lost("", nil, "the root bucket holds %q, which the store does not know; it is left out", e.k)
			continue
		}
		if len(e.v) < inBucketSize {
			w.lost(name, nil, "its header in the root page is cut short: its records are lost")
			continue
		}
		b := salvagedBucket{name: name, seq: binary.LittleEndian.Uint64(e.v[8:])}
		var recs []salvageEntry
		var err error
		w.bucket = name
		if r := binary.LittleEndian.Uint64(e.v); r == 0 {
			err = w.nodes(ctx, e.v[inBucketSize:], "an inline bucket", true, &recs)
		} else {
			err = w.tree(ctx, r, "the root page", &recs)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.lost(name, nil, "%v: its records are lost", err)
		}
		for _, r := range recs {
			if r.bucket {
				w.lost(name, r.k, "a nested bucket, which the store never makes; left out")
				continue
			}
			b.records = append(b.records, [2][]byte{r.k, r.v})
		}
		out = append(out, b)
	}
	return out
}

func (w *salvageWalk) lost(bucket string, key []byte, format string, a ...any) {
	p := Problem{Bucket: bucket, Message: fmt.Sprintf(format, a...)}
	if key != nil {
		p.Key = renderKey(bucket, key)
	}
	w.rep.Lost = append(w.rep.Lost, p)
}

type salvageEntry struct {
	k, v   []byte
	bucket bool
}

// tree reads the page tree at id into out. A page below the top that
// cannot be read is reported and passed over; the top page is the error.
func (w *salvageWalk) tree(ctx context.Context, id uint64, from string, out *[]salvageEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := w.page(id, from)
	if err != nil {
		return err
	}
	return w.nodes(ctx, b, fmt.Sprintf("page %d", id), false, out)
}

// page reads page id with its overflow, checking that it lies in the file,
// says it is page id, and was not reached before.
func (w *salvageWalk) page(id uint64, from string) ([]byte, error) {
	if id < 2 || id >= w.pgid {
		return nil, fmt.Errorf("%s names page %d, outside the file's pages 2 to %d", from, id, w.pgid-1)
	}
	if w.seen[id] {
		return nil, fmt.Errorf("%s names page %d, which another page names too", from, id)
	}
	w.seen[id] = true
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
	if overflow > 0 {
		b = make([]byte, (overflow+1)*w.ps)
		if _, err := w.f.ReadAt(b, int64(id*w.ps)); err != nil {
			return nil, fmt.Errorf("page %d: %v", id, err)
		}
	}
	return b, nil
}

// nodes reads the elements of a branch or leaf page held in b. A child of
// a branch page that cannot be read is reported, with the records below
// it, and passed over.
func (w *salvageWalk) nodes(ctx context.Context, b []byte, what string, inline bool, out *[]salvageEntry) error {
	if len(b) < pageHeaderSize {
		return fmt.Errorf("%s is cut short", what)
	}
	le := binary.LittleEndian
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	branch := flags == branchPageFlag && !inline
	if !branch && flags != leafPageFlag {
		return fmt.Errorf("%s: page type %#x where a branch or leaf page belongs", what, flags)
	}
	if pageHeaderSize+count*leafElementSize > len(b) { // branch and leaf elements are the same size
		return fmt.Errorf("%s has %d elements, more than it holds", what, count)
	}
	var prev []byte
	for i := range count {
		e := pageHeaderSize + i*leafElementSize
		if branch {
			pos, ksize := int(le.Uint32(b[e:])), int(le.Uint32(b[e+4:]))
			if e+pos+ksize > len(b) {
				return fmt.Errorf("%s: element %d's key lies outside the page", what, i)
			}
			if err := w.tree(ctx, le.Uint64(b[e+8:]), what, out); err != nil {
				if ctx.Err() != nil {
					return err
				}
				w.lost(w.bucket, b[e+pos:e+pos+ksize], "%v: the records from this key to the next branch are lost", err)
			}
			continue
		}
		pos, ksize, vsize := int(le.Uint32(b[e+4:])), int(le.Uint32(b[e+8:])), int(le.Uint32(b[e+12:]))
		if e+pos+ksize+vsize > len(b) {
			return fmt.Errorf("%s: element %d's key or value lies outside the page", what, i)
		}
		k := b[e+pos : e+pos+ksize]
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("%s: element %d's key is out of order", what, i)
		}
		prev = k
		*out = append(*out, salvageEntry{k: bytes.Clone(k), v: bytes.Clone(b[e+pos+ksize : e+pos+ksize+vsize]),
			bucket: le.Uint32(b[e:])&bucketLeafFlag != 0})
	}
	return nil
}

// writeSalvaged writes the buckets to a new bbolt file at path, records in
// key order, a few thousand to a transaction.
func writeSalvaged(ctx context.Context, path string, buckets []salvagedBucket, rep *SalvageReport) error {
	out, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second, FreelistType: bbolt.FreelistMapType, NoFreelistSync: true})
	if err != nil {
		return err
	}
	err = func() error {
		for _, b := range buckets {
			slices.SortFunc(b.records, func(x, y [2][]byte) int { return bytes.Compare(x[0], y[0]) })
			b.records = slices.CompactFunc(b.records, func(x, y [2][]byte) bool { return bytes.Equal(x[0], y[0]) })
			for start := 0; start == 0 || start < len(b.records); start += 4096 {
				if err := ctx.Err(); err != nil {
					return err
				}
				err := out.Update(func(tx *bbolt.Tx) error {
					nb, err := tx.CreateBucketIfNotExists([]byte(b.name))
					if err != nil {
						return err
					}
					nb.FillPercent = 1 // keys arrive in order
					if err := nb.SetSequence(b.seq); err != nil {
						return err
					}
					for _, r := range b.records[start:min(start+4096, len(b.records))] {
						if err := nb.Put(r[0], r[1]); err != nil {
							return fmt.Errorf("bucket %s: %w", b.name, err)
						}
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			rep.Records[b.name] = len(b.records)
		}
		return nil
	}()
	return errors.Join(err, out.Close())
}
