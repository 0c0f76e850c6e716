package uplink

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/internal/fsync"
	"github.com/outpost-edge/outpost/store"
)

// synthChain makes records 1..n of a chain whose hashes are made up: the
// stores only compare them.
func synthChain(appliance string, n int, salt string) []*Record {
	out := make([]*Record, n)
	prev := store.GenesisHash
	for i := range out {
		s := sha256.Sum256([]byte(fmt.Sprintf("%s/%s/%d", appliance, salt, i+1)))
		h := hex.EncodeToString(s[:])
		out[i] = &Record{ApplianceID: appliance, Seq: uint64(i + 1), PrevHash: prev, Hash: h,
			Line: []byte(fmt.Sprintf(`{"seq":%d}`, i+1))}
		prev = h
	}
	return out
}

// runCollectorStoreSuite is the conformance suite of CollectorStore: every
// implementation passes it (litestream's shared replica-client tests are
// the model).
func runCollectorStoreSuite(t *testing.T, open func(t *testing.T) CollectorStore) {
	now := time.Date(2025, 5, 1, 10, 0, 0, 0, time.UTC)
	chain := synthChain("ap-1", 10, "")

	t.Run("AppendAndRead", func(t *testing.T) {
		s := open(t)
		h, err := s.Append(bg, "ap-1", chain[:4], now)
		require.NoError(t, err)
		assert.Equal(t, Head{4, chain[3].Hash}, h)
		got, err := s.Records(bg, "ap-1", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 4)
		for i, r := range got {
			assert.Equal(t, chain[i].Seq, r.Seq)
			assert.Equal(t, chain[i].Hash, r.Hash)
			assert.Equal(t, chain[i].PrevHash, r.PrevHash)
			assert.Equal(t, string(chain[i].Line), string(r.Line))
		}
		got, err = s.Records(bg, "ap-1", 2, 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, uint64(3), got[0].Seq)
		list, err := s.Appliances(bg)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, ApplianceStatus{ApplianceID: "ap-1", LastSeq: 4, LastSeen: now, Chain: "ok"}, list[0])
	})

	t.Run("RepeatedAndOverlappingBatchesStoreOnce", func(t *testing.T) {
		s := open(t)
		_, err := s.Append(bg, "ap-1", chain[:4], now)
		require.NoError(t, err)
		h, err := s.Append(bg, "ap-1", chain[:4], now)
		require.NoError(t, err)
		assert.Equal(t, uint64(4), h.LastSeq)
		h, err = s.Append(bg, "ap-1", chain[2:7], now)
		require.NoError(t, err)
		assert.Equal(t, uint64(7), h.LastSeq)
		got, err := s.Records(bg, "ap-1", 0, 0)
		require.NoError(t, err)
		assert.Len(t, got, 7)
	})

	t.Run("RefusesGapForkAndBadLink", func(t *testing.T) {
		s := open(t)
		_, err := s.Append(bg, "ap-1", chain[:3], now)
		require.NoError(t, err)
		var ce *ChainError

		_, err = s.Append(bg, "ap-1", chain[4:6], now)
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, CodeGap, ce.Code)
		assert.Equal(t, uint64(4), ce.Expected)

		other := synthChain("ap-1", 5, "forked")
		_, err = s.Append(bg, "ap-1", other[1:4], now)
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, CodeFork, ce.Code)

		bad := *chain[3]
		bad.PrevHash = strings.Repeat("e", 64)
		_, err = s.Append(bg, "ap-1", []*Record{&bad}, now)
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, CodeBadLink, ce.Code)

		got, err := s.Records(bg, "ap-1", 0, 0)
		require.NoError(t, err)
		assert.Len(t, got, 3, "a refused batch stores nothing")

		require.NoError(t, s.MarkBroken(bg, "ap-1", ce, now))
		list, err := s.Appliances(bg)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, "broken", list[0].Chain)
		assert.Equal(t, uint64(4), list[0].BrokenAtSeq)
		assert.Equal(t, uint64(3), list[0].LastSeq)

		// The chain growing past the refused seq heals the status.
		_, err = s.Append(bg, "ap-1", chain[3:5], now)
		require.NoError(t, err)
		list, err = s.Appliances(bg)
		require.NoError(t, err)
		assert.Equal(t, "ok", list[0].Chain)
		assert.Equal(t, uint64(5), list[0].LastSeq)
	})

	t.Run("AppliancesAreSeparate", func(t *testing.T) {
		s := open(t)
		b := synthChain("ap-2", 2, "")
		_, err := s.Append(bg, "ap-1", chain[:1], now)
		require.NoError(t, err)
		_, err = s.Append(bg, "ap-2", b, now)
		require.NoError(t, err)
		list, err := s.Appliances(bg)
		require.NoError(t, err)
		require.Len(t, list, 2)
		assert.Equal(t, "ap-1", list[0].ApplianceID)
		assert.Equal(t, uint64(2), list[1].LastSeq)
	})

	t.Run("ConcurrentDuplicatesStoreOnce", func(t *testing.T) {
		s := open(t)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Batches overlap and race: each either extends the chain,
				// finds it already extended, or (arriving before its
				// predecessor) is refused as a gap, as over the network.
				batch := chain[:5]
				if i%2 == 1 {
					batch = chain[:10]
				}
				_, err := s.Append(bg, "ap-1", batch, now)
				var ce *ChainError
				if err != nil && !(errors.As(err, &ce) && ce.Code == CodeGap) {
					t.Errorf("append: %v", err)
				}
			}()
		}
		wg.Wait()
		got, err := s.Records(bg, "ap-1", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 10)
		for i, r := range got {
			require.Equal(t, uint64(i+1), r.Seq)
		}
	})
}

