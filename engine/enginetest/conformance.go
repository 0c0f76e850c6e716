package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// RunStoreSuite runs the conformance suite. open must return an empty store
// for each call; it is called once per subtest.
func RunStoreSuite(t *testing.T, open func(t *testing.T) engine.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s engine.Store)
	}{
		{"CheckpointRoundTrip", testCheckpointRoundTrip},
		{"CheckpointLatestAndByID", testCheckpointLatestAndByID},
		{"CheckpointNotFound", testCheckpointNotFound},
		{"CheckpointOverwrite", testCheckpointOverwrite},
		{"NamespacesAndThreadsAreSeparate", testNamespacesSeparate},
		{"History", testHistory},
		{"HistoryBranches", testHistoryBranches},
		{"OutOfOrderCommits", testOutOfOrderCommits},
		{"OverwriteChangesParent", testOverwriteChangesParent},
		{"CommitEarlier", testCommitEarlier},
		{"HistoryMatchesModel", testHistoryMatchesModel},
		{"Writes", testWrites},
		{"Blobs", testBlobs},
		{"CommitBlobsWithCheckpoint", testCommitBlobs},
		{"CommitIsAtomic", testCommitAtomic},
		{"EmptyCommit", testEmptyCommit},
		{"Runs", testRuns},
		{"RunNotFound", testRunNotFound},
		{"RunsFilterAndPaging", testRunsFilterPaging},
		{"ConcurrentCommits", testConcurrentCommits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

func ckpt(thread, ns, id, parent string, step int) *engine.Checkpoint {
	return &engine.Checkpoint{
		Thread: thread, NS: ns, ID: id, ParentID: parent, RunID: "run-" + thread,
		Step: step, Source: engine.SourceLoop, Nodes: []string{"n" + id},
		Channels: []engine.ChannelValue{{Channel: "c", Version: uint64(step + 1), Value: engine.Value{Inline: []byte(fmt.Sprintf("%d", step))}}},
		Created:  t0.Add(time.Duration(step) * time.Second),
	}
}

func commit(t *testing.T, s engine.Store, c *engine.Commit) {
	t.Helper()
	c.Sync = true
	require.NoError(t, s.Commit(context.Background(), c))
}

func ids(cs []*engine.Checkpoint) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func testCheckpointRoundTrip(t *testing.T, s engine.Store) {
	ctx := context.Background()
	big := bytes.Repeat([]byte("x"), engine.BlobThreshold+1)
	ref := engine.RefOf(big)
	want := &engine.Checkpoint{
		Thread: "t1", NS: "parent/node:task", ID: "0002", ParentID: "0001", RunID: "r1",
		Step: 7, Source: engine.SourceFork, Nodes: []string{"a", "b"},
		Channels: []engine.ChannelValue{
			{Channel: "messages", Version: 3, Delta: true, Value: engine.Value{Inline: []byte(`["hi"]`)}},
			{Channel: "doc", Version: 9, Value: engine.Value{Blob: ref}},
			{Channel: "empty", Version: 1, Value: engine.Value{}},
		},
		Next: []engine.TaskSpec{
			{ID: "task-1", Node: "a"},
			{ID: "task-2", Node: "b", Input: []byte(`{"item":1}`)},
		},
		Created: t0,
	}
	commit(t, s, &engine.Commit{Checkpoint: want, Blobs: map[engine.BlobRef][]byte{ref: big}})

	got, err := s.Checkpoint(ctx, "t1", "parent/node:task", "0002")
	require.NoError(t, err)
	assert.True(t, want.Created.Equal(got.Created), "created %v, want %v", got.Created, want.Created)
	got.Created = want.Created
	assert.Equal(t, want, got)

	b, err := s.Blob(ctx, ref)
	require.NoError(t, err)
	assert.Equal(t, big, b)
}

func testCheckpointLatestAndByID(t *testing.T, s engine.Store) {
	ctx := context.Background()
	// Committed out of order: "latest" means the greatest ID, not the last
	// written.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0002", "0001", 2)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0003", "0002", 3)})

	latest, err := s.Checkpoint(ctx, "t", "", "")
	require.NoError(t, err)
	assert.Equal(t, "0003", latest.ID)
	assert.Equal(t, 3, latest.Step)

	first, err := s.Checkpoint(ctx, "t", "", "0001")
	require.NoError(t, err)
	assert.Equal(t, "0001", first.ID)
	assert.Equal(t, "", first.ParentID)
}

func testCheckpointNotFound(t *testing.T, s engine.Store) {
	ctx := context.Background()
	_, err := s.Checkpoint(ctx, "nobody", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)

	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	for _, tc := range []struct{ name, thread, ns, id string }{
		{"unknown id", "t", "", "0009"},
		{"prefix of an id", "t", "", "000"},
		{"other namespace", "t", "sub", ""},
		{"other thread", "u", "", "0001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Checkpoint(ctx, tc.thread, tc.ns, tc.id)
			assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
		})
	}
}

func testCheckpointOverwrite(t *testing.T, s engine.Store) {
	ctx := context.Background()
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	c := ckpt("t", "", "0001", "", 5)
	commit(t, s, &engine.Commit{Checkpoint: c})
	got, err := s.Checkpoint(ctx, "t", "", "0001")
	require.NoError(t, err)
	assert.Equal(t, 5, got.Step)
	h, err := s.History(ctx, "t", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, 1)
}

func testNamespacesSeparate(t *testing.T, s engine.Store) {
	ctx := context.Background()
	// Thread "t" with namespaces "" and "a", and a thread "ta" whose name
	// shares a prefix with "t".
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "a", "0005", "", 5)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("ta", "", "0009", "", 9)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "a/b", "0007", "", 7)})

	for _, tc := range []struct {
		thread, ns string
		want       []string
	}{
		{"t", "", []string{"0001"}},
		{"t", "a", []string{"0005"}},
		{"t", "a/b", []string{"0007"}},
		{"ta", "", []string{"0009"}},
	} {
		h, err := s.History(ctx, tc.thread, tc.ns, "", 0)
		require.NoError(t, err)
		assert.Equal(t, tc.want, ids(h), "thread %q ns %q", tc.thread, tc.ns)
		latest, err := s.Checkpoint(ctx, tc.thread, tc.ns, "")
		require.NoError(t, err)
		assert.Equal(t, tc.want[0], latest.ID)
	}
}

