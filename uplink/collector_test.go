package uplink

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// errorBody decodes DESIGN's error shape, {"error": {"code", "message"}}.
func errorBody(t *testing.T, resp *http.Response) (code, message string) {
	t.Helper()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var e struct {
		Error struct{ Code, Message string }
	}
	b, _ := io.ReadAll(resp.Body)
	require.NoError(t, json.Unmarshal(b, &e), "not JSON: %q", b)
	require.NotEmpty(t, e.Error.Code, "%s", b)
	require.NotEmpty(t, e.Error.Message, "%s", b)
	return e.Error.Code, e.Error.Message
}

// A path the collector does not serve, or a method its paths do not take,
// is answered in the API's error shape, as every other refusal is.
func TestCollectorAnswersStrayRequestsInJSON(t *testing.T) {
	srv, _ := newCollector(t, t.TempDir(), "clinic-1")
	tests := []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{http.MethodGet, "/", http.StatusNotFound, "not_found", ""},
		{http.MethodPost, "/v1/outcome", http.StatusNotFound, "not_found", ""},
		{http.MethodGet, "/v1/appliances/clinic-1", http.StatusNotFound, "not_found", ""},
		{http.MethodPost, "/" + OutcomesPath, http.StatusNotFound, "not_found", ""},
		{http.MethodGet, "/v1/./appliances", http.StatusNotFound, "not_found", ""},
		{http.MethodGet, OutcomesPath, http.StatusMethodNotAllowed, "method_not_allowed", "POST"},
		{http.MethodPut, OutcomesPath, http.StatusMethodNotAllowed, "method_not_allowed", "POST"},
		{http.MethodPost, AppliancesPath, http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD"},
		{http.MethodDelete, AppliancesPath, http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, tt.status, resp.StatusCode)
			code, _ := errorBody(t, resp)
			assert.Equal(t, tt.code, code)
			assert.Equal(t, tt.allow, resp.Header.Get("Allow"))
		})
	}
}

// logBuffer is a slog destination the collector and the test share.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A batch naming an appliance the collector does not know and one whose
// signature does not match get the same answer, whatever the body's size,
// so that the answers do not tell which appliance ids exist. The
// collector's own log still says which it was.
func TestCollectorDoesNotTellUnknownAppliancesFromBadSignatures(t *testing.T) {
	logs := &logBuffer{}
	st, err := OpenBoltStore(t.TempDir())
	require.NoError(t, err)
	defer st.Close()
	srv := httptest.NewServer(NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"clinic-1": testSecret},
		Token: testToken, Logger: slog.New(slog.NewTextHandler(logs, nil))}))
	defer srv.Close()
	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	makeOutcomes(t, db, 2)
	outs, err := db.Outcomes(bg, 0, 0)
	require.NoError(t, err)

	bad := post(t, srv.URL, "clinic-1", outs, []byte("wrong"))
	unknown := post(t, srv.URL, "clinic-9", outs, testSecret)
	assert.Equal(t, http.StatusUnauthorized, bad.code)
	assert.Equal(t, bad, unknown, "a bad signature and an unknown appliance are answered alike")
	assert.NotContains(t, unknown.body, "clinic-9")

	// A body too large is refused as such for both, before either is
	// told apart.
	big := bytes.Repeat([]byte("x"), MaxBatchBytes+1)
	var answers []answer
	for _, id := range []string{"clinic-1", "clinic-9"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+OutcomesPath, bytes.NewReader(big))
		require.NoError(t, err)
		req.Header.Set("Content-Type", ContentType)
		req.Header.Set(HeaderIdempotencyKey, IdempotencyKey(id, 1, 2))
		req.Header.Set(HeaderSignature, Sign([]byte("wrong"), big))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, answer{resp.StatusCode, string(b)})
	}
	assert.Equal(t, http.StatusRequestEntityTooLarge, answers[0].code, answers[0].body)
	assert.Equal(t, answers[0], answers[1])

	log := logs.String()
	assert.Contains(t, log, `appliance=clinic-9`)
	assert.Contains(t, log, ErrUnknownAppliance.Error())
	assert.Contains(t, log, `appliance=clinic-1`)
	assert.Contains(t, log, ErrSignature.Error())
}

