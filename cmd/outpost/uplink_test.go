package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/uplink"
)

// syncBuffer is a writer that the collector command and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

// uplinkSecrets writes the collector's secrets file in coll, naming the
// appliance id, and the appliance's secret file in app, and returns them.
func uplinkSecrets(t *testing.T, app, coll, id string) (secrets, mine string) {
	t.Helper()
	secrets, mine = filepath.Join(coll, "secrets"), filepath.Join(app, "uplink-secret")
	require.NoError(t, os.WriteFile(secrets, []byte(id+" hunter2-but-longer\n"), 0o600))
	require.NoError(t, os.WriteFile(mine, []byte("hunter2-but-longer\n"), 0o600))
	return secrets, mine
}

// startCollector runs "outpost collector" on a loopback port with data
// folder coll until ctx ends, and returns its URL, what it prints, and its
// exit code once it has ended.
func startCollector(t *testing.T, ctx context.Context, coll, secrets string) (url string, out *syncBuffer, done chan int) {
	t.Helper()
	out, done = &syncBuffer{}, make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"collector", "--listen", "127.0.0.1:0", "--data", coll, "--secrets", secrets}, out, io.Discard)
	}()
	addr := regexp.MustCompile(`http://\S+`)
	deadline := time.Now().Add(10 * time.Second)
	for addr.FindString(out.String()) == "" {
		require.True(t, time.Now().Before(deadline), "collector did not start: %s", out.String())
		time.Sleep(10 * time.Millisecond)
	}
	return addr.FindString(out.String()), out, done
}

// startCollectorFor starts a collector with data folder coll that takes
// the appliance of data folder app (startCollector), and returns the
// appliance's uplink status, the collector's URL, the appliance's secret
// file, and what startCollector returns.
func startCollectorFor(t *testing.T, ctx context.Context, app, coll string) (st uplink.Status, url, mine string, out *syncBuffer, done chan int) {
	t.Helper()
	code, status, stderr := outpostBin(t, "", "uplink", "status", "--data", app, "--json")
	require.Zero(t, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(status), &st))
	secrets, mine := uplinkSecrets(t, app, coll, st.ApplianceID)
	url, out, done = startCollector(t, ctx, coll, secrets)
	return st, url, mine, out, done
}

// uplink flush and uplink status take serve's names of the uplink flags
// (--uplink, --uplink-secret, --appliance-id) beside their own (--url,
// --secret-file), so that serve's flags can be copied; -h lists each flag
// once, naming its alias.
func TestUplinkTakesServesFlagNames(t *testing.T) {
	app, coll := t.TempDir(), t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", app, "I forgot my metformin dose this morning")
	require.Zero(t, code, stderr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, url, mine, out, done := startCollectorFor(t, ctx, app, coll)
	require.Contains(t, out.String(), "(1 appliance, store: "+coll+")", "one appliance is one, not 1 appliances")

	serveFlags := []string{"--data", app, "--uplink", url, "--uplink-secret", mine, "--appliance-id", st.ApplianceID}
	code, status, stderr := outpostBin(t, "", append([]string{"uplink", "status", "--json"}, serveFlags...)...)
	require.Zero(t, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(status), &st))
	require.True(t, st.Configured, "--uplink is --url")
	require.Equal(t, url, st.URL)
	require.Equal(t, uint64(1), st.Backlog)

	// A flag under both its names is refused, not read as the last one;
	// the flush below finds the backlog it would have sent.
	for _, both := range [][]string{{"--url", "http://127.0.0.1:1", "--uplink", url}, {"--secret-file", mine, "--uplink-secret", mine}} {
		code, _, stderr = outpostBin(t, "", append(append([]string{"uplink", "flush"}, serveFlags...), both...)...)
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, "are one flag: give it once")
	}
	code, flushed, stderr := outpostBin(t, "", append([]string{"uplink", "flush"}, serveFlags...)...)
	require.Zero(t, code, stderr)
	require.Contains(t, flushed, "1 outcomes, 1 acknowledged upstream, backlog 0")
	code, flushed, stderr = outpostBin(t, "", "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, "the old names still work: %s", stderr)
	require.Contains(t, flushed, "backlog 0")

	for _, sub := range []string{"status", "flush"} {
		code, help, _ := outpostBin(t, "", "uplink", sub, "-h")
		require.Zero(t, code)
		require.Contains(t, help, "(or --uplink)\n", sub)
		require.Contains(t, help, "(or --uplink-secret)\n", sub)
		require.Contains(t, help, "  -appliance-id ", sub)
		require.NotContains(t, help, "  -uplink", "%s: an alias is not listed on its own", sub)
	}
	cancel()
	require.Zero(t, <-done)
}

