package uplink

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWireContract pins DESIGN's uplink wire format in its own words, as a
// collector of another make would see it: what an appliance sends to a
// real collector, what the collector answers, and its GET /v1/appliances.
func TestWireContract(t *testing.T) {
	st, err := OpenBoltStore(t.TempDir())
	require.NoError(t, err)
	collector := NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"clinic-1": testSecret}, Token: testToken})
	type exchange struct {
		method, path string
		header       http.Header
		body         []byte
		status       int
		answer       []byte
	}
	var mu sync.Mutex
	var seen []exchange
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		collector.ServeHTTP(rec, r)
		mu.Lock()
		seen = append(seen, exchange{r.Method, r.URL.Path, r.Header.Clone(), body, rec.Code, rec.Body.Bytes()})
		mu.Unlock()
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(func() { srv.Close(); st.Close() })

	db := openAppliance(t, t.TempDir(), "clinic-1")
	defer db.Close()
	makeOutcomes(t, db, 3)
	u, err := New(db, fastConfig(srv.URL))
	require.NoError(t, err)
	require.NoError(t, u.Flush(bg))

	mu.Lock()
	require.Len(t, seen, 1, "three outcomes go as one batch")
	x := seen[0]
	mu.Unlock()
	assert.Equal(t, "POST", x.method)
	assert.Equal(t, "/v1/outcomes", x.path)
	assert.Equal(t, "clinic-1:1-3", x.header.Get("Idempotency-Key"))

	// An NDJSON body of outcome records in sequence order.
	lines := strings.Split(strings.TrimSuffix(string(x.body), "\n"), "\n")
	require.Len(t, lines, 3)
	var head string
	for i, line := range lines {
		var rec struct {
			Seq  uint64 `json:"seq"`
			Hash string `json:"hash"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		assert.Equal(t, uint64(i+1), rec.Seq)
		head = rec.Hash
	}
	require.NotEmpty(t, head)

	// An HMAC-SHA256 signature of the body, and the chain head, each in a
	// header (DESIGN does not name them).
	mac := hmac.New(sha256.New, testSecret)
	mac.Write(x.body)
	sig := hex.EncodeToString(mac.Sum(nil))
	var signedBy, headIn []string
	for name, vals := range x.header {
		for _, v := range vals {
			if strings.Contains(strings.ToLower(v), sig) {
				signedBy = append(signedBy, name)
			}
			if v == head {
				headIn = append(headIn, name)
			}
		}
	}
	assert.Len(t, signedBy, 1, "the HMAC-SHA256 of the body is in one header: %v", x.header)
	assert.Len(t, headIn, 1, "the chain head is in one header: %v", x.header)

	assert.Equal(t, http.StatusOK, x.status)
	assert.JSONEq(t, `{"acked_seq": 3}`, string(x.answer))

	// GET /v1/appliances: {"appliances": [{"appliance_id", "last_seq",
	// "last_seen", "chain": "ok" | "broken"}]}.
	require.Equal(t, "/v1/appliances", AppliancesPath)
	var list map[string][]map[string]any
	require.NoError(t, json.Unmarshal(appliancesBody(t, srv.URL), &list))
	assert.Equal(t, []string{"appliances"}, slices.Sorted(maps.Keys(list)))
	require.Len(t, list["appliances"], 1)
	a := list["appliances"][0]
	for _, k := range []string{"appliance_id", "last_seq", "last_seen", "chain"} {
		assert.Contains(t, a, k)
	}
	assert.Equal(t, "clinic-1", a["appliance_id"])
	assert.Equal(t, 3.0, a["last_seq"])
	assert.Equal(t, "ok", a["chain"])
}
