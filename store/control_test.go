package store

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveControl serves d's control socket in dir until the test ends.
func serveControl(t *testing.T, d *DB, dir string) *Control {
	t.Helper()
	ctx, cancel := context.WithCancel(bg)
	served := make(chan error, 1)
	go func() { served <- ServeControl(ctx, d, dir) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
		assert.NoFileExists(t, filepath.Join(dir, ControlSocket), "the socket is gone when ServeControl returns")
	})
	var c *Control
	require.Eventually(t, func() bool {
		var err error
		c, err = DialControl(dir)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return c
}

func TestControlBackup(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("t", i)))
	}
	c := serveControl(t, d, dir)

	good := filepath.Join(t.TempDir(), "good.db")
	require.NoError(t, c.BackupFile(bg, good))
	b, err := Open(good, Options{ReadOnly: true})
	require.NoError(t, err)
	rep, err := b.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, b.Close())

	// A store that closes under the socket answers with an error, and no
	// file appears: before, an empty answer made an empty "backup".
	require.NoError(t, d.Close())
	bad := filepath.Join(t.TempDir(), "bad.db")
	err = c.BackupFile(bg, bad)
	require.ErrorContains(t, err, "store owner: backup:")
	_, serr := os.Stat(bad)
	assert.ErrorIs(t, serr, os.ErrNotExist)
}

// An answer that does not say how long the copy is cannot be told from a
// copy cut short, so it is refused.
func TestControlBackupNeedsALength(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, ControlSocket))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("not a store"))
		w.(http.Flusher).Flush() // chunked: no length
	}), ReadHeaderTimeout: time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	c, err := DialControl(dir)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "b.db")
	require.ErrorContains(t, c.BackupFile(bg, path), "sent no length")
	_, serr := os.Stat(path)
	assert.ErrorIs(t, serr, os.ErrNotExist)
}

// A data folder whose path is too long for a unix socket address still
// serves its control socket (reached through a descriptor of the folder).
func TestControlSocketInALongPath(t *testing.T) {
	dir := t.TempDir()
	for len(filepath.Join(dir, ControlSocket)) <= maxSocketPath+20 {
		dir = filepath.Join(dir, "a-rather-long-folder-name")
	}
	require.NoError(t, os.MkdirAll(dir, 0o700))
	d, err := OpenDir(dir, Options{})
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Commit(bg, stepCommit("t", 1)))
	c := serveControl(t, d, dir)
	rep, err := c.Check(bg)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	fi, err := os.Stat(filepath.Join(dir, ControlSocket))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}
