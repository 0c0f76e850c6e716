package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// db compact on a folder too full for even the start of the compacted
// copy fails with the store file byte for byte as it was, and nothing left
// beside it (no empty copy, no lock file). The full folder is a tmpfs just
// larger than the store.
func TestCompactOnAFullFolderChangesNothing(t *testing.T) {
	data := storeWithRun(t)
	was, err := os.ReadFile(filepath.Join(data, store.FileName))
	require.NoError(t, err)

	full := t.TempDir()
	size := (len(was)+4095)/4096*4096 + 8192 // two pages free: less than a new store file takes
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size), "tmpfs", full).CombinedOutput(); err != nil {
		t.Skipf("a small tmpfs cannot be mounted here (%v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", full).Run() })
	require.NoError(t, os.WriteFile(filepath.Join(full, store.FileName), was, 0o600))

	code, _, stderr := outpostBin(t, "", "db", "compact", "--data", full)
	require.Equal(t, 1, code, stderr)
	now, err := os.ReadFile(filepath.Join(full, store.FileName))
	require.NoError(t, err)
	require.True(t, string(was) == string(now), "the refused compaction changed the store file")
	requireStoreAlone(t, full)
	require.Contains(t, stderr, "nothing was changed")
}

// db compact on a folder with room for a new store file but not for the
// whole compacted copy fails partway through the copy, and leaves the
// store file byte for byte as it was (the open that the copy is read
// through commits nothing) and nothing beside it. The full folder is a
// tmpfs half a megabyte larger than the store, whose pages in use take
// more than that.
func TestCompactThatFillsTheDiskChangesNothing(t *testing.T) {
	data := t.TempDir()
	for i := range 6 {
		noise := make([]byte, 45000) // 60 KB of text a run that does not compress, kept as a blob
		_, _ = rand.Read(noise)
		big := base64.StdEncoding.EncodeToString(noise)
		code, _, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "t"+strconv.Itoa(i), "I forgot my dose "+big)
		require.Zero(t, code, stderr)
	}
	code, stdout, stderr := outpostBin(t, "", "db", "check", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var rep struct {
		Space struct {
			UsedBytes int64 `json:"used_bytes"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	room := int64(512 << 10)
	require.Greater(t, rep.Space.UsedBytes, room, "the copy must not fit in the room left")
	was, err := os.ReadFile(filepath.Join(data, store.FileName))
	require.NoError(t, err)

	full := t.TempDir()
	size := (int64(len(was))+4095)/4096*4096 + room
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "tmpfs", full).CombinedOutput(); err != nil {
		t.Skipf("a small tmpfs cannot be mounted here (%v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", full).Run() })
	require.NoError(t, os.WriteFile(filepath.Join(full, store.FileName), was, 0o600))

	code, _, stderr = outpostBin(t, "", "db", "compact", "--data", full)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "no space left on device")
	require.Contains(t, stderr, "nothing was changed: the copy is written beside the store and takes up to its size: make room in "+full)
	now, err := os.ReadFile(filepath.Join(full, store.FileName))
	require.NoError(t, err)
	require.True(t, bytes.Equal(was, now), "the failed compaction changed the store file")
	requireStoreAlone(t, full)
}

// Files that a compaction stopped midway left beside the store (its copy,
// the probe file of earlier versions) do not pile up unseen: db check
// names them, text and --json, and passes; the next db compact removes
// them and says so, and db check then names none.
func TestCompactLeftoversAreNamedAndRemoved(t *testing.T) {
	data := storeWithRun(t)
	leftovers := []string{store.FileName + ".compact", store.FileName + ".compact-upgrade", store.FileName + ".probe-1234567"}
	for _, name := range leftovers {
		require.NoError(t, os.WriteFile(filepath.Join(data, name), []byte("partial"), 0o600))
	}
	code, stdout, stderr := outpostBin(t, "", "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	for _, name := range leftovers {
		require.Contains(t, stdout, "leftover "+filepath.Join(data, name)+": left by a compaction that stopped midway")
	}
	code, stdout, stderr = outpostBin(t, "", "db", "check", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var rep struct{ Leftovers []string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.ElementsMatch(t, leftovers, rep.Leftovers)

	code, stdout, stderr = outpostBin(t, "", "db", "compact", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var compacted struct {
		Removed []string `json:"leftovers_removed"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &compacted), stdout)
	require.ElementsMatch(t, leftovers, compacted.Removed)
	for _, name := range leftovers {
		require.Contains(t, stderr, "removed "+filepath.Join(data, name))
		_, err := os.Stat(filepath.Join(data, name))
		require.ErrorIs(t, err, os.ErrNotExist, name)
	}
	code, stdout, stderr = outpostBin(t, "", "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "leftover")
}

// requireStoreAlone fails t unless the store file is all that dir holds.
func requireStoreAlone(t *testing.T, dir string) {
	t.Helper()
	require.Equal(t, []string{store.FileName}, folderNames(t, dir))
}
