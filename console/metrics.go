package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/bounded"
	"github.com/outpost-edge/outpost/store"
)

// Metrics collects what /metrics reports that the store and manager do not
// count themselves: step and commit latencies, blob bytes written, denied
// tool calls and the event stream's clients.
type Metrics struct {
	step   histogram // superstep latency, from the events
	commit histogram // store commit latency, from InstrumentStore

	blobBytes   atomic.Uint64
	denied      atomic.Uint64
	events      atomic.Uint64
	wsClients   atomic.Int64
	dropped     atomic.Uint64
	windowMiss  atomic.Uint64
	commitFails atomic.Uint64

	mu       sync.Mutex
	lastStep *bounded.Map[string, time.Time] // run -> its last step boundary (see stepRunsMax); made on first use

	runsMu      sync.Mutex
	runsAt      time.Time
	runsByStat  map[engine.RunStatus]int
	runsDamaged int           // run records that cannot be read, left out of runsByStat
	runsHeld    int           // runs held for their bundles, left out of runsByStat
	runsTook    time.Duration // how long the last count took
}

var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	return &Metrics{step: newHistogram(latencyBuckets), commit: newHistogram(latencyBuckets)}
}

// stepRunsMax bounds the runs whose last step boundary the metrics keep (a
// variable so that tests can make it small). A run is tracked from its
// start or resume to its end or pause, so only the runs queued or running
// need an entry: the manager's queue and workers, 1,032 by default. A run
// whose end the metrics never see (its last commit failed, so the end was
// never announced, or the stream lost the event) would otherwise stay for
// the life of the process. When a new run finds the map full, the run
// tracked longest ago is forgotten (bounded.Map): if it is still running,
// its next checkpoint tracks it again, and one step goes unmeasured.
var stepRunsMax = 4096

// markStep records at as run's last step boundary. Call with m.mu held.
func (m *Metrics) markStep(run string, at time.Time) {
	if m.lastStep == nil {
		m.lastStep = bounded.New[string, time.Time](stepRunsMax)
	}
	m.lastStep.Put(run, at)
}

type histogram struct {
	mu     sync.Mutex
	bounds []float64
	counts []uint64
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds))}
}

func (h *histogram) observe(d time.Duration) {
	v := d.Seconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
		}
	}
	h.sum += v
	h.n++
}

func (h *histogram) write(b *strings.Builder, name, help string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, bound := range h.bounds {
		fmt.Fprintf(b, "%s_bucket{le=\"%g\"} %d\n", name, bound, h.counts[i])
	}
	fmt.Fprintf(b, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, h.n, name, h.sum, name, h.n)
}

// observeEvent derives the step latency (between a run's step boundaries:
// its start or resume, then each checkpoint) and counts denials.
func (m *Metrics) observeEvent(e engine.Event) {
	m.events.Add(1)
	switch e.Type {
	case engine.EventToolDenied:
		m.denied.Add(1)
	case engine.EventRunStarted, engine.EventRunResumed:
		m.mu.Lock()
		m.markStep(e.Run, e.Time)
		m.mu.Unlock()
	case engine.EventCheckpoint:
		m.mu.Lock()
		if m.lastStep != nil {
			if t, ok := m.lastStep.Get(e.Run); ok && !e.Time.Before(t) {
				m.step.observe(e.Time.Sub(t))
			}
		}
		m.markStep(e.Run, e.Time)
		m.mu.Unlock()
	case engine.EventInterrupt, engine.EventRunCompleted, engine.EventRunFailed, engine.EventBudgetExceeded:
		m.mu.Lock()
		if m.lastStep != nil {
			m.lastStep.Delete(e.Run)
		}
		m.mu.Unlock()
	}
}

// InstrumentStore wraps s so that m times its commits and counts the blob
// bytes written through it.
func InstrumentStore(s engine.Store, m *Metrics) engine.Store { return &instrumented{Store: s, m: m} }

type instrumented struct {
	engine.Store
	m *Metrics
}

func (s *instrumented) Commit(ctx context.Context, c *engine.Commit) error {
	var n uint64
	for _, b := range c.Blobs {
		n += uint64(len(b))
	}
	start := time.Now()
	err := s.Store.Commit(ctx, c)
	if err != nil {
		s.m.commitFails.Add(1)
		return err
	}
	s.m.commit.observe(time.Since(start))
	s.m.blobBytes.Add(n)
	return nil
}

