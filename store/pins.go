package store

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// Pins are the runs pinned to one bundle: how many, and the IDs of the
// oldest few, for a message that names them.
type Pins struct {
	Runs  int
	First []string
}

// pinsNamed is how many run IDs a Pins keeps.
const pinsNamed = 3

// BundlePins is what PinnedBundles finds in the run records.
type BundlePins struct {
	// ByBundle holds the runs pinned to each bundle. A run that is pinned
	// to none (an agent from outside a bundle) is not counted.
	ByBundle map[engine.BundleRef]*Pins
	// Damaged lists the keys of the run records that cannot be read: the
	// bundles those runs are pinned to are not known.
	Damaged []string
}

// PinnedBundles reads from every run record, of any status, the bundle the
// run is pinned to: what a run refers to on disk for as long as the store
// holds it (a finished run is still replayed and forked from its bundle).
// It decodes the head of each record alone (the bundle follows the run's
// ID, thread, agent and status) and reads no blob, countBatch records to a
// read transaction as CountRuns does; so it is not a snapshot, and a run
// stored meanwhile may be missed. Run records are never deleted and a
// run's bundle never changes, so every run stored before the walk began
// is found.
func (d *DB) PinnedBundles(ctx context.Context) (*BundlePins, error) {
	pins := &BundlePins{ByBundle: map[engine.BundleRef]*Pins{}}
	err := d.eachRunRecord(ctx, func(k, v []byte) {
		ref, ok := recordBundle(v)
		switch {
		case !ok:
			pins.Damaged = append(pins.Damaged, string(k))
			return
		case ref.Name == "":
			return
		}
		p := pins.ByBundle[ref]
		if p == nil {
			p = &Pins{}
			pins.ByBundle[ref] = p
		}
		p.Runs++
		if len(p.First) < pinsNamed {
			p.First = append(p.First, string(k))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the runs' bundles: %w", err)
	}
	return pins, nil
}

// recordBundle reads the bundle from the run record v, checksum checked,
// decoding no more of a record of the current version than its head. It
// fails (false) for a record that cannot be read.
func recordBundle(v []byte) (engine.BundleRef, bool) {
	if len(v) == 0 || v[0] != runVersion {
		rec, err := decodeRunRecord(v)
		if err != nil {
			return engine.BundleRef{}, false
		}
		return rec.Bundle, true
	}
	payload, err := openRecord(v, runVersion)
	if err != nil {
		return engine.BundleRef{}, false
	}
	d := decoder{b: payload}
	for range 4 { // ID, thread, agent, status
		d.raw(d.uvarint())
	}
	ref := engine.BundleRef{Name: d.string()}
	ref.Version = d.varint()
	ref.Digest = d.string()
	return ref, d.err == nil
}

// eachRunRecord calls fn with the key and value of every run record, in
// key order, countBatch records to a read transaction: one open for a walk
// of months of runs would hold off a commit that must grow the file's
// mapping, which bbolt remaps only when no read transaction is open. k and
// v are valid during the call alone.
func (d *DB) eachRunRecord(ctx context.Context, fn func(k, v []byte)) error {
	var after []byte // the last key read, nil before the first batch
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := d.view(func(tx *bbolt.Tx) error {
			c := bucket(tx, bucketRuns).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for n := 0; n < countBatch; k, v = c.Next() {
				if k == nil {
					more = false
					return nil
				}
				if isOutcomeIndexKey(k) {
					continue
				}
				n++
				after = append(after[:0], k...)
				fn(k, v)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// OpenHeld opens the store of the data folder dir read-only, for a caller
// that holds the folder's store lock (LockDir): it takes no lock of its
// own, so that the caller reads the store while no other process can open
// it to write (and start or pin a run meanwhile), and commits nothing.
func OpenHeld(dir string, opts Options) (*DB, error) {
	opts.ReadOnly, opts.locked = true, true
	return Open(filepath.Join(dir, FileName), opts)
}
