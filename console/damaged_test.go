package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/store"
)

// damageRun flips a byte in the middle of run id's record in the store
// file of dir, which no process has open: the record then fails its
// checksum while bbolt's pages stay whole.
func damageRun(t *testing.T, dir, id string) {
	t.Helper()
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("runs"))
		v := append([]byte(nil), b.Get([]byte(id))...)
		if len(v) == 0 {
			return fmt.Errorf("no run record %s", id)
		}
		v[len(v)/2] ^= 0xff
		return b.Put([]byte(id), v)
	}))
	require.NoError(t, bdb.Close())
}

// listPage is one page of GET /api/v1/runs.
type listPage struct {
	Runs []struct {
		ID string `json:"id"`
	} `json:"runs"`
	Next    string `json:"next"`
	Damaged []struct {
		Key   string `json:"key"`
		Error string `json:"error"`
	} `json:"damaged"`
}

// A run record that cannot be read is left out of the run list, and
// named under "damaged" on the one page whose range holds it, whatever the
// page size: every readable run is listed once, and each damaged one named
// once, with status 200.
func TestListRunsLeavesOutDamagedRecords(t *testing.T) {
	dir := t.TempDir()
	e := newEnvIn(t, dir, nil)
	var ids []string
	for _, th := range []string{"a", "b", "c", "d", "e"} {
		_, run := e.startRun("dmg-"+th, "hi", "20s")
		require.Equal(t, "completed", run["status"])
		ids = append(ids, run["id"].(string))
	}
	e.close()
	damageRun(t, dir, ids[1])
	damageRun(t, dir, ids[4]) // the last: no readable run after it
	readable := []string{ids[0], ids[2], ids[3]}
	broken := []string{ids[1], ids[4]}

	e = newEnvIn(t, dir, nil)
	for _, tc := range []struct {
		query    string
		runs     []string
		maxPages int
		damaged  []string
	}{
		{"", readable, 1, broken},
		{"limit=1", readable, 3, broken},
		{"limit=2", readable, 2, broken},
		{"limit=1&agent=" + testAgent, readable, 3, broken},
		{"status=completed&limit=2", readable, 2, broken},
		// Queued, running and interrupted runs are listed through the
		// store's index of them, which the damaged records of finished
		// runs are not in: they are not met, and not named.
		{"status=running", nil, 1, nil},
		{"status=interrupted", nil, 1, nil},
	} {
		t.Run(tc.query, func(t *testing.T) {
			var runs, damaged []string
			after := ""
			for pages := 1; ; pages++ {
				require.LessOrEqual(t, pages, tc.maxPages, "too many pages")
				r := e.do("GET", "/api/v1/runs?"+tc.query+"&after="+after, nil)
				require.Equal(t, http.StatusOK, r.status, "%s", r.body)
				var p listPage
				require.NoError(t, json.Unmarshal(r.body, &p))
				for _, run := range p.Runs {
					runs = append(runs, run.ID)
				}
				for _, d := range p.Damaged {
					damaged = append(damaged, d.Key)
					assert.Contains(t, d.Error, "corrupt record in bucket runs")
					assert.Contains(t, d.Error, "outpost db check")
				}
				if p.Next == "" {
					break
				}
				after = p.Next
			}
			assert.Equal(t, tc.runs, runs)
			assert.Equal(t, tc.damaged, damaged)
		})
	}

	// A list with nothing left out has no "damaged" field, as before.
	r := e.do("GET", "/api/v1/runs?limit=1", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.NotContains(t, r.json(t), "damaged")
	assert.Equal(t, []any{ids[0]}, runIDs(r.json(t)))
}

func runIDs(m map[string]any) []any {
	var out []any
	for _, r := range m["runs"].([]any) {
		out = append(out, r.(map[string]any)["id"])
	}
	return out
}

// A damaged run record does not take the store down in /healthz (it is
// degraded: the other runs are read), nor fail /metrics, which counts it
// apart from the runs it can read, once each.
func TestDamagedRunInHealthAndMetrics(t *testing.T) {
	dir := t.TempDir()
	e := newEnvIn(t, dir, nil)
	var ids []string
	for _, th := range []string{"a", "b", "c"} {
		_, run := e.startRun("hm-"+th, "hi", "20s")
		ids = append(ids, run["id"].(string))
	}
	e.close()
	damageRun(t, dir, ids[0]) // the first: the health probe meets it
	damageRun(t, dir, ids[2]) // the last: met by two listings, counted once
	e = newEnvIn(t, dir, nil)

	hz := e.do("GET", "/healthz", nil)
	require.Equal(t, http.StatusOK, hz.status, "%s", hz.body)
	st := hz.json(t)["components"].(map[string]any)["store"].(map[string]any)
	assert.Equal(t, "degraded", st["state"], "%s", hz.body)
	assert.Contains(t, st["detail"], "cannot be read")
	assert.Contains(t, st["detail"], ids[0])

	m := e.do("GET", "/metrics", nil)
	require.Equal(t, http.StatusOK, m.status, "%s", m.body)
	assert.Contains(t, string(m.body), "\noutpost_runs_damaged 2\n")
	assert.Contains(t, string(m.body), `outpost_runs{status="completed"} 1`+"\n")
}

// The console page says, in a line above the run list, that run records
// were left out and which, and lists the others.
func TestConsoleWarnsOfDamagedRuns(t *testing.T) {
	if findChromium() == "" {
		t.Skip("SKIPPING THE BROWSER TEST: no chromium found (apt-get install -y chromium; .ci/run installs it)")
	}
	dir := t.TempDir()
	e := newEnvIn(t, dir, nil)
	var ids []string
	for _, th := range []string{"a", "b", "c"} {
		_, run := e.startRun("page-"+th, "hi", "20s")
		ids = append(ids, run["id"].(string))
	}
	e.close()
	damageRun(t, dir, ids[1])
	e = newEnvIn(t, dir, nil)

	c, ctx, shot0 := openChromium(t)
	shot := func(name string) { shot0("damaged-" + name) }
	signIn(ctx, t, c, e, shot)
	c.until(ctx, "the warning", `!document.getElementById("runs-damaged").hidden &&
		document.getElementById("runs-damaged").textContent.includes(`+jsString(ids[1])+`) &&
		document.getElementById("runs-damaged").textContent.includes("1 run record(s) cannot be read")`, shot)
	c.until(ctx, "the other runs", `document.querySelectorAll("#runs li").length === 2`, shot)
	shot("2-warning")
	box, _ := c.eval(ctx, `JSON.stringify(document.getElementById("runs-damaged").getBoundingClientRect())`).(string)
	assert.NotContains(t, box, `"height":0`, "the warning is not visible")
}

// A damaged run record does not keep the other threads from forking: the
// fork asks the manager whether a run holds the thread, not the records.
func TestForkPassesOverADamagedRecord(t *testing.T) {
	dir := t.TempDir()
	e := newEnvIn(t, dir, nil)
	_, ok := e.startRun("fork-ok", "hi", "20s")
	_, bad := e.startRun("fork-bad", "hi", "20s")
	require.Equal(t, "completed", ok["status"])
	e.close()
	damageRun(t, dir, bad["id"].(string))

	e = newEnvIn(t, dir, nil)
	h := e.do("GET", "/api/v1/threads/fork-ok/history", nil)
	require.Equal(t, http.StatusOK, h.status, "%s", h.body)
	cps := h.json(t)["checkpoints"].([]any)
	base := cps[len(cps)-1].(map[string]any)["id"].(string)
	r := e.do("POST", "/api/v1/threads/fork-ok/fork", map[string]any{"checkpoint": base})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, base, r.json(t)["parent"])
}
