package engine

import "sync"

// StateCache keeps the materialized state of each thread's newest
// checkpoint, so the next turn on a thread does not refold its history.
// Checkpoints are immutable, so an entry is valid while its id is the one
// asked for. A nil cache caches nothing.
type StateCache struct {
	mu    sync.Mutex
	max   int
	m     map[cacheKey]*cachedState
	order []cacheKey // insertion order of keys, for eviction
}

type cacheKey struct{ thread, ns string }

type cachedState struct {
	id       string
	vals     values
	versions map[string]uint64
}

// NewStateCache returns a cache for at most n threads.
func NewStateCache(n int) *StateCache {
	return &StateCache{max: max(n, 1), m: map[cacheKey]*cachedState{}}
}

func (c *StateCache) get(thread, ns, id string) *cachedState {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs := c.m[cacheKey{thread, ns}]; cs != nil && cs.id == id {
		return cs
	}
	return nil
}

func (c *StateCache) put(thread, ns, id string, vals values, versions map[string]uint64) {
	if c == nil {
		return
	}
	// versions is never modified in place (see bumpVersions), so it is
	// shared, not copied.
	vs := versions
	k := cacheKey{thread, ns}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = &cachedState{id: id, vals: vals, versions: vs}
	for len(c.m) > c.max && len(c.order) > 0 {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}
