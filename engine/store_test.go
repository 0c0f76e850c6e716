package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

func TestBlobRefText(t *testing.T) {
	ref := engine.RefOf([]byte("hello"))
	require.Equal(t, uint32(5), ref.Len)
	s := ref.String()
	require.Regexp(t, `^xxh64:[0-9a-f]{16}:5$`, s)
	back, err := engine.ParseBlobRef(s)
	require.NoError(t, err)
	require.Equal(t, ref, back)

	for _, r := range []engine.BlobRef{{}, {Hash: 1, Len: 1}, {Hash: ^uint64(0), Len: ^uint32(0)}, {Hash: 0xab00cd, Len: 600}} {
		require.Equal(t, fmt.Sprintf("xxh64:%016x:%d", r.Hash, r.Len), r.String())
	}

	text, err := ref.MarshalText()
	require.NoError(t, err)
	var u engine.BlobRef
	require.NoError(t, u.UnmarshalText(text))
	require.Equal(t, ref, u)

	for _, bad := range []string{"", "xxh64", "sha1:0123456789abcdef:1", "xxh64:0123:1", "xxh64:0123456789abcdeg:1", "xxh64:0123456789abcdef:-1", "xxh64:0123456789abcdef:4294967296", "xxh64:0123456789abcdef:1:2"} {
		_, err := engine.ParseBlobRef(bad)
		require.Error(t, err, "%q", bad)
	}
	require.True(t, engine.BlobRef{}.IsZero())
	require.False(t, ref.IsZero())
}

func TestMemoryStoreBlobs(t *testing.T) {
	ctx := context.Background()
	m := engine.NewMemoryStore()
	data := []byte(strings.Repeat("x", 1000))
	ref, err := m.PutBlob(ctx, data)
	require.NoError(t, err)
	again, err := m.PutBlob(ctx, data)
	require.NoError(t, err)
	require.Equal(t, ref, again)
	_, blobs, _ := m.Stats()
	require.Equal(t, 1, blobs)
	got, err := m.Blob(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, data, got)
	_, err = m.Blob(ctx, engine.RefOf([]byte("absent")))
	require.ErrorIs(t, err, engine.ErrBlobNotFound)

	// A commit whose blob does not match its reference changes nothing.
	err = m.Commit(ctx, &engine.Commit{
		Blobs:      map[engine.BlobRef][]byte{ref: []byte("other bytes")},
		Checkpoint: &engine.Checkpoint{Thread: "t", ID: "0000000000000001"},
	})
	require.Error(t, err)
	_, err = m.Checkpoint(ctx, "t", "", "")
	require.ErrorIs(t, err, engine.ErrCheckpointNotFound)
	_, err = m.Run(ctx, "run_x")
	require.ErrorIs(t, err, engine.ErrRunNotFound)
}

func FuzzParseBlobRef(f *testing.F) {
	f.Add("xxh64:0123456789abcdef:42")
	f.Add(engine.RefOf([]byte("seed")).String())
	f.Add("xxh64:FFFFFFFFFFFFFFFF:0")
	f.Add("xxh64::")
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := engine.ParseBlobRef(s)
		if err != nil {
			return
		}
		// Whatever parses renders to a canonical form that parses back to
		// the same reference.
		back, err := engine.ParseBlobRef(ref.String())
		if err != nil {
			t.Fatalf("%q parsed, but its canonical form %q does not: %v", s, ref.String(), err)
		}
		if back != ref {
			t.Fatalf("%q: round trip gave %v, want %v", s, back, ref)
		}
	})
}