func testHistory(t *testing.T, s engine.Store) {
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", fmt.Sprintf("%04d", i), fmt.Sprintf("%04d", i-1), i)})
	}
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "sub", "0003", "", 3)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("u", "", "0009", "", 9)})

	tests := []struct {
		name   string
		before string
		limit  int
		want   []string
	}{
		{"all newest first", "", 0, []string{"0005", "0004", "0003", "0002", "0001"}},
		{"limit", "", 2, []string{"0005", "0004"}},
		{"before", "0004", 0, []string{"0003", "0002", "0001"}},
		{"before and limit", "0004", 2, []string{"0003", "0002"}},
		{"before an absent id", "0003x", 0, []string{"0003", "0002", "0001"}},
		{"before the first", "0001", 0, []string{}},
		{"before past the end", "9999", 1, []string{"0005"}},
		{"limit above count", "", 10, []string{"0005", "0004", "0003", "0002", "0001"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := s.History(ctx, "t", "", tc.before, tc.limit)
			require.NoError(t, err)
			assert.Equal(t, tc.want, ids(h))
		})
	}
	h, err := s.History(ctx, "nobody", "", "", 0)
	require.NoError(t, err)
	assert.Empty(t, h)
}

// historyCase is one History call and the IDs it must return.
type historyCase struct {
	before string
	limit  int
	want   []string
}

func checkHistory(t *testing.T, s engine.Store, thread, ns, latest string, cases []historyCase) {
	t.Helper()
	ctx := context.Background()
	c, err := s.Checkpoint(ctx, thread, ns, "")
	require.NoError(t, err)
	assert.Equal(t, latest, c.ID, "latest")
	for _, tc := range cases {
		h, err := s.History(ctx, thread, ns, tc.before, tc.limit)
		require.NoError(t, err)
		assert.Equal(t, tc.want, ids(h), "before %q limit %d", tc.before, tc.limit)
	}
}