func (s *instrumented) PutBlob(ctx context.Context, data []byte) (engine.BlobRef, error) {
	ref, err := s.Store.PutBlob(ctx, data)
	if err == nil {
		s.m.blobBytes.Add(uint64(len(data)))
	}
	return ref, err
}

// runCountsEvery is the least time between two counts of the stored runs
// (runCounts), and runCountsShare the most of the time that their walks
// of the runs take: a count that took a second is kept for 20. Variables,
// so that tests can make the least time short.
var (
	runCountsEvery               = 5 * time.Second
	runCountsShare time.Duration = 20
)

// runCounts counts runs by status: the stored ones, and in exit
// durability those the manager has not stored yet. It reads every run
// record, so it counts at most every runCountsEvery, and at most
// 1/runCountsShare of the time: a store of months of runs, scraped every
// few seconds, would otherwise keep a core busy. A record that cannot be
// read is counted apart, in damaged, instead of failing the count. A run
// the manager holds for its bundle (engine.Manager.Held) executes
// nowhere, whatever its record says: it is counted apart, in held, not as
// queued or running.
func (s *Server) runCounts(ctx context.Context) (counts map[engine.RunStatus]int, damaged, held int, err error) {
	m := s.metrics
	m.runsMu.Lock()
	defer m.runsMu.Unlock()
	if m.runsByStat != nil && time.Since(m.runsAt) < max(runCountsEvery, runCountsShare*m.runsTook) {
		return m.runsByStat, m.runsDamaged, m.runsHeld, nil
	}
	start := time.Now()
	// Asked first, as the runs list does: a run the manager no longer has
	// was stored before, and the count of the store has it. One it has is
	// counted as it has it, and its record, should it have one by now
	// (written by a tool call), is not.
	unstored := s.cfg.Manager.Unstored(engine.RunFilter{})
	skip := make(map[string]bool, len(unstored))
	for _, r := range unstored {
		skip[r.ID] = true
	}
	heldRuns := s.cfg.Manager.Held()
	for _, h := range heldRuns {
		skip[h.ID] = true
	}
	// The runs a worker executes are counted by their live status, as
	// GET /api/v1/runs/{id} gives it (a record still saying queued is
	// running), and not by their records: a run that waits for a worker
	// is queued, whatever the count of active runs.
	var executing []string
	for _, id := range s.cfg.Manager.Executing() {
		if !skip[id] {
			skip[id] = true
			executing = append(executing, id)
		}
	}
	count := s.cfg.CountRuns
	if count == nil {
		count = func(ctx context.Context, skip map[string]bool) (map[engine.RunStatus]int, int, error) {
			return countListed(ctx, s.cfg.Manager.Store(), skip)
		}
	}
	stored, damaged, err := count(ctx, skip)
	if err != nil {
		return nil, 0, 0, err
	}
	counts = map[engine.RunStatus]int{}
	for st := range statuses {
		counts[st] = 0
	}
	for st, n := range stored {
		counts[st] += n
	}
	for _, r := range unstored {
		counts[r.Status]++
	}
	for _, id := range executing {
		r, err := s.cfg.Manager.Run(ctx, id)
		var ce *store.CorruptError
		switch {
		case errors.As(err, &ce):
			damaged++
		case errors.Is(err, engine.ErrRunNotFound):
			// Gone since it was asked for: no run to count.
		case err != nil:
			return nil, 0, 0, err
		default:
			counts[r.Status]++
		}
	}
	m.runsByStat, m.runsDamaged, m.runsHeld, m.runsAt, m.runsTook = counts, damaged, len(heldRuns), time.Now(), time.Since(start)
	return counts, damaged, len(heldRuns), nil
}

