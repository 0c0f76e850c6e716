package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// AddSubgraph adds a compiled graph as a node. The subgraph reads the
// parent's channels that it also declares, runs to its end in its own
// checkpoint namespace, and hands back what it changed in those shared
// channels: the new items of append channels and the final value of the
// others (custom channels are not handed back). An interrupt inside the
// subgraph pauses the parent run; resuming the parent resumes the subgraph
// where it stopped.
func (b *Builder) AddSubgraph(name string, sub *Graph, opts ...NodeOption) *Builder {
	if sub == nil {
		b.problems = append(b.problems, fmt.Sprintf("subgraph node %q has no graph", name))
		return b
	}
	b.AddNode(name, func(ctx context.Context, s State) ([]Write, error) {
		return runSubgraph(ctx, name, sub, s)
	}, opts...)
	if n := b.nodes[name]; n != nil {
		n.subgraph = sub
	}
	return b
}

func runSubgraph(ctx context.Context, name string, sub *Graph, s State) ([]Write, error) {
	sp := scratchFrom(ctx)
	if sp == nil || sp.exec == nil {
		return nil, fmt.Errorf("subgraph %q: not running inside a graph", name)
	}
	parent := sp.exec
	cfg := parent.cfg
	cfg.ns = subgraphNS(sp.ns, name, sp.taskID)
	cfg.nodePrefix = parent.cfg.nodePrefix + name + "/"
	cfg.Run = parent.run
	cfg.Output = nil
	cfg.parent = parent

	// The parent state a task sees is the same on every re-run of the task,
	// so the subgraph's input can be derived again instead of stored.
	var input []Write
	shared := map[string]any{}
	for _, ch := range sub.channelOrder {
		if parent.g.channels[ch] == nil {
			continue
		}
		if v, ok := s.Value(ch); ok && v != nil {
			input = append(input, Write{Channel: ch, Value: v})
			shared[ch] = v
		}
	}

	var res *Result
	var err error
	head, herr := parent.store.Checkpoint(ctx, cfg.Thread, cfg.ns, "")
	switch {
	case errors.Is(herr, ErrCheckpointNotFound):
		res, err = sub.Invoke(ctx, cfg, input...)
	case herr != nil:
		return nil, fmt.Errorf("subgraph %q: %w", name, herr)
	case len(head.Next) == 0:
		// It already finished before the parent's step was committed.
		res = &Result{}
		var snap *Snapshot
		snap, err = sub.StateAt(ctx, cfg, head.ID)
		res.State = snap
		res.Run = &Run{Status: StatusCompleted}
	default:
		var ds map[string]Decision
		ds, err = subgraphDecisions(ctx, parent.store, cfg, head.ID, sp.decisions)
		if err == nil {
			res, err = sub.Resume(ctx, cfg, ds)
		}
	}
	if errors.Is(err, ErrStepLimit) && !errors.Is(err, ErrBudgetExceeded) {
		// The run's step limit, which the subgraph's steps count against
		// (see countStep): the run ends budget_exceeded, as at its own.
		err = MarkPermanent(fmt.Errorf("%w: %w", ErrBudgetExceeded, err))
	}
	if err != nil {
		return nil, fmt.Errorf("subgraph %q: %w", name, err)
	}
	if res.Run.Status == StatusInterrupted {
		return nil, &InterruptError{Interrupts: res.Run.Interrupts}
	}
	var out []Write
	for _, ch := range sub.channelOrder {
		ps := parent.g.channels[ch]
		if ps == nil {
			continue
		}
		final, ok := res.State.Value(ch)
		if !ok || final == nil {
			continue
		}
		in := shared[ch]
		switch ps.kind {
		case KindAppend:
			if n := ps.length(in); ps.length(final) > n {
				out = append(out, Write{Channel: ch, Value: ps.tail(final, n)})
			}
		case KindSum:
			if d, ok := ps.diff(final, in); ok {
				out = append(out, Write{Channel: ch, Value: d})
			}
		case KindReplace, KindMerge:
			if res.State.Versions[ch] > 0 && (in == nil || res.State.Versions[ch] > 1) {
				out = append(out, Write{Channel: ch, Value: final})
			}
		}
	}
	return out, nil
}

// subgraphNS is the checkpoint namespace in which the task task of the
// subgraph node node runs, for a graph that runs in namespace ns.
func subgraphNS(ns, node, task string) string {
	return strings.TrimPrefix(ns+"/"+node+":"+task, "/")
}

// subgraphDecisions keeps the decisions that answer interrupts pending in the
// subgraph's namespace. The parent's Resume may also carry answers for its
// other tasks, which the subgraph would refuse as unknown.
func subgraphDecisions(ctx context.Context, store Checkpointer, cfg RunConfig, head string, decisions map[string]Decision) (map[string]Decision, error) {
	if len(decisions) == 0 {
		return nil, nil
	}
	ws, err := store.Writes(ctx, cfg.Thread, cfg.ns, head)
	if err != nil {
		return nil, fmt.Errorf("load pending writes of %s: %w", head, err)
	}
	last := map[string]PendingWrite{}
	for _, w := range ws {
		last[w.TaskID] = w
	}
	out := map[string]Decision{}
	for _, w := range last {
		if w.Kind != WriteKindInterrupt {
			continue
		}
		var ins []PendingInterrupt
		if err := json.Unmarshal(w.Data, &ins); err != nil {
			continue
		}
		for _, in := range ins {
			if d, ok := decisions[in.ID]; ok {
				out[in.ID] = d
			}
		}
	}
	return out, nil
}
