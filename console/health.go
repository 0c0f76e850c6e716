package console

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

// Component states in /healthz.
const (
	StateOK            = "ok"
	StateDegraded      = "degraded"
	StateDown          = "down"
	StateNotConfigured = "not_configured"
)

// HealthCheck is one component of /healthz.
type HealthCheck struct {
	Name  string
	Check func(ctx context.Context) Health
}

// Health is one component's state: ok, degraded (working, but not as
// configured: the scripted model standing in for an unreachable Ollama),
// down (not working) or not_configured.
type Health struct {
	State  string         `json:"state"`
	Detail string         `json:"detail,omitempty"`
	Info   map[string]any `json:"info,omitempty"`
}

// healthz answers 200 while the appliance can run turns (every component
// ok, degraded or not configured) and 503 when a component is down. A
// request without a token (a liveness probe, which DESIGN's bearer auth
// for /api/v1 does not cover) gets the status alone; the components, with
// their details, need the token.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	checks := []HealthCheck{{Name: "store", Check: s.storeHealth}}
	checks = append(checks, s.cfg.Health...)
	checks = append(checks, HealthCheck{Name: "bundle", Check: s.bundleHealth}, HealthCheck{Name: "uplink", Check: s.uplinkHealth})
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	results := make([]Health, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = c.Check(ctx)
		}()
	}
	wg.Wait()
	comps := map[string]Health{}
	degraded, down := []string{}, []string{}
	for i, c := range checks {
		comps[c.Name] = results[i]
		switch results[i].State {
		case StateDegraded:
			degraded = append(degraded, c.Name)
		case StateDown:
			down = append(down, c.Name)
		}
	}
	status, code := StateOK, http.StatusOK
	if len(degraded) > 0 {
		status = StateDegraded
	}
	if len(down) > 0 {
		status, code = StateDown, http.StatusServiceUnavailable
	}
	if !tokenEqual(bearer(r), s.cfg.Token) {
		writeJSON(w, code, map[string]any{"status": status})
		return
	}
	writeJSON(w, code, map[string]any{"status": status, "components": comps, "degraded": degraded, "down": down,
		"active_runs": s.cfg.Manager.Active()})
}

// storeHealth reads the first run to see that the store answers. A run
// record that cannot be read on the way does not make the store down (the
// other runs are read and run on), but degraded; this probe meets only
// those before the first sound record: /metrics' outpost_runs_damaged
// counts them all.
func (s *Server) storeHealth(ctx context.Context) Health {
	damaged := ""
	f := engine.RunFilter{Limit: 1, Summary: true, Damaged: func(_ string, err error) {
		if damaged == "" {
			damaged = err.Error()
		}
	}}
	if _, err := s.cfg.Manager.Store().Runs(ctx, f); err != nil {
		return Health{State: StateDown, Detail: err.Error()}
	}
	if s.cfg.StoreWrites != nil {
		if err := s.cfg.StoreWrites(); err != nil {
			return Health{State: StateDown, Detail: err.Error() + "; restart outpost once the disk is sound"}
		}
	}
	h := Health{State: StateOK}
	if damaged != "" {
		h = Health{State: StateDegraded, Detail: "a run record cannot be read and is left out of the run list: " + damaged}
	}
	if s.cfg.StoreSize != nil {
		if n, err := s.cfg.StoreSize(); err == nil {
			h.Info = map[string]any{"bytes": n}
		}
	}
	return h
}

func (s *Server) bundleHealth(context.Context) Health {
	if s.cfg.Bundles == nil {
		return Health{State: StateDown, Detail: "no bundle"}
	}
	for _, b := range s.cfg.Bundles() {
		if b.Active {
			h := Health{State: StateOK, Info: map[string]any{"name": b.Name, "version": b.Version, "digest": b.Digest, "source": b.Source}}
			if b.Notice != "" {
				h.Detail = b.Notice
			}
			return h
		}
	}
	return Health{State: StateDown, Detail: "no active bundle"}
}

func (s *Server) uplinkHealth(ctx context.Context) Health {
	st, err := s.uplinkStatus(ctx)
	switch {
	case err != nil:
		return Health{State: StateDegraded, Detail: err.Error()}
	case !st.Configured:
		return Health{State: StateNotConfigured, Detail: st.Note}
	case st.LastError != "":
		return Health{State: StateDegraded, Detail: st.LastError, Info: map[string]any{"backlog": st.Backlog}}
	}
	return Health{State: StateOK, Info: map[string]any{"backlog": st.Backlog}}
}
