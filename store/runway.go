package store

import (
	"os"

	"go.etcd.io/bbolt"
)

// The runway: written blocks ahead of the pages in use.
//
// bbolt grows its file with ftruncate, which leaves a hole: the file
// system allocates blocks only when pages are first written there, and the
// fsync of a commit that writes such pages must also commit the allocation
// to the file system's journal. On the reference workload with 64 threads,
// where most commits write new pages, the runway cut the median page fsync
// from 755 to 620 µs.
//
// So the committer keeps a runway of zeroed, synced blocks between the
// high-water mark of the pages in use and the end of the file, a chunk at
// a time, inside a write transaction before anything is written: no other
// write can touch those pages meanwhile, and the pages this transaction
// adds are written after the zeros are durable. Pages beyond the high-water
// mark hold nothing (bbolt, the open-time check and salvage all ignore
// them), so zeros there change nothing a reader or a crash can see. The
// runway never extends the file: bbolt sizes it as it grows, and the size
// on disk stays bbolt's.
type runway struct {
	f      *os.File // the store file, opened for writing; nil once given up
	zeros  []byte   // what the runway is written from, made on first use
	zeroed int64    // the runway reaches here
	size   int64    // the file's size when last looked at
	sizeAt int64    // the high-water mark then
}

const (
	// runwayChunk is the most zeroed at a time. The zeros' fsync holds up
	// the commits queued meanwhile: for 4 MB, about 8 ms on a disk whose
	// small commit takes 0.3.
	runwayChunk = 4 << 20
	// runwayMin is the least zeroed at a time: an fsync has a fixed cost,
	// so the runway is topped up in few, large steps.
	runwayMin = 256 << 10
)

func openRunway(path string) *runway {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil // the commits work as well without
	}
	return &runway{f: f}
}

func (r *runway) close() error {
	if r == nil || r.f == nil {
		return nil
	}
	return r.f.Close()
}

// giveUp ends the runway after a failure: bbolt then writes into holes as
// it would without one.
func (r *runway) giveUp() {
	_ = r.f.Close() // the failure is what matters, and it is not the commit's
	r.f = nil
}

// extend tops the runway up when what is left of it is short of an eighth
// of the pages in use (within runwayMin and half a chunk): it zeroes the
// file from the high-water mark to its end, or runwayChunk of it. bbolt
// grows the file by growStep at a time, so this happens about once per
// step. It runs at the start of a write transaction, before
// the transaction writes anything. A failure gives the runway up rather
// than failing the commit.
func (r *runway) extend(tx *bbolt.Tx) {
	if r == nil || r.f == nil {
		return
	}
	hw := tx.Size() // the high-water mark: every page in use is below it
	if r.zeroed-hw >= min(max(hw/8, runwayMin), runwayChunk/2) {
		return
	}
	// Look at the file's size again only when the pages in use have grown
	// since: bbolt grows the file as they near its end.
	if hw != r.sizeAt {
		fi, err := r.f.Stat()
		if err != nil {
			r.giveUp()
			return
		}
		r.size, r.sizeAt = fi.Size(), hw
	}
	from := max(r.zeroed, hw)
	to := min(r.size, hw+runwayChunk)
	if to-from < runwayMin {
		return // too little room: wait until bbolt grows the file
	}
	if r.zeros == nil {
		r.zeros = make([]byte, 256<<10)
	}
	for off := from; off < to; {
		n := int(min(int64(len(r.zeros)), to-off))
		if _, err := r.f.WriteAt(r.zeros[:n], off); err != nil {
			r.giveUp()
			return
		}
		off += int64(n)
	}
	if err := r.f.Sync(); err != nil {
		r.giveUp()
		return
	}
	r.zeroed = to
}
