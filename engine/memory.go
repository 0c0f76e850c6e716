package engine

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// MemoryStore keeps checkpoints, pending writes, blobs and runs in memory. It
// implements Store and is meant for tests, demos and library use; nothing
// survives the process.
//
// Locks are split by concern, and checkpoints are locked per thread, so
// concurrent runs on different threads do not queue behind one mutex.
type MemoryStore struct {
	threadsMu sync.RWMutex
	threads   map[string]*memThread

	blobShards [16]blobShard

	runsMu sync.RWMutex
	runs   map[string]*Run
	runIDs []string // ascending

	commits atomic.Int64
}

type memThread struct {
	mu     sync.RWMutex
	ckpts  map[string][]*Checkpoint // ns -> ascending by ID
	writes map[string][]PendingWrite
}

type blobShard struct {
	mu sync.RWMutex
	m  map[BlobRef][]byte
}

// NewMemoryStore returns an empty in-memory store.
func NewMemoryStore() *MemoryStore {
	m := &MemoryStore{threads: map[string]*memThread{}, runs: map[string]*Run{}}
	for i := range m.blobShards {
		m.blobShards[i].m = map[BlobRef][]byte{}
	}
	return m
}

func nsKey(thread, ns string) string           { return thread + "\x00" + ns }
func writesKey(thread, ns, ckpt string) string { return thread + "\x00" + ns + "\x00" + ckpt }

func (m *MemoryStore) shard(ref BlobRef) *blobShard { return &m.blobShards[ref.Hash%16] }

// thread returns a thread's data, creating it when create is set.
func (m *MemoryStore) thread(name string, create bool) *memThread {
	m.threadsMu.RLock()
	t := m.threads[name]
	m.threadsMu.RUnlock()
	if t != nil || !create {
		return t
	}
	m.threadsMu.Lock()
	defer m.threadsMu.Unlock()
	if t = m.threads[name]; t == nil {
		t = &memThread{ckpts: map[string][]*Checkpoint{}, writes: map[string][]PendingWrite{}}
		m.threads[name] = t
	}
	return t
}

// Commit applies c. Everything is checked before anything is applied, so a
// failed commit changes nothing. Blobs go in first, so a reader that sees a
// checkpoint finds what it refers to.
func (m *MemoryStore) Commit(_ context.Context, c *Commit) error {
	if c.Run != nil && c.Run.IsSummary() {
		return fmt.Errorf("commit run %s: %w", c.Run.ID, ErrRunSummary)
	}
	for ref, data := range c.Blobs {
		if RefOf(data) != ref {
			return fmt.Errorf("commit: blob %s does not match its bytes", ref)
		}
		sh := m.shard(ref)
		sh.mu.RLock()
		old, ok := sh.m[ref]
		sh.mu.RUnlock()
		if ok && !bytes.Equal(old, data) {
			return fmt.Errorf("commit: blob %s: %w", ref, ErrBlobCollision)
		}
	}
	for ref, data := range c.Blobs {
		sh := m.shard(ref)
		sh.mu.Lock()
		old, ok := sh.m[ref]
		if !ok {
			sh.m[ref] = data // Commit owns c and its blobs
		}
		sh.mu.Unlock()
		if ok && !bytes.Equal(old, data) {
			// A concurrent commit stored other bytes under this digest
			// since the check: refuse rather than alias them. Blobs this
			// commit already stored are harmless, as nothing refers to them.
			return fmt.Errorf("commit: blob %s: %w", ref, ErrBlobCollision)
		}
	}
	for _, w := range c.Writes {
		t := m.thread(w.Thread, true)
		k := writesKey("", w.NS, w.CheckpointID)
		t.mu.Lock()
		t.writes[k] = append(t.writes[k], w.Write)
		t.mu.Unlock()
	}
	for _, cp := range append(slices.Clip(c.Earlier), c.Checkpoint) {
		if cp == nil {
			continue
		}
		t := m.thread(cp.Thread, true)
		cc := cp // Commit owns c: the caller does not touch it again
		t.mu.Lock()
		list := t.ckpts[cp.NS]
		i := sort.Search(len(list), func(i int) bool { return list[i].ID >= cp.ID })
		if i < len(list) && list[i].ID == cp.ID {
			list[i] = cc
		} else {
			list = append(list, nil)
			copy(list[i+1:], list[i:])
			list[i] = cc
		}
		t.ckpts[cp.NS] = list
		t.mu.Unlock()
	}
	if c.Run != nil {
		m.runsMu.Lock()
		if _, ok := m.runs[c.Run.ID]; !ok {
			i := sort.SearchStrings(m.runIDs, c.Run.ID)
			m.runIDs = append(m.runIDs, "")
			copy(m.runIDs[i+1:], m.runIDs[i:])
			m.runIDs[i] = c.Run.ID
		}
		m.runs[c.Run.ID] = c.Run // Commit owns c: the caller does not touch it again
		m.runsMu.Unlock()
	}
	m.commits.Add(1)
	return nil
}

