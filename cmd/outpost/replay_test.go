package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/store"
)

func TestRunsReplay(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--thread", "a", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpost(t, "run", "--data", dir, "--thread", "a", "remind me to refill metformin")
	require.Zero(t, code, stderr)
	m := regexp.MustCompile(`outpost resume (run_\w+) --interrupt (int_\w+)`).FindStringSubmatch(stdout)
	require.Len(t, m, 3, stdout)
	code, _, stderr = outpost(t, "resume", "--data", dir, m[1], "--interrupt", m[2], "--decision", "edit", "--value", `"We will call you."`, "--by", "nurse")
	require.Zero(t, code, stderr)

	code, stdout, stderr = outpost(t, "runs", "replay", m[1], "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var rep struct {
		Same  bool
		Steps int
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.True(t, rep.Same, stdout)
	require.Equal(t, 7, rep.Steps)

	// Take the recorded model response away: the replay must not ask a
	// model, so it parts from the original and says where.
	require.NotZero(t, deleteCallRecords(t, dir, func(k []byte) bool { return bytes.HasPrefix(k, []byte("model:"+m[1])) }),
		"the run's model call was recorded")
	code, stdout, stderr = outpost(t, "runs", "replay", m[1], "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "does not replay")
	require.Contains(t, stdout, "generate_response")
	require.Contains(t, stderr, "differs from the original")
}

// deleteCallRecords deletes from the store in dir the call records whose
// keys match, and returns how many it deleted.
func deleteCallRecords(t *testing.T, dir string, match func(key []byte) bool) int {
	t.Helper()
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, bdb.Close()) }()
	var keys [][]byte
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("toolcalls"))
		_ = b.ForEach(func(k, _ []byte) error {
			if match(k) {
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	}))
	return len(keys)
}

// A run of an agent whose subgraph (the reference tools agent, as a node
// of kind subgraph) calls the model and a tool replays: the subgraph's
// calls are found under their original keys. Without the record of its
// tool call, the replay says which call the original did not make.
func TestRunsReplayOfASubgraph(t *testing.T) {
	dir := t.TempDir()
	data, b := filepath.Join(dir, "data"), filepath.Join(dir, "b")
	key := filepath.Join("..", "..", "testdata", "keys", "firmware-test")
	outpostOK(t, "firmware", "export", b)
	setBundleVersion(t, b, embeddedVersion(t)+1)
	mf := filepath.Join(b, firmware.ManifestFile)
	raw, err := os.ReadFile(mf)
	require.NoError(t, err)
	raw = bytes.Replace(raw, []byte(`"agents": {`), []byte(`"agents": {"care-team": "agents/care-team.json", `), 1)
	require.NoError(t, os.WriteFile(mf, raw, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(b, "agents", "care-team.json"), []byte(`{
  "name": "care-team",
  "channels": [
    {"name": "input", "type": "string", "reducer": "replace"},
    {"name": "messages", "type": "messages", "reducer": "append"},
    {"name": "answer", "type": "string", "reducer": "replace"}],
  "input": "input", "output": "answer", "history": "messages", "step_limit": 40,
  "nodes": [{"name": "team", "kind": "subgraph", "config": {"graph": "agents/medication-adherence-tools.json"}}],
  "edges": [{"from": "START", "to": "team"}, {"from": "team", "to": "END"}]
}`), 0o644))
	outpostOK(t, "firmware", "sign", "--key", key+".key", b)
	outpostOK(t, "firmware", "install", "--data", data, "--keys", key+".pub", b)

	var run string
	for range 2 { // the second turn starts from the first's end
		out := outpostOK(t, "run", "--data", data, "--agent", "care-team", "--thread", "a", "what time is it today for my metformin")
		m := regexp.MustCompile(`run (run_\w+) on thread a: completed`).FindStringSubmatch(out)
		require.Len(t, m, 2, out)
		run = m[1]
		require.Contains(t, out, "team/generate_response")
	}
	var rep struct {
		Same  bool
		Steps int
	}
	require.NoError(t, json.Unmarshal([]byte(outpostOK(t, "runs", "replay", run, "--data", data, "--json")), &rep))
	require.True(t, rep.Same)
	require.Equal(t, 1, rep.Steps, "the run's one step is the subgraph node's")

	// The subgraph's tool call: current_time, which the model asked for.
	db, err := store.OpenDir(data, store.Options{})
	require.NoError(t, err)
	calls, err := db.ToolCalls(context.Background(), run+":")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	var tool string
	for _, c := range calls {
		if c.Tool == "current_time" {
			tool = c.Key
		}
	}
	require.NotEmpty(t, tool, "%v", calls)
	require.Equal(t, 1, deleteCallRecords(t, data, func(k []byte) bool { return string(k) == tool }))
	code, stdout, stderr := outpost(t, "runs", "replay", run, "--data", data)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stdout, "does not replay")
	require.Contains(t, stdout, "call "+tool+" (current_time) was not made by the original run")
}

