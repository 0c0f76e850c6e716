package fsync

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMkdirAll(t *testing.T) {
	var dirs []string
	defer Observe(func(dir string) { dirs = append(dirs, dir) })()
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b")
	require.NoError(t, MkdirAll(dir, 0o700))
	// The folder above each new one, top down.
	assert.Equal(t, []string{base, filepath.Join(base, "a")}, dirs)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	dirs = nil
	require.NoError(t, MkdirAll(dir, 0o700), "an existing folder is fine")
	assert.Empty(t, dirs)

	// A file in the way is reported, as os.MkdirAll reports it.
	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	assert.Error(t, MkdirAll(filepath.Join(file, "c"), 0o700))
}

// A relative folder, as the default ./outpost-data is: the folders above
// are named relative to the working folder.
func TestMkdirAllRelative(t *testing.T) {
	t.Chdir(t.TempDir())
	var dirs []string
	defer Observe(func(dir string) { dirs = append(dirs, dir) })()
	require.NoError(t, MkdirAll(filepath.Join("data", "inner"), 0o700))
	assert.Equal(t, []string{".", "data"}, dirs)
	fi, err := os.Stat(filepath.Join("data", "inner"))
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
}

func TestDir(t *testing.T) {
	require.NoError(t, Dir(t.TempDir()))
	assert.ErrorIs(t, Dir(filepath.Join(t.TempDir(), "missing")), os.ErrNotExist)
}
