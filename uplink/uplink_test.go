package uplink

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// newCollector serves a bbolt collector in dir that knows appliance id.
func newCollector(t *testing.T, dir, id string) (*httptest.Server, *BoltStore) {
	t.Helper()
	st, err := OpenBoltStore(dir)
	require.NoError(t, err)
	srv := httptest.NewServer(NewCollector(st, CollectorOptions{Secrets: map[string][]byte{id: testSecret}, Token: testToken}))
	t.Cleanup(func() { srv.Close(); st.Close() })
	return srv, st
}

// applianceSendingTo opens clinic-1's store with n outcomes (closed at the
// test's end) and an uplink to url, not yet started.
func applianceSendingTo(t *testing.T, url string, n int) (*store.DB, *Uplink) {
	t.Helper()
	db := openAppliance(t, t.TempDir(), "clinic-1")
	t.Cleanup(func() { db.Close() })
	makeOutcomes(t, db, n)
	u, err := New(db, fastConfig(url))
	require.NoError(t, err)
	return db, u
}

// flushFailing flushes for a moment, expecting it to fail, and returns the
// status it leaves.
func flushFailing(t *testing.T, u *Uplink) Status {
	t.Helper()
	// Long enough for the first answer to arrive on a busy machine: a
	// flush cut short before it reports the cut, not the answer.
	ctx, cancel := contextWithTimeout(time.Second)
	defer cancel()
	require.Error(t, u.Flush(ctx))
	return u.Status()
}

func fastConfig(url string) Config {
	return Config{URL: url, Secret: testSecret, Redactor: keepAll{}, MinBackoff: time.Millisecond,
		MaxBackoff: 20 * time.Millisecond, Timeout: 2 * time.Second, Poll: 5 * time.Millisecond}
}

func TestWireRedactionStillVerifies(t *testing.T) {
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	makeOutcomes(t, db, 5)
	outs, err := db.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	ref, err := policy.NewRedactor(policy.RedactionPolicy{Fields: []string{"status", "bundle", "output", "tools", "tokens"}})
	require.NoError(t, err)
	for _, r := range []Redactor{nil, keepAll{}, ref} {
		for _, o := range outs {
			line, err := EncodeRecord(o, r)
			require.NoError(t, err)
			rec, err := DecodeRecord(line)
			require.NoError(t, err, "%s", line)
			assert.Equal(t, o.Hash, rec.Hash)
			assert.Equal(t, o.PrevHash, rec.PrevHash)
			var m map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(line, &m))
			switch r.(type) {
			case nil:
				assert.NotContains(t, m, "status", "nothing governed leaves without a policy")
				assert.NotContains(t, string(line), "555-123-4567")
			case keepAll:
				assert.NotContains(t, m, "redacted")
			default:
				assert.Contains(t, m, "status")
				assert.NotContains(t, m, "thread", "dropped by the policy")
				assert.NotContains(t, string(line), "555-123-4567", "masked by the detectors")
				if o.Status == engine.StatusCompleted {
					assert.Contains(t, string(m["redacted"]), `"output":{"digest"`)
					assert.Contains(t, string(m["redacted"]), "[REDACTED:phone]")
				}
			}
			// Altering a clear field, or a digest, breaks the hash.
			bad := bytes.Replace(line, []byte(`"seq":`), []byte(`"seq":1`), 1)
			_, err = DecodeRecord(bad)
			assert.Error(t, err)
		}
	}
}

func TestUplinkDrainsAndIsIdempotent(t *testing.T) {
	srv, cst := newCollector(t, t.TempDir(), "clinic-1")
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	events := &sink{}
	cfg := fastConfig(srv.URL)
	cfg.MaxRecords, cfg.Events = 7, events
	u, err := New(db, cfg)
	require.NoError(t, err)
	st := u.Status()
	assert.True(t, st.Configured)
	assert.Zero(t, st.Backlog)

	makeOutcomes(t, db, 30)
	assert.Equal(t, uint64(30), u.Status().Backlog, "offline is normal: the backlog shows")
	require.NoError(t, u.Flush(bg))
	st = u.Status()
	assert.Equal(t, uint64(30), st.AckedSeq)
	assert.Zero(t, st.Backlog)
	assert.NotNil(t, st.LastSuccessAt)
	assert.Len(t, events.all(), 5, "30 records in batches of 7")
	assert.Equal(t, engine.EventUplinkSent, events.all()[0].Type)

	got, err := cst.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 30)

	// A batch sent again is answered the same way and stored once.
	outs, err := db.Outcomes(bg, 0, 7)
	require.NoError(t, err)
	for range 2 {
		resp := post(t, srv.URL, "clinic-1", outs, testSecret)
		assert.Equal(t, http.StatusOK, resp.code)
		assert.JSONEq(t, `{"acked_seq":7}`, resp.body)
	}
	got, err = cst.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	assert.Len(t, got, 30)

	list := appliances(t, srv.URL)
	require.Len(t, list, 1)
	assert.Equal(t, "ok", list[0].Chain)
	assert.Equal(t, uint64(30), list[0].LastSeq)
}

