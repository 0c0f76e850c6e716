package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

// Options configures Run.
type Options struct {
	// Resolver finds the conversations' agents (required). A new run gets
	// the zero BundleRef, a resumed one the bundle it was pinned to.
	Resolver engine.Resolver
	// Parallel bounds the conversations replayed at once; default
	// GOMAXPROCS. The turns of one conversation always run in order.
	Parallel int
	// FlagsChannel is the channel that "flags" is checked against; default
	// "flags".
	FlagsChannel string
	// FinalChannel holds the final answer that final_contains and
	// final_regex read; default "final". When the agent's state has no
	// such channel, the run's output is the answer.
	FinalChannel string
	// Timeout bounds one conversation; default one minute.
	Timeout time.Duration
	// MaxDuration and MaxTokens are every run's wall-time and token
	// budgets (engine.ManagerOptions; 0: none), as the appliance sets
	// them: a replayed turn over one ends budget_exceeded, as it would
	// on the appliance.
	MaxDuration time.Duration
	MaxTokens   int
	// Progress, when set, is called as each conversation ends, one call at
	// a time, with how many have ended out of how many.
	Progress func(done, total int, c *Case)
}

// eventBuffer is one conversation's subscription buffer. A turn's committed
// events are all published before Invoke or Wait returns, and the harness
// drains them after every turn, so this bounds the events of one turn.
const eventBuffer = 8192

// Run replays conversations and reports on each. Every conversation runs on
// its own engine.MemoryStore, run manager and event bus, so they share no
// state and may run concurrently; its turns share one thread. The error is
// for options that make replay impossible; a conversation that fails, or
// cannot be replayed, is a failed Case.
func Run(ctx context.Context, convs []Conversation, opts Options) (*Report, error) {
	if opts.Resolver == nil {
		return nil, errors.New("eval: a resolver is required")
	}
	if opts.Parallel <= 0 {
		opts.Parallel = runtime.GOMAXPROCS(0)
	}
	if opts.FlagsChannel == "" {
		opts.FlagsChannel = "flags"
	}
	if opts.FinalChannel == "" {
		opts.FinalChannel = "final"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Minute
	}
	start := time.Now()
	rep := &Report{Cases: make([]Case, len(convs))}
	var (
		mu   sync.Mutex
		done int
		wg   sync.WaitGroup
		sem  = make(chan struct{}, opts.Parallel)
	)
	for i := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c := replay(ctx, &convs[i], &opts)
			mu.Lock()
			defer mu.Unlock()
			rep.Cases[i] = c
			done++
			if opts.Progress != nil {
				opts.Progress(done, len(convs), &rep.Cases[i])
			}
		}()
	}
	wg.Wait()
	for _, c := range rep.Cases {
		if c.Passed {
			rep.Passed++
		} else {
			rep.Failed++
		}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// Observed is what one turn produced, as the expectations see it.
type Observed struct {
	Run    string `json:"run"`
	Status string `json:"status"`
	// Path is the run's node order: the root graph's node.completed
	// events, in order. After a resume it is the whole run's, both sides of
	// the pause.
	Path  []string `json:"path"`
	Flags []string `json:"flags"`
	// Tools are the tool.called events' tool names, in order (the whole
	// run's after a resume).
	Tools []string `json:"tools"`
	// Denied are the tools refused by policy (tool.unauthorized events),
	// in order. No expectation reads them; they explain a report.
	Denied []string `json:"denied,omitempty"`
	// Interrupt is the node of the pending interrupt (several are joined
	// with commas), empty when none is pending.
	Interrupt string `json:"interrupt,omitempty"`
	Final     string `json:"final"`
	Error     string `json:"error,omitempty"`
}

// conversation is one replay in progress.
type conversation struct {
	opts   *Options
	m      *engine.Manager
	sub    *engine.Subscription
	events []engine.Event // every committed event so far, in order
}

func replay(parent context.Context, c *Conversation, opts *Options) (cs Case) {
	start := time.Now()
	cs = Case{Name: c.Name, Agent: c.Agent, File: c.File, Line: c.Line, Turns: len(c.Turns)}
	defer func() { cs.Duration = time.Since(start) }()
	ctx, cancel := context.WithTimeout(parent, opts.Timeout)
	defer cancel()

	bus := engine.NewBus()
	defer bus.Close()
	cv := &conversation{opts: opts, sub: bus.Subscribe(eventBuffer, func(e engine.Event) bool { return !e.Live })}
	cv.m = engine.NewManager(engine.NewMemoryStore(), opts.Resolver, engine.ManagerOptions{Workers: 1, Events: bus,
		MaxDuration: opts.MaxDuration, MaxTokens: opts.MaxTokens})
	defer cv.m.Close()

	thread := "eval-" + c.Name
	for i, t := range c.Turns {
		tr := TurnResult{Turn: i + 1}
		failf := func(format string, args ...any) Case {
			cs.Failure = fmt.Sprintf("turn %d: ", tr.Turn) + fmt.Sprintf(format, args...)
			cs.Results = append(cs.Results, tr)
			return cs
		}
		run, err := cv.m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: c.Agent, Input: t.Input,
			Meta: map[string]string{"eval": c.Name}})
		if err != nil {
			return failf("%v", err) // the manager's errors say "start run"
		}
		obs, err := cv.observe(ctx, run)
		if err != nil {
			return failf("%v", err)
		}
		tr.Observed = obs
		if ctx.Err() != nil {
			return failf("timed out after %s (the run is %s)", opts.Timeout, obs.Status)
		}
		if diff := compare(t.Expect, obs); diff != "" {
			return failf("%s", withRunError(diff, obs))
		}
		if t.Resume == nil {
			cs.Results = append(cs.Results, tr)
			continue
		}
		if run.Status != engine.StatusInterrupted || len(run.Interrupts) == 0 {
			return failf("cannot resume: the run is %s with no pending interrupt", run.Status)
		}
		// One golden decision answers every pending interrupt: a turn
		// pauses at one review node in the agents this format is for.
		decisions := map[string]engine.Decision{}
		for _, in := range run.Interrupts {
			decisions[in.ID] = engine.Decision{Kind: t.Resume.Decision, Value: t.Resume.Value,
				Reason: t.Resume.Reason, By: "eval"}
		}
		if _, err := cv.m.Resume(ctx, run.ID, decisions); err != nil {
			return failf("resume: %v", err)
		}
		run, err = cv.m.Wait(ctx, run.ID)
		if err != nil {
			return failf("after resume: %v", err)
		}
		after, err := cv.observe(ctx, run)
		if err != nil {
			return failf("after resume: %v", err)
		}
		tr.AfterResume = after
		if ctx.Err() != nil {
			return failf("after resume: timed out after %s (the run is %s)", opts.Timeout, after.Status)
		}
		if diff := compare(t.AfterResume, after); diff != "" {
			return failf("after resume: %s", withRunError(diff, after))
		}
		cs.Results = append(cs.Results, tr)
	}
	cs.Passed = true
	return cs
}