func TestBoltCollectorStore(t *testing.T) {
	runCollectorStoreSuite(t, func(t *testing.T) CollectorStore {
		s, err := OpenBoltStore(t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// A new collector store, and its folder, are named durably: the collector
// acknowledges records, and an appliance never sends those again.
func TestBoltCollectorStoreIsNamedDurably(t *testing.T) {
	var synced []string
	defer fsync.Observe(func(d string) { synced = append(synced, d) })()
	base := t.TempDir()
	dir := filepath.Join(base, "collector")
	s, err := OpenBoltStore(dir)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.Equal(t, []string{base, dir}, synced)

	synced = nil
	s, err = OpenBoltStore(dir)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	assert.Equal(t, []string{dir}, synced, "every open, in case the one that made the file stopped first")
}

func TestPostgresCollectorStore(t *testing.T) {
	dsn := pgDSN(t)
	n := 0
	runCollectorStoreSuite(t, func(t *testing.T) CollectorStore {
		n++
		schema := fmt.Sprintf("outpost_test_%d_%d", time.Now().UnixNano(), n)
		s, err := OpenPostgresStore(bg, dsn, schema)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = s.pool.Exec(bg, "DROP SCHEMA "+s.schema+" CASCADE")
			s.Close()
		})
		return s
	})
}

// Collectors that share one PostgreSQL share one bearer token for GET
// /v1/appliances: started together, each with a token of its own, they
// all come away with the same one, which each of them then takes, so an
// operator or a dashboard that holds it can ask any of them.
func TestPostgresCollectorsShareOneToken(t *testing.T) {
	dsn := pgDSN(t)
	schema := fmt.Sprintf("outpost_token_%d", time.Now().UnixNano())
	const n = 4
	stores := make([]*PostgresStore, n)
	for i := range stores {
		s, err := OpenPostgresStore(bg, dsn, schema)
		require.NoError(t, err)
		stores[i] = s
	}
	t.Cleanup(func() {
		_, _ = stores[0].pool.Exec(bg, "DROP SCHEMA "+stores[0].schema+" CASCADE")
		for _, s := range stores {
			s.Close()
		}
	})

	own := make([]string, n)
	shared := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range stores {
		own[i] = fmt.Sprintf("token-of-collector-%d-0123456789abcdef0123456789", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			shared[i], errs[i] = s.SharedToken(bg, own[i])
		}()
	}
	wg.Wait()
	for i := range stores {
		require.NoError(t, errs[i])
		require.Equal(t, shared[0], shared[i], "collector %d took another token", i)
	}
	require.Contains(t, own, shared[0], "the token is one of those the collectors brought")

	again, err := stores[1].SharedToken(bg, "a-later-collector-token-0123456789abcdef")
	require.NoError(t, err)
	require.Equal(t, shared[0], again, "a collector that starts later takes the stored token")
	_, err = stores[1].SharedToken(bg, "short")
	require.Error(t, err, "a token too short to be one is refused")
	again, err = stores[2].SharedToken(bg, own[2])
	require.NoError(t, err)
	require.Equal(t, shared[0], again, "a refused token changed nothing")

	// Every collector answers the shared token, and none the ones that lost.
	for i, s := range stores {
		srv := httptest.NewServer(NewCollector(s, CollectorOptions{Secrets: map[string][]byte{"a1": testSecret}, Token: shared[i]}))
		for _, tok := range own {
			req, err := http.NewRequest(http.MethodGet, srv.URL+AppliancesPath, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			want := http.StatusUnauthorized
			if tok == shared[0] {
				want = http.StatusOK
			}
			require.Equal(t, want, resp.StatusCode, "collector %d, token %q", i, tok)
		}
		srv.Close()
	}
}
