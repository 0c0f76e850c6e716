package store

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// Checkpoints are keyed by ID first (see the bucket keys in db.go), so a
// namespace is not a key range. It is a forest along parent links, and its
// leaves are recorded: the newest in heads, the others in branches. A leaf
// is a checkpoint that no newer checkpoint of its namespace names as its
// parent. Every other checkpoint is the parent of a newer one, so walking
// parent links down from the leaves reaches every checkpoint of the
// namespace, and each walk meets IDs in descending order.
//
// A link counts only when the parent exists in the namespace and its ID is
// below the child's. The engine's IDs are time-ordered, so that is every
// link it makes; the rule keeps walks finite and descending whatever a
// caller commits.
//
// A step on the newest checkpoint, by far the most common commit, rewrites
// one heads entry in place and touches no other leaf record.

// nsTree reads and maintains one namespace's leaves inside a transaction.
type nsTree struct {
	cb         checkpoints
	hb, bb     *bbolt.Bucket
	thread, ns string
	headKey    []byte
	head       string // "" while the namespace has no checkpoint
}

func openNSTree(tx *bbolt.Tx, thread, ns string) (*nsTree, error) {
	t := &nsTree{
		cb: openCheckpoints(tx), hb: bucket(tx, bucketHeads), bb: bucket(tx, bucketBranches),
		thread: thread, ns: ns, headKey: nsKey(thread, ns),
	}
	if rec := t.hb.Get(t.headKey); rec != nil {
		id, err := decodeHead(rec)
		if err != nil {
			return nil, corrupt(bucketHeads, t.headKey, err)
		}
		t.head = id
	}
	return t, nil
}

func (t *nsTree) key(id string) []byte { return checkpointKey(t.thread, t.ns, id) }

func (t *nsTree) get(id string) []byte { return t.cb.Get(t.key(id)) }

// parentLink returns the parent of the checkpoint stored as rec under id,
// when that link counts (see above).
func (t *nsTree) parentLink(id string, rec []byte) (parent string, ok bool, err error) {
	_, parent, err = decodeCheckpointLink(rec)
	if err != nil {
		return "", false, t.cb.corrupt(t.key(id), err)
	}
	return parent, t.counts(id, parent), nil
}

// counts reports whether a link from child to parent counts.
func (t *nsTree) counts(child, parent string) bool {
	return parent != "" && parent < child && t.get(parent) != nil
}

// leaves returns the head, then the branch heads in ascending order.
func (t *nsTree) leaves() []string {
	if t.head == "" {
		return nil
	}
	out := []string{t.head}
	prefix := nsPrefix(t.thread, t.ns)
	c := t.bb.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	return out
}

// put stores checkpoint cp, encoded as rec, and keeps the leaves exact.
func (t *nsTree) put(cp *engine.Checkpoint, rec []byte) error {
	key := t.key(cp.ID)
	var old []byte
	if t.head == "" || cp.ID <= t.head {
		// Otherwise the checkpoint is new: the head is the namespace's
		// greatest ID, since every other checkpoint is a leaf below it or
		// the parent of a newer one. A step on the head, the common
		// commit, saves two lookups.
		old = t.cb.Get(key)
	}
	existed := old != nil
	var oldParent string
	if existed {
		var err error
		if _, oldParent, err = decodeCheckpointLink(old); err != nil {
			return t.cb.corrupt(key, err)
		}
	}
	put := t.cb.putNew
	if existed {
		put = t.cb.Put
	}
	if err := put(key, rec); err != nil {
		return fmt.Errorf("put checkpoint %s: %w", cp.ID, err)
	}
	if !existed && t.head != "" && cp.ParentID == t.head && cp.ID > t.head {
		return t.setHead(cp.ID)
	}
	if existed && oldParent == cp.ParentID {
		return nil // same links, same leaves
	}
	// The new link makes its parent an inner checkpoint.
	if t.counts(cp.ID, cp.ParentID) {
		if err := t.removeLeaf(cp.ParentID); err != nil {
			return err
		}
	}
	if existed {
		// A rewrite changes no checkpoint's children but its old parent's,
		// which may have lost its only newer child.
		if t.counts(cp.ID, oldParent) {
			return t.addLeafUnlessCovered(oldParent)
		}
		return nil
	}
	return t.addLeafUnlessCovered(cp.ID)
}

func (t *nsTree) setHead(id string) error {
	if err := t.hb.Put(t.headKey, encodeHead(id)); err != nil {
		return fmt.Errorf("put head of thread %q ns %q: %w", t.thread, t.ns, err)
	}
	t.head = id
	return nil
}

// addLeafUnlessCovered records id as a leaf unless a newer checkpoint of
// the namespace names it as its parent. Only a checkpoint older than the
// head can have one, so the walk runs only then: when a caller commits out
// of ID order, or rewrites a checkpoint with another parent.
func (t *nsTree) addLeafUnlessCovered(id string) error {
	if t.head != "" && id < t.head {
		covered, err := t.covered(id)
		if err != nil || covered {
			return err
		}
	}
	return t.addLeaf(id)
}