func testHistoryBranches(t *testing.T, s engine.Store) {
	// A main line 1..5, a fork from 3 (6, 7), a fork from 5 (8) and a
	// step on the first fork's head after that (9): History lists every
	// branch, merged newest first.
	for _, c := range [][2]string{
		{"0001", ""}, {"0002", "0001"}, {"0003", "0002"}, {"0004", "0003"}, {"0005", "0004"},
		{"0006", "0003"}, {"0007", "0006"}, {"0008", "0005"}, {"0009", "0007"},
	} {
		commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", c[0], c[1], 1)})
	}
	all := []string{"0009", "0008", "0007", "0006", "0005", "0004", "0003", "0002", "0001"}
	checkHistory(t, s, "t", "", "0009", []historyCase{
		{"", 0, all},
		{"", 1, all[:1]},
		{"", 3, all[:3]},
		{"0008", 2, []string{"0007", "0006"}},
		{"0006", 0, all[4:]},
		{"0004", 1, []string{"0003"}},
		{"0001", 0, []string{}},
	})
	// A fork from the middle becomes the newest.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0010", "0002", 10)})
	checkHistory(t, s, "t", "", "0010", []historyCase{
		{"", 0, append([]string{"0010"}, all...)},
		{"", 2, []string{"0010", "0009"}},
	})
}

func testOutOfOrderCommits(t *testing.T, s engine.Store) {
	// Children before their parents, and IDs below the newest.
	for _, c := range [][2]string{
		{"0005", "0004"}, {"0003", "0002"}, {"0004", "0003"}, {"0001", ""}, {"0002", "0001"},
	} {
		commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", c[0], c[1], 1)})
	}
	checkHistory(t, s, "t", "", "0005", []historyCase{
		{"", 0, []string{"0005", "0004", "0003", "0002", "0001"}},
		{"", 2, []string{"0005", "0004"}},
	})
	// A lone checkpoint below the newest, whose parent is not stored, and
	// one whose parent is newer than itself.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("u", "", "0010", "0009", 1)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("u", "", "0002", "", 1)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("u", "", "0003", "0010", 1)})
	checkHistory(t, s, "u", "", "0010", []historyCase{
		{"", 0, []string{"0010", "0003", "0002"}},
		{"0010", 1, []string{"0003"}},
	})
}

func testOverwriteChangesParent(t *testing.T, s engine.Store) {
	for _, c := range [][2]string{{"0001", ""}, {"0002", "0001"}, {"0003", "0002"}} {
		commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", c[0], c[1], 1)})
	}
	// 0003 now hangs off 0001: 0002 loses its only child.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0003", "0001", 7)})
	checkHistory(t, s, "t", "", "0003", []historyCase{{"", 0, []string{"0003", "0002", "0001"}}})
	got, err := s.Checkpoint(context.Background(), "t", "", "0003")
	require.NoError(t, err)
	assert.Equal(t, "0001", got.ParentID)
	assert.Equal(t, 7, got.Step)
	// And back, and then without a parent.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0003", "0002", 8)})
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0002", "", 9)})
	checkHistory(t, s, "t", "", "0003", []historyCase{
		{"", 0, []string{"0003", "0002", "0001"}},
		{"0003", 1, []string{"0002"}},
	})
}

