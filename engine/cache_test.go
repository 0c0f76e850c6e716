package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sized(n int64) map[string]int64 { return map[string]int64{"a": n / 2, "b": n - n/2} }

// The cache keeps the threads used most recently, within its count and
// its bytes.
func TestStateCacheBounds(t *testing.T) {
	c := NewStateCache(3, 100)
	put := func(thread string, size int64) { c.put(thread, "", thread+"-1", values{}, nil, sized(size)) }
	has := func(thread string) bool { return c.get(thread, "", thread+"-1") != nil }

	put("a", 30)
	put("b", 30)
	put("c", 30)
	n, bytes := c.Len()
	assert.Equal(t, 3, n)
	assert.Equal(t, int64(90), bytes)

	require.True(t, has("a"), "a is now the most recently used")
	put("d", 5) // a fourth thread: b, used least recently, goes
	assert.False(t, has("b"))
	assert.True(t, has("a") && has("c") && has("d"))

	// Used least recently first: a, then c, then d. 30+30+5+60 > 100, so a,
	// the least recent, goes, and the rest fits.
	put("e", 60)
	n, bytes = c.Len()
	assert.Equal(t, 3, n)
	assert.Equal(t, int64(95), bytes, "the bytes count what is kept")
	assert.False(t, has("a"))
	assert.True(t, has("c") && has("d") && has("e"))

	// A newer state of a thread replaces the old one and its bytes.
	c.put("e", "", "e-2", values{}, nil, sized(10))
	assert.Nil(t, c.get("e", "", "e-1"))
	assert.NotNil(t, c.get("e", "", "e-2"))
	_, bytes = c.Len()
	assert.Equal(t, int64(30+5+10), bytes)

	// A state over the whole budget is not kept, and takes the thread's
	// older state with it.
	c.put("e", "", "e-3", values{}, nil, sized(101))
	assert.Nil(t, c.get("e", "", "e-2"))
	assert.Nil(t, c.get("e", "", "e-3"))
	_, bytes = c.Len()
	assert.Equal(t, int64(30+5), bytes)

	// No byte bound: only the count.
	u := NewStateCache(2, 0)
	u.put("x", "", "x-1", values{}, nil, sized(1<<40))
	u.put("y", "", "y-1", values{}, nil, sized(1<<40))
	n, bytes = u.Len()
	assert.Equal(t, 2, n)
	assert.Equal(t, int64(2<<40), bytes)

	var none *StateCache
	none.put("x", "", "x-1", values{}, nil, sized(1))
	assert.Nil(t, none.get("x", "", "x-1"))
}

// The sizes the cache counts are what the state's channels take encoded,
// whether the state was folded from the store or kept by the run that made
// it; a cache too small for a thread still gives the right state.
func TestStateCacheCountsEncodedSizes(t *testing.T) {
	b := NewGraph("chat")
	msgs := Append[string](b, "messages")
	last := Replace[string](b, "last")
	b.AddNode("reply", func(_ context.Context, s State) ([]Write, error) {
		r := fmt.Sprintf("reply to message %d", len(msgs.Get(s)))
		return []Write{Push(msgs, r), last.Set(r)}, nil
	})
	b.AddEdge(Start, "reply")
	g, err := b.Compile()
	require.NoError(t, err)
	ctx := context.Background()
	store := NewMemoryStore()
	warm := NewStateCache(4, 0)
	for i := range 20 {
		_, err := g.Invoke(ctx, RunConfig{Thread: "t", Store: store, Cache: warm}, Push(msgs, fmt.Sprintf("user turn %d", i)))
		require.NoError(t, err)
	}

	// What the store holds for the thread: the deltas of messages, and the
	// newest value of last.
	hist, err := g.History(ctx, store, "t", 0)
	require.NoError(t, err)
	want := map[string]int64{}
	for i := len(hist) - 1; i >= 0; i-- { // oldest first
		for _, cv := range hist[i].Channels {
			if cv.Delta {
				want[cv.Channel] += int64(len(cv.Value.Inline)) + int64(cv.Value.Blob.Len)
			} else {
				want[cv.Channel] = int64(len(cv.Value.Inline)) + int64(cv.Value.Blob.Len)
			}
		}
	}
	require.Greater(t, want["messages"], int64(40*len(`"user turn 0"`)), "40 messages")
	require.Positive(t, want["last"])

	kept := warm.get("t", "", hist[0].ID)
	require.NotNil(t, kept, "the run kept its final state")
	assert.Equal(t, want, kept.sizes, "as kept by the runs")

	cold := NewStateCache(4, 0)
	snap, err := g.StateAt(ctx, RunConfig{Thread: "t", Store: store, Cache: cold}, "")
	require.NoError(t, err)
	folded := cold.get("t", "", hist[0].ID)
	require.NotNil(t, folded)
	assert.Equal(t, want, folded.sizes, "as folded from the store")

	// A budget below the thread's state: nothing is kept, and each turn
	// folds the thread again, to the same state.
	tiny := NewStateCache(4, 16)
	res, err := g.Invoke(ctx, RunConfig{Thread: "t", Store: store, Cache: tiny}, Push(msgs, "user turn 20"))
	require.NoError(t, err)
	n, bytes := tiny.Len()
	assert.Zero(t, n)
	assert.Zero(t, bytes)
	assert.Len(t, msgs.Get(res.State), len(msgs.Get(snap))+2)
	assert.Equal(t, "reply to message 41", last.Get(res.State))
}
