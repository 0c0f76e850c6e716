package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

// A run waiting for a person whose installed bundle's folder was deleted
// by hand (the firmware index still lists the version) is refused at
// resume, on the command line and through serve, and at serve's start,
// with what is missing and how to put it back; nothing changes meanwhile.
// Installing the same bundle again repairs the folder, and the run goes on.
func TestResumeWithTheInstalledBundleFolderDeleted(t *testing.T) {
	data := t.TempDir()
	var id string
	p := deletePinnedFolder(t, data, func() { id = approvalWaitingRun(t, builtOutpost(t), nil, data, "waits") })
	folder := p.folder
	// The run as it stands: its record and its thread's checkpoints.
	state := func() string {
		t.Helper()
		code, run, stderr := outpostBin(t, "", "runs", "show", "--data", data, "--json", id)
		require.Zero(t, code, stderr)
		code, history, stderr := outpostBin(t, "", "runs", "history", "--data", data, "--json", "waits")
		require.Zero(t, code, stderr)
		return run + history
	}
	before := state()
	require.Contains(t, before, `"status": "interrupted"`)
	index, err := os.ReadFile(filepath.Join(data, "firmware", "index.json"))
	require.NoError(t, err)
	unchanged := func() {
		t.Helper()
		require.Equal(t, before, state(), "the run changed")
		nowIndex, err := os.ReadFile(filepath.Join(data, "firmware", "index.json"))
		require.NoError(t, err)
		require.Equal(t, string(index), string(nowIndex), "the firmware index changed")
		_, err = os.Stat(folder)
		require.ErrorIs(t, err, os.ErrNotExist, "nothing put the folder back")
	}
	says := func(t *testing.T, msg string) {
		t.Helper()
		require.Contains(t, msg, "pinned bundle not on disk: the run is pinned to "+firmware.ReferenceName+" v1")
		require.Contains(t, msg, "its folder "+folder+" is gone: install the same bundle file again")
		require.Contains(t, msg, "outpost firmware install")
		require.NotContains(t, msg, "lstat")
	}

	code, _, stderr := outpostBin(t, "", "resume", "--data", data, "--decision", "approve", id)
	require.Equal(t, 1, code, stderr)
	says(t, stderr)
	require.Equal(t, 1, strings.Count(stderr, "pinned bundle not on disk"), "said once, by the resume's error:\n%s", stderr)
	unchanged()

	s := startServe(t, builtOutpost(t), data)
	require.True(t, s.stderr.waitFor("waits for a person but cannot go on", 10*time.Second), s.stderr.String())
	says(t, s.stderr.String())
	status, body := s.call(t, http.MethodPost, "/api/v1/runs/"+id+"/resume", `{"decision": "approve"}`)
	require.GreaterOrEqual(t, status, 400, "%s", body)
	says(t, string(body))
	s.stop(t)
	unchanged()

	// The active version's folder gone too, serve does not start, and
	// says why and what to do.
	active := filepath.Join(data, "firmware", firmware.ReferenceName, "2")
	aside := filepath.Join(t.TempDir(), "2")
	require.NoError(t, os.Rename(active, aside))
	code, _, stderr = outpostBin(t, "", "serve", "--data", data, "--listen", "127.0.0.1:0")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "active bundle "+firmware.ReferenceName+" v2: its folder "+active+" is gone")
	require.Contains(t, stderr, "install the same bundle file again with outpost firmware install")
	require.NoError(t, os.Rename(aside, active))
	unchanged()

	p.reinstall(t)
	code, stdout, stderr := outpostBin(t, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "on thread waits: completed")
}