// Checkpoint returns one checkpoint, or the newest when id is "".
func (m *MemoryStore) Checkpoint(_ context.Context, thread, ns, id string) (*Checkpoint, error) {
	t := m.thread(thread, false)
	if t == nil {
		return nil, fmt.Errorf("thread %q ns %q: %w", thread, ns, ErrCheckpointNotFound)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	list := t.ckpts[ns]
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
	t := m.thread(thread, false)
	if t == nil {
		return nil, nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	list := t.ckpts[ns]
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
	t := m.thread(thread, false)
	if t == nil {
		return nil, nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return append([]PendingWrite(nil), t.writes[writesKey("", ns, ckpt)]...), nil
}

// PutBlob stores data once.
func (m *MemoryStore) PutBlob(_ context.Context, data []byte) (BlobRef, error) {
	ref := RefOf(data)
	sh := m.shard(ref)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old, ok := sh.m[ref]; ok {
		if !bytes.Equal(old, data) {
			return ref, fmt.Errorf("put blob %s: %w", ref, ErrBlobCollision)
		}
		return ref, nil
	}
	sh.m[ref] = bytes.Clone(data)
	return ref, nil
}

// Blob returns a blob's bytes.
func (m *MemoryStore) Blob(_ context.Context, ref BlobRef) ([]byte, error) {
	sh := m.shard(ref)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	b, ok := sh.m[ref]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", ref, ErrBlobNotFound)
	}
	return b, nil
}

// Run returns one run.
func (m *MemoryStore) Run(_ context.Context, id string) (*Run, error) {
	m.runsMu.RLock()
	defer m.runsMu.RUnlock()
	r, ok := m.runs[id]
	if !ok {
		return nil, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	return r.Clone(), nil
}

// Runs lists runs in ID order (oldest first), or newest first with f.Desc.
func (m *MemoryStore) Runs(_ context.Context, f RunFilter) ([]*Run, error) {
	m.runsMu.RLock()
	defer m.runsMu.RUnlock()
	var out []*Run
	ids, step := m.runIDs, 1
	i := 0
	switch {
	case f.Desc && f.After != "":
		i, step = sort.SearchStrings(ids, f.After)-1, -1 // the last ID below After
	case f.Desc:
		i, step = len(ids)-1, -1
	case f.After != "":
		i = sort.Search(len(ids), func(i int) bool { return ids[i] > f.After })
	}
	for ; i >= 0 && i < len(ids); i += step {
		r := m.runs[ids[i]]
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
	m.threadsMu.RLock()
	for _, t := range m.threads {
		t.mu.RLock()
		for _, l := range t.ckpts {
			checkpoints += len(l)
		}
		t.mu.RUnlock()
	}
	m.threadsMu.RUnlock()
	for i := range m.blobShards {
		sh := &m.blobShards[i]
		sh.mu.RLock()
		blobs += len(sh.m)
		sh.mu.RUnlock()
	}
	return checkpoints, blobs, int(m.commits.Load())
}
