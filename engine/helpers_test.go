package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// noop is a node that writes nothing.
func noop(context.Context, engine.State) ([]engine.Write, error) { return nil, nil }

// writes returns a node that always returns ws.
func writes(ws ...engine.Write) engine.NodeFunc {
	return func(context.Context, engine.State) ([]engine.Write, error) { return ws, nil }
}

// counter counts calls per key, safely across goroutines.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: map[string]int{}} }

func (c *counter) inc(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[k]++
	return c.n[k]
}

func (c *counter) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// counted wraps fn so that every call is counted under the node's name.
func (c *counter) counted(fn engine.NodeFunc) engine.NodeFunc {
	return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		c.inc(s.Node())
		return fn(ctx, s)
	}
}

func mustCompile(t testing.TB, b *engine.Builder, opts ...engine.CompileOption) *engine.Graph {
	t.Helper()
	g, err := b.Compile(opts...)
	require.NoError(t, err)
	return g
}

// recordingStore wraps a MemoryStore and remembers every commit, so tests can
// see what was made durable and in which order.
type recordingStore struct {
	*engine.MemoryStore
	mu      sync.Mutex
	commits []*engine.Commit
	// onCommit, when set, runs before the commit is applied.
	onCommit func(c *engine.Commit)
}

func newRecordingStore() *recordingStore {
	return &recordingStore{MemoryStore: engine.NewMemoryStore()}
}

func (r *recordingStore) Commit(ctx context.Context, c *engine.Commit) error {
	r.mu.Lock()
	r.commits = append(r.commits, c)
	hook := r.onCommit
	r.mu.Unlock()
	if hook != nil {
		hook(c)
	}
	return r.MemoryStore.Commit(ctx, c)
}

// namespaces lists the namespaces of committed checkpoints, in first-seen order.
func (r *recordingStore) namespaces() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for _, c := range r.commits {
		if c.Checkpoint != nil && !seen[c.Checkpoint.NS] {
			seen[c.Checkpoint.NS] = true
			out = append(out, c.Checkpoint.NS)
		}
	}
	return out
}
