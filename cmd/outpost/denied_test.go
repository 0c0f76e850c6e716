//go:build linux

package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// run, serve, db compact and db prune on a data folder this user cannot
// write say so and what to do, beside the system's error. As root, which
// every folder lets write, the binary is run as uid 65534 (nobody) on a
// folder root owns with mode 0755; as another user, on a folder of its
// own made read-only. The folder holds a store, made first, and is left
// as it was.
func TestCommandsOnAFolderNotOurs(t *testing.T) {
	// Folders the other user can reach: not below t.TempDir, which is 0700.
	shared := func() string {
		dir, err := os.MkdirTemp("", "outpost-denied-")
		require.NoError(t, err)
		require.NoError(t, os.Chmod(dir, 0o755))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755); _ = os.RemoveAll(dir) })
		return dir
	}
	bin := filepath.Join(shared(), "outpost")
	src, err := os.ReadFile(builtOutpost(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, src, 0o755))

	data := shared()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "hello")
	require.Equal(t, 0, code, stderr)
	was, err := os.ReadFile(filepath.Join(data, store.FileName))
	require.NoError(t, err)
	uid := 65534
	if os.Getuid() != 0 {
		uid = os.Getuid()
		require.NoError(t, os.Chmod(data, 0o555))
	}

	for _, args := range [][]string{
		{"run", "--data", data, "hello"},
		{"serve", "--data", data, "--listen", "127.0.0.1:0"},
		{"db", "compact", "--data", data},
		{"db", "prune", "--older-than", "720h", "--data", data},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "OUTPOST_DATA=")
		if os.Getuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		}
		var errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &errb
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("%v did not stop", args)
		}
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v: %s", args, errb.String())
		require.Equal(t, 1, exit.ExitCode(), "%v: %s", args, errb.String())
		require.Contains(t, errb.String(), "permission denied", args)
		require.Contains(t, errb.String(), "cannot be written by this user (uid "+strconv.Itoa(uid)+"): run outpost as the appliance's user", args)
		require.Contains(t, errb.String(), "or fix the folder's permissions", args)
	}
	now, err := os.ReadFile(filepath.Join(data, store.FileName))
	require.NoError(t, err)
	require.True(t, bytes.Equal(was, now), "the store changed")
}
