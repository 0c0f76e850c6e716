package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// countedKind is a node kind of the tests' own, which passes through and
// counts how often a node of it is built: once for each compilation of
// the graph that holds it.
const countedKind = "test_counted"

var countedBuilds atomic.Int64

func init() {
	firmware.RegisterKind(countedKind, func(cfg json.RawMessage, env *firmware.Env) (engine.NodeFunc, error) {
		var none struct{}
		if err := env.Decode(cfg, &none); err != nil {
			return nil, err
		}
		countedBuilds.Add(1)
		return func(context.Context, engine.State) ([]engine.Write, error) { return nil, nil }, nil
	})
}

// run checks its agent against the installed bundle before it opens the
// store, then runs the turn: the bundle is compiled for that once, not
// once for the check and again for the run.
func TestRunCompilesTheBundleOnce(t *testing.T) {
	dir := t.TempDir()
	data, b := filepath.Join(dir, "data"), filepath.Join(dir, "b")
	key := filepath.Join("..", "..", "testdata", "keys", "firmware-test")
	outpostOK(t, "firmware", "export", b)
	edit := func(file, old, new string) {
		t.Helper()
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Contains(t, string(raw), old)
		require.NoError(t, os.WriteFile(file, []byte(strings.Replace(string(raw), old, new, 1)), 0o644))
	}
	setBundleVersion(t, b, embeddedVersion(t)+1)
	// The first router of the agent's graph is its intake node.
	edit(filepath.Join(b, "agents", firmware.ReferenceAgent+".json"), `"kind": "router"`, `"kind": "`+countedKind+`"`)
	outpostOK(t, "firmware", "sign", "--key", key+".key", b)
	outpostOK(t, "firmware", "install", "--data", data, "--keys", key+".pub", b)

	countedBuilds.Store(0)
	out := outpostOK(t, "run", "--data", data, "--agent", firmware.ReferenceAgent, "I forgot my metformin dose")
	require.Contains(t, out, ": completed")
	require.Regexp(t, `node.completed +intake `, out, "the turn ran through the counted node")
	require.EqualValues(t, 1, countedBuilds.Load(), "compilations of the agent's graph by one run")
}

// serve with no bundle installed serves the embedded one: it resolves
// agents, lists the bundle for the console and, with an uplink, redacts
// outcomes with the bundle compiled once, not once for each use.
func TestServeCompilesTheEmbeddedBundleOnce(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "uplink-secret")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2-but-longer\n"), 0o600))
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"alone", nil},
		{"with an uplink", []string{"--uplink", "http://127.0.0.1:1", "--uplink-secret", secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			before := firmware.Compilations()
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan int, 1)
			var out, errb bytes.Buffer
			go func() {
				served <- execute(ctx, append([]string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, tc.flags...), &out, &errb)
			}()
			awaitControl(t, data) // serve has resolved its agents, listed its bundles and started its uplink
			compiled := firmware.Compilations() - before
			cancel()
			require.Zero(t, <-served, errb.String())
			require.Contains(t, out.String(), "bundle: "+firmware.ReferenceName, "the embedded bundle served")
			require.EqualValues(t, 1, compiled, "compilations of the embedded bundle by one serve")
		})
	}
}