type sink struct {
	mu sync.Mutex
	ev []engine.Event
}

func (s *sink) Publish(evs ...engine.Event) {
	s.mu.Lock()
	s.ev = append(s.ev, evs...)
	s.mu.Unlock()
}

func (s *sink) all() []engine.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]engine.Event(nil), s.ev...)
}

type answer struct {
	code int
	body string
}

func post(t *testing.T, url, appliance string, outs []*store.Outcome, secret []byte) answer {
	t.Helper()
	return postAs(t, url, appliance, outs, secret, nil)
}

// postAs is post with another Content-Type ("" sends none).
func postAs(t *testing.T, url, appliance string, outs []*store.Outcome, secret []byte, contentType *string) answer {
	t.Helper()
	var body bytes.Buffer
	for _, o := range outs {
		line, err := EncodeRecord(o, keepAll{})
		require.NoError(t, err)
		body.Write(line)
		body.WriteByte('\n')
	}
	req, err := http.NewRequest(http.MethodPost, url+OutcomesPath, bytes.NewReader(body.Bytes()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set(HeaderIdempotencyKey, IdempotencyKey(appliance, outs[0].Seq, outs[len(outs)-1].Seq))
	req.Header.Set(HeaderSignature, Sign(secret, body.Bytes()))
	req.Header.Set(HeaderChainHead, outs[len(outs)-1].Hash)
	if contentType != nil {
		req.Header.Set("Content-Type", *contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b)}
}

// collectorAndOutcomes serves a bbolt collector that knows clinic-1, and
// returns n outcomes of clinic-1's ledger, not yet sent.
func collectorAndOutcomes(t *testing.T, n int) (*httptest.Server, *BoltStore, []*store.Outcome) {
	t.Helper()
	srv, cst := newCollector(t, t.TempDir(), "clinic-1")
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	makeOutcomes(t, db, n)
	outs, err := db.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	return srv, cst, outs
}

func TestCollectorRefusesBadBatches(t *testing.T) {
	srv, _, outs := collectorAndOutcomes(t, 6)

	a := post(t, srv.URL, "clinic-1", outs[:2], []byte("wrong"))
	assert.Equal(t, http.StatusUnauthorized, a.code)
	assert.Contains(t, a.body, `"code":"unauthorized"`)
	a = post(t, srv.URL, "clinic-9", outs[:2], testSecret)
	assert.Equal(t, http.StatusUnauthorized, a.code)
	assert.Contains(t, a.body, `"code":"unauthorized"`)
	a = post(t, srv.URL, "clinic-1", outs[3:5], testSecret)
	assert.Equal(t, http.StatusConflict, a.code)
	assert.Contains(t, a.body, `"code":"gap"`)
	assert.Contains(t, a.body, `"expected_seq":1`)
	a = post(t, srv.URL, "clinic-1", []*store.Outcome{outs[0], outs[2]}, testSecret)
	assert.Equal(t, http.StatusBadRequest, a.code)
	a = post(t, srv.URL, "clinic-1", outs[:3], testSecret)
	assert.Equal(t, http.StatusOK, a.code)
}

// A body that is not declared NDJSON is refused before anything is read
// from it, even when it would otherwise pass: it did not come from an
// uplink speaking the wire format.
func TestCollectorRefusesOtherContentTypes(t *testing.T) {
	srv, cst, outs := collectorAndOutcomes(t, 3)
	for _, ct := range []string{"", "text/plain", "application/json", "multipart/form-data; boundary=x", "application/x-ndjson-but-not"} {
		a := postAs(t, srv.URL, "clinic-1", outs, testSecret, &ct)
		assert.Equal(t, http.StatusUnsupportedMediaType, a.code, "Content-Type %q", ct)
		assert.Contains(t, a.body, `"code":"unsupported_media_type"`)
		assert.Contains(t, a.body, ContentType)
	}
	got, err := cst.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	assert.Empty(t, got, "a refused batch changes nothing")
	assert.Empty(t, appliances(t, srv.URL))

	for _, ct := range []string{ContentType, "application/x-ndjson; charset=utf-8", "Application/X-NDJSON"} {
		a := postAs(t, srv.URL, "clinic-1", outs, testSecret, &ct)
		assert.Equal(t, http.StatusOK, a.code, "Content-Type %q: %s", ct, a.body)
	}
}

func TestRetriesAndParking(t *testing.T) {
	srv, _ := newCollector(t, t.TempDir(), "clinic-1")
	var calls atomic.Int64
	var mode, busyUntil atomic.Value
	mode.Store("ok")
	busyUntil.Store(time.Time{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch mode.Load().(string) {
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case "429":
			// Busy for a moment (by the clock, so a straggling request of
			// an earlier phase cannot use it up).
			if time.Now().Before(busyUntil.Load().(time.Time)) {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
		case "403":
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":"forbidden","message":"no"}}`))
			return
		}
		proxyTo(srv.URL, w, r)
	}))
	defer front.Close()
	db, u := applianceSendingTo(t, front.URL, 3)

	// 5xx: retried with backoff until ctx ends, nothing dropped. The flush
	// is stopped once it has tried three times, however slow the machine.
	mode.Store("503")
	ctx, cancel := contextWithTimeout(30 * time.Second)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for calls.Load() < 3 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	err := u.Flush(ctx)
	<-stopped
	require.Error(t, err)
	assert.Greater(t, calls.Load(), int64(2))
	st := u.Status()
	assert.Contains(t, st.LastError, "503")
	assert.Equal(t, uint64(3), st.Backlog)

	// 429 with Retry-After: waited out.
	busyUntil.Store(time.Now().Add(300 * time.Millisecond))
	mode.Store("429")
	start := time.Now()
	require.NoError(t, u.Flush(bg))
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond)
	assert.Zero(t, u.Status().Backlog)

	// Another 4xx parks the batch: kept, and shown.
	makeOutcomes(t, db, 2)
	mode.Store("403")
	err = u.Flush(bg)
	require.ErrorIs(t, err, ErrParked)
	st = u.Status()
	require.NotNil(t, st.Parked)
	assert.Equal(t, uint64(4), st.Parked.FirstSeq)
	assert.Equal(t, http.StatusForbidden, st.Parked.StatusCode)
	assert.Equal(t, uint64(2), st.Backlog)
	mode.Store("ok")
	require.NoError(t, u.Flush(bg))
	st = u.Status()
	assert.Nil(t, st.Parked)
	assert.Zero(t, st.Backlog)
}

// proxyTo forwards r to base and copies the answer.
// A flush stopped mid-request, or between requests, keeps the collector's
// last error in the status: the stop says nothing about the collector.
func TestStoppedFlushKeepsTheLastError(t *testing.T) {
	var calls atomic.Int64
	second, release := make(chan struct{}), make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		close(second)
		<-release // not answered before the flush has given up
	}))
	defer front.Close()
	defer close(release)
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	makeOutcomes(t, db, 1)
	u, err := New(db, fastConfig(front.URL))
	require.NoError(t, err)
	ctx, cancel := contextWithTimeout(30 * time.Second)
	go func() {
		<-second
		cancel()
	}()
	err = u.Flush(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, u.Status().LastError, "503")
	assert.Equal(t, int64(2), calls.Load())

	// Between requests: the next batch is not even read from the store.
	_, err = u.sendBatch(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, u.Status().LastError, "503")
}