func testCommitEarlier(t *testing.T, s engine.Store) {
	ctx := context.Background()
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	// A run's input checkpoint commits with its first step.
	input := ckpt("t", "", "0002", "0001", 2)
	input.Source = engine.SourceInput
	commit(t, s, &engine.Commit{
		Earlier:    []*engine.Checkpoint{input},
		Checkpoint: ckpt("t", "", "0003", "0002", 3),
	})
	checkHistory(t, s, "t", "", "0003", []historyCase{{"", 0, []string{"0003", "0002", "0001"}}})
	got, err := s.Checkpoint(ctx, "t", "", "0002")
	require.NoError(t, err)
	assert.Equal(t, engine.SourceInput, got.Source)

	// Earlier alone, and two of them in other namespaces.
	commit(t, s, &engine.Commit{Earlier: []*engine.Checkpoint{ckpt("t", "", "0004", "0003", 4)}})
	commit(t, s, &engine.Commit{Earlier: []*engine.Checkpoint{ckpt("t", "a", "0005", "", 5), ckpt("u", "", "0006", "", 6)}})
	checkHistory(t, s, "t", "", "0004", []historyCase{{"", 0, []string{"0004", "0003", "0002", "0001"}}})
	checkHistory(t, s, "t", "a", "0005", []historyCase{{"", 0, []string{"0005"}}})
	checkHistory(t, s, "u", "", "0006", []historyCase{{"", 0, []string{"0006"}}})

	// A failed commit writes none of its earlier checkpoints.
	bad := engine.RefOf([]byte("other bytes"))
	err = s.Commit(ctx, &engine.Commit{
		Earlier:    []*engine.Checkpoint{ckpt("v", "", "0001", "", 1)},
		Checkpoint: ckpt("v", "", "0002", "0001", 2),
		Blobs:      map[engine.BlobRef][]byte{bad: []byte("not those")},
		Sync:       true,
	})
	require.Error(t, err)
	_, err = s.Checkpoint(ctx, "v", "", "0001")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
}

// testHistoryMatchesModel commits pseudo-random checkpoints (forks,
// out-of-order IDs, missing parents, rewrites) and compares every
// namespace's listing with what the definition says: all its checkpoints,
// newest first.
func testHistoryMatchesModel(t *testing.T, s engine.Store) {
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(7, 11))
	model := map[string]map[string]bool{} // ns -> IDs
	nss := []string{"", "a"}
	for i := range 300 {
		ns := nss[rnd.IntN(len(nss))]
		if model[ns] == nil {
			model[ns] = map[string]bool{}
		}
		var id string
		if i%10 == 9 || rnd.IntN(4) == 0 {
			id = fmt.Sprintf("%04d", rnd.IntN(60)) // below the newest, or a rewrite
		} else {
			id = fmt.Sprintf("%04d", 60+i)
		}
		parent := ""
		switch r := rnd.IntN(10); {
		case r < 6 && len(model[ns]) > 0:
			existing := slices.Sorted(maps.Keys(model[ns]))
			// Mostly the newest, sometimes an older one (a fork).
			if r < 4 {
				parent = existing[len(existing)-1]
			} else {
				parent = existing[rnd.IntN(len(existing))]
			}
		case r < 8:
			parent = fmt.Sprintf("%04d", rnd.IntN(400)) // maybe not stored yet, maybe newer
		}
		if parent == id {
			parent = ""
		}
		commit(t, s, &engine.Commit{Checkpoint: ckpt("t", ns, id, parent, i)})
		model[ns][id] = true
	}
	for _, ns := range nss {
		want := slices.Sorted(maps.Keys(model[ns]))
		slices.Reverse(want)
		cases := []historyCase{{"", 0, want}, {"", 5, want[:5]}}
		for _, at := range []int{1, len(want) / 3, len(want) / 2, len(want) - 1} {
			cases = append(cases, historyCase{want[at], 0, want[at+1:]}, historyCase{want[at], 4, want[at+1 : min(at+5, len(want))]})
		}
		checkHistory(t, s, "t", ns, want[0], cases)
	}
	_, err := s.Checkpoint(ctx, "t", "b", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
}

