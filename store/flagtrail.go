package store

import (
	"bytes"
	"sync"

	"github.com/outpost-edge/outpost/engine"
)

// An outcome records the flags channel's value at the run's last
// checkpoint, which walkFlags finds by walking up the checkpoint's parents
// to the last step that set it. Those checkpoints are nearly always the
// run's own, committed by this process moments before, so the store keeps
// a short trail of each thread's newest root checkpoints, reduced to what
// the walk reads of them: the parent link and the flags channel's entries.
// The outcome of a run then finds its flags without a read transaction or
// decoding a checkpoint; a checkpoint missing from the trail is read from
// the file, as before.
//
// The trail only ever holds what committed: a checkpoint goes in once its
// commit has returned, a rewrite of it replaces it, and a prune (which may
// delete checkpoints) empties the trail. A flags value stored as a blob is
// left out, so an entry stays small.
//
// The walk was about a twentieth of bench S2's CPU (64 x 20, sync): a read
// transaction and up to five checkpoints decoded per run. Skipping it
// altogether ran 1.058 times as many turns a second (10 interleaved pairs,
// median), and the trail 1.038 and 1.036 times (12 pairs each).

// trailLen is how many of a thread's newest root checkpoints the trail
// keeps: a run of the reference graph commits six or seven.
const trailLen = 16

// trailThreads bounds the threads the trail remembers (a variable so that
// tests can make it small). When a new thread finds it full, one
// remembered thread is forgotten.
var trailThreads = 4096

type flagTrail struct {
	mu      sync.Mutex
	threads map[string]*threadTrail
}

// threadTrail is a ring of one thread's newest checkpoints. newest is the
// greatest ID it took in: a checkpoint with a greater one is new (IDs grow
// along a thread), so only a rewrite has to search the ring.
type threadTrail struct {
	cps    [trailLen]*engine.Checkpoint
	next   int
	newest string
}

// add records the root checkpoints of c, which has committed, oldest
// first.
func (t *flagTrail) add(c *engine.Commit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cp := range c.Earlier {
		t.addLocked(cp)
	}
	t.addLocked(c.Checkpoint)
}

func (t *flagTrail) addLocked(cp *engine.Checkpoint) {
	if cp == nil || cp.NS != "" {
		return
	}
	s, ok := flagSkeleton(cp)
	tt := t.threads[cp.Thread]
	if tt == nil {
		if !ok {
			return
		}
		if t.threads == nil {
			t.threads = map[string]*threadTrail{}
		}
		if len(t.threads) >= trailThreads {
			for k := range t.threads {
				delete(t.threads, k)
				break
			}
		}
		tt = &threadTrail{}
		t.threads[cp.Thread] = tt
	}
	if cp.ID <= tt.newest {
		if i := tt.find(cp.ID); i >= 0 { // a rewrite
			tt.cps[i] = s // nil when it cannot be kept
			return
		}
	}
	if ok {
		tt.cps[tt.next] = s
		tt.next = (tt.next + 1) % trailLen
		tt.newest = max(tt.newest, cp.ID)
	}
}

// find returns the ring index of checkpoint id, or -1. It looks from the
// newest back: a walk up a run's checkpoints asks for them in that order.
func (tt *threadTrail) find(id string) int {
	for k := 1; k <= trailLen; k++ {
		i := (tt.next - k + trailLen) % trailLen
		if cp := tt.cps[i]; cp != nil && cp.ID == id {
			return i
		}
	}
	return -1
}

// flagSkeleton is cp as walkFlags reads it: its links and its flags
// entries, copied. ok is false when a flags entry is a blob.
func flagSkeleton(cp *engine.Checkpoint) (_ *engine.Checkpoint, ok bool) {
	s := &engine.Checkpoint{Thread: cp.Thread, ID: cp.ID, ParentID: cp.ParentID}
	for _, cv := range cp.Channels {
		if cv.Channel != FlagsChannel {
			continue
		}
		if !cv.Value.Blob.IsZero() {
			return nil, false
		}
		s.Channels = append(s.Channels, engine.ChannelValue{Channel: cv.Channel, Delta: cv.Delta,
			Value: engine.Value{Inline: bytes.Clone(cv.Value.Inline)}})
	}
	return s, true
}

// get returns the trail's copy of the thread's root checkpoint id, or nil.
func (t *flagTrail) get(thread, id string) *engine.Checkpoint {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if tt := t.threads[thread]; tt != nil {
		if i := tt.find(id); i >= 0 {
			return tt.cps[i]
		}
	}
	return nil
}

// reset forgets every thread.
func (t *flagTrail) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.threads = nil
}
