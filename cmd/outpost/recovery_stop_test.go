package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// stalledOllama answers as Ollama does, with llama3.2:3b pulled, and holds
// every chat request until the client goes away or the test ends; asked
// reports each one.
func stalledOllama(t *testing.T) (url string, asked <-chan struct{}) {
	ch, release := make(chan struct{}, 16), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/version":
			fmt.Fprint(w, `{"version":"0.17.4"}`)
		case "/api/tags":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"models":[{"name":"llama3.2:3b","model":"llama3.2:3b"}]}`)
		case "/api/chat":
			// Read whole, the request's context ends with its connection.
			_, _ = io.Copy(io.Discard, r.Body)
			ch <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for the handlers
	return srv.URL, ch
}

// killMidModelCall starts outpost run on thread in data, with a model
// that never answers, and kills it (kill -9) once the run has called it.
func killMidModelCall(t *testing.T, data, thread string) {
	t.Helper()
	ollamaURL, asked := stalledOllama(t)
	cut := exec.Command(builtOutpost(t), "run", "--data", data, "--thread", thread,
		"--model", "ollama:llama3.2:3b", "--ollama", ollamaURL, "I forgot my metformin dose")
	cut.Env = append(os.Environ(), "OUTPOST_DATA=")
	require.NoError(t, cut.Start())
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		_ = cut.Process.Kill()
		t.Fatal("the run never called the model")
	}
	require.NoError(t, cut.Process.Kill())
	_ = cut.Wait()
}

// runID is the id of the one run on thread in data, and its status.
func runOnThread(t *testing.T, data, thread string) (id, status string) {
	t.Helper()
	code, stdout, stderr := outpostBin(t, "", "runs", "list", "--data", data, "--thread", thread, "--json")
	require.Equal(t, 0, code, stderr)
	var list struct {
		Runs []struct{ ID, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.Len(t, list.Runs, 1, stdout)
	return list.Runs[0].ID, list.Runs[0].Status
}

// A run that a crash left running is resumed at the next start, and a
// command that stops before it is done with it leaves it for the start
// after: it is not failed. Here resume refuses its command line's run (one
// that has completed) just as it has begun to recover the other: it is
// still there to resume afterwards, not failed with "context canceled".
// The stop races with the recovery's first reads, so the refusal is tried
// a number of times, on the store as the crash left it.
func TestRefusedResumeLeavesARecoveredRunToTheNextStart(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "done", "I forgot my metformin dose")
	require.Equal(t, 0, code, stderr)
	done, _ := runOnThread(t, data, "done")

	killMidModelCall(t, data, "cut")
	cutID, status := runOnThread(t, data, "cut")
	require.NotEqual(t, "failed", status)

	path := filepath.Join(data, store.FileName)
	crashed, err := os.ReadFile(path)
	require.NoError(t, err)
	for i := range 8 {
		require.NoError(t, os.WriteFile(path, crashed, 0o600))
		code, _, stderr := outpostBin(t, "", "resume", "--data", data, done, "--decision", "approve")
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "run "+done+" is completed")
		_, status := runOnThread(t, data, "cut")
		require.NotEqual(t, "failed", status, "try %d: the refused resume failed run %s, which the next start should resume", i, cutID)
	}
}
