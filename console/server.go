package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

// Config is what a Server serves.
type Config struct {
	Manager *engine.Manager
	// Bus is the bus the manager publishes on; the server subscribes to it
	// for the event stream and the metrics.
	Bus *engine.Bus
	// Resolve finds agents (with a zero BundleRef for new runs), as the
	// manager does.
	Resolve engine.Resolver
	// Agents lists the agent names offered to new runs.
	Agents []string
	// Token is the bearer token every API and stream request must carry.
	Token string
	// AllowHosts adds Host names to the loopback ones.
	AllowHosts []string
	// Bundles reports the bundles the appliance runs, for /api/v1/firmware
	// and /healthz. Nil reports none.
	Bundles func() []BundleInfo
	// Kept lists the copies of embedded bundles kept for the runs pinned
	// to them (firmware.Installer.Kept), for /api/v1/firmware. It is asked
	// at each request: a run that pins the embedded bundle makes its copy
	// while serve runs. Nil reports none.
	Kept func() ([]firmware.Kept, error)
	// Health adds checks to /healthz besides the store's (the model
	// provider, typically).
	Health []HealthCheck
	// Uplink reports the uplink's state; nil means no uplink is configured.
	Uplink func(ctx context.Context) (*UplinkStatus, error)
	// Metrics, when the store was wrapped with InstrumentStore, is the same
	// *Metrics; nil makes a fresh one.
	Metrics *Metrics
	// StoreSize reports the store file's size for /metrics; optional.
	StoreSize func() (int64, error)
	// StoreWrites reports why the store takes no more writes (a failed
	// write or fsync), or nil while it does; /healthz then reports the
	// store down. Optional.
	StoreWrites func() error
	// CountRuns counts the stored runs by status for /metrics, and the
	// records that cannot be read, leaving out the runs that skip names
	// (store.DB.CountRuns, which reads the statuses alone). Nil counts
	// through the manager's store's run listings, which read what a
	// listing does.
	CountRuns func(ctx context.Context, skip map[string]bool) (counts map[engine.RunStatus]int, damaged int, err error)
	// Records reads what the store keeps of runs besides their records:
	// their flags and their tool calls (a *store.DB). Nil reads them
	// through the manager's store when it is one, and shows none
	// otherwise.
	Records RunRecords

	Events EventOptions
	// MaxBody bounds a request body (default 1 MiB).
	MaxBody int64
	// MaxWait bounds a request's "wait" (default 5 minutes).
	MaxWait time.Duration
	// Logf reports problems no client sees; nil discards them.
	Logf func(format string, args ...any)
}

// RunRecords reads a run's flags and tool-call records (store.DB does).
type RunRecords interface {
	RunFlags(ctx context.Context, runs []*engine.Run) (map[string][]string, error)
	ToolCalls(ctx context.Context, prefix string) ([]*store.ToolCall, error)
}

// BundleInfo describes a bundle the appliance runs.
type BundleInfo struct {
	Name    string   `json:"name"`
	Version int64    `json:"version"`
	Digest  string   `json:"digest"`
	Agents  []string `json:"agents"`
	// Allowlists maps each agent to its allowlist: the tools of the
	// bundle's registry it may call ([]: none), or null for an agent that
	// names none and may call every tool of the registry. The appliance's
	// restriction and a request's override narrow it further.
	Allowlists map[string][]string `json:"allowlists,omitempty"`
	Active     bool                `json:"active"`
	// Source is "embedded" for the reference bundle built into the binary,
	// "installed" for one installed from a file.
	Source string `json:"source"`
	Notice string `json:"notice,omitempty"`
}

// UplinkStatus is GET /api/v1/uplink.
type UplinkStatus struct {
	Configured    bool       `json:"configured"`
	AckedSeq      uint64     `json:"acked_seq"`
	LastSeq       uint64     `json:"last_seq"`
	Backlog       uint64     `json:"backlog"`
	LastError     string     `json:"last_error,omitempty"`
	LastSuccessAt *time.Time `json:"last_success_at,omitempty"`
	// ResendingFrom is set while outcomes the collector lost are sent
	// again (see package uplink).
	ResendingFrom uint64 `json:"resending_from,omitempty"`
	Note          string `json:"note,omitempty"`
}

// Server serves the API, the event stream and the page.
type Server struct {
	cfg     Config
	hosts   hostPolicy
	hub     *hub
	metrics *Metrics
	mux     *http.ServeMux
	ctx     context.Context
	stop    context.CancelFunc
}