func testWrites(t *testing.T, s engine.Store) {
	ctx := context.Background()
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
	w := func(task, kind string, i int) engine.CommitWrites {
		pw := engine.PendingWrite{TaskID: task, Node: "n", Kind: kind}
		switch kind {
		case engine.WriteKindWrites:
			pw.Writes = []engine.ChannelValue{{Channel: "c", Version: uint64(i), Value: engine.Value{Inline: []byte(fmt.Sprint(i))}}}
		default:
			pw.Data = json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))
		}
		return engine.CommitWrites{Thread: "t", NS: "", CheckpointID: "0001", Write: pw}
	}
	commit(t, s, &engine.Commit{Writes: []engine.CommitWrites{w("b", engine.WriteKindWrites, 1), w("a", engine.WriteKindWrites, 2)}})
	commit(t, s, &engine.Commit{Writes: []engine.CommitWrites{w("c", engine.WriteKindInterrupt, 3)}})
	commit(t, s, &engine.Commit{Writes: []engine.CommitWrites{w("c", engine.WriteKindResume, 4)}})
	// Writes of another checkpoint, another namespace and a checkpoint
	// whose ID extends this one's must not show up.
	other := w("x", engine.WriteKindError, 5)
	other.CheckpointID = "0002"
	other2 := w("y", engine.WriteKindError, 6)
	other2.NS = "sub"
	other3 := w("z", engine.WriteKindError, 7)
	other3.CheckpointID = "00010"
	commit(t, s, &engine.Commit{Writes: []engine.CommitWrites{other, other2, other3}})

	got, err := s.Writes(ctx, "t", "", "0001")
	require.NoError(t, err)
	want := []engine.PendingWrite{w("b", engine.WriteKindWrites, 1).Write, w("a", engine.WriteKindWrites, 2).Write,
		w("c", engine.WriteKindInterrupt, 3).Write, w("c", engine.WriteKindResume, 4).Write}
	assert.Equal(t, want, got)

	none, err := s.Writes(ctx, "t", "", "0009")
	require.NoError(t, err)
	assert.Empty(t, none)
}

func testBlobs(t *testing.T, s engine.Store) {
	ctx := context.Background()
	data := []byte("a payload that is stored once")
	ref, err := s.PutBlob(ctx, data)
	require.NoError(t, err)
	assert.Equal(t, engine.RefOf(data), ref)

	again, err := s.PutBlob(ctx, bytes.Clone(data))
	require.NoError(t, err, "storing the same bytes again is deduplicated")
	assert.Equal(t, ref, again)

	got, err := s.Blob(ctx, ref)
	require.NoError(t, err)
	assert.Equal(t, data, got)

	empty, err := s.PutBlob(ctx, []byte{})
	require.NoError(t, err)
	got, err = s.Blob(ctx, empty)
	require.NoError(t, err)
	assert.Empty(t, got)

	_, err = s.Blob(ctx, engine.RefOf([]byte("never stored")))
	assert.ErrorIs(t, err, engine.ErrBlobNotFound)
	// Same hash, other length: a different reference.
	_, err = s.Blob(ctx, engine.BlobRef{Hash: ref.Hash, Len: ref.Len + 1})
	assert.ErrorIs(t, err, engine.ErrBlobNotFound)
}

func testCommitBlobs(t *testing.T, s engine.Store) {
	ctx := context.Background()
	big := bytes.Repeat([]byte("y"), 2*engine.BlobThreshold)
	ref := engine.RefOf(big)
	c := ckpt("t", "", "0001", "", 1)
	c.Channels[0].Value = engine.Value{Blob: ref}
	commit(t, s, &engine.Commit{Checkpoint: c, Blobs: map[engine.BlobRef][]byte{ref: big}})
	// A second commit offering the same blob deduplicates it.
	c2 := ckpt("u", "", "0001", "", 1)
	c2.Channels[0].Value = engine.Value{Blob: ref}
	commit(t, s, &engine.Commit{Checkpoint: c2, Blobs: map[engine.BlobRef][]byte{ref: bytes.Clone(big)}})

	got, err := s.Blob(ctx, ref)
	require.NoError(t, err)
	assert.Equal(t, big, got)
}

func testCommitAtomic(t *testing.T, s engine.Store) {
	ctx := context.Background()
	good := []byte("good")
	// A blob offered under a reference that is not its own fails the whole
	// commit: nothing of it is visible afterwards.
	bad := engine.RefOf([]byte("other bytes"))
	err := s.Commit(ctx, &engine.Commit{
		Checkpoint: ckpt("t", "", "0001", "", 1),
		Blobs:      map[engine.BlobRef][]byte{engine.RefOf(good): good, bad: []byte("not those")},
		Writes: []engine.CommitWrites{{Thread: "t", CheckpointID: "0001",
			Write: engine.PendingWrite{TaskID: "a", Kind: engine.WriteKindError, Data: json.RawMessage(`{}`)}}},
		Run:  &engine.Run{ID: "r1", Thread: "t", Status: engine.StatusRunning, CreatedAt: t0},
		Sync: true,
	})
	require.Error(t, err)

	_, err = s.Checkpoint(ctx, "t", "", "")
	assert.ErrorIs(t, err, engine.ErrCheckpointNotFound)
	ws, err := s.Writes(ctx, "t", "", "0001")
	require.NoError(t, err)
	assert.Empty(t, ws)
	_, err = s.Run(ctx, "r1")
	assert.ErrorIs(t, err, engine.ErrRunNotFound)
	_, err = s.Blob(ctx, engine.RefOf(good))
	assert.ErrorIs(t, err, engine.ErrBlobNotFound)

	// The store still takes commits.
	commit(t, s, &engine.Commit{Checkpoint: ckpt("t", "", "0001", "", 1)})
}