// countListed counts the runs rs lists by status, but for those skip
// names, and the records that cannot be read: Config.CountRuns for a
// store that has no cheaper count.
func countListed(ctx context.Context, rs engine.RunStore, skip map[string]bool) (counts map[engine.RunStatus]int, damaged int, err error) {
	counts = map[engine.RunStatus]int{}
	// By key: the listing after the last run, which finds none, meets
	// again the damaged records that the one before read past that run.
	bad := map[string]bool{}
	after := ""
	for {
		runs, err := rs.Runs(ctx, engine.RunFilter{After: after, Limit: 1000, Summary: true,
			Damaged: func(key string, _ error) { bad[key] = true }})
		if err != nil {
			return nil, 0, err
		}
		if len(runs) == 0 {
			break
		}
		for _, r := range runs {
			if !skip[r.ID] {
				counts[r.Status]++
			}
		}
		after = runs[len(runs)-1].ID
	}
	return counts, len(bad), nil
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	m := s.metrics
	counts, damaged, held, err := s.runCounts(r.Context())
	if err != nil {
		writeError(w, errorf(http.StatusInternalServerError, "read_failed", err.Error()))
		return
	}
	b.WriteString("# HELP outpost_runs Runs by status: those in the store, and those in exit durability not stored yet; a run held for its bundle is in outpost_runs_held instead.\n# TYPE outpost_runs gauge\n")
	keys := make([]string, 0, len(counts))
	for st := range counts {
		keys = append(keys, string(st))
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "outpost_runs{status=%q} %d\n", k, counts[engine.RunStatus(k)])
	}
	fmt.Fprintf(&b, "# HELP outpost_runs_damaged Run records that cannot be read (a failed checksum or decoding), left out of outpost_runs: run outpost db check.\n# TYPE outpost_runs_damaged gauge\noutpost_runs_damaged %d\n", damaged)
	fmt.Fprintf(&b, "# HELP outpost_runs_held Runs a crash left queued or running whose pinned bundle is unavailable (its installed folder deleted or changed by hand), left out of outpost_runs: installing the same bundle again and restarting resumes them.\n# TYPE outpost_runs_held gauge\noutpost_runs_held %d\n", held)
	fmt.Fprintf(&b, "# HELP outpost_runs_active Runs executing or queued for a worker.\n# TYPE outpost_runs_active gauge\noutpost_runs_active %d\n", s.cfg.Manager.Active())
	m.step.write(&b, "outpost_step_duration_seconds", "Superstep latency: from a run's start or previous checkpoint to its next checkpoint.")
	m.commit.write(&b, "outpost_commit_duration_seconds", "Store commit latency (one fsynced transaction, shared by concurrent commits).")
	fmt.Fprintf(&b, "# HELP outpost_commit_failures_total Commits the store refused.\n# TYPE outpost_commit_failures_total counter\noutpost_commit_failures_total %d\n", m.commitFails.Load())
	fmt.Fprintf(&b, "# HELP outpost_blob_bytes_written_total Bytes of blobs handed to the store since start (a blob already stored is counted again).\n# TYPE outpost_blob_bytes_written_total counter\noutpost_blob_bytes_written_total %d\n", m.blobBytes.Load())
	if s.cfg.StoreSize != nil {
		if n, err := s.cfg.StoreSize(); err == nil {
			fmt.Fprintf(&b, "# HELP outpost_store_bytes Size of the store file.\n# TYPE outpost_store_bytes gauge\noutpost_store_bytes %d\n", n)
		}
	}
	// The backlog is the ledger's, uplink or none: the same number as
	// GET /api/v1/uplink gives.
	var backlog uint64
	configured := 0
	if st, err := s.uplinkStatus(r.Context()); err == nil {
		backlog = st.Backlog
		if st.Configured {
			configured = 1
		}
	}
	fmt.Fprintf(&b, "# HELP outpost_uplink_configured Whether an uplink is configured.\n# TYPE outpost_uplink_configured gauge\noutpost_uplink_configured %d\n", configured)
	fmt.Fprintf(&b, "# HELP outpost_uplink_backlog Outcome records not yet acknowledged upstream.\n# TYPE outpost_uplink_backlog gauge\noutpost_uplink_backlog %d\n", backlog)
	fmt.Fprintf(&b, "# HELP outpost_tool_denied_total Tool calls refused (tool.unauthorized events).\n# TYPE outpost_tool_denied_total counter\noutpost_tool_denied_total %d\n", m.denied.Load())
	fmt.Fprintf(&b, "# HELP outpost_events_total Events published since start.\n# TYPE outpost_events_total counter\noutpost_events_total %d\n", m.events.Load())
	fmt.Fprintf(&b, "# HELP outpost_stream_clients Event stream clients connected.\n# TYPE outpost_stream_clients gauge\noutpost_stream_clients %d\n", m.wsClients.Load())
	fmt.Fprintf(&b, "# HELP outpost_stream_dropped_total Stream clients dropped for falling behind.\n# TYPE outpost_stream_dropped_total counter\noutpost_stream_dropped_total %d\n", m.dropped.Load())
	fmt.Fprintf(&b, "# HELP outpost_stream_window_exceeded_total Resumes from a seq older than the replay window.\n# TYPE outpost_stream_window_exceeded_total counter\noutpost_stream_window_exceeded_total %d\n", m.windowMiss.Load())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write([]byte(b.String()))
}