// rewriteCallRecord replaces the call record under key in the store in
// dir with what change makes of it.
func rewriteCallRecord(t *testing.T, dir, key string, change func(*agent.CallRecord)) {
	t.Helper()
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	rec, err := wiring.CallLog(db, db).Get(ctx, key)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Equal(t, 1, deleteCallRecords(t, dir, func(k []byte) bool { return string(k) == key }))
	change(rec)
	db, err = store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	log := wiring.CallLog(db, db)
	_, err = log.Intent(ctx, *rec)
	require.NoError(t, err)
	require.NoError(t, log.Done(ctx, key, rec.Result, rec.Error))
}

// A replay whose model call asks something other than the recorded
// request is reported at that call, in --json as fields added to the
// report's; a record that keeps no digest of its request is served, with
// a note.
func TestRunsReplayChecksTheRequests(t *testing.T) {
	dir := t.TempDir()
	out := outpostOK(t, "run", "--data", dir, "--thread", "a", "I forgot my metformin dose")
	m := regexp.MustCompile(`run (run_\w+) on thread a: completed`).FindStringSubmatch(out)
	require.Len(t, m, 2, out)
	run := m[1]
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	calls, err := db.ToolCalls(context.Background(), "model:"+run+":")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.NotEmpty(t, calls)
	key := calls[0].Key

	// The report's fields before requests were checked, and their types.
	compatible := func(t *testing.T, stdout string) map[string]any {
		var rep map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
		require.IsType(t, "", rep["run"])
		require.IsType(t, float64(0), rep["steps"])
		require.IsType(t, false, rep["same"])
		if d, ok := rep["difference"].(map[string]any); ok {
			require.IsType(t, float64(0), d["step"])
			for _, f := range []string{"original", "replayed", "detail"} {
				require.IsType(t, "", d[f], f)
			}
		}
		return rep
	}
	rep := compatible(t, outpostOK(t, "runs", "replay", run, "--data", dir, "--json"))
	require.Equal(t, true, rep["same"])
	require.NotContains(t, rep, "notes")

	// The record says the system prompt was another.
	rewriteCallRecord(t, dir, key, func(r *agent.CallRecord) {
		var d models.RequestDigest
		require.NoError(t, json.Unmarshal(r.Args, &d))
		require.NotEmpty(t, d.Messages)
		d.Messages[0].Digest = "0000000000000000"
		r.Args, _ = json.Marshal(d)
		r.ArgsHash = "sha256:00"
	})
	code, stdout, stderr := outpost(t, "runs", "replay", run, "--data", dir, "--json")
	require.Equal(t, 1, code, stderr)
	rep = compatible(t, stdout)
	require.Equal(t, false, rep["same"])
	d := rep["difference"].(map[string]any)
	require.Equal(t, key, d["call"])
	require.Equal(t, "message 0", d["part"])
	code, stdout, _ = outpost(t, "runs", "replay", run, "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "call "+key)
	require.Contains(t, stdout, "its message 0 differs")

	// An older record, with no digest of its request.
	rewriteCallRecord(t, dir, key, func(r *agent.CallRecord) { r.Args, r.ArgsHash = nil, "" })
	rep = compatible(t, outpostOK(t, "runs", "replay", run, "--data", dir, "--json"))
	require.Equal(t, true, rep["same"])
	require.Len(t, rep["notes"], 1)
	require.Contains(t, rep["notes"].([]any)[0], key)
	require.Contains(t, outpostOK(t, "runs", "replay", run, "--data", dir), "note: call "+key)
}