func proxyTo(base string, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
}

// tamperOutcome rewrites outcome seq in a stopped appliance's store file,
// with a valid envelope checksum, as someone editing the file would.
func tamperOutcome(t *testing.T, path string, seq uint64) {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer bdb.Close()
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("outcomes"))
		k := binary.BigEndian.AppendUint64(nil, seq)
		v := b.Get(k)
		payload := bytes.Replace(v[1:len(v)-4], []byte(`"status":"failed"`), []byte(`"status":"completed"`), 1)
		require.NotEqual(t, v[1:len(v)-4], payload, "seq %d should have failed", seq)
		rec := append([]byte{v[0]}, payload...)
		rec = binary.LittleEndian.AppendUint32(rec, crc32.Checksum(rec, crc32.MakeTable(crc32.Castagnoli)))
		return b.Put(k, rec)
	}))
}

func TestTamperedOutcomeIsRefused(t *testing.T) {
	dir := t.TempDir()
	db := openAppliance(t, dir, "clinic-1")
	makeOutcomes(t, db, 10)
	outs, err := db.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	var victim uint64
	for _, o := range outs {
		if o.Status == engine.StatusFailed && o.Seq > 3 {
			victim = o.Seq
			break
		}
	}
	require.NotZero(t, victim)
	require.NoError(t, db.Close())

	// A copy of the database, altered.
	cp := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(dir, store.FileName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(cp, store.FileName), raw, 0o600))
	tamperOutcome(t, filepath.Join(cp, store.FileName), victim)

	db = openAppliance(t, cp, "clinic-1")
	defer db.Close()
	rep, err := db.Check(bg)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Problems)
	assert.Equal(t, "outcomes", rep.Problems[0].Bucket)
	assert.Equal(t, "seq "+itoa(victim), rep.Problems[0].Key)

	srv, cst := newCollector(t, t.TempDir(), "clinic-1")
	cfg := fastConfig(srv.URL)
	cfg.MaxRecords = 3
	u, err := New(db, cfg)
	require.NoError(t, err)
	err = u.Flush(bg)
	require.ErrorIs(t, err, ErrParked)
	st := u.Status()
	require.NotNil(t, st.Parked)
	assert.Equal(t, http.StatusUnprocessableEntity, st.Parked.StatusCode)
	assert.Equal(t, CodeBadHash, st.Parked.Code)
	assert.LessOrEqual(t, st.Parked.FirstSeq, victim)
	assert.GreaterOrEqual(t, st.Parked.LastSeq, victim)
	assert.Equal(t, st.Parked.FirstSeq-1, st.AckedSeq, "everything before the altered batch went")
	list, err := cst.Appliances(bg)
	require.NoError(t, err)
	assert.Equal(t, "broken", list[0].Chain)
	assert.Equal(t, victim, list[0].BrokenAtSeq)
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(bg, d)
}