// GET /v1/appliances names every appliance and how far its chain reaches:
// it takes the collector's bearer token, and a collector given none
// answers it to no one.
func TestCollectorListNeedsItsToken(t *testing.T) {
	srv, _ := newCollector(t, t.TempDir(), "clinic-1")
	get := func(url, auth string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url+AppliancesPath, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, auth := range []string{"", "Bearer", "Bearer wrong-token", "Basic " + testToken, testToken, "Bearer " + testToken + "x"} {
		resp := get(srv.URL, auth)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "Authorization %q", auth)
		assert.Equal(t, "Bearer", resp.Header.Get("WWW-Authenticate"))
		code, _ := errorBody(t, resp)
		assert.Equal(t, "unauthorized", code)
	}
	resp := get(srv.URL, "Bearer "+testToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list map[string][]ApplianceStatus
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	assert.Contains(t, list, "appliances")
	assert.NotNil(t, list["appliances"], "an empty list is [], not null")

	st, err := OpenBoltStore(t.TempDir())
	require.NoError(t, err)
	defer st.Close()
	open := httptest.NewServer(NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"clinic-1": testSecret}}))
	defer open.Close()
	for _, auth := range []string{"", "Bearer ", "Bearer " + testToken} {
		resp := get(open.URL, auth)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no token configured, Authorization %q", auth)
	}
}

// Only the appliance's own signed records can show its chain broken: a
// fork, a bad link or an altered record. A batch refused for anything
// else (a bad signature, an unknown appliance, a malformed body, or a gap,
// which says the collector lacks records, as when an old batch is sent
// again after the collector was restored from a backup) leaves an honest
// appliance's chain "ok".
func TestRefusedBatchesDoNotBreakAnHonestChain(t *testing.T) {
	srv, cst, outs := collectorAndOutcomes(t, 6)
	require.Equal(t, http.StatusOK, post(t, srv.URL, "clinic-1", outs[:3], testSecret).code)

	forked := *outs[3]
	forked.PrevHash = strings.Repeat("e", 64)
	forkedBatch := []*store.Outcome{&forked, outs[4]}

	a := post(t, srv.URL, "clinic-1", forkedBatch, []byte("a third party's guess"))
	assert.Equal(t, http.StatusUnauthorized, a.code, a.body)
	a = post(t, srv.URL, "clinic-1", outs[4:6], testSecret)
	assert.Equal(t, http.StatusConflict, a.code, "a gap: %s", a.body)
	assert.Contains(t, a.body, `"code":"gap"`)
	contentType := "text/plain"
	a = postAs(t, srv.URL, "clinic-1", outs[3:5], testSecret, &contentType)
	assert.Equal(t, http.StatusUnsupportedMediaType, a.code, a.body)
	a = post(t, srv.URL, "clinic-1", []*store.Outcome{outs[3], outs[5]}, testSecret)
	assert.Equal(t, http.StatusBadRequest, a.code, a.body)

	list := appliances(t, srv.URL)
	require.Len(t, list, 1)
	assert.Equal(t, "ok", list[0].Chain, "%+v", list[0])
	assert.Zero(t, list[0].BrokenAtSeq)
	assert.Equal(t, uint64(3), list[0].LastSeq)

	// The appliance's own signature over a record altered since it was
	// hashed is evidence of a break.
	a = post(t, srv.URL, "clinic-1", forkedBatch, testSecret)
	assert.Equal(t, http.StatusUnprocessableEntity, a.code, a.body)
	list, err := cst.Appliances(bg)
	require.NoError(t, err)
	assert.Equal(t, "broken", list[0].Chain)
	assert.Equal(t, uint64(4), list[0].BrokenAtSeq)
}
