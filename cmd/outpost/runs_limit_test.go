package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// runsPage is a page of runs as runs list --json and GET /api/v1/runs
// print it.
type runsPage struct {
	Runs []struct{ ID string }
	Next string
}

func (p runsPage) ids() []string {
	ids := make([]string, len(p.Runs))
	for i, r := range p.Runs {
		ids[i] = r.ID
	}
	return ids
}

// runs list --limit over 1000 reads as 1000, as GET /api/v1/runs reads
// limit=5000, and says so on stderr: the two list the same page, with the
// same next, from the store file and through serve alike. Before, the
// command refused it (exit 1, "--limit must be between 1 and 1000").
func TestRunsListLimitAsTheAPIReadsIt(t *testing.T) {
	data := t.TempDir()
	db, err := store.OpenDir(data, store.Options{})
	require.NoError(t, err)
	const n = 1005
	for i := range n {
		id := fmt.Sprintf("%016x", i+1)
		now := time.Now().UTC()
		require.NoError(t, db.Commit(context.Background(), &engine.Commit{
			Checkpoint: &engine.Checkpoint{Thread: "t1", ID: id, Created: now},
			Run: &engine.Run{ID: "run_" + id, Thread: "t1", Agent: "medication-adherence", Status: engine.StatusCompleted,
				Checkpoint: id, CreatedAt: now, EndedAt: now},
			Sync: i == n-1,
		}))
	}
	require.NoError(t, db.Close())

	list := func(args ...string) runsPage {
		t.Helper()
		code, stdout, stderr := outpostBin(t, "", append([]string{"runs", "list", "--data", data, "--json"}, args...)...)
		require.Zero(t, code, stderr)
		require.Contains(t, stderr, "--limit 5000 reads as 1000, the most one page holds; the \"more:\" line (\"next\" under --json) pages on")
		var p runsPage
		require.NoError(t, json.Unmarshal([]byte(stdout), &p), stdout)
		return p
	}
	first := list("--limit", "5000")
	require.Len(t, first.Runs, 1000)
	require.Equal(t, first.Runs[999].ID, first.Next)
	rest := list("--limit", "5000", "--after", first.Next)
	require.Len(t, rest.Runs, n-1000)
	require.Empty(t, rest.Next)

	code, stdout, _ := outpostBin(t, "", "runs", "list", "--data", data, "--limit", "5000")
	require.Zero(t, code)
	require.Contains(t, stdout, "\nmore: outpost runs list --data "+data+" --limit 1000 --after "+first.Next+"\n")
	for _, bad := range []string{"0", "-5"} {
		code, _, stderr := outpostBin(t, "", "runs", "list", "--data", data, "--limit", bad)
		require.Equal(t, 2, code, bad)
		require.Contains(t, stderr, "--limit must be a whole number from 1 to 1000 (a larger one reads as 1000)")
	}

	s := startServe(t, builtOutpost(t), data)
	for _, page := range []struct {
		query string
		cli   runsPage
	}{{"limit=5000", first}, {"limit=5000&after=" + first.Next, rest}} {
		status, body := s.call(t, http.MethodGet, "/api/v1/runs?"+page.query, "")
		require.Equal(t, http.StatusOK, status, "%s", body)
		var api runsPage
		require.NoError(t, json.Unmarshal(body, &api))
		require.Equal(t, api.ids(), page.cli.ids(), page.query)
		require.Equal(t, api.Next, page.cli.Next, page.query)
	}
	// Through serve's control socket, the same.
	require.Equal(t, first.ids(), list("--limit", "5000").ids())
	s.stop(t)
}
