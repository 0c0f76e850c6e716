package wiring

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
)

// OllamaSwitch stands in for an Ollama that did not answer when the
// appliance started: new model calls are served by the bundle's scripted
// rules until Run finds Ollama serving the model asked for, and by Ollama
// from then on. The choice is made as a call starts (firmware's
// Runtime.Models), so that no call changes provider midway.
//
// The switch is one way. An Ollama that goes away afterwards fails calls
// as unreachable, which the engine retries, rather than having answers
// come silently from the scripted rules again.
type OllamaSwitch struct {
	client *ollama.Client
	model  string
	opts   SwitchOptions

	mu         sync.Mutex
	live       bool
	switchedAt time.Time
	lastProbe  time.Time
	nextProbe  time.Time
	lastErr    string
}

// SwitchOptions tune an OllamaSwitch. The zero value is usable.
type SwitchOptions struct {
	// MinBackoff is the wait before the first probe and after the first
	// failed one (default 1s); each failure doubles it, up to MaxBackoff
	// (default 30s).
	MinBackoff, MaxBackoff time.Duration
	// ProbeTimeout bounds one probe (default 5s).
	ProbeTimeout time.Duration
	// Logf is told of the switch, and of an Ollama that answers but lacks
	// the model. Nil logs nothing.
	Logf func(format string, args ...any)
}

// SwitchStatus is where an OllamaSwitch stands, for a health check.
type SwitchStatus struct {
	Live       bool      // Ollama serves new model calls
	SwitchedAt time.Time // when it began to
	LastProbe  time.Time
	NextProbe  time.Time // zero once live, or once Run has stopped
	LastError  string    // why the last probe did not switch
}

// NewOllamaSwitch returns a switch to model on client, serving the
// scripted rules until Run switches it.
func NewOllamaSwitch(client *ollama.Client, model string, opts SwitchOptions) *OllamaSwitch {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 5 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	return &OllamaSwitch{client: client, model: model, opts: opts}
}

// Models is firmware's Runtime.Models: no provider (the bundle's scripted
// rules) until the switch, then Ollama and the model.
func (s *OllamaSwitch) Models() (models.Provider, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live {
		return s.client, s.model
	}
	return nil, ""
}

// Status reports the switch's state.
func (s *OllamaSwitch) Status() SwitchStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SwitchStatus{Live: s.live, SwitchedAt: s.switchedAt, LastProbe: s.lastProbe, NextProbe: s.nextProbe, LastError: s.lastErr}
}

// URL is the Ollama server's base URL.
func (s *OllamaSwitch) URL() string { return s.client.URL() }

// Model is the model asked for.
func (s *OllamaSwitch) Model() string { return s.model }

// Run probes Ollama, with a backoff, until it answers with the model
// installed, and then switches. It returns nil once switched, or ctx's
// error when ctx ends first.
func (s *OllamaSwitch) Run(ctx context.Context) error {
	wait := s.opts.MinBackoff
	lackedModel := false
	defer func() {
		s.mu.Lock()
		s.nextProbe = time.Time{}
		s.mu.Unlock()
	}()
	for {
		s.mu.Lock()
		s.nextProbe = time.Now().Add(wait)
		s.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, s.opts.MaxBackoff)

		pctx, cancel := context.WithTimeout(ctx, s.opts.ProbeTimeout)
		has, err := s.client.HasModel(pctx, s.model)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := time.Now()
		s.mu.Lock()
		s.lastProbe = now
		switch {
		case err != nil:
			s.lastErr = err.Error()
		case !has:
			s.lastErr = fmt.Sprintf("Ollama answers but has no model %s (ollama pull %s)", s.model, s.model)
		default:
			s.live, s.switchedAt, s.lastErr = true, now, ""
		}
		live, lastErr := s.live, s.lastErr
		s.mu.Unlock()

		switch {
		case live:
			s.opts.Logf("model: Ollama at %s answers with %s: new model calls use it (calls under way finish on the scripted model)", s.client.URL(), s.model)
			return nil
		case err == nil && !lackedModel:
			lackedModel = true
			s.opts.Logf("model: %s; still using the scripted model", lastErr)
		}
	}
}
