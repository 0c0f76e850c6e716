package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

func init() {
	register("runs", "list runs, show one, a thread's history, fork a thread, or replay a run", runRuns, subNames(runsCommands)...)
}

const runsUsage = `Usage: outpost runs <list|show|history|fork|replay> [flags]

  list [--status S] [--agent A] [--thread T] [--limit N] [--after RUN] [--newest-first]
  show RUN
  history THREAD [--limit N] [--before ID]
                                    checkpoints, newest first
  fork THREAD --checkpoint ID       start a new branch at an earlier checkpoint
  replay RUN                        re-execute a past run from its records, for an audit,
                                    and say where it parts from the original

Every subcommand takes --data DIR and --json; "outpost runs SUB -h" lists its flags.
list, show and history only read: while serve owns the store, they ask it through its
control socket, and list and show the runs as its HTTP API does. fork and replay need
the store to themselves: stop serve first (or fork through its HTTP API).
A run that a stop cut short is shown as stopped: it had started, and list
--status running lists it (whether it is stored as running or as queued),
--status queued does not. One left so whose pinned bundle is unavailable (its
installed folder deleted or changed by hand) is shown as held: a start leaves
it as it is until the same bundle is installed again.
`

// maxLimit bounds a page of runs or checkpoints, as the HTTP API does.
const maxLimit = 1000

// runsCommands are the runs subcommands. Each reads an existing store and
// never makes one.
var runsCommands = []sub[func(ctx context.Context, args []string, stdout, stderr io.Writer) error]{
	{"list", runsList},
	{"show", runsShow},
	{"history", runsHistory},
	{"fork", runsFork},
	{"replay", runsReplay},
}

func runRuns(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := subFirst("runs", runsUsage, "subcommand", subNames(runsCommands), args); err != nil {
		return err
	}
	if isHelp(args[0]) {
		return groupHelp(runsUsage, stdout)
	}
	run, ok := findSub(runsCommands, args[0])
	if !ok {
		return unknownSub(runsUsage, "unknown runs subcommand %q", args[0])
	}
	return run(ctx, args[1:], stdout, stderr)
}

// runsFlags is a runs subcommand's flag set with the flags all of them
// take, --data and --json.
func runsFlags(sub, synopsis string, stdout, stderr io.Writer) (fs *cmdFlags, data *string, asJSON *bool) {
	fs = newCmdFlags("runs "+sub, synopsis, stdout, stderr)
	data = dataFlag(fs.FlagSet)
	asJSON = fs.Bool("json", false, "print JSON")
	return fs, data, asJSON
}

// pageLimit checks --limit as the HTTP API checks limit: a whole number
// from 1 up, one over maxLimit read as maxLimit, which stderr is told (a
// page holds no more; the next one starts where the "more:" line says).
func pageLimit(limit *int, stderr io.Writer) error {
	switch {
	case *limit < 1:
		return badUsage("--limit must be a whole number from 1 to %d (a larger one reads as %d)", maxLimit, maxLimit)
	case *limit > maxLimit:
		fmt.Fprintf(stderr, "--limit %d reads as %d, the most one page holds; the \"more:\" line (\"next\" under --json) pages on\n", *limit, maxLimit)
		*limit = maxLimit
	}
	return nil
}

