package eval_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/eval"
)

// triage is a small agent in the reference agent's shape, built in Go:
//
//	intake → guard → (END | lookup → answer → [review] → closing)
//
// guard flags "chest pain" as acute and "weather" as out of scope, with a
// fixed answer; lookup calls kb_search (and record_note when asked to note
// something); answer drafts from the input and the thread's earlier inputs;
// review interrupts when the input says "risky". gauge, when set, counts the
// runs inside lookup at once.
type triage struct {
	gauge    atomic.Int64
	peak     atomic.Int64
	hold     time.Duration // how long lookup holds its gauge
	resolver engine.Resolver
}

func newTriage(t testing.TB) *triage {
	t.Helper()
	tr := &triage{}
	b := engine.NewGraph("triage")
	input := engine.Replace[string](b, "input")
	history := engine.Append[string](b, "history")
	flags := engine.Replace[[]string](b, "flags")
	draft := engine.Replace[string](b, "draft")
	final := engine.Replace[string](b, "final")

	b.AddNode("intake", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{flags.Set([]string{}), engine.Push(history, input.Get(s)), final.Set("")}, nil
	})
	b.AddNode("guard", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		in := input.Get(s)
		switch {
		case strings.Contains(in, "chest pain"):
			return []engine.Write{flags.Set([]string{"acute"}), final.Set("Call emergency services now.")}, nil
		case strings.Contains(in, "weather"):
			return []engine.Write{flags.Set([]string{"out_of_scope"}), final.Set("I can only help with medicines.")}, nil
		}
		return nil, nil
	})
	b.AddConditionalEdge("guard", func(s engine.State) []string {
		if len(flags.Get(s)) > 0 {
			return []string{engine.End}
		}
		return []string{"lookup"}
	}, "lookup", engine.End)
	b.AddNode("lookup", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		n := tr.gauge.Add(1)
		for p := tr.peak.Load(); n > p && !tr.peak.CompareAndSwap(p, n); p = tr.peak.Load() {
		}
		time.Sleep(tr.hold)
		tr.gauge.Add(-1)
		engine.Announce(ctx, engine.EventToolCalled, map[string]any{"tool": "kb_search"})
		if strings.Contains(input.Get(s), "note") {
			engine.Announce(ctx, engine.EventToolCalled, map[string]any{"tool": "record_note"})
		}
		if strings.Contains(input.Get(s), "delete") {
			engine.Announce(ctx, engine.EventToolDenied, map[string]any{"tool": "delete_record", "layer": "registry"})
		}
		return nil, nil
	})
	b.AddNode("answer", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		h := history.Get(s)
		text := fmt.Sprintf("About %s (turn %d)", input.Get(s), len(h))
		if len(h) > 1 {
			text += ", after: " + strings.Join(h[:len(h)-1], "; ")
		}
		return []engine.Write{draft.Set(text)}, nil
	})
	b.AddConditionalEdge("answer", func(s engine.State) []string {
		if strings.Contains(input.Get(s), "risky") {
			return []string{"review"}
		}
		return []string{"closing"}
	}, "review", "closing")
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		d, err := engine.Interrupt(ctx, map[string]string{"draft": draft.Get(s)})
		if err != nil {
			return nil, err
		}
		switch d.Kind {
		case engine.Edit:
			var text string
			if err := json.Unmarshal(d.Value, &text); err != nil {
				return nil, err
			}
			return []engine.Write{draft.Set(text), flags.Set([]string{"review_edited"})}, nil
		case engine.Reject:
			return []engine.Write{draft.Set("A clinician will call you back."), flags.Set([]string{"review_rejected"})}, nil
		}
		return []engine.Write{flags.Set([]string{"review_approved"})}, nil
	})
	b.AddEdge("lookup", "answer")
	b.AddEdge("review", "closing")
	b.AddNode("closing", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{final.Set(draft.Get(s))}, nil
	})
	b.AddEdge(engine.Start, "intake")
	b.AddEdge("intake", "guard")
	g, err := b.Compile()
	if err != nil {
		t.Fatal(err)
	}
	agent := &engine.Agent{Name: "triage", Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			return []engine.Write{input.Set(s)}, nil
		},
		Output: func(s engine.State) json.RawMessage {
			raw, _ := json.Marshal(final.Get(s))
			return raw
		}}
	tr.resolver = func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name == "triage" {
			return agent, nil
		}
		return nil, fmt.Errorf("%w %q", engine.ErrUnknownAgent, name)
	}
	return tr
}

// replay decodes golden lines and runs them against the triage agent.
func (tr *triage) replay(t *testing.T, opts eval.Options, lines ...string) *eval.Report {
	t.Helper()
	convs, err := eval.Decode("test.jsonl", []byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	opts.Resolver = tr.resolver
	rep, err := eval.Run(context.Background(), convs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
