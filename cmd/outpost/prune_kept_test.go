package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

// keptDir is where the data folder data keeps the copy of the embedded
// bundle ref.
func keptDir(data string, ref engine.BundleRef) string {
	return filepath.Join(data, "firmware", ".embedded", ref.Name, strconv.FormatInt(ref.Version, 10)+"-"+strings.TrimPrefix(ref.Digest, "sha256:"))
}

// embeddedRef is the reference of the bundle the tagged binary embeds
// under env, read from the copy a run pinned to it kept in data.
func embeddedRef(t *testing.T, bin string, env []string, data string, before map[engine.BundleRef]bool) engine.BundleRef {
	t.Helper()
	code, stdout, stderr := outpostBinEnv(t, bin, env, "", "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var list struct{ Kept []firmware.Kept }
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	for _, k := range list.Kept {
		if !before[k.BundleRef] {
			before[k.BundleRef] = true
			return k.BundleRef
		}
	}
	t.Fatalf("no new kept copy in %s", stdout)
	return engine.BundleRef{}
}

// db prune removes the copies of embedded bundles kept for runs that no
// run refers to any more (here, after the store was restored from a
// backup taken before their runs), and never one that a run refers to: a
// run waiting for a person, a completed run. Through serve, the copy of
// serve's own embedded bundle stays, since serve may pin a new run to it
// at any moment; with serve stopped, a prune takes it, and the next run
// that pins that bundle keeps it again. The waiting run then completes on
// its own bundle under another binary.
func TestDBPruneReclaimsKeptCopiesNoRunRefersTo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, data := builtOutpostTagged(t), t.TempDir()
	envB := []string{"OUTPOST_TEST_REFERENCE=" + upgradedReference(t, "BINARY-B")}
	envC := []string{"OUTPOST_TEST_REFERENCE=" + upgradedReference(t, "BINARY-C")}
	envD := []string{"OUTPOST_TEST_REFERENCE=" + upgradedReference(t, "BINARY-D")}
	seen := map[engine.BundleRef]bool{}

	waiting := approvalWaitingRun(t, bin, nil, data, "waits")
	refA := embeddedRef(t, bin, nil, data, seen)
	code, _, stderr := outpostBinEnv(t, bin, envB, "", "run", "--data", data, "--thread", "done", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	refB := embeddedRef(t, bin, envB, data, seen)

	backup := filepath.Join(t.TempDir(), "before.db")
	code, _, stderr = outpostBinEnv(t, bin, nil, "", "db", "backup", "--data", data, backup)
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBinEnv(t, bin, envC, "", "run", "--data", data, "--thread", "c", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	refC := embeddedRef(t, bin, envC, data, seen)
	code, _, stderr = outpostBinEnv(t, bin, envD, "", "run", "--data", data, "--thread", "d", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	refD := embeddedRef(t, bin, envD, data, seen)
	// The store as it was before the runs on C and D: their copies are
	// referred to by no run now.
	raw, err := os.ReadFile(backup)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(data, "outpost.db"), raw, 0o600))

	s := startServeEnv(t, bin, envC, data)
	code, stdout, stderr := outpostBinEnv(t, bin, envC, "", "db", "prune", "--data", data, "--older-than", "0s", "--json")
	require.Zero(t, code, stderr)
	var rep struct {
		KeptRemoved *int `json:"kept_removed"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.NotNil(t, rep.KeptRemoved, stdout)
	require.Equal(t, 1, *rep.KeptRemoved, stdout)
	require.NoDirExists(t, keptDir(data, refD))
	require.DirExists(t, keptDir(data, refC), "serve's own embedded bundle went while serve ran")
	s.stop(t)

	code, stdout, stderr = outpostBinEnv(t, bin, envB, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "removed 1 kept copy(ies) of embedded bundles that no run refers to")
	require.NoDirExists(t, keptDir(data, refC))
	for _, ref := range []engine.BundleRef{refA, refB} {
		require.FileExists(t, filepath.Join(keptDir(data, ref), "manifest.json"), "a copy a run refers to went")
	}
	code, stdout, stderr = outpostBinEnv(t, bin, envB, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "kept copy")

	// Made again by the next run that pins it.
	code, _, stderr = outpostBinEnv(t, bin, envC, "", "run", "--data", data, "--thread", "c2", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpostBinEnv(t, bin, envB, "", "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, "%s%s", stdout, stderr)
	var list struct{ Kept []firmware.Kept }
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.ElementsMatch(t, []firmware.Kept{{BundleRef: refA}, {BundleRef: refB}, {BundleRef: refC}}, list.Kept)

	code, stdout, stderr = outpostBinEnv(t, bin, envB, "", "resume", "--data", data, "--decision", "approve", waiting)
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.NotContains(t, stdout, "BINARY-B", "the waiting run went on with another binary's bundle")
}

// keptCopyFolder returns a data folder where a finished run, on thread
// "t", kept a copy of the embedded reference bundle, and that copy's
// reference.
func keptCopyFolder(t *testing.T) (string, engine.BundleRef) {
	t.Helper()
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "t", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	ref, err := firmware.Reference()
	require.NoError(t, err)
	return data, ref.Ref()
}

// forgetRuns replaces the store of data with another folder's, which
// holds a single finished run, on thread "b": then no run refers to the
// copies data keeps.
func forgetRuns(t *testing.T, data string) {
	t.Helper()
	empty := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", empty, "--thread", "b", "--agent", "reference", "hi")
	require.Zero(t, code, stderr)
	fresh, err := os.ReadFile(filepath.Join(empty, "outpost.db"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(data, "outpost.db"), fresh, 0o600))
}

// A firmware folder that cannot be read (a damaged index) does not undo
// or fail the prune of the store: the kept copies stay, and the prune says
// why.
func TestDBPruneWithADamagedFirmwareIndexLeavesTheCopies(t *testing.T) {
	data, ref := keptCopyFolder(t)
	require.NoError(t, os.WriteFile(filepath.Join(data, "firmware", "index.json"), []byte("{"), 0o644))
	forgetRuns(t, data)

	code, stdout, stderr := outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "pruned 1 thread(s)")
	require.Contains(t, stdout, "skipped no kept copy of an embedded bundle was removed: firmware installer: ")
	require.FileExists(t, filepath.Join(keptDir(data, ref), "manifest.json"))
}

// A failure after the store's prune has committed (the kept copies cannot
// be listed: a file stands where their folder belongs, which stops root
// as it stops anyone, where a read-only folder would not) does not hide
// what the prune did: db prune prints its report, human or JSON, then the
// error, and exits 1, whether it prunes the store itself or through the
// process that owns it, where the failure is the owner's. The store's
// prune stands.
func TestDBPruneReportsWhatItDidBeforeAKeptCopyFailure(t *testing.T) {
	own, err := firmware.ReferenceRef()
	require.NoError(t, err)
	for _, c := range []struct{ asJSON, owned bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		asJSON := c.asJSON
		data, _ := keptCopyFolder(t)
		embedded := filepath.Join(data, "firmware", ".embedded")
		require.NoError(t, os.Rename(embedded, embedded+"-aside"))
		require.NoError(t, os.WriteFile(embedded, []byte("x"), 0o644))
		if c.owned {
			stop := serveStoreWith(t, data, func(db *store.DB) store.ControlOptions { return keptReclaimer(data, db, nil, nil, own) })
			defer stop()
		}

		args := []string{"db", "prune", "--data", data, "--older-than", "0s"}
		if asJSON {
			args = append(args, "--json")
		}
		code, stdout, stderr := outpostBin(t, "", args...)
		require.Equal(t, 1, code, "%s%s", stdout, stderr)
		if asJSON {
			var rep struct {
				Threads     int
				KeptRemoved *int `json:"kept_removed"`
			}
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
			require.Equal(t, 1, rep.Threads, stdout)
			require.NotNil(t, rep.KeptRemoved, stdout)
			require.Zero(t, *rep.KeptRemoved, stdout)
		} else {
			require.Contains(t, stdout, "pruned 1 thread(s): ")
		}
		then := "the store was pruned (reported above), then: "
		if c.owned {
			then += "store owner: "
		}
		require.Contains(t, stderr, then+"kept bundles: ")
		require.Contains(t, stderr, embedded+": not a directory")
		require.FileExists(t, embedded)

		code, stdout, stderr = outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
		require.Equal(t, 1, code, "%s%s", stdout, stderr)
		require.Contains(t, stdout, "pruned 0 thread(s): ", "the store's prune did not stand")
	}
}

// An owner whose control socket prunes the store alone (a serve from
// before the kept copies were reclaimed; here the store package's socket
// with no AfterPrune) reports no kept_removed: db prune through it says
// the copies were not looked at and what to do, and --json gives null,
// not 0. The copies, which no run refers to, stay.
func TestDBPruneThroughAnOwnerThatDoesNotReclaimKeptCopies(t *testing.T) {
	data, ref := keptCopyFolder(t)
	forgetRuns(t, data)
	serveStore(t, data)

	code, stdout, stderr := outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "pruned 1 thread(s): ")
	require.Contains(t, stdout, "the kept copies of embedded bundles in "+filepath.Join(data, "firmware", ".embedded")+
		" were not looked at: the store's owner (serve, or run) did not report them (an older binary?); "+
		"to remove those no run refers to, run outpost db prune --data "+data+" with it stopped, or upgrade it\n")
	require.NotContains(t, stdout, "kept copy(ies)")

	code, stdout, stderr = outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s", "--json")
	require.Zero(t, code, "%s%s", stdout, stderr)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	kept, ok := rep["kept_removed"]
	require.True(t, ok, "kept_removed left out: %s", stdout)
	require.Nil(t, kept, "kept_removed: %s", stdout)
	require.FileExists(t, filepath.Join(keptDir(data, ref), "manifest.json"))
}

// A file in the folder of kept copies that is no kept copy (a README, an
// editor's backup) fails neither firmware list nor db prune: both warn of
// it and pass over it, and it stays. The copy beside it is listed whole,
// and removed once no run refers to it.
func TestStrayFilesBesideKeptCopiesFailNothing(t *testing.T) {
	data, ref := keptCopyFolder(t)
	readme := filepath.Join(data, "firmware", ".embedded", "README")
	backup := keptDir(data, ref) + "~"
	for _, p := range []string{readme, backup} {
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	}
	warning := " is not a kept copy of an embedded bundle (a folder NAME/VERSION-SHA256): passed over, left as it is"

	code, stdout, stderr := outpostBin(t, "", "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, "%s%s", stdout, stderr)
	var list struct{ Kept []firmware.Kept }
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.Equal(t, []firmware.Kept{{BundleRef: ref}}, list.Kept)
	require.Contains(t, stderr, "warning: "+readme+warning)
	require.Contains(t, stderr, "warning: "+backup+warning)

	forgetRuns(t, data)
	code, stdout, stderr = outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "removed 1 kept copy(ies) of embedded bundles that no run refers to")
	require.Contains(t, stdout, "skipped "+readme+warning)
	require.Contains(t, stdout, "skipped "+backup+warning)
	require.NoDirExists(t, keptDir(data, ref))
	require.FileExists(t, readme)
	require.FileExists(t, backup)
}

// A stray beside the kept copies is named by the same absolute path
// whether db prune reclaims the copies itself or through the process that
// owns the store, whose --data was relative to its own folder: through it,
// the path was the owner's relative one, meaningless where db prune ran.
func TestStrayKeptPathIsTheSameThroughTheOwner(t *testing.T) {
	data, _ := keptCopyFolder(t)
	readme := filepath.Join(data, "firmware", ".embedded", "README")
	require.NoError(t, os.WriteFile(readme, []byte("x"), 0o644))
	// db prune runs beside the data folder, with --data relative to it.
	beside, rel := filepath.Dir(data), filepath.Base(data)
	skipped := func() string {
		t.Helper()
		code, stdout, stderr := outpostBin(t, beside, "db", "prune", "--data", rel, "--older-than", "0s")
		require.Zero(t, code, "%s%s", stdout, stderr)
		for _, l := range strings.Split(stdout, "\n") {
			if strings.HasPrefix(l, "skipped ") {
				return l
			}
		}
		t.Fatalf("no skipped line: %s", stdout)
		return ""
	}
	local := skipped()
	require.Contains(t, local, "skipped "+readme+" is not a kept copy")

	// The owner runs in this test's folder, with --data relative to it.
	cwd, err := os.Getwd()
	require.NoError(t, err)
	ownerData, err := filepath.Rel(cwd, data)
	require.NoError(t, err)
	own, err := firmware.ReferenceRef()
	require.NoError(t, err)
	serveStoreWith(t, data, func(db *store.DB) store.ControlOptions { return keptReclaimer(ownerData, db, nil, nil, own) })
	require.Equal(t, local, skipped(), "through the owner")
}

// A prune while run (or resume) owns the store goes through run's control
// socket, and removes the kept copies no run refers to through the
// installer run's session opened, the one that keeps the copy of its own
// embedded bundle, and under its lock; that copy stays, though no stored
// run refers to it yet (run may pin a new run to it at any moment). The
// firmware index is damaged after the session opened its installer: a
// prune that opened an installer of its own, as run's did, cannot read it
// and removes nothing.
func TestPruneDuringRunUsesTheRunsInstaller(t *testing.T) {
	data, own := keptCopyFolder(t)
	forgetRuns(t, data)
	other := keptDir(data, engine.BundleRef{Name: own.Name, Version: own.Version, Digest: "sha256:" + strings.Repeat("0", 64)})
	require.NoError(t, os.CopyFS(other, os.DirFS(keptDir(data, own))))

	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	mc, bc := modelFlags(fs), budgetFlags(fs, true)
	require.NoError(t, fs.Parse(nil))
	s, err := openSession(context.Background(), data, true, engine.DurabilitySync, io.Discard, io.Discard, false, mc, bc, loadedBundles{})
	require.NoError(t, err)
	defer s.close()
	awaitControl(t, data)
	require.NoError(t, os.WriteFile(filepath.Join(data, "firmware", "index.json"), []byte("{"), 0o644))

	code, stdout, stderr := outpostBin(t, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "removed 1 kept copy(ies) of embedded bundles that no run refers to")
	require.NotContains(t, stdout, "skipped")
	require.NoDirExists(t, other)
	require.FileExists(t, filepath.Join(keptDir(data, own), "manifest.json"), "run's own embedded bundle's copy went")
}
