// Package bounded holds a map that keeps at most a fixed number of keys:
// state kept per run (or per anything else that comes and goes) in a
// process that runs for months, where a key that is never deleted would
// otherwise stay for good.
package bounded

// Map keeps at most its capacity of keys. When a new key finds it full,
// the key put longest ago is forgotten, unless it was deleted and put again
// since (it then counts from its new put). Putting a key it holds replaces
// the value and keeps its place. It is not safe for concurrent use.
type Map[K comparable, V any] struct {
	vals map[K]slotted[V]
	ring []K    // the keys, in the order they were put; zero: free
	used []bool // ring[i] holds a key
	next int    // the slot the next new key takes
}

type slotted[V any] struct {
	v    V
	slot int
}

// New returns an empty map that keeps at most capacity keys (at least 1).
func New[K comparable, V any](capacity int) *Map[K, V] {
	n := max(capacity, 1)
	return &Map[K, V]{vals: map[K]slotted[V]{}, ring: make([]K, n), used: make([]bool, n)}
}

// Get returns the value kept for k.
func (m *Map[K, V]) Get(k K) (V, bool) {
	s, ok := m.vals[k]
	return s.v, ok
}

// Put keeps v for k, forgetting the oldest key if the map is full.
func (m *Map[K, V]) Put(k K, v V) {
	if s, ok := m.vals[k]; ok {
		m.vals[k] = slotted[V]{v: v, slot: s.slot}
		return
	}
	i := m.next
	if m.used[i] {
		if s, ok := m.vals[m.ring[i]]; ok && s.slot == i {
			delete(m.vals, m.ring[i])
		}
	}
	m.ring[i], m.used[i] = k, true
	m.next = (i + 1) % len(m.ring)
	m.vals[k] = slotted[V]{v: v, slot: i}
}

// Delete forgets k.
func (m *Map[K, V]) Delete(k K) { delete(m.vals, k) }

// Len is the number of keys kept.
func (m *Map[K, V]) Len() int { return len(m.vals) }
