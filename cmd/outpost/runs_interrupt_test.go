package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// runs show names the node a run waits in by its path through the
// subgraphs, as events do: two instances of a subgraph, and the run's own
// graph, may each hold a node of the same name.
func TestPrintInterruptsNamesTheNodesPath(t *testing.T) {
	for _, tc := range []struct {
		ns, want string
	}{
		{"", "at loop:"},
		{"a:1f2e", "at a/loop:"},
		{"b:77aa", "at b/loop:"},
		{"team:1f2e/b:77aa", "at team/b/loop:"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			r := &engine.Run{ID: "run_1", Interrupts: []engine.PendingInterrupt{
				{ID: "int_1", Node: "loop", NS: tc.ns, Payload: []byte(`{"reason":"uncertain_side_effect"}`)}}}
			var out bytes.Buffer
			printInterrupts(&out, r, "")
			require.Contains(t, out.String(), "waiting for a decision on int_1 "+tc.want)
		})
	}
}

// runs show --json and runs list --json give each interrupt its path
// through the subgraphs ("path"), as the HTTP API's run does, beside the
// stored record's fields, which stay as they are.
func TestRunsJSONInterruptsNameTheNodesPath(t *testing.T) {
	dir := t.TempDir()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	id := engine.NewRunID()
	// Interrupted inside the subgraph b that the node team's subgraph
	// runs, and in the run's own graph, at nodes of the same bare name.
	r := &engine.Run{ID: id, Thread: "t", Agent: "nested", Status: engine.StatusInterrupted, CreatedAt: time.Now().UTC(),
		Interrupts: []engine.PendingInterrupt{
			{ID: "int_1", Node: "loop", NS: "team:1f2e/b:77aa", TaskID: "task", Payload: json.RawMessage(`{"reason":"ask"}`)},
			{ID: "int_2", Node: "loop", Index: 1}}}
	c := &engine.Checkpoint{Thread: "t", ID: "0000000000000001", RunID: id, Created: r.CreatedAt}
	require.NoError(t, db.Commit(context.Background(), &engine.Commit{Checkpoint: c, Run: r, Sync: true}))
	require.NoError(t, db.Close())

	want := []map[string]any{
		{"id": "int_1", "node": "loop", "ns": "team:1f2e/b:77aa", "task_id": "task", "index": 0.0, "payload": map[string]any{"reason": "ask"}, "path": "team/b/loop"},
		{"id": "int_2", "node": "loop", "index": 1.0, "path": "loop"},
	}
	code, stdout, stderr := outpost(t, "runs", "show", "--json", "--data", dir, id)
	require.Zero(t, code, stderr)
	var one struct {
		ID         string           `json:"id"`
		Status     string           `json:"status"`
		Interrupts []map[string]any `json:"interrupts"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &one), stdout)
	require.Equal(t, id, one.ID, stdout)
	require.Equal(t, "interrupted", one.Status, stdout)
	require.Equal(t, want, one.Interrupts, stdout)

	code, stdout, stderr = outpost(t, "runs", "list", "--json", "--data", dir)
	require.Zero(t, code, stderr)
	var list struct {
		Runs []struct {
			Interrupts []map[string]any `json:"interrupts"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.Len(t, list.Runs, 1, stdout)
	require.Equal(t, want, list.Runs[0].Interrupts, stdout)
}