func testEmptyCommit(t *testing.T, s engine.Store) {
	commit(t, s, &engine.Commit{})
	commit(t, s, &engine.Commit{Events: []engine.Event{{Type: engine.EventCheckpoint}}})
}

func run(id, thread, agent string, status engine.RunStatus) *engine.Run {
	return &engine.Run{
		ID: id, Thread: thread, Agent: agent, Status: status,
		Bundle:        engine.BundleRef{Name: "ref", Version: 3, Digest: "sha256:abc"},
		CorrelationID: "corr-" + id, CreatedAt: t0,
	}
}

func testRuns(t *testing.T, s engine.Store) {
	ctx := context.Background()
	want := run("r1", "t", "agent", engine.StatusInterrupted)
	want.Input = json.RawMessage(`{"text": "hello"}`)
	want.Interrupts = []engine.PendingInterrupt{{ID: "i1", Node: "review", TaskID: "task", Index: 0, Payload: json.RawMessage(`{"draft":"x"}`)}}
	want.Decisions = []engine.DecisionRecord{{Interrupt: "i0", Decision: "approve", At: t0}}
	want.Checkpoint = "0003"
	want.Steps = 3
	want.Durability = engine.DurabilitySync
	want.Meta = map[string]string{"k": "v"}
	want.StartedAt = t0.Add(time.Second)
	commit(t, s, &engine.Commit{Run: want})

	got, err := s.Run(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, want, got)

	// The store keeps its own copy.
	got.Status = engine.StatusFailed
	got.Meta["k"] = "changed"
	again, err := s.Run(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, engine.StatusInterrupted, again.Status)
	assert.Equal(t, "v", again.Meta["k"])

	// A later commit replaces the record.
	done := want.Clone()
	done.Status = engine.StatusCompleted
	done.Interrupts = nil
	done.Output = json.RawMessage(`"bye"`)
	done.EndedAt = t0.Add(time.Minute)
	commit(t, s, &engine.Commit{Run: done})
	got, err = s.Run(ctx, "r1")
	require.NoError(t, err)
	assert.Equal(t, done, got)
}

func testRunNotFound(t *testing.T, s engine.Store) {
	_, err := s.Run(context.Background(), "nope")
	assert.ErrorIs(t, err, engine.ErrRunNotFound)
}

