package engine

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
)

// MemoryStore keeps checkpoints, pending writes, blobs and runs in memory. It
// implements Store and is meant for tests, demos and library use; nothing
// survives the process.
type MemoryStore struct {
	mu      sync.RWMutex
	ckpts   map[string][]*Checkpoint // thread|ns -> ascending by ID
	writes  map[string][]PendingWrite
	blobs   map[BlobRef][]byte
	runs    map[string]*Run
	runIDs  []string // ascending
	commits int
}

// NewMemoryStore returns an empty in-memory store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		ckpts:  map[string][]*Checkpoint{},
		writes: map[string][]PendingWrite{},
		blobs:  map[BlobRef][]byte{},
		runs:   map[string]*Run{},
	}
}

func nsKey(thread, ns string) string           { return thread + "\x00" + ns }
func writesKey(thread, ns, ckpt string) string { return thread + "\x00" + ns + "\x00" + ckpt }
func (m *MemoryStore) putBlobLocked(ref BlobRef, data []byte) error {
	if old, ok := m.blobs[ref]; ok {
		if !bytes.Equal(old, data) {
			return fmt.Errorf("put blob %s: %w", ref, ErrBlobCollision)
		}
		return nil
	}
	m.blobs[ref] = bytes.Clone(data)
	return nil
}

// Commit applies c atomically.
func (m *MemoryStore) Commit(_ context.Context, c *Commit) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Check first so a failed commit changes nothing.
	for ref, data := range c.Blobs {
		if RefOf(data) != ref {
			return fmt.Errorf("commit: blob %s does not match its bytes", ref)
		}
		if old, ok := m.blobs[ref]; ok && !bytes.Equal(old, data) {
			return fmt.Errorf("commit: blob %s: %w", ref, ErrBlobCollision)
		}
	}
	for ref, data := range c.Blobs {
		_ = m.putBlobLocked(ref, data)
	}
	for _, w := range c.Writes {
		k := writesKey(w.Thread, w.NS, w.CheckpointID)
		m.writes[k] = append(m.writes[k], w.Write)
	}
	if cp := c.Checkpoint; cp != nil {
		k := nsKey(cp.Thread, cp.NS)
		list := m.ckpts[k]
		cc := *cp
		i := sort.Search(len(list), func(i int) bool { return list[i].ID >= cp.ID })
		if i < len(list) && list[i].ID == cp.ID {
			list[i] = &cc
		} else {
			list = append(list, nil)
			copy(list[i+1:], list[i:])
			list[i] = &cc
		}
		m.ckpts[k] = list
	}
	if c.Run != nil {
		if _, ok := m.runs[c.Run.ID]; !ok {
			i := sort.SearchStrings(m.runIDs, c.Run.ID)
			m.runIDs = append(m.runIDs, "")
			copy(m.runIDs[i+1:], m.runIDs[i:])
			m.runIDs[i] = c.Run.ID
		}
		m.runs[c.Run.ID] = c.Run // Commit owns c: the caller does not touch it again
	}
	m.commits++
	return nil
}

// Checkpoint returns one checkpoint, or the newest when id is "".
func (m *MemoryStore) Checkpoint(_ context.Context, thread, ns, id string) (*Checkpoint, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	list := m.ckpts[nsKey(thread, ns)]
	if len(list) == 0 {
		return nil, fmt.Errorf("thread %q ns %q: %w", thread, ns, ErrCheckpointNotFound)
	}
	if id == "" {
		c := *list[len(list)-1]
		return &c, nil
	}
	i := sort.Search(len(list), func(i int) bool { return list[i].ID >= id })
	if i == len(list) || list[i].ID != id {
		return nil, fmt.Errorf("checkpoint %s of thread %q: %w", id, thread, ErrCheckpointNotFound)
	}
	c := *list[i]
	return &c, nil
}

// History lists checkpoints newest first.
func (m *MemoryStore) History(_ context.Context, thread, ns, before string, limit int) ([]*Checkpoint, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	list := m.ckpts[nsKey(thread, ns)]
	var out []*Checkpoint
	for i := len(list) - 1; i >= 0; i-- {
		if before != "" && list[i].ID >= before {
			continue
		}
		c := *list[i]
		out = append(out, &c)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}

// Writes returns the pending writes of a checkpoint.
func (m *MemoryStore) Writes(_ context.Context, thread, ns, ckpt string) ([]PendingWrite, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]PendingWrite(nil), m.writes[writesKey(thread, ns, ckpt)]...), nil
}

// PutBlob stores data once.
func (m *MemoryStore) PutBlob(_ context.Context, data []byte) (BlobRef, error) {
	ref := RefOf(data)
	m.mu.Lock()
	defer m.mu.Unlock()
	return ref, m.putBlobLocked(ref, data)
}

// Blob returns a blob's bytes.
func (m *MemoryStore) Blob(_ context.Context, ref BlobRef) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.blobs[ref]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", ref, ErrBlobNotFound)
	}
	return b, nil
}

// Run returns one run.
func (m *MemoryStore) Run(_ context.Context, id string) (*Run, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.runs[id]
	if !ok {
		return nil, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	return r.Clone(), nil
}

// Runs lists runs in ID order (oldest first).
func (m *MemoryStore) Runs(_ context.Context, f RunFilter) ([]*Run, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*Run
	start := 0
	if f.After != "" {
		start = sort.Search(len(m.runIDs), func(i int) bool { return m.runIDs[i] > f.After })
	}
	for _, id := range m.runIDs[start:] {
		r := m.runs[id]
		if !f.Match(r) {
			continue
		}
		out = append(out, r.Clone())
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Match reports whether r passes the filter's status, agent and thread.
func (f RunFilter) Match(r *Run) bool {
	return (f.Status == "" || r.Status == f.Status) &&
		(f.Agent == "" || r.Agent == f.Agent) &&
		(f.Thread == "" || r.Thread == f.Thread)
}

// Stats reports counts, for tests and benchmarks.
func (m *MemoryStore) Stats() (checkpoints, blobs, commits int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, l := range m.ckpts {
		checkpoints += len(l)
	}
	return checkpoints, len(m.blobs), m.commits
}
