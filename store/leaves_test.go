package store

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// leafState returns a namespace's heads entry and branch IDs as stored.
func leafState(t *testing.T, d *DB, thread, ns string) (head string, branches []string) {
	t.Helper()
	branches = []string{}
	require.NoError(t, d.db.View(func(tx *bbolt.Tx) error {
		tr, err := openNSTree(tx, thread, ns)
		if err != nil {
			return err
		}
		head = tr.head
		if l := tr.leaves(); len(l) > 1 {
			branches = l[1:]
		}
		return nil
	}))
	return head, branches
}

func commitCkpt(t *testing.T, d *DB, thread, ns, id, parent string) {
	t.Helper()
	require.NoError(t, d.Commit(bg, &engine.Commit{Checkpoint: &engine.Checkpoint{
		Thread: thread, NS: ns, ID: id, ParentID: parent, Created: tc0}}))
}

func TestLeavesFollowForks(t *testing.T) {
	d := openTest(t)
	steps := []struct {
		id, parent string
		head       string
		branches   []string
	}{
		{"01", "", "01", []string{}},
		{"02", "01", "02", []string{}},
		{"03", "02", "03", []string{}},
		// A fork from 02: the old head becomes a branch head.
		{"04", "02", "04", []string{"03"}},
		// A step on the branch head: the branch moves along, and as the
		// newest it becomes the head.
		{"05", "03", "05", []string{"04"}},
		{"06", "05", "06", []string{"04"}},
		// Another fork, from the root.
		{"07", "01", "07", []string{"04", "06"}},
		// Committed below the head with no child: a branch head of its own.
		{"00", "", "07", []string{"00", "04", "06"}},
		// Its child, newer than everything, moves it.
		{"08", "00", "08", []string{"04", "06", "07"}},
	}
	for _, s := range steps {
		commitCkpt(t, d, "t", "", s.id, s.parent)
		head, branches := leafState(t, d, "t", "")
		assert.Equal(t, s.head, head, "after %s", s.id)
		assert.Equal(t, s.branches, branches, "after %s", s.id)
	}
	h, err := d.History(bg, "t", "", "", 0)
	require.NoError(t, err)
	assert.Len(t, h, len(steps))
	// Pruning keeps the head alone.
	rep, err := d.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	assert.Equal(t, 1, rep.Records[bucketHeads])
	assert.Equal(t, 3, rep.Records[bucketBranches])
}

// A step on the newest checkpoint, the common commit, writes no branch.
func TestStepOnHeadTouchesNoBranch(t *testing.T) {
	d := openTest(t)
	commitCkpt(t, d, "t", "", "01", "")
	for i := 2; i <= 50; i++ {
		commitCkpt(t, d, "t", "", fmt.Sprintf("%02d", i), fmt.Sprintf("%02d", i-1))
	}
	head, branches := leafState(t, d, "t", "")
	assert.Equal(t, "50", head)
	assert.Empty(t, branches)
	h, err := d.History(bg, "t", "", "40", 3)
	require.NoError(t, err)
	assert.Equal(t, []string{"39", "38", "37"}, []string{h[0].ID, h[1].ID, h[2].ID})
}

func TestCheckFindsLeafProblems(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(tx *bbolt.Tx) error
		want   []string
	}{
		{"missing heads entry", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketHeads).Delete(nsKey("t", ""))
		}, []string{
			`heads "t\x00": is missing (the namespace's newest checkpoint is 05)`,
			`branches "t\x00\x0003": its namespace has no heads entry`,
		}},
		{"head names a missing checkpoint", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketHeads).Put(nsKey("t", ""), encodeHead("09"))
		}, []string{
			`heads "t\x00": names checkpoint 09, which is missing`,
			`heads "t\x00": names checkpoint 09, but the namespace's newest is 05`,
			`recent "05\x00t\x00": checkpoint 05 is neither recorded in heads or branches nor the parent of a newer one: History does not list it`,
		}},
		{"head is not the newest", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketHeads).Put(nsKey("t", ""), encodeHead("03"))
		}, []string{
			`heads "t\x00": names checkpoint 03, but the namespace's newest is 05`,
			`branches "t\x00\x0003": is not older than the namespace's head 03`,
			`recent "05\x00t\x00": checkpoint 05 is neither recorded in heads or branches nor the parent of a newer one: History does not list it`,
		}},
		{"corrupt heads entry", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketHeads).Put(nsKey("t", ""), []byte("junk!"))
		}, []string{
			`heads "t\x00": checksum mismatch`,
		}},
		{"dangling branch", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketBranches).Put(branchKey("t", "", "00"), []byte{})
		}, []string{`branches "t\x00\x0000": names checkpoint 00, which is missing`}},
		{"branch that is not a leaf", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketBranches).Put(branchKey("t", "", "02"), []byte{})
		}, []string{`branches "t\x00\x0002": names checkpoint 02, which a newer checkpoint names as its parent`}},
		{"branch with a value", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketBranches).Put(branchKey("t", "", "03"), []byte("x"))
		}, []string{`branches "t\x00\x0003": holds 1 bytes, want none`}},
		{"unrecorded leaf", func(tx *bbolt.Tx) error {
			return bucket(tx, bucketBranches).Delete(branchKey("t", "", "03"))
		}, []string{`recent "03\x00t\x00": checkpoint 03 is neither recorded in heads or branches nor the parent of a newer one: History does not list it`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := openTest(t)
			for _, c := range [][2]string{{"01", ""}, {"02", "01"}, {"03", "02"}, {"04", "02"}, {"05", "04"}} {
				commitCkpt(t, d, "t", "", c[0], c[1])
			}
			rep, err := d.Check(bg)
			require.NoError(t, err)
			require.True(t, rep.OK(), "%v", rep.Problems)

			require.NoError(t, d.db.Update(tc.break_))
			rep, err = d.Check(bg)
			require.NoError(t, err)
			var got []string
			for _, p := range rep.Problems {
				got = append(got, p.String())
			}
			assert.ElementsMatch(t, tc.want, got)
		})
	}
}

func TestCorruptHeadIsReported(t *testing.T) {
	d := openTest(t)
	commitCkpt(t, d, "t", "", "01", "")
	flip(t, d, bucketHeads, nsKey("t", ""), 2)
	for name, read := range map[string]func() error{
		"newest":  func() error { _, err := d.Checkpoint(bg, "t", "", ""); return err },
		"history": func() error { _, err := d.History(bg, "t", "", "", 0); return err },
		"commit": func() error {
			return d.Commit(bg, &engine.Commit{Checkpoint: &engine.Checkpoint{Thread: "t", ID: "02", ParentID: "01"}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := read()
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, bucketHeads, ce.Bucket)
			assert.Equal(t, string(nsKey("t", "")), ce.Key)
			assert.True(t, strings.Contains(err.Error(), `bucket heads, key "t\x00"`), err.Error())
		})
	}
	_, err := d.Checkpoint(bg, "t", "", "01")
	assert.NoError(t, err, "a lookup by ID does not need the head")
}