// A collector that lost records it had acknowledged (restored from an older
// backup) answers the next batch with a gap. The appliance sends again from
// the seq the collector expects, up to its cursor and on, and the collector
// ends with the whole chain, no longer broken.
func TestUplinkResendsWhatTheCollectorLost(t *testing.T) {
	collectorDir := t.TempDir()
	st, err := OpenBoltStore(collectorDir)
	require.NoError(t, err)
	var handler atomic.Pointer[http.Handler]
	serve := func(st CollectorStore) {
		var h http.Handler = NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"clinic-1": testSecret}, Token: testToken})
		handler.Store(&h)
	}
	serve(st)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	defer srv.Close()

	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	cfg := fastConfig(srv.URL)
	cfg.MaxRecords = 4
	u, err := New(db, cfg)
	require.NoError(t, err)
	makeOutcomes(t, db, 6)
	require.NoError(t, u.Flush(bg))

	// The collector comes back from a backup that holds seqs 1-3 only.
	recs, err := st.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, recs, 6)
	require.NoError(t, st.Close())
	restored, err := OpenBoltStore(t.TempDir())
	require.NoError(t, err)
	defer restored.Close()
	outs, err := db.Outcomes(bg, 0, 3)
	require.NoError(t, err)
	serve(restored)
	resp := post(t, srv.URL, "clinic-1", outs, testSecret)
	require.Equal(t, http.StatusOK, resp.code, resp.body)

	makeOutcomes(t, db, 5)
	require.NoError(t, u.Flush(bg))
	got, err := restored.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 11, "seqs 4-6 were sent again, then 7-11")
	for i, r := range got {
		assert.Equal(t, uint64(i+1), r.Seq)
	}
	status := u.Status()
	assert.Equal(t, uint64(11), status.AckedSeq)
	assert.Zero(t, status.ResendingFrom, "caught up")
	assert.Nil(t, status.Parked)

	list := appliances(t, srv.URL)
	require.Len(t, list, 1)
	assert.Equal(t, "ok", list[0].Chain, "the chain healed once the collector held past the gap")
}

