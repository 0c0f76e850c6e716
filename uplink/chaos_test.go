package uplink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chaosProxy sits on loopback between the appliance and the collector and
// fails about 30% of the requests in the ways a flaky link does, plus some
// duplicated deliveries.
type chaosProxy struct {
	target atomic.Value // the collector's base URL; "" while it is down
	mu     sync.Mutex
	rng    *rand.Rand
	stall  time.Duration
	counts sync.Map // what happened -> *atomic.Int64
	client *http.Client
}

func (p *chaosProxy) count(what string) {
	v, _ := p.counts.LoadOrStore(what, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (p *chaosProxy) roll() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

// forward sends the request to the collector and returns its answer.
func (p *chaosProxy) forward(r *http.Request, body []byte) (int, []byte, error) {
	base, _ := p.target.Load().(string)
	if base == "" {
		return 0, nil, fmt.Errorf("collector down")
	}
	req, _ := http.NewRequest(r.Method, base+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// reset closes the client's connection abruptly (RST).
func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

func (p *chaosProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x := p.roll()
	switch {
	case x < 0.07:
		p.count("500")
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
		return
	case x < 0.14:
		// Reset in the middle of the request body: nothing reaches the
		// collector.
		p.count("reset mid-body")
		io.CopyN(io.Discard, r.Body, max(r.ContentLength/2, 1))
		reset(w)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	switch {
	case x < 0.22:
		// The collector stores it, but the answer comes too late.
		p.count("timeout")
		_, _, _ = p.forward(r, body)
		select {
		case <-time.After(p.stall):
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusGatewayTimeout)
		return
	case x < 0.30:
		// A success whose answer is lost.
		p.count("answer lost")
		_, _, _ = p.forward(r, body)
		reset(w)
		return
	case x < 0.38:
		// Delivered twice, at once.
		p.count("duplicated")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _, _, _ = p.forward(r, body) }()
		code, b, err := p.forward(r, body)
		wg.Wait()
		p.answer(w, code, b, err)
		return
	}
	p.count("passed")
	code, b, err := p.forward(r, body)
	p.answer(w, code, b, err)
}

func (p *chaosProxy) answer(w http.ResponseWriter, code int, b []byte, err error) {
	if err != nil {
		p.count("collector unreachable")
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// chaosOutcomes is how many outcomes the chaos test ends with:
// $OUTPOST_CHAOS_OUTCOMES, else 10,000 (1,000 with -short).
func chaosOutcomes(t *testing.T) int {
	if v := os.Getenv("OUTPOST_CHAOS_OUTCOMES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	if testing.Short() {
		return 1000
	}
	return 10000
}

// collectorProc is a collector "process": its store and HTTP server.
type collectorProc struct {
	st  *BoltStore
	srv *httptest.Server
}

func startCollectorProc(t *testing.T, dir string) *collectorProc {
	st, err := OpenBoltStore(dir)
	require.NoError(t, err)
	srv := httptest.NewServer(NewCollector(st, CollectorOptions{Secrets: map[string][]byte{"ship-1": testSecret}, Token: testToken}))
	return &collectorProc{st, srv}
}

func (c *collectorProc) stop() {
	c.srv.CloseClientConnections()
	c.srv.Close()
	c.st.Close()
}

// applianceProc is an appliance "process": its store and running uplink.
type applianceProc struct {
	u      *Uplink
	cancel context.CancelFunc
	done   chan struct{}
	close  func() error
}

func TestChaos(t *testing.T) {
	total := chaosOutcomes(t)
	start := time.Now()
	adir, cdir := t.TempDir(), t.TempDir()

	proxy := &chaosProxy{rng: rand.New(rand.NewPCG(42, 7)), stall: 600 * time.Millisecond,
		client: &http.Client{Timeout: 5 * time.Second}}
	front := httptest.NewServer(proxy)
	defer front.Close()

	col := startCollectorProc(t, cdir)
	proxy.target.Store(col.srv.URL)
	restartCollector := func() {
		proxy.target.Store("")
		col.stop()
		col = startCollectorProc(t, cdir)
		proxy.target.Store(col.srv.URL)
	}
	defer func() { col.stop() }()

	startAppliance := func() *applianceProc {
		db := openAppliance(t, adir, "ship-1")
		cfg := fastConfig(front.URL)
		cfg.MaxRecords, cfg.Timeout = 250, 500*time.Millisecond
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
		u, err := New(db, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(bg)
		a := &applianceProc{u: u, cancel: cancel, done: make(chan struct{}), close: db.Close}
		go func() { defer close(a.done); _ = u.Run(ctx) }()
		return a
	}
	stopAppliance := func(a *applianceProc) {
		a.cancel()
		<-a.done
		require.NoError(t, a.close())
	}

	app := startAppliance()
	const rounds = 5
	for i := range rounds {
		db := app.u.db
		makeOutcomes(t, db, total/rounds+map[bool]int{true: total % rounds}[i == rounds-1])
		app.u.Notify()
		time.Sleep(50 * time.Millisecond) // let some batches go out mid-backlog
		switch i % 2 {
		case 0:
			stopAppliance(app)
			app = startAppliance()
		case 1:
			restartCollector()
		}
	}

	// A bound on liveness, not a speed target: the drain takes about 20 s
	// with the race detector on a quiet machine, twice that on a busy one,
	// and more on one shared with other test binaries. So the test fails
	// when the uplink stops getting acknowledgements (no progress for
	// stallLimit), not when the drain is slow.
	waitDrained(t, app.u, 45*time.Second)
	st := app.u.Status()
	outs, err := app.u.db.Outcomes(bg, 0, 0)
	require.NoError(t, err)
	stopAppliance(app)

	// The collector holds each outcome exactly once, in order, with a
	// verified chain, and it survives a last restart.
	restartCollector()
	recs, err := col.st.Records(bg, "ship-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, recs, total)
	require.Len(t, outs, total)
	assert.Equal(t, uint64(total), st.AckedSeq)
	assert.Zero(t, st.Backlog)
	prev := ""
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq)
		got, err := DecodeRecord(r.Line)
		require.NoError(t, err, "seq %d", r.Seq)
		require.Equal(t, outs[i].Hash, got.Hash)
		if i > 0 {
			require.Equal(t, prev, got.PrevHash)
		}
		prev = got.Hash
	}
	list, err := col.st.Appliances(bg)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "ok", list[0].Chain)
	assert.Equal(t, uint64(total), list[0].LastSeq)

	var faults []string
	proxy.counts.Range(func(k, v any) bool {
		faults = append(faults, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("%d outcomes through the chaos proxy in %s: %v", total, time.Since(start).Round(time.Millisecond), faults)
}

// waitDrained waits for u's backlog to empty, and fails the test once no
// outcome has been acknowledged for stallLimit.
func waitDrained(t *testing.T, u *Uplink, stallLimit time.Duration) {
	t.Helper()
	acked, since := u.Status().AckedSeq, time.Now()
	for st := u.Status(); st.Backlog > 0; st = u.Status() {
		if st.AckedSeq != acked {
			acked, since = st.AckedSeq, time.Now()
		}
		if time.Since(since) > stallLimit {
			t.Fatalf("no outcome acknowledged for %s; backlog still %d: %+v", stallLimit, st.Backlog, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
