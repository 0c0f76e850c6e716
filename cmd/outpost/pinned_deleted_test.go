package main

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/firmware"
)

// A run waiting for a person whose installed bundle's folder was deleted
// by hand (the firmware index still lists the version) is refused at
// resume, on the command line and through serve, and at serve's start,
// with what is missing and how to put it back; nothing changes meanwhile.
// Installing the same bundle again repairs the folder, and the run goes on.
func TestResumeWithTheInstalledBundleFolderDeleted(t *testing.T) {
	data := t.TempDir()
	keys, key := signingKey(t)
	bundle := bundleVersion(t, key, 1)
	code, _, stderr := outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, bundle)
	require.Zero(t, code, stderr)
	id := approvalWaitingRun(t, builtOutpost(t), nil, data, "waits")
	// v2 serves new runs, so that serve starts without v1.
	code, _, stderr = outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, "--activate", bundleVersion(t, key, 2))
	require.Zero(t, code, stderr)

	folder := filepath.Join(data, "firmware", firmware.ReferenceName, "1")
	require.NoError(t, os.RemoveAll(folder))
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

	code, _, stderr = outpostBin(t, "", "resume", "--data", data, "--decision", "approve", id)
	require.Equal(t, 1, code, stderr)
	says(t, stderr)
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

	code, _, stderr = outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, bundle)
	require.Zero(t, code, stderr)
	code, stdout, stderr := outpostBin(t, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "%s%s", stdout, stderr)
	require.Contains(t, stdout, "on thread waits: completed")
}
