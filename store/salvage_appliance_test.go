package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// zeroRoots clears the root pages that the meta pages of the store file b
// name, so that no meta page leads to any bucket.
func zeroRoots(b []byte) []byte {
	ps := int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
	for _, m := range []boltMeta{readMeta(b), readMeta(b[ps:])} {
		clear(b[int(m.root)*ps : int(m.root+1)*ps])
	}
	return b
}

// stepsOnly writes a store of checkpoints alone, with no run ended and so
// no outcome, committed one step at a time: its free pages hold the root
// pages that each commit replaced. It returns the file's bytes and its
// appliance ID.
func stepsOnly(t *testing.T) ([]byte, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path, Options{ApplianceID: "clinic-north-3"})
	require.NoError(t, err)
	for i := 1; i <= 40; i++ {
		require.NoError(t, d.Commit(bg, stepCommit(fmt.Sprintf("t%d", i%3), i)))
	}
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b, "clinic-north-3"
}

// stepsCopy writes a backup (one that keeps the file's free pages, among
// them the root page that the commit before the last replaced, with its
// inline meta bucket) or a compacted copy (one with no free page) of the
// store file steps, with its root pages cleared, and returns its path.
func stepsCopy(t *testing.T, steps []byte, backup bool) string {
	t.Helper()
	src := writeStore(t, steps)
	d, err := Open(src, Options{ReadOnly: !backup})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "copy.db")
	if backup {
		require.NoError(t, d.BackupFile(bg, path))
	} else {
		require.NoError(t, d.Compact(bg, path))
	}
	require.NoError(t, d.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return writeStore(t, zeroRoots(b))
}

// applianceOfCopy is the appliance ID that the salvaged store at path
// opens with, and sends its outcomes as.
func applianceOfCopy(t *testing.T, path string) string {
	t.Helper()
	d, err := Open(path, Options{})
	require.NoError(t, err)
	defer d.Close()
	st, err := d.Ledger(bg)
	require.NoError(t, err)
	return st.ApplianceID
}

// A salvage whose root page is lost keeps the appliance ID: the outcomes
// it copies carry it, and without them an older copy of the meta bucket
// still names it, or the operator gives it. Before, the copy got a new ID,
// and its ledger, chained under the old one, could no longer go upstream:
// the collector takes a batch only when its records carry the batch's ID.
func TestSalvageKeepsTheApplianceID(t *testing.T) {
	good, _, _, want := backupFixture(t)
	id := string(want[bucketMeta][string(metaAppliance)])
	require.NotEmpty(t, id)
	steps, stepsID := stepsOnly(t)

	t.Run("from the outcomes", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		rep, err := Salvage(bg, writeStore(t, zeroRoots(slices.Clone(good))), dst)
		require.NoError(t, err)
		require.NotZero(t, rep.Records[bucketOutcomes], "no outcome came back")
		assert.Equal(t, ApplianceFromOutcomes, rep.ApplianceFrom)
		assert.Equal(t, id, rep.ApplianceID)
		assert.Equal(t, id, applianceOfCopy(t, dst))
		for _, p := range rep.Lost {
			assert.NotContains(t, p.Message, "appliance ID is lost")
		}
	})
	t.Run("from an older copy of the meta bucket", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		rep, err := Salvage(bg, stepsCopy(t, steps, true), dst)
		require.NoError(t, err)
		require.Zero(t, rep.Records[bucketOutcomes])
		assert.Equal(t, ApplianceFromOldCopy, rep.ApplianceFrom, "%v", rep.Lost)
		assert.Equal(t, stepsID, applianceOfCopy(t, dst))
	})
	// A compacted store holds no free page, so nothing else names the ID.
	t.Run("nothing names it", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		rep, err := Salvage(bg, stepsCopy(t, steps, false), dst)
		require.NoError(t, err)
		assert.Equal(t, ApplianceFromNew, rep.ApplianceFrom)
		assert.NotEqual(t, stepsID, rep.ApplianceID)
		assert.Contains(t, rep.Lost, Problem{Bucket: bucketMeta, Message: "the appliance ID is lost, and nothing left in the file names it: " +
			"the copy gets a new one, which a collector takes for another appliance. If this appliance has sent outcomes upstream, " +
			"salvage again with --appliance-id ID, the ID it sends them as (serve's --appliance-id, or the collector's list of appliances)"})
	})
	t.Run("given", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		rep, err := SalvageWith(bg, stepsCopy(t, steps, false), dst, SalvageOptions{ApplianceID: stepsID})
		require.NoError(t, err)
		assert.Equal(t, ApplianceFromOption, rep.ApplianceFrom)
		assert.Equal(t, stepsID, applianceOfCopy(t, dst))
	})
	t.Run("given, but the outcomes carry another", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		_, err := SalvageWith(bg, writeStore(t, zeroRoots(slices.Clone(good))), dst, SalvageOptions{ApplianceID: "elsewhere"})
		require.ErrorIs(t, err, ErrApplianceID)
		require.ErrorContains(t, err, fmt.Sprintf("the outcomes copied carry appliance ID %q, not %q", id, "elsewhere"))
		assert.NoFileExists(t, dst)
		assert.NoFileExists(t, dst+".salvage")
	})
	t.Run("given, but the store names another", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		_, err := SalvageWith(bg, writeStore(t, slices.Clone(good)), dst, SalvageOptions{ApplianceID: "elsewhere"})
		require.ErrorIs(t, err, ErrApplianceID)
		assert.NotContains(t, err.Error(), "write ", "a refusal is not a failed write")
		assert.NoFileExists(t, dst)
	})
	t.Run("given, malformed", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "salvaged.db")
		_, err := SalvageWith(bg, writeStore(t, slices.Clone(good)), dst, SalvageOptions{ApplianceID: "a:b"})
		require.ErrorIs(t, err, ErrInvalidKey)
		assert.NoFileExists(t, dst)
	})
}

