package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/firmware"
)

// bundleVersion writes the reference bundle as version v, signed with the
// private key file key, and returns its folder.
func bundleVersion(t *testing.T, key string, v int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "v")
	require.NoError(t, firmware.Export(dir))
	setBundleVersion(t, dir, int64(v))
	require.NoError(t, firmware.Sign(dir, key))
	return dir
}

// signingKey makes a key pair with firmware keygen and returns the folder
// of its public key (for --keys) and its private key file.
func signingKey(t *testing.T) (keys, key string) {
	t.Helper()
	keys = t.TempDir()
	code, stdout, stderr := outpostBin(t, "", "firmware", "keygen", "--out", keys)
	require.Zero(t, code, stderr)
	return keys, filepath.Join(keys, strings.Fields(stdout)[1]+".key")
}

// firmware remove removes an installed version that no run refers to, and
// refuses, changing nothing (the store, the index, the bundle's files): the
// active version, a version that a run waiting for a person is pinned to
// and, once that run has completed, still (it is replayed from its
// bundle), a version that is not installed, and any removal while serve
// owns the data folder. The refused version still verifies and serves its
// run.
func TestFirmwareRemove(t *testing.T) {
	data := t.TempDir()
	keys, key := signingKey(t)

	// v1 installed (active) serves a run that waits for a person; then
	// v2 is made active, and v3 installed beside it.
	code, _, stderr := outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, bundleVersion(t, key, 1))
	require.Zero(t, code, stderr)
	id := approvalWaitingRun(t, builtOutpost(t), nil, data, "waits")
	code, _, stderr = outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, "--activate", bundleVersion(t, key, 2))
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, "", "firmware", "install", "--data", data, "--keys", keys, bundleVersion(t, key, 3))
	require.Zero(t, code, stderr)

	name := firmware.ReferenceName
	unchanged := func() func() {
		t.Helper()
		db, err := os.ReadFile(filepath.Join(data, "outpost.db"))
		require.NoError(t, err)
		index, err := os.ReadFile(filepath.Join(data, "firmware", "index.json"))
		require.NoError(t, err)
		return func() {
			t.Helper()
			now, err := os.ReadFile(filepath.Join(data, "outpost.db"))
			require.NoError(t, err)
			require.True(t, string(now) == string(db), "the store changed")
			nowIndex, err := os.ReadFile(filepath.Join(data, "firmware", "index.json"))
			require.NoError(t, err)
			require.Equal(t, string(index), string(nowIndex), "the firmware index changed")
			code, stdout, stderr := outpostBin(t, "", "firmware", "list", "--data", data)
			require.Zero(t, code, "%s%s", stdout, stderr)
			require.Regexp(t, `(?m)^`+name+` +1 .* verified$`, stdout)
			require.Regexp(t, `(?m)^`+name+` +2 +active .* verified$`, stdout)
		}
	}

	check := unchanged()
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "remove "+name+" v2: bundle version is in use: it is the active version of "+name)
	require.Contains(t, stderr, "make another version active first: outpost firmware activate --data "+data)
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "1")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "remove "+name+" v1: bundle version is in use: 1 run(s) are pinned to it: "+id+" (outpost runs show ID)")
	check()

	// Completed, the run still refers to v1: it replays from it.
	code, stdout, stderr := outpostBin(t, "", "resume", "--data", data, "--decision", "approve", id)
	require.Zero(t, code, "%s%s", stdout, stderr)
	check = unchanged()
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", "--json", name, "1")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "1 run(s) are pinned to it: "+id)
	check()
	code, stdout, stderr = outpostBin(t, "", "runs", "replay", "--data", data, id)
	require.Zero(t, code, "%s%s", stdout, stderr)
	check = unchanged()

	// Not installed: exit 1, naming what is; a version that is not a
	// number is a bad command line.
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "9")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "remove "+name+" v9: bundle version not installed: installed versions of "+name+": v1, v2, v3")
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "x")
	require.Equal(t, 2, code, stderr)
	check()

	// While serve owns the folder, nothing is removed.
	s := startServe(t, builtOutpost(t), data)
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "3")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is in use")
	require.Contains(t, stderr, "stop it, remove the version, and start it again")
	s.stop(t)
	require.DirExists(t, filepath.Join(data, "firmware", name, "3"))

	// Who removes and why are recorded, so a removal without them is a
	// bad command line, and changes nothing.
	check = unchanged()
	for _, args := range [][]string{
		{"--reason", "retired"}, {"--by", "ops"}, {"--by", "ops", "--reason", ""}, {},
	} {
		code, _, stderr = outpostBin(t, "", append(append([]string{"firmware", "remove", "--data", data}, args...), name, "3")...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "firmware remove needs --by NAME and --reason TEXT, which are recorded")
		require.DirExists(t, filepath.Join(data, "firmware", name, "3"))
	}
	check()

	// v3, which no run refers to, goes; the log records it, with who
	// removed it and why. The store is read, not changed. A stray file
	// beside the kept copies of embedded bundles, which remove does not
	// look at, stops nothing.
	require.NoError(t, os.MkdirAll(filepath.Join(data, "firmware", ".embedded"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "firmware", ".embedded", "README"), []byte("x"), 0o644))
	db, err := os.ReadFile(filepath.Join(data, "outpost.db"))
	require.NoError(t, err)
	code, stdout, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", "--json", name, "3")
	require.Zero(t, code, stderr)
	var out struct {
		Name       string
		Version    int64
		Removed    bool
		By, Reason string
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
	require.Equal(t, name, out.Name)
	require.EqualValues(t, 3, out.Version)
	require.True(t, out.Removed)
	require.Equal(t, "ops", out.By)
	require.Equal(t, "retired", out.Reason)
	require.NoDirExists(t, filepath.Join(data, "firmware", name, "3"))
	now, err := os.ReadFile(filepath.Join(data, "outpost.db"))
	require.NoError(t, err)
	require.True(t, string(now) == string(db), "the store changed")
	code, stdout, stderr = outpostBin(t, "", "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, stderr)
	require.Regexp(t, regexp.MustCompile(`"action": "remove",\s+"name": "`+name+`",\s+"version": 3`), stdout)
	var list struct {
		Installed []struct{ Version int64 }
		Log       []firmware.LogEntry
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	last := list.Log[len(list.Log)-1]
	require.Equal(t, "remove", last.Action, stdout)
	require.Equal(t, [2]string{"ops", "retired"}, [2]string{last.By, last.Reason}, stdout)
	require.Len(t, list.Installed, 2)
	require.EqualValues(t, []int64{1, 2}, []int64{list.Installed[0].Version, list.Installed[1].Version})
	code, _, stderr = outpostBin(t, "", "firmware", "remove", "--data", data, "--by", "ops", "--reason", "retired", name, "3")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "installed versions of "+name+": v1, v2\n")
}