// A run that a crash left running, whose installed bundle's folder was
// deleted by hand before the next start, is not failed by that start's
// recovery: it is left as it is, with its stored status, holding its
// thread, and serve says which bundle it waits for and how to put it back.
// Every view says it is held and why (heldEverywhere). Once the same bundle is
// installed again, the next start resumes it from its last checkpoint, and
// it completes; no step it had committed runs again.
func TestRunLeftRunningWithTheInstalledBundleFolderDeleted(t *testing.T) {
	data := t.TempDir()
	var id, status string
	p := deletePinnedFolder(t, data, func() {
		killMidModelCall(t, data, "cut")
		id, status = runOnThread(t, data, "cut")
	})
	folder := p.folder
	history := func() []store.HistoryEntry {
		t.Helper()
		code, stdout, stderr := outpostBin(t, "", "runs", "history", "--data", data, "--json", "cut")
		require.Zero(t, code, stderr)
		var h struct{ Checkpoints []store.HistoryEntry }
		require.NoError(t, json.Unmarshal([]byte(stdout), &h), stdout)
		return h.Checkpoints
	}
	before := history()
	require.NotEmpty(t, before)

	s := startServe(t, builtOutpost(t), data)
	code, body := s.call(t, http.MethodGet, "/api/v1/runs/"+id, "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	var got struct{ Status string }
	require.NoError(t, json.Unmarshal(body, &got), "%s", body)
	require.Equal(t, status, got.Status, "the API gives the status it is left with: %s", body)
	require.True(t, s.stderr.waitFor("left as it is", 10*time.Second), s.stderr.String())
	heldEverywhere(t, s, data, id, status, folder)
	warning := s.stderr.String()
	for _, want := range []string{
		"run " + id + " was left running and cannot go on: pinned bundle not on disk: the run is pinned to " + firmware.ReferenceName + " v1 (sha256:",
		"its folder " + folder + " is gone: install the same bundle file again",
		"outpost firmware install (it puts the folder back): the run goes on at its resume, or, left running, at the next start",
		"it is left as it is (stored as " + status + "), not failed",
	} {
		require.Contains(t, warning, want)
	}
	require.NotContains(t, warning, "then resume the run", "a run left running is not resumed by outpost resume")
	code, body = s.call(t, http.MethodPost, "/api/v1/threads/cut/runs", `{"agent": "medication-adherence", "input": "hello"}`)
	require.Equal(t, http.StatusConflict, code, "its thread is still its own: %s", body)
	require.Contains(t, string(body), "waiting for its pinned bundle")
	s.stop(t)

	code, stdout, stderr := outpostBin(t, "", "runs", "show", "--data", data, "--json", id)
	require.Zero(t, code, stderr)
	var shown struct {
		Status  string
		Stopped bool
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown), stdout)
	require.Equal(t, status, shown.Status, stdout)
	require.True(t, shown.Stopped, "runs show says it resumes at a start: %s", stdout)
	// Read from the store itself, as the next start will find it.
	heldEverywhere(t, nil, data, id, status, folder)
	require.Equal(t, before, history(), "nothing of it ran")

	p.reinstall(t)
	s = startServe(t, builtOutpost(t), data)
	deadline := time.Now().Add(30 * time.Second)
	for got.Status != "completed" {
		require.True(t, time.Now().Before(deadline), "the run did not complete: %s", body)
		time.Sleep(100 * time.Millisecond)
		code, body = s.call(t, http.MethodGet, "/api/v1/runs/"+id, "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		require.NoError(t, json.Unmarshal(body, &got), "%s", body)
	}
	require.NotContains(t, s.stderr.String(), "cannot go on")
	require.NotContains(t, string(body), `"held"`, "it is held no more")
	s.stop(t)

	// The checkpoints it had committed are all still there, and each node
	// of the run ran in one committed step alone: none ran again.
	after := history()
	for _, c := range before {
		require.Contains(t, after, c)
	}
	ran := map[string]string{}
	for _, c := range after {
		if c.Run != id || c.Source != engine.SourceLoop {
			continue
		}
		for _, n := range c.Nodes {
			require.NotContains(t, ran, n, "node %s ran in two committed steps", n)
			ran[n] = c.ID
		}
	}
	require.Contains(t, ran, "closing", "it ran to its end")
}

// heldEverywhere checks that every view of run id, which a crash left
// stored as status and whose installed folder is gone, says it is held,
// why and for which bundle: through serve s, its HTTP API (the run and the
// list), /metrics (counted held, not as queued or running), and runs
// list, show and db check through serve's socket; with s nil, runs list,
// show and db check reading the store itself.
func heldEverywhere(t *testing.T, s *serving, data, id, status, folder string) {
	t.Helper()
	type held struct {
		Reason string
		Bundle engine.BundleRef
	}
	says := func(h *held, of string) {
		t.Helper()
		require.NotNil(t, h, "%s does not say the run is held", of)
		require.Contains(t, h.Reason, "its folder "+folder+" is gone: install the same bundle file again", of)
		require.Equal(t, firmware.ReferenceName, h.Bundle.Name, of)
		require.EqualValues(t, 1, h.Bundle.Version, of)
	}
	if s != nil {
		code, body := s.call(t, http.MethodGet, "/api/v1/runs/"+id, "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		var one struct {
			Status string
			Held   *held
		}
		require.NoError(t, json.Unmarshal(body, &one), "%s", body)
		require.Equal(t, status, one.Status, "the status stays the stored one: %s", body)
		says(one.Held, "GET /api/v1/runs/{id}: "+string(body))

		code, body = s.call(t, http.MethodGet, "/api/v1/runs?thread=cut", "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		var list struct {
			Runs []struct {
				ID   string
				Held *held
			}
		}
		require.NoError(t, json.Unmarshal(body, &list), "%s", body)
		require.Len(t, list.Runs, 1, "%s", body)
		says(list.Runs[0].Held, "GET /api/v1/runs: "+string(body))

		code, body = s.call(t, http.MethodGet, "/metrics", "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		require.Contains(t, string(body), "\noutpost_runs_held 1\n")
		for _, st := range []string{"queued", "running"} {
			require.Contains(t, string(body), "\noutpost_runs{status=\""+st+"\"} 0\n", "the held run is not counted %s", st)
		}
	}

	code, stdout, stderr := outpostBin(t, "", "runs", "show", "--data", data, "--json", id)
	require.Zero(t, code, stderr)
	var shown struct {
		Status string
		Held   *held
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown), stdout)
	require.Equal(t, status, shown.Status, stdout)
	says(shown.Held, "runs show --json: "+stdout)
	code, stdout, stderr = outpostBin(t, "", "runs", "show", "--data", data, id)
	require.Zero(t, code, stderr)
	require.Regexp(t, `(?m)^status +held: the run was left unfinished and waits for its pinned bundle`, stdout)
	require.Contains(t, stdout, "its folder "+folder+" is gone")

	code, stdout, stderr = outpostBin(t, "", "runs", "list", "--data", data, "--thread", "cut")
	require.Zero(t, code, stderr)
	require.Regexp(t, id+` +cut +\S+ +held `, stdout)
	require.Contains(t, stdout, "\nheld: the run was left unfinished and waits for its pinned bundle")
	code, stdout, stderr = outpostBin(t, "", "runs", "list", "--data", data, "--thread", "cut", "--json")
	require.Zero(t, code, stderr)
	var listed struct {
		Runs []struct{ Held *held }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed), stdout)
	require.Len(t, listed.Runs, 1, stdout)
	says(listed.Runs[0].Held, "runs list --json: "+stdout)

	code, stdout, stderr = outpostBin(t, "", "db", "check", "--data", data, "--json")
	require.Zero(t, code, "%s%s", stdout, stderr)
	var rep store.CheckReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	i := slices.IndexFunc(rep.Stranded, func(sr store.StrandedRun) bool { return sr.Run == id })
	require.GreaterOrEqual(t, i, 0, "db check names the held run: %s", stdout)
	require.True(t, rep.Stranded[i].Held, stdout)
	says(&held{rep.Stranded[i].Reason, rep.Stranded[i].Bundle}, "db check --json: "+stdout)
	code, stdout, stderr = outpostBin(t, "", "db", "check", "--data", data)
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "WARNING run "+id+" was left unfinished and is held, waiting for its pinned bundle: pinned bundle not on disk")
}

// pinnedFolder is a data folder holding a run pinned to the reference
// bundle's v1, whose installed folder was then deleted by hand.
type pinnedFolder struct{ data, keys, bundle, folder string }

// deletePinnedFolder installs the reference bundle's v1 into data, makes
// the run with mkRun, installs v2 to serve new runs (so that serve starts
// without v1), and deletes v1's installed folder.
func deletePinnedFolder(t *testing.T, data string, mkRun func()) pinnedFolder {
	t.Helper()
	keys, key := signingKey(t)
	p := pinnedFolder{data: data, keys: keys, bundle: bundleVersion(t, key, 1),
		folder: filepath.Join(data, "firmware", firmware.ReferenceName, "1")}
	p.reinstall(t)
	mkRun()
	code, _, stderr := outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, "--activate", bundleVersion(t, key, 2))
	require.Zero(t, code, stderr)
	require.NoError(t, os.RemoveAll(p.folder))
	return p
}

// reinstall installs v1's bundle file (again).
func (p pinnedFolder) reinstall(t *testing.T) {
	t.Helper()
	code, _, stderr := outpostBin(t, "", "firmware", "install", "--data", p.data, "--keys", p.keys, p.bundle)
	require.Zero(t, code, stderr)
}