// New returns a server for cfg. It starts following cfg.Bus at once, so
// the replay window holds events from now on; call Close to stop.
func New(cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Minute
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.Records == nil && cfg.Manager != nil {
		cfg.Records, _ = cfg.Manager.Store().(RunRecords)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, hosts: newHostPolicy(cfg.AllowHosts), metrics: cfg.Metrics, ctx: ctx, stop: stop}
	s.hub = newHub(cfg.Bus, cfg.Events, s.metrics)
	s.routes()
	return s
}

// Close stops following the bus and drops every stream client.
func (s *Server) Close() {
	s.stop()
	s.hub.close()
}

// Handler serves the page, /healthz, /metrics and /api/v1.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

func (s *Server) routes() {
	m := http.NewServeMux()
	api := func(pattern string, h func(http.ResponseWriter, *http.Request) *apiError) {
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if e := h(w, r); e != nil {
				writeError(w, e)
			}
		})
	}
	api("POST /api/v1/threads/{thread}/runs", s.startRun)
	api("GET /api/v1/threads/{thread}/history", s.history)
	api("POST /api/v1/threads/{thread}/fork", s.fork)
	api("GET /api/v1/runs", s.listRuns)
	api("GET /api/v1/runs/{id}", s.getRun)
	api("POST /api/v1/runs/{id}/resume", s.resume)
	api("POST /api/v1/runs/{id}/cancel", s.cancel)
	api("GET /api/v1/agents", s.agents)
	api("GET /api/v1/agents/{agent}/graph", s.graph)
	api("GET /api/v1/firmware", s.firmware)
	api("GET /api/v1/uplink", s.uplink)
	// The catch-alls take every method, so they also meet a wrong method
	// on a route that exists, which the mux would answer 405 without them.
	api("/api/", func(w http.ResponseWriter, r *http.Request) *apiError {
		if e := s.wrongMethod(w, r); e != nil {
			return e
		}
		return errorf(http.StatusNotFound, "not_found", "no such API route")
	})
	m.HandleFunc("GET /api/v1/events", s.events)
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /metrics", s.serveMetrics)
	for _, path := range []string{"/healthz", "/metrics"} {
		api(path, func(w http.ResponseWriter, r *http.Request) *apiError {
			if e := s.wrongMethod(w, r); e != nil {
				return e
			}
			return errorf(http.StatusNotFound, "not_found", "no such route")
		})
	}
	m.Handle("/", pageHandler())
	s.mux = m
}

// serve applies the checks every request passes before its handler.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if !s.hosts.host(r) {
		writeError(w, errorf(http.StatusMisdirectedRequest, "bad_host",
			"Host "+quote(r.Host)+" is not a name this appliance answers to (start it with --allow-host to add one)"))
		return
	}
	protected := strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/healthz" || r.URL.Path == "/metrics"
	if protected {
		if !s.hosts.origin(r) {
			writeError(w, errorf(http.StatusForbidden, "bad_origin", "Origin "+quote(r.Header.Get("Origin"))+" is not allowed"))
			return
		}
		// A websocket may authenticate with its first message or a
		// subprotocol instead of a header: the events handler checks.
		// A token that is there and wrong is refused at the handshake all
		// the same, as a wrong subprotocol token is.
		streamAuth := r.URL.Path == "/api/v1/events" && isWebsocket(r) && r.Header.Get("Authorization") == ""
		// /healthz is outside /api/v1: a probe with no token at all gets the
		// overall state (see healthz), a token gets the components too.
		probe := r.URL.Path == "/healthz" && r.Header.Get("Authorization") == ""
		if !streamAuth && !probe && !tokenEqual(bearer(r), s.cfg.Token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outpost"`)
			writeError(w, errorf(http.StatusUnauthorized, "unauthorized", "a valid bearer token is required (outpost token --data DIR prints it)"))
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// routeMethods are the methods probed for a path's routes.
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// wrongMethod answers a request that reached a catch-all: when a route
// other than a catch-all takes r's path with another method, it sets Allow
// to those methods and returns 405 method_not_allowed; otherwise nil.
func (s *Server) wrongMethod(w http.ResponseWriter, r *http.Request) *apiError {
	var allow []string
	for _, m := range routeMethods {
		// A method's own routes have patterns that begin with it (a GET
		// route also takes HEAD); the catch-alls name no method.
		if _, pattern := s.mux.Handler(&http.Request{Method: m, URL: r.URL, Host: r.Host}); strings.Contains(pattern, " ") {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return nil
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	return errorf(http.StatusMethodNotAllowed, "method_not_allowed",
		fmt.Sprintf("%s takes %s, not %s", quote(r.URL.Path), strings.Join(allow, ", "), quote(r.Method)))
}

func isWebsocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return `"` + strings.Map(func(c rune) rune {
		if c < 0x20 || c == '"' {
			return '?'
		}
		return c
	}, s) + `"`
}