func TestUplinkFlushToCollector(t *testing.T) {
	app, coll := t.TempDir(), t.TempDir()
	code, out, errs := outpost(t, "uplink", "status", "--data", app, "--json")
	// No store yet: status says so.
	require.Equal(t, 1, code, out)
	assert.Contains(t, errs, "no store")

	code, _, errs = outpost(t, "run", "--data", app, "I forgot my metformin dose this morning")
	require.Equal(t, 0, code, errs)
	code, out, errs = outpost(t, "uplink", "status", "--data", app, "--json")
	require.Equal(t, 0, code, errs)
	var st uplink.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.Equal(t, uint64(1), st.Backlog)
	assert.False(t, st.Configured)

	secrets, mine := uplinkSecrets(t, app, coll, st.ApplianceID)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, cout, done := startCollector(t, ctx, coll, secrets)

	code, out, errs = outpost(t, "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "backlog 0")

	code, out, errs = outpost(t, "db", "check", "--data", app)
	require.Equal(t, 0, code, out+errs)

	// The list of appliances takes the token the collector made.
	assert.Contains(t, cout.String(), "outpost token --collector --data "+coll)
	fi, err := os.Stat(filepath.Join(coll, uplink.TokenFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	code, tok, errs := outpost(t, "token", "--collector", "--data", coll)
	require.Equal(t, 0, code, errs)
	tok = strings.TrimSpace(tok)
	require.NotEmpty(t, tok)
	for auth, want := range map[string]int{"": http.StatusUnauthorized, "Bearer " + tok: http.StatusOK} {
		req, err := http.NewRequest(http.MethodGet, url+uplink.AppliancesPath, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "%s", body)
		if want == http.StatusOK {
			assert.Contains(t, string(body), `"appliance_id":"`+st.ApplianceID+`"`)
		}
	}
	code, _, errs = outpost(t, "token", "--collector", "--data", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "no collector token")

	cancel()
	require.Equal(t, 0, <-done)
	st2, err := uplink.OpenBoltStore(coll)
	require.NoError(t, err)
	defer st2.Close()
	list, err := st2.Appliances(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, st.ApplianceID, list[0].ApplianceID)
	assert.Equal(t, uint64(1), list[0].LastSeq)
	assert.Equal(t, "ok", list[0].Chain)
	recs, err := st2.Records(context.Background(), st.ApplianceID, 0, 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	// The reference bundle's policy keeps the status and the run id in
	// clear, and leaves no field home.
	assert.Contains(t, string(recs[0].Line), `"status":"completed"`)
	assert.Contains(t, string(recs[0].Line), `"run":"run_`)
	assert.NotContains(t, string(recs[0].Line), `"redacted"`)
}

// A long flush prints how far it has got, once an interval has passed, from
// the batches the collector acknowledged; other events are ignored.
func TestFlushProgress(t *testing.T) {
	var out strings.Builder
	p := newFlushProgress(&out, 1000, 0)
	sent := func(acked uint64) engine.Event {
		data, _ := json.Marshal(map[string]any{"acked_seq": acked, "records": 500})
		return engine.Event{Type: engine.EventUplinkSent, Data: data}
	}
	p.Publish(sent(500), engine.Event{Type: engine.EventRunCompleted, Data: []byte(`{"acked_seq":7}`)})
	p.Publish(sent(1000))
	assert.Equal(t, "uplink: 500 of 1000 outcomes acknowledged in 0s…\nuplink: 1000 of 1000 outcomes acknowledged in 0s…\n", out.String())

	out.Reset()
	p = newFlushProgress(&out, 1000, time.Hour)
	p.Publish(sent(500))
	assert.Empty(t, out.String(), "nothing before the interval")
}

// uplink status says what it can know: --url reports the uplink as
// configured (it is what the flag is for), and while serve owns the store,
// whose uplink only serve knows, the status says where to read its errors.
func TestUplinkStatusSaysWhatItKnows(t *testing.T) {
	app := t.TempDir()
	code, _, errs := outpost(t, "run", "--data", app, "I forgot my metformin dose this morning")
	require.Equal(t, 0, code, errs)

	for _, owned := range []bool{false, true} {
		if owned {
			serveStore(t, app)
		}
		code, out, errs := outpost(t, "uplink", "status", "--data", app, "--json")
		require.Equal(t, 0, code, errs)
		var st uplink.Status
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		assert.False(t, st.Configured, "owned %v: no --url", owned)
		assert.Equal(t, uint64(1), st.Backlog)

		code, out, errs = outpost(t, "uplink", "status", "--data", app, "--url", "http://127.0.0.1:1", "--json")
		require.Equal(t, 0, code, errs)
		st = uplink.Status{}
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		assert.True(t, st.Configured, "owned %v: --url reports the uplink as configured", owned)
		assert.Equal(t, "http://127.0.0.1:1", st.URL, "owned %v", owned)

		code, out, errs = outpost(t, "uplink", "status", "--data", app)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "backlog 1")
		if owned {
			assert.Contains(t, out, "GET /api/v1/uplink", "serve holds the last error and the last success")
		} else {
			assert.NotContains(t, out, "GET /api/v1/uplink")
		}
	}
}

// uplink status in text said nothing of an uplink that is not configured
// (only --json had configured: false), so a backlog that never drains
// looked like a collector that does not answer. It says so, and what
// serve takes to configure one; with --url it does not.
func TestUplinkStatusSaysWhenNoneIsConfigured(t *testing.T) {
	data, _ := oneOutcomeToSend(t)
	code, stdout, stderr := outpostBin(t, "", "uplink", "status", "--data", data)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "no uplink configured")
	require.Contains(t, stdout, "start serve with --uplink URL --appliance-id ID --uplink-secret FILE")

	code, stdout, stderr = outpostBin(t, "", "uplink", "status", "--data", data, "--url", "http://127.0.0.1:9")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, ": 1 outcomes, 0 acknowledged upstream, backlog 1")
	require.NotContains(t, stdout, "no uplink configured")

	// Its help says how it tells a configured uplink.
	code, stdout, stderr = outpostBin(t, "", "uplink", "status", "-h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, strings.Join(strings.Fields(stdout), " "), "without it, it says that none is and what serve takes to send the ledger")
}

// uplink status, while serve runs, said that serve sends the uplink even
// when serve was started without --uplink. It says whether serve sends
// one, and to which collector (with no password, and never the secret).
func TestUplinkStatusSaysWhetherServeSendsIt(t *testing.T) {
	data, secret := oneOutcomeToSend(t)
	bin := builtOutpost(t)
	type owned struct {
		Owner *struct {
			Command     string `json:"command"`
			SendsUplink bool   `json:"sends_uplink"`
			UplinkURL   string `json:"uplink_url"`
		} `json:"owner"`
		Configured bool   `json:"configured"`
		Backlog    uint64 `json:"backlog"`
	}
	status := func() (string, owned) {
		t.Helper()
		code, text, errs := outpostBin(t, "", "uplink", "status", "--data", data)
		require.Equal(t, 0, code, errs)
		code, out, errs := outpostBin(t, "", "uplink", "status", "--data", data, "--json")
		require.Equal(t, 0, code, errs)
		var st owned
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		return text, st
	}

	s := startServe(t, bin, data)
	text, st := status()
	assert.Contains(t, text, "serve is running without an uplink")
	assert.NotContains(t, text, "sends its uplink")
	require.NotNil(t, st.Owner, "--json names the owner")
	assert.Equal(t, "serve", st.Owner.Command)
	assert.False(t, st.Owner.SendsUplink)
	assert.Empty(t, st.Owner.UplinkURL)
	assert.False(t, st.Configured, "configured still says what --url says")
	// flush, refused while serve owns the store, says the same.
	code, _, errs := outpostBin(t, "", "uplink", "flush", "--data", data, "--url", "http://127.0.0.1:9", "--secret-file", secret)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "serve is running without an uplink")
	assert.NotContains(t, errs, "drains the uplink itself")
	s.stop(t)

	// Serve started with --uplink, to a collector on loopback: the status
	// names it, without the password its URL carries.
	code, out, errs := outpostBin(t, "", "uplink", "status", "--data", data, "--json")
	require.Equal(t, 0, code, errs)
	var mine uplink.Status
	require.NoError(t, json.Unmarshal([]byte(out), &mine))
	coll := t.TempDir()
	secrets, _ := uplinkSecrets(t, t.TempDir(), coll, mine.ApplianceID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	collURL, _, _ := startCollector(t, ctx, coll, secrets)
	withPassword := strings.Replace(collURL, "http://", "http://site:pa55word@", 1)
	s = startServe(t, bin, data, "--uplink", withPassword, "--uplink-secret", secret)
	text, st = status()
	assert.Contains(t, text, "serve owns this store and sends its uplink to "+collURL)
	assert.NotContains(t, text, "pa55word")
	assert.NotContains(t, text, "without an uplink")
	require.NotNil(t, st.Owner)
	assert.Equal(t, "serve", st.Owner.Command)
	assert.True(t, st.Owner.SendsUplink)
	assert.Equal(t, collURL, st.Owner.UplinkURL)
	code, _, errs = outpostBin(t, "", "uplink", "flush", "--data", data, "--url", collURL, "--secret-file", secret)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "serve owns this store and sends its uplink to "+collURL)
	s.stop(t)

	// With serve stopped, no process owns the store, and --json says none.
	_, st = status()
	assert.Nil(t, st.Owner)
}

// An outcome of the embedded reference bundle leaves for the collector with
// every field its redaction policy governs in clear: the policy names each
// of them as an outcome is written, so that the guardrail flags and the
// run's id and start go upstream (PII in them still masked), and none of
// them is left home as a digest because the policy misnamed it. The line
// is made as serve and uplink flush make it: the bundle's policy through
// bundleRedactors, then uplink.EncodeRecord.
func TestReferenceOutcomeLeavesWithItsFlags(t *testing.T) {
	app := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", app, "I took my amlodipine and now I have chest pain")
	require.Zero(t, code, stderr)
	db, err := store.OpenDir(app, store.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	outcomes, err := db.Outcomes(context.Background(), 0, 0)
	require.NoError(t, err)
	require.Len(t, outcomes, 1)
	o := outcomes[0]
	require.Equal(t, []string{"acute"}, o.Flags, "the turn raised the red flag")

	ref, err := firmware.Reference()
	require.NoError(t, err)
	require.Equal(t, ref.Ref(), o.Bundle, "the run was on the embedded bundle")
	red := bundleRedactors(ref, nil, io.Discard)(o.Bundle)
	require.NotNil(t, red, "the embedded bundle has a redaction policy")
	line, err := uplink.EncodeRecord(o, red)
	require.NoError(t, err)
	_, err = uplink.DecodeRecord(line)
	require.NoError(t, err, "the collector takes the line: %s", line)

	var sent map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(line, &sent))
	require.JSONEq(t, `["acute"]`, string(sent["flags"]), "flags in clear: %s", line)
	require.NotContains(t, sent, "redacted", "a field left home as a digest: %s", line)
	vals, err := o.FieldValues()
	require.NoError(t, err)
	for _, f := range store.OutcomeFields {
		require.JSONEq(t, string(vals[f]), string(sent[f]), "%s in clear: %s", f, line)
	}
}