func (t *nsTree) addLeaf(id string) error {
	if t.head != "" && id <= t.head {
		if err := t.bb.Put(branchKey(t.thread, t.ns, id), []byte{}); err != nil {
			return fmt.Errorf("put branch %s: %w", id, err)
		}
		return nil
	}
	if t.head != "" {
		if err := t.bb.Put(branchKey(t.thread, t.ns, t.head), []byte{}); err != nil {
			return fmt.Errorf("put branch %s: %w", t.head, err)
		}
	}
	return t.setHead(id)
}

// dropBranches deletes every branch record of a namespace, leaving its
// head as its only recorded leaf.
func dropBranches(bb *bbolt.Bucket, thread, ns string) error {
	prefix := nsPrefix(thread, ns)
	var keys [][]byte
	c := bb.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, k := range keys {
		if err := bb.Delete(k); err != nil {
			return fmt.Errorf("drop branch %s: %w", renderKey(bucketBranches, k), err)
		}
	}
	return nil
}

// removeLeaf forgets id as a leaf. When it was the head, the greatest
// branch head takes its place.
func (t *nsTree) removeLeaf(id string) error {
	if id != t.head {
		if err := t.bb.Delete(branchKey(t.thread, t.ns, id)); err != nil {
			return fmt.Errorf("delete branch %s: %w", id, err)
		}
		return nil
	}
	prefix := nsPrefix(t.thread, t.ns)
	k, _ := lastWithPrefix(t.bb.Cursor(), prefix)
	if k == nil {
		if err := t.hb.Delete(t.headKey); err != nil {
			return fmt.Errorf("delete head of thread %q ns %q: %w", t.thread, t.ns, err)
		}
		t.head = ""
		return nil
	}
	next := string(k[len(prefix):])
	if err := t.bb.Delete(bytes.Clone(k)); err != nil {
		return fmt.Errorf("delete branch %s: %w", next, err)
	}
	return t.setHead(next)
}

// covered reports whether a checkpoint newer than id names it as its
// parent, walking down from the leaves through the checkpoints above id.
func (t *nsTree) covered(id string) (bool, error) {
	seen := map[string]bool{}
	var stack []string
	for _, l := range t.leaves() {
		if l > id {
			stack = append(stack, l)
		}
	}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[x] {
			continue
		}
		seen[x] = true
		rec := t.get(x)
		if rec == nil {
			continue // a dangling leaf entry: Check reports it
		}
		parent, ok, err := t.parentLink(x, rec)
		if err != nil {
			return false, err
		}
		switch {
		case !ok:
		case parent == id:
			return true, nil
		case parent > id:
			stack = append(stack, parent)
		}
	}
	return false, nil
}

// walk lists a namespace's checkpoints newest first: a merge of the parent
// chains that start at its leaves. Chains that meet continue as one, so
// each checkpoint comes once, and only as much of each chain is read as
// the caller consumes.
type walk struct {
	t    *nsTree
	h    chainHeap
	last string
}

type chainPos struct {
	id  string
	rec []byte
}

type chainHeap []chainPos

func (h chainHeap) Len() int           { return len(h) }
func (h chainHeap) Less(i, j int) bool { return h[i].id > h[j].id }
func (h chainHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *chainHeap) Push(x any)        { *h = append(*h, x.(chainPos)) }
func (h *chainHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// errMissingLeaf marks a heads or branches entry that names no checkpoint.
var errMissingLeaf = errors.New("names a checkpoint that is missing")

func (t *nsTree) walk() (*walk, error) {
	w := &walk{t: t}
	for i, id := range t.leaves() {
		rec := t.get(id)
		if rec == nil {
			if i == 0 {
				return nil, corrupt(bucketHeads, t.headKey, fmt.Errorf("%w: %s", errMissingLeaf, id))
			}
			return nil, corrupt(bucketBranches, branchKey(t.thread, t.ns, id), errMissingLeaf)
		}
		w.h = append(w.h, chainPos{id, rec})
	}
	heap.Init(&w.h)
	return w, nil
}

// next returns the next checkpoint's ID and record, or ok false at the end.
func (w *walk) next() (id string, rec []byte, ok bool, err error) {
	for w.h.Len() > 0 {
		top := w.h[0]
		if top.id == w.last {
			heap.Pop(&w.h) // another chain got here first
			continue
		}
		w.last = top.id
		parent, linked, err := w.t.parentLink(top.id, top.rec)
		if err != nil {
			return "", nil, false, err
		}
		if linked {
			w.h[0] = chainPos{parent, w.t.get(parent)}
			heap.Fix(&w.h, 0)
		} else {
			heap.Pop(&w.h)
		}
		return top.id, top.rec, true, nil
	}
	return "", nil, false, nil
}
