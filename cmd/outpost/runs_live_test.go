package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
	"github.com/outpost-edge/outpost/store"
)

// holdAgent resolves the agent "hold" (enginetest.HoldAgent), which holds
// a run whose input is "hold" until release is closed.
func holdAgent(t *testing.T, release <-chan struct{}) engine.Resolver {
	ag := enginetest.HoldAgent(t, "hold", release)
	return func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name != "hold" {
			return nil, fmt.Errorf("%w %q", engine.ErrUnknownAgent, name)
		}
		return ag, nil
	}
}

// exitOwner owns the store in dir as serve does, with a run manager in
// exit durability: its console on a loopback HTTP server and its control
// socket, until stop (also a cleanup).
type exitOwner struct {
	m     *engine.Manager
	url   string
	token string
	stop  func()
}

func ownInExitDurability(t *testing.T, dir string, resolve engine.Resolver) *exitOwner {
	t.Helper()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	bus := engine.NewBus()
	m := engine.NewManager(db, resolve, engine.ManagerOptions{Durability: engine.DurabilityExit, Workers: 4, Events: bus})
	srv := console.New(console.Config{Manager: m, Bus: bus, Resolve: resolve, Agents: []string{"hold"}, Token: "secret"})
	hs := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- store.ServeControl(ctx, db, dir, m) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			hs.Close()
			srv.Close()
			m.Close()
			cancel()
			require.NoError(t, <-served)
			bus.Close()
			require.NoError(t, db.Close())
		})
	}
	t.Cleanup(stop)
	awaitControl(t, dir)
	return &exitOwner{m: m, url: hs.URL, token: "secret", stop: stop}
}

// start starts a run of the hold agent on thread, and waits for it to end
// unless its input is "hold".
func (o *exitOwner) start(t *testing.T, thread, input string) string {
	t.Helper()
	raw, _ := json.Marshal(input)
	r, err := o.m.Start(t.Context(), engine.RunRequest{Thread: thread, Agent: "hold", Input: raw})
	require.NoError(t, err)
	if input != "hold" {
		_, err = o.m.Wait(t.Context(), r.ID)
		require.NoError(t, err)
	}
	return r.ID
}

// listPage is one page of runs as a list shows it: ids with their
// statuses, the next page's start, and the damaged records named.
type listPage struct {
	Runs    []string
	Next    string
	Damaged []string
}

// httpPage is GET /api/v1/runs with query q.
func (o *exitOwner) httpPage(t *testing.T, q url.Values) listPage {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, o.url+"/api/v1/runs?"+q.Encode(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+o.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var page struct {
		Runs    []struct{ ID, Status string }
		Next    string
		Damaged []struct{ Key string }
	}
	require.NoError(t, json.Unmarshal(body, &page))
	out := listPage{Next: page.Next}
	for _, r := range page.Runs {
		out.Runs = append(out.Runs, r.ID+" "+r.Status)
	}
	for _, d := range page.Damaged {
		out.Damaged = append(out.Damaged, d.Key)
	}
	return out
}

// cliPage is outpost runs list --json with the flags of query q.
func cliPage(t *testing.T, dir string, q url.Values) listPage {
	t.Helper()
	args := []string{"runs", "list", "--data", dir, "--json"}
	for k, flag := range map[string]string{"status": "--status", "agent": "--agent", "thread": "--thread", "limit": "--limit", "after": "--after"} {
		if v := q.Get(k); v != "" {
			args = append(args, flag, v)
		}
	}
	if q.Get("order") == "desc" {
		args = append(args, "--newest-first")
	}
	r := outpostResult(t, args...)
	var page struct {
		Runs []struct{ ID, Status string }
		Next string
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page), "%v: %s", args, r.stderr)
	out := listPage{Next: page.Next}
	for _, run := range page.Runs {
		out.Runs = append(out.Runs, run.ID+" "+string(run.Status))
	}
	for _, m := range regexp.MustCompile(`left out: .*, key (\S+): `).FindAllStringSubmatch(r.stderr, -1) {
		out.Damaged = append(out.Damaged, m[1])
	}
	require.Equal(t, len(out.Damaged) > 0, r.code == 1, "%v: exit %d: %s", args, r.code, r.stderr)
	return out
}

// While serve owns the store, runs list through its control socket shows
// the runs that GET /api/v1/runs shows, page by page: in exit durability,
// a run still running has no record yet, and the list had left it out
// (and showed a stored queued run that a worker executes as queued, where
// the HTTP list says running). runs show finds such a run, as GET
// /api/v1/runs/{id} does. A damaged record is named on the page whose
// range holds it, by both.
func TestRunsListThroughServeShowsExitRunsNotStoredYet(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	defer close(release)
	resolve := holdAgent(t, release)

	// Three runs stored, the middle one then damaged.
	var stored []string
	o := ownInExitDurability(t, dir, resolve)
	for _, th := range []string{"a", "b", "a"} {
		stored = append(stored, o.start(t, th, "go"))
	}
	o.stop()
	eachRunRecord(t, dir, func(tx *bbolt.Tx, k []byte) error {
		if string(k) != stored[1] {
			return nil
		}
		b := tx.Bucket([]byte("runs"))
		v := append([]byte(nil), b.Get(k)...)
		v[len(v)/2] ^= 0xff
		return b.Put(k, v)
	})

	o = ownInExitDurability(t, dir, resolve)
	live := o.start(t, "hold", "hold")
	require.Eventually(t, func() bool {
		r, err := o.m.Run(t.Context(), live)
		return err == nil && r.Status == engine.StatusRunning
	}, 5*time.Second, 10*time.Millisecond)
	last := o.start(t, "c", "go")
	_, err := o.m.Store().Run(t.Context(), live)
	require.ErrorIs(t, err, engine.ErrRunNotFound, "exit durability stores the run when it ends")

	for _, q := range []url.Values{
		{}, {"order": {"desc"}}, {"status": {"running"}}, {"status": {"queued"}}, {"status": {"completed"}},
		{"thread": {"hold"}}, {"agent": {"hold"}}, {"after": {stored[2]}}, {"order": {"desc"}, "after": {last}},
	} {
		for _, limit := range []int{1, 2, 100} {
			q := cloneValues(q)
			q.Set("limit", strconv.Itoa(limit))
			for page := 1; ; page++ {
				want := o.httpPage(t, q)
				require.Equal(t, want, cliPage(t, dir, q), "%s, page %d", q.Encode(), page)
				if want.Next == "" {
					break
				}
				q.Set("after", want.Next)
			}
		}
	}
	// The held run is on the list, running.
	all := o.httpPage(t, url.Values{})
	require.Contains(t, all.Runs, live+" running")
	require.Equal(t, []string{stored[1]}, all.Damaged)

	r := outpostResult(t, "runs", "show", live, "--data", dir, "--json")
	require.Zero(t, r.code, r.stderr)
	var shown engine.Run
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Equal(t, engine.StatusRunning, shown.Status)
	require.Equal(t, "hold", shown.Thread)
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}