// withRunError adds the run's error to a difference, unless the difference
// is the status, which already says it.
func withRunError(diff string, o *Observed) string {
	if o.Error == "" || strings.HasPrefix(diff, "status:") {
		return diff
	}
	return diff + " (run error: " + o.Error + ")"
}

// drain takes the events published so far. Committed events are published
// before the manager's Invoke and Wait return, so nothing of the turn is
// still on its way.
func (cv *conversation) drain() error {
	for {
		select {
		case e, ok := <-cv.sub.C():
			if !ok {
				return nil
			}
			if e.Type == engine.EventLost {
				return fmt.Errorf("the event subscription lost events (%s): a turn published more than %d", e.Data, eventBuffer)
			}
			cv.events = append(cv.events, e)
		default:
			return nil
		}
	}
}

// observe gathers what run produced: its events, and its final state.
func (cv *conversation) observe(ctx context.Context, run *engine.Run) (*Observed, error) {
	if err := cv.drain(); err != nil {
		return nil, err
	}
	o := &Observed{Run: run.ID, Status: string(run.Status), Error: run.Error, Path: []string{}, Tools: []string{}, Flags: []string{}}
	for _, e := range cv.events {
		if e.Run != run.ID {
			continue
		}
		switch e.Type {
		case engine.EventNodeCompleted:
			// Subgraph nodes are announced as "parent/child"; the path is
			// the root graph's.
			if !strings.Contains(e.Node, "/") {
				o.Path = append(o.Path, e.Node)
			}
		case engine.EventToolCalled, engine.EventToolDenied:
			var d struct {
				Tool string `json:"tool"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				return nil, fmt.Errorf("%s event %d: %w", e.Type, e.Seq, err)
			}
			if e.Type == engine.EventToolCalled {
				o.Tools = append(o.Tools, d.Tool)
			} else {
				o.Denied = append(o.Denied, d.Tool)
			}
		}
	}
	var nodes []string
	for _, in := range run.Interrupts {
		nodes = append(nodes, in.Node)
	}
	o.Interrupt = strings.Join(nodes, ",")

	ag, err := cv.opts.Resolver(run.Agent, run.Bundle)
	if err != nil {
		return nil, fmt.Errorf("resolve %s to read its state: %w", run.Agent, err)
	}
	snap, err := ag.Graph.StateAt(context.WithoutCancel(ctx), engine.RunConfig{Thread: run.Thread, Store: cv.m.Store()}, run.Checkpoint)
	if err != nil {
		return nil, fmt.Errorf("read the state of run %s: %w", run.ID, err)
	}
	if v, ok := snap.Value(cv.opts.FlagsChannel); ok {
		o.Flags = toStrings(v)
	}
	if v, ok := snap.Value(cv.opts.FinalChannel); ok {
		o.Final = toText(v)
	} else if len(run.Output) > 0 {
		o.Final = toText(run.Output)
	}
	return o, nil
}

// toStrings reads a flags channel's value: a list of strings, whatever its
// Go type.
func toStrings(v any) []string {
	switch v := v.(type) {
	case nil:
		return []string{}
	case []string:
		return append([]string{}, v...)
	case string:
		if v == "" {
			return []string{}
		}
		return []string{v}
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			out = append(out, fmt.Sprint(x))
		}
		return out
	}
	var out []string
	if b, err := json.Marshal(v); err == nil && json.Unmarshal(b, &out) == nil && out != nil {
		return out
	}
	return []string{fmt.Sprint(v)}
}

// toText reads a final answer: a string as is, a JSON string unquoted, a
// list of strings one a line, anything else as JSON.
func toText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []string:
		return strings.Join(v, "\n")
	case json.RawMessage:
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
		if string(v) == "null" {
			return ""
		}
		return string(v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return toText(json.RawMessage(b))
}
