package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/store"
)

// The README's Layout table has a row for every package under internal/,
// and its quick start names every file outpost keeps at the top of a data
// folder: those a run leaves there, the token, the control socket, and
// the stream mark that serve writes beside the store.
func TestReadmeNamesWhatThereIs(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	readme := string(raw)

	dirs, err := os.ReadDir(filepath.Join("..", "..", "internal"))
	require.NoError(t, err)
	for _, d := range dirs {
		if d.IsDir() {
			require.Contains(t, readme, "\n| `internal/"+d.Name()+"/` | ", "the Layout table has no row for internal/%s", d.Name())
		}
	}

	_, quick, ok := strings.Cut(readme, "- The data folder, `./outpost-data`, is made at the first start")
	require.True(t, ok, "the quick start's data folder paragraph")
	quick, _, _ = strings.Cut(quick, "\n- With no Ollama")
	data := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", data, "hello")
	require.Zero(t, code, stderr)
	files, err := os.ReadDir(data)
	require.NoError(t, err)
	names := []string{console.TokenFile, store.ControlSocket, store.FileName + ".stream", store.LockFile(store.FileName)}
	for _, f := range files {
		names = append(names, f.Name())
	}
	for _, n := range names {
		require.Contains(t, quick, "`"+n+"`", "the quick start does not say what %s is", n)
	}
}
