package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

func init() {
	register("runs", "list runs, show one, a thread's history, or fork a thread", runRuns)
}

const runsUsage = `Usage: outpost runs <list|show|history|fork> [flags]

  list [--status S] [--agent A] [--thread T] [--limit N] [--after RUN]
  show RUN
  history THREAD [--limit N]        checkpoints, newest first
  fork THREAD --checkpoint ID       start a new branch at an earlier checkpoint
  replay RUN                        re-execute a past run from its records, for an audit,
                                    and say where it parts from the original

Every subcommand takes --data DIR and --json.
`

func runRuns(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, fs, err := subcommand("runs", runsUsage, args, stderr)
	if sub == "" {
		return err
	}
	args = args[1:]
	data := dataFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	status := fs.String("status", "", "list: only runs in this status")
	agent := fs.String("agent", "", "list: only runs of this agent")
	thread := fs.String("thread", "", "list: only runs on this thread")
	limit := fs.Int("limit", 100, "at most this many (list at most 1000)")
	after := fs.String("after", "", "list: start after this run id (the previous page's last)")
	checkpoint := fs.String("checkpoint", "", "fork: the checkpoint to branch from")
	if err := parse(fs, args); err != nil {
		return err
	}
	db, err := openStore(*data)
	if err != nil {
		return err
	}
	defer db.Close()
	switch sub {
	case "list":
		if *limit < 1 || *limit > 1000 {
			return fmt.Errorf("--limit must be between 1 and 1000")
		}
		runs, err := db.Runs(ctx, engine.RunFilter{Status: engine.RunStatus(*status), Agent: *agent, Thread: *thread, After: *after, Limit: *limit})
		if err != nil {
			return err
		}
		if *asJSON {
			page := map[string]any{"runs": runs}
			if len(runs) == *limit {
				page["next"] = runs[len(runs)-1].ID
			}
			return printJSON(stdout, page)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tTHREAD\tAGENT\tSTATUS\tSTEPS\tCREATED")
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Thread, r.Agent, r.Status, r.Steps, r.CreatedAt.Local().Format(time.DateTime))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(runs) == *limit {
			fmt.Fprintf(stdout, "more: outpost runs list --after %s\n", runs[len(runs)-1].ID)
		}
		return nil
	case "show":
		if fs.NArg() != 1 {
			return fmt.Errorf("show needs a run id")
		}
		r, err := db.Run(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		return printJSON(stdout, r)
	case "history":
		if fs.NArg() != 1 {
			return fmt.Errorf("history needs a thread id")
		}
		cps, err := db.History(ctx, fs.Arg(0), "", "", *limit)
		if err != nil {
			return err
		}
		if len(cps) == 0 {
			return fmt.Errorf("thread %q has no checkpoints", fs.Arg(0))
		}
		if *asJSON {
			type entry struct {
				ID       string    `json:"id"`
				ParentID string    `json:"parent_id,omitempty"`
				Run      string    `json:"run"`
				Step     int       `json:"step"`
				Source   string    `json:"source"`
				Nodes    []string  `json:"nodes,omitempty"`
				Channels []string  `json:"channels"`
				Next     []string  `json:"next"`
				Created  time.Time `json:"created_at"`
			}
			out := make([]entry, len(cps))
			for i, c := range cps {
				out[i] = entry{ID: c.ID, ParentID: c.ParentID, Run: c.RunID, Step: c.Step, Source: c.Source, Nodes: c.Nodes,
					Channels: channelNames(c), Next: taskNodes(c.Next), Created: c.Created}
			}
			return printJSON(stdout, map[string]any{"thread": fs.Arg(0), "checkpoints": out})
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECKPOINT\tSTEP\tSOURCE\tBY\tCHANGED\tNEXT\tRUN")
		for _, c := range cps {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Step, c.Source, strings.Join(c.Nodes, ","),
				strings.Join(channelNames(c), ","), strings.Join(taskNodes(c.Next), ","), c.RunID)
		}
		return tw.Flush()
	case "replay":
		if fs.NArg() != 1 {
			return fmt.Errorf("replay needs a run id")
		}
		return replayRun(ctx, db, *data, fs.Arg(0), *asJSON, stdout)
	case "fork":
		if fs.NArg() != 1 || *checkpoint == "" {
			return fmt.Errorf("fork needs a thread and --checkpoint ID")
		}
		th := fs.Arg(0)
		runs, err := db.Runs(ctx, engine.RunFilter{Thread: th})
		if err != nil {
			return err
		}
		if len(runs) == 0 {
			return fmt.Errorf("thread %q has no runs", th)
		}
		resolve, err := resolver()
		if err != nil {
			return err
		}
		last := runs[len(runs)-1]
		ag, err := resolve(last.Agent, last.Bundle)
		if err != nil {
			return err
		}
		c, err := ag.Graph.Fork(ctx, engine.RunConfig{Thread: th, Store: db}, *checkpoint)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, map[string]string{"thread": th, "checkpoint": c.ID, "parent": c.ParentID})
		}
		fmt.Fprintf(stdout, "forked thread %s at %s: new head %s; the next run on the thread continues from it\n", th, c.ParentID, c.ID)
		return nil
	}
	fmt.Fprint(stderr, runsUsage)
	return fmt.Errorf("unknown runs subcommand %q", sub)
}

func channelNames(c *engine.Checkpoint) []string {
	out := make([]string, len(c.Channels))
	for i, cv := range c.Channels {
		out[i] = cv.Channel
	}
	return out
}

func taskNodes(ts []engine.TaskSpec) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Node
	}
	return out
}
