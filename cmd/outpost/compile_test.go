package main

import (
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
	ok := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := outpost(t, args...)
		require.Zero(t, code, "%v: %s", args, stderr)
		return stdout
	}
	ok("firmware", "export", b)
	edit := func(file, old, new string) {
		t.Helper()
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Contains(t, string(raw), old)
		require.NoError(t, os.WriteFile(file, []byte(strings.Replace(string(raw), old, new, 1)), 0o644))
	}
	edit(filepath.Join(b, "manifest.json"), `"version": 1,`, `"version": 2,`)
	// The first router of the agent's graph is its intake node.
	edit(filepath.Join(b, "agents", firmware.ReferenceAgent+".json"), `"kind": "router"`, `"kind": "`+countedKind+`"`)
	ok("firmware", "sign", "--key", key+".key", b)
	ok("firmware", "install", "--data", data, "--keys", key+".pub", b)

	countedBuilds.Store(0)
	out := ok("run", "--data", data, "--agent", firmware.ReferenceAgent, "I forgot my metformin dose")
	require.Contains(t, out, ": completed")
	require.Regexp(t, `node.completed +intake `, out, "the turn ran through the counted node")
	require.EqualValues(t, 1, countedBuilds.Load(), "compilations of the agent's graph by one run")
}
