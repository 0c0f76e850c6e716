package engine

import (
	"container/list"
	"sync"
)

// DefaultCacheBytes is the state cache's default budget: what the cached
// states' values take encoded. Decoded, they take a few times as much.
const DefaultCacheBytes = 64 << 20

// StateCache keeps the materialized state of each thread's newest
// checkpoint, so the next turn on a thread does not refold its history.
// Checkpoints are immutable, so an entry is valid while its id is the one
// asked for. It holds at most a number of threads and a number of bytes,
// counted as the states' values take encoded, and lets the thread used
// least recently go first. A nil cache caches nothing.
type StateCache struct {
	mu       sync.Mutex
	max      int
	maxBytes int64
	bytes    int64
	m        map[cacheKey]*list.Element // of *cacheEntry
	lru      list.List                  // most recently used first
}

type cacheKey struct{ thread, ns string }

type cacheEntry struct {
	key   cacheKey
	state *cachedState
}

type cachedState struct {
	id       string
	vals     values
	versions map[string]uint64
	// sizes holds each channel's encoded size: its value's, or for an
	// append channel the sum of its deltas'. size is their sum.
	sizes map[string]int64
	size  int64
}

// NewStateCache returns a cache for at most n threads, whose states take
// at most maxBytes encoded (no bound if maxBytes <= 0). A state larger
// than maxBytes on its own is not kept.
func NewStateCache(n int, maxBytes int64) *StateCache {
	return &StateCache{max: max(n, 1), maxBytes: maxBytes, m: map[cacheKey]*list.Element{}}
}

// Len reports how many threads' states the cache holds, and their size.
func (c *StateCache) Len() (threads int, bytes int64) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m), c.bytes
}

func (c *StateCache) get(thread, ns, id string) *cachedState {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.m[cacheKey{thread, ns}]
	if el == nil {
		return nil
	}
	cs := el.Value.(*cacheEntry).state
	if cs.id != id {
		return nil
	}
	c.lru.MoveToFront(el)
	return cs
}

// put keeps the state of thread's checkpoint id. versions and sizes are
// copied before they are next modified (see bumpVersions and foldSizes), so
// they are shared, not copied.
func (c *StateCache) put(thread, ns, id string, vals values, versions map[string]uint64, sizes map[string]int64) {
	if c == nil {
		return
	}
	var size int64
	for _, n := range sizes {
		size += n
	}
	k := cacheKey{thread, ns}
	cs := &cachedState{id: id, vals: vals, versions: versions, sizes: sizes, size: size}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.m[k]; el != nil {
		c.remove(el)
	}
	if c.maxBytes > 0 && size > c.maxBytes {
		return
	}
	c.m[k] = c.lru.PushFront(&cacheEntry{key: k, state: cs})
	c.bytes += size
	for len(c.m) > c.max || (c.maxBytes > 0 && c.bytes > c.maxBytes) {
		c.remove(c.lru.Back())
	}
}

func (c *StateCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.m, e.key)
	c.bytes -= e.state.size
}

// encodedSize is what a channel's stored value takes.
func encodedSize(v Value) int64 {
	if !v.Blob.IsZero() {
		return int64(v.Blob.Len)
	}
	return int64(len(v.Inline))
}

// foldSizes updates sizes with a committed checkpoint's channels, in place
// unless shared (then in a copy), and returns it.
func foldSizes(sizes map[string]int64, shared bool, cvs []ChannelValue) map[string]int64 {
	if len(cvs) == 0 {
		return sizes
	}
	if shared || sizes == nil {
		out := make(map[string]int64, len(sizes)+len(cvs))
		for k, n := range sizes {
			out[k] = n
		}
		sizes = out
	}
	for _, cv := range cvs {
		addSize(sizes, cv)
	}
	return sizes
}

// addSize counts a committed channel value into sizes: an append
// channel's delta adds to what the channel takes, any other value replaces
// it.
func addSize(sizes map[string]int64, cv ChannelValue) {
	if cv.Delta {
		sizes[cv.Channel] += encodedSize(cv.Value)
	} else {
		sizes[cv.Channel] = encodedSize(cv.Value)
	}
}
