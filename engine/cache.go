package engine

import "sync"

// StateCache keeps the materialized state of recent checkpoints, so the next
// turn on a thread does not refold its whole history. Checkpoints are
// immutable, so an entry never goes stale. A nil cache caches nothing.
type StateCache struct {
	mu    sync.Mutex
	max   int
	m     map[string]*cachedState
	order []string
}

type cachedState struct {
	vals     values
	versions map[string]uint64
}

// NewStateCache returns a cache of at most n states.
func NewStateCache(n int) *StateCache {
	return &StateCache{max: max(n, 1), m: map[string]*cachedState{}}
}

func (c *StateCache) get(thread, ns, id string) *cachedState {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[writesKey(thread, ns, id)]
}

func (c *StateCache) put(thread, ns, id string, vals values, versions map[string]uint64) {
	if c == nil {
		return
	}
	vs := make(map[string]uint64, len(versions))
	for k, v := range versions {
		vs[k] = v
	}
	k := writesKey(thread, ns, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = &cachedState{vals: vals, versions: vs}
	for len(c.order) > c.max {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}
