package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// db check said nothing of a run waiting for a person whose pinned bundle
// is on disk nowhere, which the starts of serve, run and resume warn of:
// it names it, as a warning that leaves the store sound (exit 0), in text
// and in --json (stranded), and changes nothing in the data folder.
func TestDBCheckNamesRunsStrandedWithoutTheirBundle(t *testing.T) {
	bin, data, oldRef, upgraded, id := waitingBeforeUpgrade(t)
	// Under the binary the run started with, and under a later one while
	// the copy kept of its bundle is there, it can go on.
	for _, env := range [][]string{nil, upgraded} {
		code, stdout, stderr := outpostBinEnv(t, bin, env, "", "db", "check", "--data", data)
		require.Zero(t, code, stderr)
		require.Contains(t, stdout, "store is sound")
		require.NotContains(t, stdout, "cannot go on")
	}

	require.NoError(t, os.RemoveAll(filepath.Join(data, "firmware", ".embedded", oldRef.Name)))
	before := folderTree(t, data)
	code, stdout, stderr := outpostBinEnv(t, bin, upgraded, "", "db", "check", "--data", data)
	require.Zero(t, code, "a stranded run leaves the store sound: %s", stderr)
	require.Contains(t, stdout, "WARNING run "+id+" waits for a person but cannot go on: pinned bundle not on disk: the run is pinned to "+
		fmt.Sprintf("%s v%d (%s)", oldRef.Name, oldRef.Version, oldRef.Digest))
	require.Contains(t, stdout, "store is sound")

	code, stdout, stderr = outpostBinEnv(t, bin, upgraded, "", "db", "check", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var rep struct {
		Problems []any
		Stranded []struct {
			Run    string
			Bundle struct{ Name, Digest string }
			Reason string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Empty(t, rep.Problems)
	require.Len(t, rep.Stranded, 1, stdout)
	require.Equal(t, id, rep.Stranded[0].Run)
	require.Equal(t, oldRef.Digest, rep.Stranded[0].Bundle.Digest)
	require.True(t, strings.HasPrefix(rep.Stranded[0].Reason, "pinned bundle not on disk"), rep.Stranded[0].Reason)
	require.Equal(t, before, folderTree(t, data), "db check changed the data folder")

	// The binary that embeds the bundle can still go on with the run:
	// for it nothing is stranded.
	code, stdout, stderr = outpostBinEnv(t, bin, nil, "", "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "cannot go on")
}

// A key file in DATA/keys that does not parse keeps the pinned bundles
// from being resolved; it does not fail the check of the store, which
// passes as it did, with a warning that the waiting runs went unchecked.
func TestDBCheckWithAnUnreadableKeyStillChecksTheStore(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "hello")
	require.Zero(t, code, stderr)
	require.NoError(t, os.MkdirAll(filepath.Join(data, "keys"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "keys", "bad.pub"), []byte("junk\n"), 0o644))
	code, stdout, stderr := outpostBin(t, "", "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
	require.Contains(t, stderr, "WARNING: the runs waiting for a person were not checked for their pinned bundles: bad key file")
}
