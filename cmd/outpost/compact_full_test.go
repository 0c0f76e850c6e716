package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// db compact on a folder too full for the compacted copy refuses before
// it opens the store for writing: the store file is byte for byte as it
// was, and nothing is left beside it (no empty copy, no lock file). The
// full folder is a tmpfs just larger than the store.
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
	entries, err := os.ReadDir(full)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{store.FileName}, names)
	require.Contains(t, stderr, "nothing was changed")
}