func testRunsFilterPaging(t *testing.T, s engine.Store) {
	ctx := context.Background()
	// Committed out of ID order: lists are in ID order.
	for _, r := range []*engine.Run{
		run("r3", "t2", "a", engine.StatusRunning),
		run("r1", "t1", "a", engine.StatusCompleted),
		run("r5", "t1", "b", engine.StatusCompleted),
		run("r2", "t1", "a", engine.StatusInterrupted),
		run("r4", "t2", "b", engine.StatusCompleted),
	} {
		commit(t, s, &engine.Commit{Run: r})
	}
	runIDs := func(rs []*engine.Run) []string {
		out := []string{}
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	tests := []struct {
		name string
		f    engine.RunFilter
		want []string
	}{
		{"all", engine.RunFilter{}, []string{"r1", "r2", "r3", "r4", "r5"}},
		{"status", engine.RunFilter{Status: engine.StatusCompleted}, []string{"r1", "r4", "r5"}},
		{"agent", engine.RunFilter{Agent: "b"}, []string{"r4", "r5"}},
		{"thread", engine.RunFilter{Thread: "t1"}, []string{"r1", "r2", "r5"}},
		{"combined", engine.RunFilter{Thread: "t1", Status: engine.StatusCompleted, Agent: "a"}, []string{"r1"}},
		{"limit", engine.RunFilter{Limit: 2}, []string{"r1", "r2"}},
		{"after", engine.RunFilter{After: "r2", Limit: 2}, []string{"r3", "r4"}},
		{"after an absent id", engine.RunFilter{After: "r2x"}, []string{"r3", "r4", "r5"}},
		{"after the last", engine.RunFilter{After: "r5"}, []string{}},
		{"filter then page", engine.RunFilter{Status: engine.StatusCompleted, After: "r1", Limit: 1}, []string{"r4"}},
		{"no match", engine.RunFilter{Agent: "nobody"}, []string{}},
		{"newest first", engine.RunFilter{Desc: true}, []string{"r5", "r4", "r3", "r2", "r1"}},
		{"newest first, limit", engine.RunFilter{Desc: true, Limit: 2}, []string{"r5", "r4"}},
		{"newest first, after", engine.RunFilter{Desc: true, After: "r4", Limit: 2}, []string{"r3", "r2"}},
		{"newest first, after an absent id", engine.RunFilter{Desc: true, After: "r3x"}, []string{"r3", "r2", "r1"}},
		{"newest first, after one past the last", engine.RunFilter{Desc: true, After: "r9"}, []string{"r5", "r4", "r3", "r2", "r1"}},
		{"newest first, after the first", engine.RunFilter{Desc: true, After: "r1"}, []string{}},
		{"newest first, filtered", engine.RunFilter{Desc: true, Status: engine.StatusCompleted, After: "r5"}, []string{"r4", "r1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := s.Runs(ctx, tc.f)
			require.NoError(t, err)
			assert.Equal(t, tc.want, runIDs(rs))
		})
	}
	// Paging through everything with the last ID as the cursor.
	var all []string
	after := ""
	for {
		rs, err := s.Runs(ctx, engine.RunFilter{After: after, Limit: 2})
		require.NoError(t, err)
		if len(rs) == 0 {
			break
		}
		all = append(all, runIDs(rs)...)
		after = rs[len(rs)-1].ID
	}
	assert.Equal(t, []string{"r1", "r2", "r3", "r4", "r5"}, all)
	// And backwards, newest first.
	all, after = nil, ""
	for {
		rs, err := s.Runs(ctx, engine.RunFilter{After: after, Limit: 2, Desc: true})
		require.NoError(t, err)
		if len(rs) == 0 {
			break
		}
		all = append(all, runIDs(rs)...)
		after = rs[len(rs)-1].ID
	}
	assert.Equal(t, []string{"r5", "r4", "r3", "r2", "r1"}, all)
}

func testConcurrentCommits(t *testing.T, s engine.Store) {
	ctx := context.Background()
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thread := fmt.Sprintf("t%d", w)
			for i := 1; i <= each; i++ {
				id := fmt.Sprintf("%04d", i)
				data := []byte(fmt.Sprintf("shared blob %d", i%3)) // shared across threads
				c := ckpt(thread, "", id, fmt.Sprintf("%04d", i-1), i)
				c.Channels[0].Value = engine.Value{Blob: engine.RefOf(data)}
				r := run("run-"+thread, thread, "a", engine.StatusRunning)
				r.Checkpoint = id
				err := s.Commit(ctx, &engine.Commit{
					Checkpoint: c, Run: r, Sync: true,
					Blobs: map[engine.BlobRef][]byte{engine.RefOf(data): data},
					Writes: []engine.CommitWrites{{Thread: thread, CheckpointID: id,
						Write: engine.PendingWrite{TaskID: "task", Kind: engine.WriteKindWrites}}},
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for w := range workers {
		thread := fmt.Sprintf("t%d", w)
		h, err := s.History(ctx, thread, "", "", 0)
		require.NoError(t, err)
		assert.Len(t, h, each)
		r, err := s.Run(ctx, "run-"+thread)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("%04d", each), r.Checkpoint)
		for _, c := range h {
			_, err := s.Blob(ctx, c.Channels[0].Value.Blob)
			require.NoError(t, err)
			ws, err := s.Writes(ctx, thread, "", c.ID)
			require.NoError(t, err)
			assert.Len(t, ws, 1)
		}
	}
}
