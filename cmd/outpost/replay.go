package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/audit"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/store"
)

// replayRun re-executes a past run for an audit: on its pinned bundle, with
// every model response and tool result served from what it recorded, on a
// scratch copy of its thread. It prints where replay and original part.
func replayRun(ctx context.Context, db *store.DB, dir, runID string, asJSON bool, stdout io.Writer) error {
	run, err := db.Run(ctx, runID)
	if err != nil {
		return err
	}
	log := wiring.CallLog(db, db)
	// The lane is checked against the model the original asked for.
	model := "scripted"
	if recs, err := wiring.Records(ctx, log, "model:"+run.ID+":"); err == nil && len(recs) > 0 {
		model = strings.TrimPrefix(recs[0].Tool, "model:")
	}
	rt := &firmware.Runtime{Provider: audit.NoModel{}, Model: model, Log: audit.ReplayLog{Original: log},
		Blobs: db, Runs: db, Notes: replayNotes{}, Followups: &agent.MemoryFollowups{}}
	resolve, err := applianceResolver(dir, loadedBundles{rt: rt}, nil, true, keepNothing)
	if err != nil {
		return err
	}
	ag, err := resolve(run.Agent, run.Bundle)
	if err != nil {
		return fmt.Errorf("replay run %s: %w", run.ID, err)
	}
	rep, err := audit.Replay(ctx, ag.Graph, db, run)
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else if rep.Same {
		fmt.Fprintf(stdout, "run %s replayed: %d step(s), the same state at every checkpoint, ended %s\n", run.ID, rep.Steps, run.Status)
	} else {
		d := rep.Diff
		fmt.Fprintf(stdout, "run %s does not replay: %s\n", run.ID, d.Detail)
		if d.Call != "" {
			fmt.Fprintf(stdout, "  call %s (%s), node %v at step %d: its %s differs\n", d.Call, d.Tool, d.Nodes, d.Step, d.Part)
		} else if d.Checkpoint != "" {
			fmt.Fprintf(stdout, "  at checkpoint %s (step %d)\n", d.Checkpoint, d.Step)
		}
		if d.Original != "" || d.Replayed != "" {
			fmt.Fprintf(stdout, "  original: %s\n  replayed: %s\n", d.Original, d.Replayed)
		}
	}
	if !asJSON {
		for _, n := range rep.Notes {
			fmt.Fprintf(stdout, "  note: %s\n", n)
		}
	}
	if !rep.Same {
		return fmt.Errorf("replay of run %s differs from the original", run.ID)
	}
	return nil
}

// replayNotes refuses writes: a replay serves recorded results only.
type replayNotes struct{}

func (replayNotes) Put(context.Context, agent.Note) (bool, error) {
	return false, fmt.Errorf("%w: a note the original run did not write", audit.ErrDiverged)
}
