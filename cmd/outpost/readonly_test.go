package main

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/uplink"
)

// folderTree lists what dir holds, every file and folder below it with
// its size, so that a command can be seen to make nothing.
func folderTree(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	tree := map[string]int64{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		tree[rel] = info.Size()
		if info.IsDir() {
			tree[rel] = -1
		}
		return nil
	}))
	return tree
}

// folderNames lists the names in dir.
func folderNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// The commands that only read (uplink status and flush, runs list, show
// and history, firmware list, db check, token) make nothing in a data
// folder: a flush sends the backlog to a real collector and leaves no
// firmware folder behind where there was none (a folder restored from a
// backup of its store alone, say). On a data folder that is not there,
// each exits 1, says that there is no such folder, and makes none.
func TestReadOnlyCommandsMakeNothing(t *testing.T) {
	app, coll := t.TempDir(), t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", app, "--thread", "t", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	require.NoError(t, os.RemoveAll(filepath.Join(app, "firmware")))
	code, out, stderr := outpostBin(t, "", "runs", "list", "--data", app, "--json")
	require.Zero(t, code, stderr)
	var list struct{ Runs []struct{ ID string } }
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list.Runs, 1)
	code, out, stderr = outpostBin(t, "", "uplink", "status", "--data", app, "--json")
	require.Zero(t, code, stderr)
	var st uplink.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	secrets, mine := uplinkSecrets(t, coll, coll, st.ApplianceID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, _, done := startCollector(t, ctx, coll, secrets)
	token := filepath.Join(app, "console.token")
	require.NoError(t, os.WriteFile(token, []byte("0123456789abcdef0123456789abcdef\n"), 0o600))

	commands := [][]string{
		{"uplink", "status"},
		{"uplink", "flush", "--uplink", url, "--uplink-secret", mine},
		{"runs", "list"},
		{"runs", "show", list.Runs[0].ID},
		{"runs", "history", "t"},
		{"firmware", "list"},
		{"db", "check"},
		{"token"},
	}
	for _, args := range commands {
		was := folderTree(t, app)
		code, out, stderr := outpostBin(t, "", append(args, "--data", app)...)
		require.Zero(t, code, "%v: %s%s", args, out, stderr)
		require.Equal(t, was, folderTree(t, app), "%v changed the data folder", args)
	}
	cancel()
	require.Zero(t, <-done)

	missing := filepath.Join(t.TempDir(), "typo")
	for _, args := range commands {
		code, out, stderr := outpostBin(t, "", append(args, "--data", missing)...)
		require.Equal(t, 1, code, "%v: %s%s", args, out, stderr)
		require.Contains(t, stderr, "there is no folder "+missing, args)
		require.NoDirExists(t, missing, args)
	}
}

// firmware activate where nothing is installed is refused, and makes no
// firmware folder; on a data folder that is not there it makes none.
func TestActivateWithNothingInstalledMakesNothing(t *testing.T) {
	app := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", app, "--thread", "t", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	require.NoError(t, os.RemoveAll(filepath.Join(app, "firmware")))
	was := folderTree(t, app)
	code, _, stderr = outpostBin(t, "", "firmware", "activate", "--data", app, "medication-adherence", "1")
	require.Equal(t, 1, code, stderr)
	require.Equal(t, was, folderTree(t, app), "the refused activation changed the data folder")
	require.Contains(t, stderr, "nothing is installed in "+app)
	require.Contains(t, stderr, "outpost firmware install --data "+app+" --activate PATH")

	missing := filepath.Join(t.TempDir(), "typo")
	code, _, stderr = outpostBin(t, "", "firmware", "activate", "--data", missing, "medication-adherence", "1")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "there is no folder "+missing)
	require.NoDirExists(t, missing)
}

// run, which installs nothing, makes nothing in the firmware folder but
// the copy of the embedded bundle its run is pinned to (kept so that the
// run can go on under a later binary) and an index that lists nothing
// installed; runs replay, an audit, makes nothing at all, not even the
// kept copy of the embedded bundle its run is pinned to when it is gone.
func TestRunAndReplayMakeNoFirmwareFolder(t *testing.T) {
	app := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", app, "--thread", "t", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	require.Equal(t, []string{".embedded", "index.json"}, folderNames(t, filepath.Join(app, "firmware")), "run made more in the firmware folder than the kept bundle and an index listing nothing")
	code, out, stderr := outpostBin(t, "", "runs", "list", "--data", app, "--json")
	require.Zero(t, code, stderr)
	var list struct{ Runs []struct{ ID string } }
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list.Runs, 1)
	was := folderTree(t, app)
	code, out, stderr = outpostBin(t, "", "runs", "replay", "--data", app, list.Runs[0].ID)
	require.Zero(t, code, "%s%s", out, stderr)
	require.Equal(t, was, folderTree(t, app), "replay changed the data folder")

	// Its run is pinned to this binary's embedded bundle, which serves
	// the replay as it is: the kept copy, removed, is not written back.
	require.NoError(t, os.RemoveAll(filepath.Join(app, "firmware", ".embedded")))
	was = folderTree(t, app)
	code, out, stderr = outpostBin(t, "", "runs", "replay", "--data", app, list.Runs[0].ID)
	require.Zero(t, code, "%s%s", out, stderr)
	require.Equal(t, was, folderTree(t, app), "replay kept the embedded bundle again")

	// Without a firmware folder, replay keeps nothing and makes none.
	require.NoError(t, os.RemoveAll(filepath.Join(app, "firmware")))
	code, out, stderr = outpostBin(t, "", "runs", "replay", "--data", app, list.Runs[0].ID)
	require.Zero(t, code, "%s%s", out, stderr)
	require.NoDirExists(t, filepath.Join(app, "firmware"), "replay made a firmware folder")
}