func runsList(ctx context.Context, args []string, stdout, stderr io.Writer) (rerr error) {
	fs, data, asJSON := runsFlags("list", "runs list [flags]", stdout, stderr)
	status := fs.String("status", "", "only runs in this `STATUS`: "+statusNames()+
		"; a run shown as stopped had started, and is listed under running, not queued")
	agent := fs.String("agent", "", "only runs of this `AGENT`")
	thread := fs.String("thread", "", "only runs on this `THREAD`")
	limit := fs.Int("limit", 100, fmt.Sprintf("at most this many, 1 to %d (a larger number reads as %d)", maxLimit, maxLimit))
	after := fs.String("after", "", "start after the run `RUN` (the previous page's last)")
	newest := fs.Bool("newest-first", false, "list the newest runs first (--after then pages on towards older ones)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	if *status == "stopped" {
		return badUsage("--status stopped: a run shown as stopped had started, and --status running lists it (stopped is no status of its own)")
	}
	if *status != "" && !engine.RunStatus(*status).Valid() {
		return badUsage("--status %q: want one of %s", *status, statusNames())
	}
	if err := pageLimit(limit, stderr); err != nil {
		return err
	}
	if *after != "" && !engine.IsRunID(*after) {
		return badUsage("--after %q is not a run id: give the --after of the \"more:\" line, the last run of the page before", *after)
	}
	// One more than the page, to know whether another page follows. A
	// record that cannot be read is left out and named after the list, so
	// that one damaged run does not hide all the others.
	type leftOut struct {
		key string
		err error
	}
	var damaged []leftOut
	var runs []runView
	err := readRuns(*data, func(rs runReader) (err error) {
		runs, err = listRuns(ctx, rs, engine.RunFilter{Status: engine.RunStatus(*status), Agent: *agent, Thread: *thread, After: *after, Limit: *limit + 1,
			Desc: *newest, Summary: true, Damaged: func(key string, err error) {
				if !slices.ContainsFunc(damaged, func(d leftOut) bool { return d.key == key }) {
					damaged = append(damaged, leftOut{key, err})
				}
			}})
		return err
	})
	if err != nil {
		return err
	}
	next := ""
	if len(runs) > *limit {
		runs = runs[:*limit]
		next = runs[len(runs)-1].ID
	}
	// As GET /api/v1/runs does: the listing read past next, and a damaged
	// key there is the next page's to name; those named come in the
	// listing's order.
	damaged = slices.DeleteFunc(damaged, func(d leftOut) bool { return next != "" && d.key > next != *newest })
	slices.SortStableFunc(damaged, func(a, b leftOut) int {
		if *newest {
			return strings.Compare(b.key, a.key)
		}
		return strings.Compare(a.key, b.key)
	})
	defer func() {
		if len(damaged) > 0 && rerr == nil {
			for _, d := range damaged {
				fmt.Fprintf(stderr, "left out: %v\n", d.err)
			}
			rerr = fmt.Errorf("%d run record(s) cannot be read and were left out of the list (run outpost db check)", len(damaged))
		}
	}()
	if *asJSON {
		if runs == nil {
			runs = []runView{} // a list, even an empty one
		}
		page := map[string]any{"runs": runs}
		if next != "" {
			page["next"] = next
		}
		return printJSON(stdout, page)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tTHREAD\tAGENT\tSTATUS\tSTEPS\tCREATED")
	stopped, held := false, false
	for _, r := range runs {
		status := string(r.Status)
		switch {
		case r.Held != nil:
			status, held = "held", true
		case r.Stopped:
			status, stopped = "stopped", true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Thread, r.Agent, status, r.Steps, r.CreatedAt.Local().Format(time.DateTime))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if stopped {
		fmt.Fprintln(stdout, "stopped: "+stoppedMeaning)
	}
	if held {
		fmt.Fprintln(stdout, "held: "+heldMeaning+" (outpost runs show RUN says what is missing)")
	}
	if next != "" {
		// The same filters, from where this page ends.
		hint := "outpost runs list" + dataHint(fs.FlagSet)
		for _, f := range []struct{ name, value string }{{"status", *status}, {"agent", *agent}, {"thread", *thread}} {
			if f.value != "" {
				hint += " --" + f.name + " " + shellQuote(f.value)
			}
		}
		if *limit != 100 {
			hint += fmt.Sprintf(" --limit %d", *limit)
		}
		fmt.Fprintf(stdout, "more: %s --after %s\n", hint, next)
	}
	return nil
}

// listRuns is the page of runs that f selects, as runs list shows them.
// Read from the store itself, a run shown as stopped had started: it is
// listed under running, whether it is stored as running or as queued (its
// record is not rewritten at every step), and never under queued, so that
// --status agrees with the STATUS column. Such runs are the unfinished
// ones, which the store indexes: both statuses are read whole and merged
// in the listing's order.
func listRuns(ctx context.Context, rs runReader, f engine.RunFilter) ([]runView, error) {
	_, local := rs.(localRuns)
	if !local || (f.Status != engine.StatusQueued && f.Status != engine.StatusRunning) {
		list, err := rs.Runs(ctx, f)
		views := make([]runView, 0, len(list))
		for _, r := range list {
			views = append(views, viewRun(ctx, rs, r))
		}
		return views, err
	}
	var unfinished []*engine.Run
	for _, st := range []engine.RunStatus{engine.StatusQueued, engine.StatusRunning} {
		part := f
		part.Status, part.Limit = st, 0
		list, err := rs.Runs(ctx, part)
		if err != nil {
			return nil, err
		}
		unfinished = append(unfinished, list...)
	}
	slices.SortFunc(unfinished, func(a, b *engine.Run) int {
		if f.Desc {
			return strings.Compare(b.ID, a.ID)
		}
		return strings.Compare(a.ID, b.ID)
	})
	var views []runView
	for _, r := range unfinished {
		if f.Limit > 0 && len(views) == f.Limit {
			break
		}
		if v := viewRun(ctx, rs, r); v.Stopped == (f.Status == engine.StatusRunning) {
			views = append(views, v)
		}
	}
	return views, nil
}

// statusNames lists the run statuses, for help and errors.
func statusNames() string {
	var names []string
	for _, s := range engine.RunStatuses() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

func runsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, data, asJSON := runsFlags("show", "runs show [flags] RUN", stdout, stderr)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	pos, err := fs.args("RUN")
	if err != nil {
		return err
	}
	if err := runArg(pos[0]); err != nil {
		return err
	}
	var v runView
	err = readRuns(*data, func(rs runReader) error {
		r, err := rs.Run(ctx, pos[0])
		if err != nil {
			return err
		}
		v = viewRun(ctx, rs, r)
		return nil
	})
	if err != nil {
		return runNotFound(err, *data, fs.FlagSet)
	}
	if *asJSON {
		return printJSON(stdout, v)
	}
	return printRun(stdout, v, dataHint(fs.FlagSet))
}

// runView is a run as runs list and show print it: its record, and, for
// one that a stop cut short, what its checkpoints tell of it.
type runView struct {
	*engine.Run
	// Stopped says that the store holds the run as queued or running
	// while no process has it, and that it had started: the appliance
	// stopped (or crashed) before it ended, and it resumes at the next
	// start. Status stays as stored; Steps counts its checkpoints.
	Stopped bool `json:"stopped,omitempty"`
}

// MarshalJSON is the run record as stored, with each interrupt's path
// through the subgraphs added ("team/review"), as the HTTP API's run view
// gives it: an interrupt's node alone names every instance of a subgraph
// alike, and its ns has the task ids of the steps that entered them.
func (v runView) MarshalJSON() ([]byte, error) {
	type record runView // its fields without this method
	type interrupt struct {
		engine.PendingInterrupt
		Path string `json:"path"`
	}
	var ins []interrupt
	if v.Run != nil {
		for _, in := range v.Interrupts {
			ins = append(ins, interrupt{in, in.Path()})
		}
	}
	// The outer interrupts, less deep than the record's, are the ones
	// encoding/json writes.
	return json.Marshal(struct {
		record
		Interrupts []interrupt `json:"interrupts,omitempty"`
	}{record(v), ins})
}

// stoppedMeaning says what a stopped run is, after the listing that shows one.
const stoppedMeaning = "the run had started and stopped with the appliance before it ended; " +
	"it resumes at the next start of outpost serve, run or resume"

// heldMeaning says what a held run is (engine.Run.Held).
const heldMeaning = "the run was left unfinished and waits for its pinned bundle, which is unavailable; " +
	"a start leaves it as it is, holding its thread, until the same bundle file is installed again " +
	"(outpost firmware install), and the next start of outpost serve, run or resume then resumes it"

// viewRun is r as runs list and show print it. A run record is not
// rewritten at every step, so one that a stop left queued or running
// holds the status and step count it had when it was last written; read
// from the store itself (no process has it), its steps are counted from
// its checkpoints, as recovery counts them, and one that had started is
// marked stopped; one whose pinned bundle the next start would find
// unavailable, and hold (engine.Manager.Held), is marked held as well.
// Through the owner's socket the record is live as it is, held when the
// owner holds it.
func viewRun(ctx context.Context, rs runReader, r *engine.Run) runView {
	l, local := rs.(localRuns)
	if !local || (r.Status != engine.StatusQueued && r.Status != engine.StatusRunning) {
		return runView{Run: r}
	}
	// A count that fails (a damaged checkpoint, which db check names)
	// leaves the record's.
	if steps, err := engine.RunSteps(ctx, l.DB, r.Thread, r.ID); err == nil {
		r.Steps = max(r.Steps, steps)
	}
	if l.held != nil {
		r.Held = l.held(r)
	}
	return runView{Run: r, Stopped: r.Status == engine.StatusRunning || r.Steps > 0 || !r.StartedAt.IsZero()}
}

// printRun shows a run record for a person: who and what it was, how far it
// got, what it waits for and how it ended. --json has the whole record.
func printRun(w io.Writer, v runView, dataHint string) error {
	r := v.Run
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	when := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Local().Format(time.DateTime)
	}
	row("run", r.ID)
	row("thread", r.Thread)
	row("agent", r.Agent)
	if r.Bundle.Name != "" {
		row("bundle", fmt.Sprintf("%s version %d", r.Bundle.Name, r.Bundle.Version))
	}
	switch {
	case r.Held != nil:
		row("status", "held: "+heldMeaning)
		row("waits for", r.Held.Reason)
	case v.Stopped:
		row("status", "stopped: "+stoppedMeaning)
	default:
		row("status", string(r.Status))
	}
	row("correlation", r.CorrelationID)
	row("created", when(r.CreatedAt))
	row("started", when(r.StartedAt))
	row("ended", when(r.EndedAt))
	if !r.StartedAt.IsZero() && !r.EndedAt.IsZero() {
		row("took", r.EndedAt.Sub(r.StartedAt).Round(time.Millisecond).String())
	}
	row("steps", fmt.Sprint(r.Steps))
	row("durability", string(r.Durability))
	row("checkpoint", r.Checkpoint)
	row("input", readableJSON(r.Input))
	row("output", readableJSON(r.Output))
	row("error", r.Error)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, d := range r.Decisions {
		fmt.Fprintf(w, "decided %s on %s", d.Decision, d.Interrupt)
		if d.By != "" {
			fmt.Fprintf(w, " by %s", d.By)
		}
		if !d.At.IsZero() {
			fmt.Fprintf(w, " at %s", d.At.Local().Format(time.DateTime))
		}
		if len(d.Value) > 0 {
			fmt.Fprintf(w, ": %s", readableJSON(d.Value))
		}
		if d.Reason != "" {
			fmt.Fprintf(w, " (%s)", d.Reason)
		}
		fmt.Fprintln(w)
	}
	printInterrupts(w, r, dataHint)
	return nil
}

// printInterrupts says what an interrupted run waits for, and how to answer.
// The node is named by its path through the subgraphs, as events name it:
// the bare name is the same in every instance of a subgraph.
func printInterrupts(w io.Writer, r *engine.Run, dataHint string) {
	for _, in := range r.Interrupts {
		fmt.Fprintf(w, "waiting for a decision on %s at %s: %s\n  outpost resume %s --interrupt %s --decision approve|edit|reject%s\n",
			in.ID, in.Path(), in.Payload, r.ID, in.ID, dataHint)
	}
}

// readableJSON shows a JSON string as its text and anything else as JSON.
func readableJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func runsHistory(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, data, asJSON := runsFlags("history", "runs history [flags] THREAD", stdout, stderr)
	limit := fs.Int("limit", 100, fmt.Sprintf("at most this many checkpoints, newest first, 1 to %d (a larger number reads as %d)", maxLimit, maxLimit))
	before := fs.String("before", "", "start below the checkpoint `ID` (the previous page's last)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	pos, err := fs.args("THREAD")
	if err != nil {
		return err
	}
	if err := pageLimit(limit, stderr); err != nil {
		return err
	}
	if *before != "" && !engine.IsCheckpointID(*before) {
		return badUsage("--before %q is not a checkpoint id: give the --before of the \"more:\" line, the last checkpoint of the page before", *before)
	}
	// One more than the page, to know whether another page follows.
	var cps []store.HistoryEntry
	err = readRuns(*data, func(rs runReader) (err error) {
		cps, err = rs.History(ctx, pos[0], "", *before, *limit+1)
		return err
	})
	if errors.Is(err, engine.ErrCheckpointNotFound) && *before != "" {
		return fmt.Errorf("--before %q names no checkpoint of thread %q: give the --before of the \"more:\" line, the last checkpoint of the page before\n(looked in the data folder %s)", *before, pos[0], absFolder(*data))
	}
	if err != nil {
		return err
	}
	if len(cps) == 0 {
		if *before != "" {
			return fmt.Errorf("thread %q has no checkpoints before %s", pos[0], *before)
		}
		return fmt.Errorf("thread %q has no checkpoints", pos[0])
	}
	next := ""
	if len(cps) > *limit {
		cps = cps[:*limit]
		next = cps[len(cps)-1].ID
	}
	if *asJSON {
		page := map[string]any{"thread": pos[0], "checkpoints": cps}
		if next != "" {
			page["next"] = next
		}
		return printJSON(stdout, page)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tSTEP\tSOURCE\tBY\tCHANGED\tNEXT\tRUN")
	for _, c := range cps {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Step, c.Source, strings.Join(c.Nodes, ","),
			strings.Join(c.Channels, ","), strings.Join(c.Next, ","), c.Run)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		// The same page size, from below this page's oldest checkpoint.
		hint := "outpost runs history " + shellQuote(pos[0]) + dataHint(fs.FlagSet)
		if *limit != 100 {
			hint += fmt.Sprintf(" --limit %d", *limit)
		}
		fmt.Fprintf(stdout, "more: %s --before %s\n", hint, next)
	}
	return nil
}

// runReader is what runs list, show and history read: the store itself,
// or the process that owns it, through its control socket.
type runReader interface {
	Run(ctx context.Context, id string) (*engine.Run, error)
	Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error)
	History(ctx context.Context, thread, ns, before string, limit int) ([]store.HistoryEntry, error)
}

// localRuns reads the store file, opened read-only, and summarizes
// checkpoints as the owner does across the socket. held, when set, says
// of a run stored as queued or running whether the next start would hold
// it for its bundle, as the owner says of one it holds.
type localRuns struct {
	*store.DB
	held func(r *engine.Run) *engine.Hold
}

// newLocalRuns reads db, the store of the data folder dir, and resolves
// the bundles of the runs a stop left unfinished as the next start will
// (pinnedResolver, which writes nothing, made at the first such run),
// once a bundle: one unavailable (engine.ErrBundleUnavailable) would be
// held. A firmware folder that cannot be read says nothing of any run.
func newLocalRuns(dir string, db *store.DB) localRuns {
	var resolve engine.Resolver
	var resolverErr error
	holds := map[engine.BundleRef]*engine.Hold{}
	return localRuns{DB: db, held: func(r *engine.Run) *engine.Hold {
		if resolve == nil && resolverErr == nil {
			resolve, resolverErr = pinnedResolver(dir)
		}
		if resolverErr != nil {
			return nil
		}
		h, seen := holds[r.Bundle]
		if !seen {
			if _, err := resolve(r.Agent, r.Bundle); errors.Is(err, engine.ErrBundleUnavailable) {
				h = &engine.Hold{Reason: err.Error(), Bundle: r.Bundle}
			}
			holds[r.Bundle] = h
		}
		return h
	}}
}

func (l localRuns) History(ctx context.Context, thread, ns, before string, limit int) ([]store.HistoryEntry, error) {
	cps, err := engine.HistoryPage(ctx, l.DB, thread, ns, before, limit)
	if err != nil {
		return nil, err
	}
	out := make([]store.HistoryEntry, len(cps))
	for i, c := range cps {
		out[i] = store.NewHistoryEntry(c)
	}
	return out, nil
}

// readRuns calls read with the store in dir, opened read-only (it commits
// nothing), or, while another process such as serve owns it, with that
// process's control socket; the answers are the same either way.
func readRuns(dir string, read func(runReader) error) error {
	return withStoreReadOnly(dir,
		func(db *store.DB) error { return read(newLocalRuns(dir, db)) },
		func(c *store.Control) error { return read(c) })
}

func runsReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, data, asJSON := runsFlags("replay", "runs replay [flags] RUN", stdout, stderr)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	pos, err := fs.args("RUN")
	if err != nil {
		return err
	}
	run := pos[0]
	if err := runArg(run); err != nil {
		return err
	}
	// The replay reads the run's records through the engine, with the
	// store to itself; the HTTP API has no replay.
	db, err := openToWork(*data, "serve, or another outpost process, owns it: stop serve, then replay the run "+
		"(the HTTP API has no replay)")
	if err != nil {
		return err
	}
	defer db.Close()
	return runNotFound(replayRun(ctx, db, *data, run, *asJSON, stdout), *data, fs.FlagSet)
}