// Whatever a page holds, reading it for copies of the meta bucket does not
// panic, and every ID it returns is one the store would accept. The corpus
// holds a root page with an inline meta bucket, from a real store.
func FuzzApplianceCopies(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, id := range applianceCopies(page) {
			require.NoError(t, CheckApplianceID(id))
		}
	})
}

// Whatever a page holds, reading it for the stream epochs of older copies
// of the meta bucket does not panic, and returns only epochs that copies
// of the meta bucket on the page name. The corpus holds a root page with
// an inline meta bucket, from a real store.
func FuzzEpochCopies(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, page []byte) {
		epochs := epochCopies(page)
		if len(epochs) > 0 {
			require.NotEmpty(t, metaCopies(page))
		}
		require.LessOrEqual(t, len(epochs), len(metaCopies(page)))
	})
}

// A salvage whose copy lost outcomes that the collector acknowledged says
// so: the copy's next outcomes would take their seqs, and the collector
// refuses them as a fork. Before, nothing said it.
func TestSalvageSaysTheCollectorHoldsOutcomesTheCopyLost(t *testing.T) {
	src := filepath.Join(t.TempDir(), FileName)
	d, err := Open(src, Options{})
	require.NoError(t, err)
	const runs = 40
	for i := 1; i <= runs; i++ {
		th := fmt.Sprintf("t%02d", i)
		require.NoError(t, d.Commit(bg, stepCommit(th, i)))
		require.NoError(t, d.Commit(bg, &engine.Commit{Sync: true, Run: &engine.Run{ID: "run-" + th, Thread: th,
			Status: engine.StatusCompleted, Checkpoint: fmt.Sprintf("%04d", i), Output: []byte(`"done"`)}}))
	}
	require.NoError(t, d.AckOutcomes(bg, runs))
	// A compacted copy holds each record once, so the page cleared below
	// leaves no older copy of its outcomes behind.
	compacted := filepath.Join(t.TempDir(), "compacted.db")
	require.NoError(t, d.Compact(bg, compacted))
	require.NoError(t, d.Close())
	b, err := os.ReadFile(compacted)
	require.NoError(t, err)
	ps := int(binary.LittleEndian.Uint32(b[metaOffset+8:]))
	last := records(t, compacted)[bucketOutcomes][string(binary.BigEndian.AppendUint64(nil, runs))]
	i := bytes.Index(b, last)
	require.GreaterOrEqual(t, i, 0)
	clear(b[i/ps*ps : (i/ps+1)*ps])

	dst := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err := Salvage(bg, writeStore(t, b), dst)
	require.NoError(t, err)
	var kept uint64
	for k := range records(t, dst)[bucketOutcomes] {
		kept = max(kept, binary.BigEndian.Uint64([]byte(k)))
	}
	require.Less(t, kept, uint64(runs))
	assert.Contains(t, rep.Lost, Problem{Bucket: bucketOutcomes, Message: fmt.Sprintf(
		"the collector acknowledged outcomes up to seq %d, but the copy's ledger ends at %d: outcomes %d to %d are lost here "+
			"though the collector holds them, and the outcomes the copy appends next would take their seqs, which the collector "+
			"refuses as a fork of this appliance's chain. Restore a backup that holds them rather than use this copy, if there is one",
		runs, kept, kept+1, runs)})
}
