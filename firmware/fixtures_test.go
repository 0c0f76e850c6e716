package firmware_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

var update = flag.Bool("update", false, "regenerate the test key (if missing) and re-sign testdata/bundles/patterns")

const (
	patternsDir = "../testdata/bundles/patterns"
	testKey     = "../testdata/keys/firmware-test.key"
	testPub     = "../testdata/keys/firmware-test.pub"
)

// TestUpdateFixtures re-signs the patterns bundle with the test key when
// run with -update, so that edits to its files are one command away.
func TestUpdateFixtures(t *testing.T) {
	if !*update {
		t.Skip("run with -update to re-sign the test bundle")
	}
	if _, err := os.Stat(testKey); errors.Is(err, fs.ErrNotExist) {
		dir := t.TempDir()
		id, err := firmware.Keygen(dir)
		if err != nil {
			t.Fatal(err)
		}
		for src, dst := range map[string]string{id + ".key": testKey, id + ".pub": testPub} {
			data, err := os.ReadFile(filepath.Join(dir, src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := firmware.Sign(patternsDir, testKey); err != nil {
		t.Fatal(err)
	}
}

func testKeyring(t testing.TB) *firmware.Keyring {
	t.Helper()
	k, err := firmware.LoadKeyring(testPub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// copyDir copies a bundle directory, so a test can change and re-sign it.
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// editManifest rewrites fields of a bundle's manifest (before re-signing).
func editManifest(t testing.TB, dir string, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, firmware.ManifestFile)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, dir, rel, text string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// variant copies the patterns bundle at a new version, with an edit, signed
// with the test key.
func variant(t testing.TB, version int, edit func(dir string)) string {
	t.Helper()
	dir := copyDir(t, patternsDir)
	editManifest(t, dir, func(m map[string]any) { m["version"] = version })
	if edit != nil {
		edit(dir)
	}
	if err := firmware.Sign(dir, testKey); err != nil {
		t.Fatal(err)
	}
	return dir
}

func loadPatterns(t testing.TB) *firmware.Bundle {
	t.Helper()
	b, err := firmware.Load(patternsDir, testKeyring(t))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// outcome is what a test asserts of a run: its record, its final state and
// the nodes it ran, step by step (nodes of one step in declaration order).
type outcome struct {
	run   *engine.Run
	state *engine.Snapshot
	path  []string
}

func (o outcome) str(ch string) string {
	v, _ := o.state.Value(ch)
	s, _ := v.(string)
	return s
}

func (o outcome) strs(ch string) []string {
	v, _ := o.state.Value(ch)
	s, _ := v.([]string)
	return s
}

// invoke runs one turn of an agent on a fresh thread with a MemoryStore.
func invoke(t testing.TB, resolve engine.Resolver, agent string, input any) outcome {
	t.Helper()
	store := engine.NewMemoryStore()
	m := engine.NewManager(store, resolve, engine.ManagerOptions{Workers: 2})
	defer m.Close()
	raw, _ := json.Marshal(input)
	ctx := context.Background()
	run, err := m.Invoke(ctx, engine.RunRequest{Thread: "t-" + agent, Agent: agent, Input: raw})
	if err != nil {
		t.Fatalf("invoke %s: %v", agent, err)
	}
	return observe(t, store, resolve, run)
}

func observe(t testing.TB, store *engine.MemoryStore, resolve engine.Resolver, run *engine.Run) outcome {
	t.Helper()
	ctx := context.Background()
	ag, err := resolve(run.Agent, run.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := ag.Graph.StateAt(ctx, engine.RunConfig{Thread: run.Thread, Store: store}, "")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := ag.Graph.History(ctx, store, run.Thread, 0)
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for i := len(hist) - 1; i >= 0; i-- {
		if c := hist[i]; c.Source == engine.SourceLoop {
			path = append(path, c.Nodes...)
		}
	}
	return outcome{run: run, state: snap, path: path}
}

func join(s []string) string { return strings.Join(s, ",") }
