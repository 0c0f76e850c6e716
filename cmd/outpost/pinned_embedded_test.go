package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// upgradedReference writes a copy of the embedded reference bundle with
// the same name and version and another digest, as a re-signed bundle of a
// later binary has: its closing template begins with mark, so that an
// answer shows which of the two a run ran on. It returns the folder.
func upgradedReference(t *testing.T, mark string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "upgraded")
	require.NoError(t, firmware.Export(dir))
	graph := filepath.Join(dir, "agents", "medication-adherence-tools.json")
	raw, err := os.ReadFile(graph)
	require.NoError(t, err)
	edited := strings.Replace(string(raw), `"template": "{{draft}}"`, `"template": "`+mark+` {{draft}}"`, 1)
	require.NotEqual(t, string(raw), edited, "the closing template moved")
	require.NoError(t, os.WriteFile(graph, []byte(edited), 0o644))
	require.NoError(t, firmware.Sign(dir, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
	return dir
}

// approvalWaitingRun runs a turn of the tools agent that waits for a person's
// approval, with the binary bin and env, and returns its id.
func approvalWaitingRun(t *testing.T, bin string, env []string, data, thread string) string {
	t.Helper()
	code, stdout, stderr := outpostBinEnv(t, bin, env, "", "run", "--data", data, "--thread", thread,
		"--agent", firmware.ReferenceToolsAgent, "please schedule a follow-up call about my refills")
	require.Zero(t, code, stderr)
	run := regexp.MustCompile(`outpost resume (run_[0-9a-f]+) `).FindStringSubmatch(stdout)
	require.NotNil(t, run, stdout)
	return run[1]
}

// waitingBeforeUpgrade makes, with the tagged binary bin, a data folder
// holding a run on thread "waits" that waits for a person, pinned to the
// embedded bundle oldRef; upgraded is the environment under which bin
// embeds another digest of it, as a later binary does.
func waitingBeforeUpgrade(t *testing.T) (bin, data string, oldRef engine.BundleRef, upgraded []string, id string) {
	t.Helper()
	bin, data = builtOutpostTagged(t), t.TempDir()
	old, err := firmware.Reference()
	require.NoError(t, err)
	upgraded = []string{"OUTPOST_TEST_REFERENCE=" + upgradedReference(t, "UPGRADED")}
	return bin, data, old.Ref(), upgraded, approvalWaitingRun(t, bin, nil, data, "waits")
}

// firstCheckpoint returns the oldest checkpoint of thread, read with the
// binary bin and env.
func firstCheckpoint(t *testing.T, bin string, env []string, data, thread string) string {
	t.Helper()
	code, stdout, stderr := outpostBinEnv(t, bin, env, "", "runs", "history", thread, "--data", data, "--json")
	require.Zero(t, code, stderr)
	var history struct {
		Checkpoints []struct {
			ID string `json:"id"`
		} `json:"checkpoints"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &history))
	require.NotEmpty(t, history.Checkpoints)
	return history.Checkpoints[len(history.Checkpoints)-1].ID
}

// A run waiting for a person's approval, pinned to the bundle embedded in
// the binary it started under, is approved and completes on that bundle
// after the binary is replaced by one whose embedded bundle has the same
// version and another digest: the first binary kept a copy of its bundle
// in the data folder when the run pinned it. Pruning the store leaves the
// copy alone, and firmware list shows it. A run whose pinned bundle is
// truly gone is refused with what is missing and what to do, and doing
// that lets it go on.
func TestRunPinnedToEmbeddedBundleSurvivesUpgrade(t *testing.T) {
	bin, data, oldRef, upgraded, id := waitingBeforeUpgrade(t)
	v := strconv.FormatInt(oldRef.Version, 10)
	kept := filepath.Join(data, "firmware", ".embedded", oldRef.Name,
		v+"-"+strings.TrimPrefix(oldRef.Digest, "sha256:"), "manifest.json")
	require.FileExists(t, kept)

	// Another thread finishes, and prune takes it; the waiting run's
	// bundle stays.
	code, _, stderr := outpostBinEnv(t, bin, nil, "", "run", "--data", data, "--thread", "done", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr := outpostBinEnv(t, bin, upgraded, "", "db", "prune", "--data", data, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "1 thread")
	require.FileExists(t, kept)

	// The upgraded binary's new runs use its own bundle; its listing
	// shows the copy kept for the waiting run.
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "firmware", "list", "--data", data)
	require.Zero(t, code, stderr)
	require.Regexp(t, `(?m)^`+oldRef.Name+` +`+v+` +`+oldRef.Digest+` +verified$`, stdout)

	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "runs", "show", "--data", data, "--json", id)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, `"status": "completed"`)
	require.Contains(t, stdout, `"digest": "`+oldRef.Digest+`"`)
	require.NotContains(t, stdout, "UPGRADED", "the run went on with the upgraded binary's bundle")

	// Its thread forks from its first checkpoint, with the graph of the
	// bundle it is pinned to.
	first := firstCheckpoint(t, bin, upgraded, data, "waits")
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "runs", "fork", "waits", "--data", data, "--checkpoint", first)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "forked thread waits at "+first)

	// A new run under the upgraded binary is on its bundle.
	newID := approvalWaitingRun(t, bin, upgraded, data, "new")
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "resume", "--data", data, "--decision", "approve", newID)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "UPGRADED")

	// A run whose bundle is not on disk any more is refused, with what
	// is missing and what to do; doing it lets the run go on.
	gone := approvalWaitingRun(t, bin, nil, data, "gone")
	require.NoError(t, os.RemoveAll(filepath.Join(data, "firmware", ".embedded", oldRef.Name, filepath.Base(filepath.Dir(kept)))))
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "resume", "--data", data, "--decision", "approve", gone)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "pinned bundle not on disk: the run is pinned to "+oldRef.Name+" v"+v+" ("+oldRef.Digest+"), which is neither installed")
	require.Contains(t, stderr, "outpost firmware export DIR with that binary, then outpost firmware install --trust-dev-key DIR")
	export := filepath.Join(t.TempDir(), "export")
	code, _, stderr = outpostBinEnv(t, bin, nil, "", "firmware", "export", export)
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBinEnv(t, bin, upgraded, "", "firmware", "install", "--data", data, "--trust-dev-key", export)
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "resume", "--data", data, "--decision", "approve", gone)
	require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.NotContains(t, stdout, "UPGRADED")
}

// A run that waits for a person pinned to the embedded bundle with no copy
// kept of it (it pinned the bundle before copies were kept) has the copy
// made at the next start under the binary that embeds the bundle, a start
// that resolves nothing else from that bundle (a turn of the bench agent),
// and so it outlives the upgrade after. A start under a binary that cannot
// have the bundle says so at once.
func TestStartKeepsTheEmbeddedBundleOfWaitingRuns(t *testing.T) {
	bin := builtOutpostTagged(t)
	data := t.TempDir()
	old, err := firmware.Reference()
	require.NoError(t, err)
	upgraded := []string{"OUTPOST_TEST_REFERENCE=" + upgradedReference(t, "UPGRADED")}
	keptRoot := filepath.Join(data, "firmware", ".embedded")

	id := approvalWaitingRun(t, bin, nil, data, "waits")
	require.NoError(t, os.RemoveAll(keptRoot))
	code, _, stderr := outpostBinEnv(t, bin, nil, "", "run", "--data", data, "--thread", "bench", "--agent", "reference", "hi")
	require.Zero(t, code, stderr)
	v := strconv.FormatInt(old.Ref().Version, 10)
	require.FileExists(t, filepath.Join(keptRoot, old.Ref().Name, v+"-"+strings.TrimPrefix(old.Ref().Digest, "sha256:"), "manifest.json"))
	require.NotContains(t, stderr, "WARNING")

	code, stdout, stderr := outpostBinEnv(t, bin, upgraded, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.NotContains(t, stdout, "UPGRADED")

	gone := approvalWaitingRun(t, bin, nil, data, "gone")
	require.NoError(t, os.RemoveAll(keptRoot))
	code, _, stderr = outpostBinEnv(t, bin, upgraded, "", "run", "--data", data, "--thread", "bench", "--agent", "reference", "hi")
	require.Zero(t, code, stderr)
	require.Contains(t, stderr, "WARNING: run "+gone+", and any other run pinned to "+old.Ref().Name+" v"+v+" ("+old.Ref().Digest+
		"), waits for a person but cannot go on: pinned bundle not on disk: ")
}

// runs fork refuses a thread whose last run waits for a person, as the
// HTTP API does: the fork would move the thread's head from under the
// run, whose resume could then not go on. The run still completes.
func TestRunsForkRefusesAThreadWaitingForAPerson(t *testing.T) {
	bin := builtOutpost(t)
	data := t.TempDir()
	id := approvalWaitingRun(t, bin, nil, data, "waits")
	first := firstCheckpoint(t, bin, nil, data, "waits")
	code, stdout, stderr := outpostBinEnv(t, bin, nil, "", "runs", "fork", "waits", "--data", data, "--checkpoint", first)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "run "+id+" on the thread is interrupted: finish it (outpost resume) or cancel it before forking")
	code, stdout, stderr = outpostBinEnv(t, bin, nil, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
}