func runsFork(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, data, asJSON := runsFlags("fork", "runs fork [flags] THREAD --checkpoint ID", stdout, stderr)
	checkpoint := fs.String("checkpoint", "", "the checkpoint `ID` to branch from (see outpost runs history THREAD)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	pos, err := fs.args("THREAD")
	if err != nil {
		return err
	}
	if *checkpoint == "" {
		return badUsage("fork needs --checkpoint ID (usage: outpost %s)", fs.synopsis)
	}
	body, _ := json.Marshal(map[string]string{"checkpoint": *checkpoint})
	db, err := openToWork(*data, fmt.Sprintf("serve, or another outpost process, owns it: stop serve, or fork through its HTTP API: "+
		"POST /api/v1/threads/%s/fork with %s and the bearer token that outpost token%s prints", url.PathEscape(pos[0]), body, dataHint(fs.FlagSet)))
	if err != nil {
		return err
	}
	defer db.Close()
	return forkThread(ctx, *data, db, pos[0], *checkpoint, *asJSON, dataHint(fs.FlagSet), stdout)
}

// forkThread forks thread th of the store db of the data folder dir at
// checkpoint; dataHint (" --data DIR" or "") goes into the command it
// suggests.
func forkThread(ctx context.Context, dir string, db *store.DB, th, checkpoint string, asJSON bool, dataHint string, stdout io.Writer) error {
	runs, err := db.Runs(ctx, engine.RunFilter{Thread: th, Summary: true})
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return fmt.Errorf("thread %q has no runs", th)
	}
	// The graph of the bundle the thread's last run is pinned to: an
	// installed one, or the embedded one of this or an earlier binary.
	resolve, err := applianceResolver(dir, loadedBundles{}, nil, true, keepInFolder)
	if err != nil {
		return err
	}
	last := runs[len(runs)-1]
	// A fork moves the thread's head from under a run not yet ended: a
	// run waiting for a person would go on from the fork, not from where
	// it paused, and its decision would be asked again. The HTTP API
	// refuses it too.
	if !last.Status.Terminal() {
		todo := "let it finish or cancel it"
		if last.Status == engine.StatusInterrupted {
			todo = "finish it (outpost resume) or cancel it"
		}
		return fmt.Errorf("run %s on the thread is %s: %s before forking", last.ID, last.Status, todo)
	}
	ag, err := resolve(last.Agent, last.Bundle)
	if err != nil {
		return err
	}
	c, err := ag.Graph.Fork(ctx, engine.RunConfig{Thread: th, Store: db}, checkpoint)
	if errors.Is(err, engine.ErrCheckpointNotFound) {
		// Said short when the checkpoint named is not there, as the HTTP
		// API says it; one of its ancestors missing (damage) keeps the
		// whole chain.
		if _, cerr := db.Checkpoint(ctx, th, "", checkpoint); errors.Is(cerr, engine.ErrCheckpointNotFound) {
			return fmt.Errorf("thread %q has no checkpoint %q (outpost runs history %s%s lists them)", th, checkpoint, shellQuote(th), dataHint)
		}
	}
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, map[string]string{"thread": th, "checkpoint": c.ID, "parent": c.ParentID})
	}
	fmt.Fprintf(stdout, "forked thread %s at %s: new head %s; the next run on the thread continues from it\n", th, c.ParentID, c.ID)
	return nil
}

// openToWork opens the store in dir, which must exist, for a command that
// writes or runs the engine; inUse says what to do while another process
// owns it.
func openToWork(dir, inUse string) (*store.DB, error) {
	if err := storeExists(dir); err != nil {
		return nil, err
	}
	db, err := store.OpenDir(dir, store.Options{})
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w\n(%s)", err, inUse)
	}
	if err != nil {
		return nil, explainOpen(dir, err)
	}
	return db, nil
}