// appliances reads a collector's GET /v1/appliances.
func appliances(t *testing.T, url string) []ApplianceStatus {
	t.Helper()
	var list struct{ Appliances []ApplianceStatus }
	require.NoError(t, json.Unmarshal(appliancesBody(t, url), &list))
	return list.Appliances
}

// appliancesBody is the body of a collector's GET /v1/appliances, which
// must answer 200.
func appliancesBody(t *testing.T, url string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+AppliancesPath, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, http.StatusOK, r.StatusCode)
	body, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	return body
}

// A collector URL that cannot be sent to is refused when the uplink is
// made, not after a minute of retries.
func TestUplinkRefusesAnUnusableURL(t *testing.T) {
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	for _, bad := range []string{"notaurl", "ftp://collector", "https://", "http//collector:8443", "::"} {
		_, err := New(db, fastConfig(bad))
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "want http:// or https:// and a host", bad)
	}
	_, err := New(db, fastConfig("https://collector.site:8443"))
	require.NoError(t, err)
	_, err = New(db, Config{}) // no uplink: nothing to check
	require.NoError(t, err)
}

// A network in the way (a captive portal, a proxy's error page) answers
// with a page of its own. The status quotes the start of it, not the page:
// last_error is shown by GET /api/v1/uplink and the console page.
func TestOtherServersPagesAreQuotedShort(t *testing.T) {
	page := "<!DOCTYPE html><html><head><title>Ship Wi-Fi: sign in</title></head><body>" +
		strings.Repeat("<p>Accept the terms to continue.</p>", 2000) + "</body></html>"
	for _, status := range []int{http.StatusOK, http.StatusBadGateway, http.StatusForbidden} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, page)
			}))
			defer front.Close()
			_, u := applianceSendingTo(t, front.URL, 2)
			st := flushFailing(t, u)
			assert.Equal(t, uint64(2), st.Backlog, "nothing is taken for acknowledged")
			assert.Contains(t, st.LastError, "Ship Wi-Fi: sign in")
			assert.Less(t, len(st.LastError), 600, "last error: %.200s…", st.LastError)
			if st.Parked != nil {
				assert.Less(t, len(st.Parked.Message), 400, "parked: %.200s…", st.Parked.Message)
			}
		})
	}
}

// A collector URL that redirects (to another host, or from http to https)
// is not followed: the outcomes and their signature go only where the
// uplink was configured to send them, and the batch parks with the
// redirect's target named. A 301 or 302 followed would also have turned the
// POST into a GET.
func TestRedirectsAreNotFollowed(t *testing.T) {
	srv, cst := newCollector(t, t.TempDir(), "clinic-1")
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, srv.URL+r.URL.Path, status)
			}))
			defer front.Close()
			_, u := applianceSendingTo(t, front.URL, 2)
			err := u.Flush(bg)
			require.ErrorIs(t, err, ErrParked)
			st := u.Status()
			assert.Equal(t, uint64(2), st.Backlog)
			require.NotNil(t, st.Parked)
			assert.Equal(t, status, st.Parked.StatusCode)
			assert.Contains(t, st.Parked.Message, "the collector redirects to \""+srv.URL+OutcomesPath+"\"")
			got, err := cst.Records(bg, "clinic-1", 0, 0)
			require.NoError(t, err)
			assert.Empty(t, got, "the redirect's target received the batch")
		})
	}
}

// A collector that acknowledges more than it was sent (a bug, or another
// appliance's answer behind a shared proxy) must not move the cursor past
// records that never left: the batch is sent again, and nothing is lost.
func TestAckBeyondTheBatchMovesNothing(t *testing.T) {
	srv, cst := newCollector(t, t.TempDir(), "clinic-1")
	var lie atomic.Bool
	lie.Store(true)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lie.Load() {
			_, _ = io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"acked_seq": 1000}`)
			return
		}
		proxyTo(srv.URL, w, r)
	}))
	defer front.Close()
	_, u := applianceSendingTo(t, front.URL, 5)
	st := flushFailing(t, u)
	assert.Zero(t, st.AckedSeq)
	assert.Equal(t, uint64(5), st.Backlog)
	assert.Contains(t, st.LastError, "not {\"acked_seq\"} within the batch")

	lie.Store(false)
	require.NoError(t, u.Flush(bg))
	got, err := cst.Records(bg, "clinic-1", 0, 0)
	require.NoError(t, err)
	assert.Len(t, got, 5)
	assert.Zero(t, u.Status().Backlog)
}
