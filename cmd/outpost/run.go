package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
	"github.com/outpost-edge/outpost/store"
)

func init() {
	register("run", "run one turn of an agent, printing its events", runRun)
	register("resume", "answer an interrupted run and run it on", runResume)
}

// session is an open store with a run manager and an event printer.
type session struct {
	stop context.CancelFunc
	db   *store.DB
	bus  *engine.Bus
	m    *engine.Manager
	// resolve is the manager's resolver.
	resolve engine.Resolver
	sub     *engine.Subscription
	done    sync.WaitGroup
}

// modelChoice is what --model, --ollama and the --ollama-* flags select.
type modelChoice struct {
	model     string // "scripted" or "ollama:NAME"
	ollama    string // the Ollama server's URL
	keepAlive keepAliveFlag
	stall     time.Duration
}

// defaultKeepAlive keeps the model loaded through a clinic's quiet hours
// and its night, so that the first question of the day does not wait for
// it to load (Ollama's own default unloads it after five idle minutes).
// Ollama still unloads an idle model when another needs the memory.
const defaultKeepAlive = 24 * time.Hour

func modelFlags(fs *flag.FlagSet) *modelChoice {
	mc := &modelChoice{keepAlive: keepAliveFlag{d: defaultKeepAlive, set: true}}
	fs.StringVar(&mc.model, "model", "scripted", "`MODEL`: scripted (the bundle's deterministic rules) or ollama:NAME (a local model in the agent's lane)")
	fs.StringVar(&mc.ollama, "ollama", ollama.DefaultURL, "the Ollama server's `URL`, for --model ollama:NAME")
	fs.Var(&mc.keepAlive, "ollama-keep-alive", "how long Ollama keeps the model loaded after each call: a `duration`, -1 until Ollama stops, or 0 to leave it to Ollama's OLLAMA_KEEP_ALIVE (five minutes unless set)")
	fs.DurationVar(&mc.stall, "ollama-stall-timeout", ollama.DefaultStallTimeout, "longest pause between two chunks of a streamed answer before the call fails and is retried (0 waits for the node's timeout alone)")
	return mc
}

// keepAliveFlag is --ollama-keep-alive: a duration, -1 for "until Ollama
// stops", or 0 for "not sent".
type keepAliveFlag struct {
	d   time.Duration
	set bool // false: leave it to the server
}

func (k *keepAliveFlag) String() string {
	switch {
	case k == nil || !k.set:
		return "0"
	case k.d < 0:
		return "-1"
	}
	return k.d.String()
}

func (k *keepAliveFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "-1" {
		k.d, k.set = -1, true
		return nil
	}
	d, err := time.ParseDuration(s)
	if s == "0" {
		d, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("want a duration such as 24h, -1 (until Ollama stops) or 0 (Ollama's own setting)")
	}
	k.d, k.set = d, d != 0
	if d < 0 {
		k.d = -1
	}
	return nil
}

// client returns the Ollama client the flags describe.
func (mc *modelChoice) client() *ollama.Client {
	opts := ollama.Options{StallTimeout: mc.stall}
	if mc.stall == 0 {
		opts.StallTimeout = -1 // off: the flag's 0 means no stall timeout
	}
	if mc.keepAlive.set {
		d := mc.keepAlive.d
		opts.KeepAlive = &d
	}
	return ollama.NewWithOptions(mc.ollama, nil, opts)
}

// provider returns the model provider and model name chosen, or nil for the
// scripted rules. An Ollama that does not answer is an error for a command
// that runs one turn and ends (run, resume): the person asked for that
// model, and an answer from the scripted rules in its place is not one.
// With fallback (serve, which keeps running and moves to Ollama once it
// answers), the command says plainly that it falls back to the scripted
// model.
func (mc *modelChoice) provider(ctx context.Context, stderr io.Writer, fallback bool) (models.Provider, string, error) {
	if mc == nil {
		return nil, "", nil
	}
	if err := mc.check(); err != nil {
		return nil, "", err
	}
	name, ok := strings.CutPrefix(mc.model, "ollama:")
	if !ok {
		return nil, "", nil
	}
	client := mc.client()
	if err := ollamaReachable(ctx, client.URL()); err != nil {
		if !fallback {
			return nil, "", fmt.Errorf("--model %s: Ollama is not reachable at %s (%v); nothing was run. Start Ollama (ollama serve), or use --model scripted for the bundle's deterministic rules", mc.model, client.URL(), err)
		}
		fmt.Fprintf(stderr, "Ollama is not reachable at %s (%v): falling back to the scripted model\n", client.URL(), err)
		return nil, "", nil
	}
	return client, name, nil
}

// check refuses what the model flags cannot mean, before any work: a
// --model that is neither scripted nor ollama:NAME, an --ollama URL that
// cannot be called, a negative --ollama-stall-timeout.
func (mc *modelChoice) check() error {
	if mc.model != "" && mc.model != "scripted" {
		if name, ok := strings.CutPrefix(mc.model, "ollama:"); !ok || name == "" {
			return badUsage("--model %q: want scripted or ollama:NAME (such as ollama:llama3.2:3b)", mc.model)
		}
	}
	if err := mc.client().URLErr(); err != nil {
		return badUsage("--ollama: %v", err)
	}
	if mc.stall < 0 {
		return badUsage("--ollama-stall-timeout must not be negative (0 waits for the node's timeout alone), not %s", mc.stall)
	}
	return nil
}

// ollamaReachable asks the server for its version, briefly.
func ollamaReachable(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/version", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Unwrap(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /api/version: %s", resp.Status)
	}
	return nil
}

// bindRuntime gives rt, made with the appliance's budget and tool
// restriction before the store was open, what model nodes run with in a
// store-backed session: calls recorded in the store, notes and follow-ups
// in files beside it. Bundles loaded for rt read these
// fields when a node runs, not when they are compiled, so a command may
// check its agent on bundles loaded for rt before it opens the store, and
// run them once it has.
func bindRuntime(rt *firmware.Runtime, db *store.DB, dir string, p models.Provider, model string) error {
	notes, err := agent.OpenFileNotes(filepath.Join(dir, "notes.jsonl"))
	if err != nil {
		return err
	}
	rt.Provider, rt.Model, rt.Log, rt.Blobs, rt.Runs = p, model, wiring.CallLog(db, db), db, db
	rt.Notes, rt.Followups = notes, &agent.FileFollowups{Path: filepath.Join(dir, "followups.jsonl")}
	return nil
}

// openSession opens the store in dir, making it first when create is set
// (run makes one; resume answers a run that must already be there). lb
// is what was loaded of dir's bundles already, for lb.rt (checkNewRun's),
// so that no bundle is loaded again; its zero value loads them.
func openSession(ctx context.Context, dir string, create bool, durability engine.Durability, out, stderr io.Writer, asJSON bool, mc *modelChoice, bc *budgetChoice, lb loadedBundles) (*session, error) {
	budget, err := bc.budget()
	if err != nil {
		return nil, err
	}
	if !create {
		if err := storeExists(dir); err != nil {
			return nil, err
		}
	}
	p, model, err := mc.provider(ctx, stderr, false)
	if err != nil {
		return nil, err
	}
	bus := engine.NewBus()
	db, err := openStore(dir)
	if err != nil {
		return nil, err
	}
	if lb.rt == nil {
		lb = loadedBundles{rt: &firmware.Runtime{Budget: budget}}
	}
	if err := bindRuntime(lb.rt, db, dir, p, model); err != nil {
		db.Close()
		return nil, err
	}
	// One installer for the session: its resolver keeps the embedded
	// bundle's copy through it, and a prune through the control socket
	// removes copies through it (keptReclaimer), under its lock.
	if lb.in == nil {
		if lb.in, err = openInstaller(dir, lb.rt); err != nil {
			db.Close()
			return nil, err
		}
	}
	resolve, err := applianceResolver(dir, lb, func(notice string) { fmt.Fprintf(stderr, "%s\n", notice) }, true, keepPinning)
	if err != nil {
		db.Close()
		return nil, err
	}
	own, err := firmware.ReferenceRef()
	if err != nil {
		db.Close()
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &session{db: db, bus: bus, stop: stop, resolve: resolve}
	s.sub = s.bus.Subscribe(4096, nil)
	// The manager's wall time holds for agents from outside a bundle too
	// (the bench workload's).
	s.m = engine.NewManager(db, resolve, engine.ManagerOptions{Durability: durability, Events: s.bus, MaxDuration: budget.WallTime,
		MaxTokens: budget.Tokens, MaxRecoveries: bc.maxRecoveries(), MaxAlone: bc.maxAlone(),
		MaxSuspectWait: bc.maxSuspectWait()})
	// While this process owns the store, db backup and db check reach it
	// through the control socket, and runs list and show read its runs as
	// its manager has them (in exit durability, not stored until they end).
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		ctl := keptReclaimer(dir, db, s.m, lb.in, own)
		ctl.Owner = store.ControlOwner{Command: "run"}
		if err := store.ServeControl(ctx, db, dir, s.m, ctl); err != nil {
			fmt.Fprintf(out, "control socket: %v\n", err)
		}
	}()
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for e := range s.sub.C() {
			printEvent(out, e, asJSON)
		}
	}()
	return s, nil
}

func (s *session) close() {
	s.m.Close()
	s.stop()
	s.bus.Close()
	s.done.Wait()
	s.db.Close()
}

func printEvent(w io.Writer, e engine.Event, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(e)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	if e.Type == engine.EventModelToken {
		return
	}
	node := e.Node
	if node == "" {
		node = "-"
	}
	data := string(e.Data)
	// A refused call is printed whole: its reason (which layer left the
	// tool out) comes last in its data, and it is what explains the
	// run's answer.
	if len(data) > 160 && e.Type != engine.EventToolDenied {
		data = data[:157] + "..."
	}
	fmt.Fprintf(w, "%s %-16s %-18s %s\n", e.Time.Local().Format("15:04:05.000"), e.Type, node, data)
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("run", "run [flags] INPUT", stdout, stderr)
	data := dataFlag(fs.FlagSet)
	agentName := fs.String("agent", firmware.ReferenceAgent, "the `AGENT` to run (the bench workload's agent is \"reference\")")
	mc := modelFlags(fs.FlagSet)
	var tools toolsFlag
	fs.Var(&tools, "tools", "narrow the run's tools to these `NAMES` (comma-separated; \"\" for none); without it, the run may call every tool its agent may")
	thread := fs.String("thread", "default", "the `THREAD` (conversation) to run the turn on")
	durability := fs.String("durability", "sync", "when to commit, `sync|exit`: sync, every step; exit, only when the run ends or pauses")
	asJSON := fs.Bool("json", false, "print events and the run as JSON lines")
	bc := budgetFlags(fs.FlagSet, true)
	applianceTools := applianceToolsFlag(fs.FlagSet)
	fs.About = runAbout
	if err := fs.parse(args, true); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return badUsage("no input given (usage: outpost %s)", fs.synopsis)
	}
	if err := flagAfterInput(fs, args); err != nil {
		return err
	}
	// Checked before the store is opened: a typo must not run the turn in
	// another mode than the one asked for.
	dur, err := engine.ParseDurability(*durability)
	if err != nil {
		return badUsage("--durability must be sync or exit, not %q", *durability)
	}
	if err := mc.check(); err != nil {
		return err
	}
	budget, err := bc.budget()
	if err != nil {
		return err
	}
	// The bundles that the check loads are loaded for the runtime the
	// session binds to the store, and the session runs them as loaded.
	rt := &firmware.Runtime{Budget: budget, Tools: applianceTools.restriction()}
	lb, err := checkApplianceTools(*data, loadedBundles{rt: rt})
	if err != nil {
		return err
	}
	if lb, err = checkNewRun(*data, *thread, *agentName, &tools, lb); err != nil {
		return err
	}
	input, _ := json.Marshal(strings.Join(fs.Args(), " "))
	s, err := openSession(ctx, *data, true, dur, stdout, stderr, *asJSON, mc, bc, lb)
	if err != nil {
		return err
	}
	var meta map[string]string
	if tools.set {
		meta = map[string]string{firmware.MetaTools: tools.names}
	}
	if n, err := recoverRuns(ctx, s.m, s.resolve, engine.BundleRef{}, stderr); err != nil {
		s.close()
		return err
	} else if n > 0 {
		fmt.Fprintf(stderr, "resumed %d run(s) left running by an earlier process\n", n)
	}
	run, err := s.m.Invoke(ctx, engine.RunRequest{Thread: *thread, Agent: *agentName, Input: input, Meta: meta})
	// Closing waits for every run, including recovered ones, and for the
	// event printer to drain, so the summary comes last.
	s.close()
	if err != nil {
		return err
	}
	return reportRun(run, stdout, *asJSON, dataHint(fs.FlagSet))
}

const runAbout = `Run one turn of an agent on INPUT, printing its events, then how the run ended.

Flags go before the input: the input is free text, and it starts at the first word that is
not a flag. A word after the input that is one of run's own flags (outpost run hello --json)
is refused, with exit 2 and nothing run, since it was most likely meant as a flag: write the
flags first (outpost run --json hello). To send such a word as text, put -- before the input:
outpost run -- what does --json do`

// flagAfterInput refuses a run whose input holds a word that is one of
// run's own flags (args being run's arguments, parsed flags first): most
// often a flag written after the input, which would otherwise be run as
// text, in the default data folder, agent and output. Input after "--" is
// taken as it is.
func flagAfterInput(fs *cmdFlags, args []string) error {
	i := len(args) - fs.NArg() // where the input starts
	if i > 0 && args[i-1] == "--" {
		return nil
	}
	for _, w := range fs.Args()[1:] {
		if !isFlagOf(fs.FlagSet, w) {
			continue
		}
		if name := flagName(w); name == "h" || name == "help" {
			return usageError(fmt.Sprintf("%s after the input would be read as input, so nothing was run: outpost run -h lists run's flags", w))
		}
		flags, words, bare := splitFlags(fs.FlagSet, args)
		if bare != "" {
			// The line with the flags first would take the input for
			// the flag's value.
			return usageError(fmt.Sprintf("%s after the input would be read as input, so nothing was run, and it has no value: "+
				"run takes its flags, each with its value, before the input (outpost run %s %s ... INPUT)", bare, bare, strings.ToUpper(flagName(bare))))
		}
		asText := append(append(slices.Clip(args[:i]), "--"), args[i:]...)
		return usageError(fmt.Sprintf("%s after the input would be read as input, so nothing was run: run takes its flags before the input:\n"+
			"  outpost run %s\n(to send %s as text, put -- before the input: outpost run %s)",
			w, shellJoin(append(flags, words...)), w, shellJoin(asText)))
	}
	return nil
}

// flagName is the name of the flag the word w would set: "data" for
// "--data", "-data" and "--data=DIR"; "" when w is no flag.
func flagName(w string) string {
	if len(w) < 2 || w[0] != '-' || w == "--" {
		return ""
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(w[1:], "-"), "=")
	return name
}

// isFlagOf reports whether the word w sets one of fs's flags, or asks for
// help.
func isFlagOf(fs *flag.FlagSet, w string) bool {
	name := flagName(w)
	return name != "" && (fs.Lookup(name) != nil || name == "h" || name == "help")
}

// splitFlags splits a command line into its flags (with their values) and
// its other words, wherever the flags are, so that the flags can be shown
// first. bare is a flag that takes a value and ends the line without one.
func splitFlags(fs *flag.FlagSet, args []string) (flags, words []string, bare string) {
	for i := 0; i < len(args); i++ {
		w := args[i]
		if w == "--" {
			return flags, append(words, args[i+1:]...), ""
		}
		if !isFlagOf(fs, w) {
			words = append(words, w)
			continue
		}
		flags = append(flags, w)
		f := fs.Lookup(flagName(w))
		b, isBool := f.Value.(interface{ IsBoolFlag() bool })
		if !strings.Contains(w, "=") && !(isBool && b.IsBoolFlag()) {
			if i+1 == len(args) {
				return flags, words, w
			}
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, words, ""
}

// shellJoin writes words as a shell command line's arguments.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}

// toolsFlag is --tools: unset, the run's tools are not narrowed; set,
// even to "", they are narrowed to the names given.
type toolsFlag struct {
	names string
	set   bool
}

// String is "" unset, so that -h shows no default: the flag's text says
// what leaving it out does.
func (f *toolsFlag) String() string {
	if f == nil {
		return ""
	}
	return f.names
}

func (f *toolsFlag) Set(s string) error {
	f.names, f.set = s, true
	return nil
}

// reportRun prints how a run ended; dataHint (" --data DIR" or "") goes
// into the resume command it suggests.
func reportRun(run *engine.Run, stdout io.Writer, asJSON bool, dataHint string) error {
	if asJSON {
		b, _ := json.Marshal(run)
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		fmt.Fprintf(stdout, "\nrun %s on thread %s: %s\n", run.ID, run.Thread, run.Status)
		if len(run.Output) > 0 {
			var out any
			if json.Unmarshal(run.Output, &out) == nil {
				if str, ok := out.(string); ok {
					fmt.Fprintf(stdout, "output: %s\n", str)
				} else {
					fmt.Fprintf(stdout, "output: %s\n", run.Output)
				}
			}
		}
		printInterrupts(stdout, run, dataHint)
		if run.Error != "" {
			fmt.Fprintf(stdout, "error: %s\n", run.Error)
		}
	}
	switch run.Status {
	case engine.StatusCompleted, engine.StatusInterrupted:
		return nil
	}
	return fmt.Errorf("run %s ended %s", run.ID, run.Status)
}

func runResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("resume", "resume [flags] RUN --decision approve|edit|reject [--value JSON]", stdout, stderr)
	fs.About = `Answer a run that waits for a person (outpost run, runs show and runs list --status interrupted
name them), then run it on to its end, printing its events. approve sends the draft as it is;
reject withholds it, and the agent sends its notice instead; edit sends --value in its place:
a text is quoted twice, --value '"Please call the pharmacy."'. A decision the run cannot
take leaves it waiting.`
	data := dataFlag(fs.FlagSet)
	interrupt := fs.String("interrupt", "", "the interrupt `ID` to answer (default: the run's only one)")
	decision := fs.String("decision", "", "the `DECISION`: approve, edit or reject")
	value := fs.String("value", "", "edit: the new value, as `JSON` (a text is quoted twice: --value '\"new text\"')")
	reason := fs.String("reason", "", "why, in a `TEXT` (recorded with the decision)")
	by := fs.String("by", "cli", "who decides, by `NAME` (recorded with the decision)")
	asJSON := fs.Bool("json", false, "print events and the run as JSON lines")
	mc := modelFlags(fs.FlagSet)
	bc := budgetFlags(fs.FlagSet, true)
	applianceTools := applianceToolsFlag(fs.FlagSet)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	pos, err := fs.args("RUN")
	if err != nil {
		return err
	}
	d := engine.Decision{Kind: *decision, Reason: *reason, By: *by, At: time.Now().UTC()}
	if *value != "" {
		if !json.Valid([]byte(*value)) {
			return usageError(`--value is not valid JSON; a text is quoted twice, as in --value '"new text"'`)
		}
		d.Value = json.RawMessage(*value)
	}
	if d.Kind == engine.Edit && len(d.Value) == 0 {
		return badUsage(`--decision edit needs --value JSON, such as --value '"new text"'`)
	}
	if err := d.Validate(); err != nil {
		return usageError(err.Error())
	}
	if err := mc.check(); err != nil {
		return err
	}
	if err := runArg(pos[0]); err != nil {
		return err
	}
	budget, err := bc.budget()
	if err != nil {
		return err
	}
	lb, err := checkApplianceTools(*data, loadedBundles{rt: &firmware.Runtime{Budget: budget, Tools: applianceTools.restriction()}})
	if err != nil {
		return err
	}
	s, err := openSession(ctx, *data, false, engine.DurabilitySync, stdout, stderr, *asJSON, mc, bc, lb)
	if err != nil {
		return err
	}
	run, err := resumeOne(ctx, s, pos[0], *interrupt, d, stderr)
	s.close()
	if err != nil {
		return runNotFound(err, *data, fs.FlagSet)
	}
	return reportRun(run, stdout, *asJSON, dataHint(fs.FlagSet))
}

func resumeOne(ctx context.Context, s *session, runID, interrupt string, d engine.Decision, stderr io.Writer) (*engine.Run, error) {
	// A bundle of the run's that cannot be resolved is said once, by the
	// resume's error, not first by the start's warning as well.
	var own engine.BundleRef
	if r, err := s.db.Run(ctx, runID); err == nil && r.Status == engine.StatusInterrupted {
		own = r.Bundle
	}
	if _, err := recoverRuns(ctx, s.m, s.resolve, own, stderr); err != nil {
		return nil, err
	}
	run, err := s.db.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	if run.Status != engine.StatusInterrupted {
		// What Manager.Resume says too: naming an interrupt would not help.
		return nil, fmt.Errorf("%w: run %s is %s", engine.ErrNotInterrupted, runID, run.Status)
	}
	if interrupt == "" {
		if len(run.Interrupts) != 1 {
			return nil, fmt.Errorf("run %s has %d pending interrupts: name one with --interrupt", runID, len(run.Interrupts))
		}
		interrupt = run.Interrupts[0].ID
	}
	if _, err := s.m.Resume(ctx, runID, map[string]engine.Decision{interrupt: d}); err != nil {
		return nil, err
	}
	return s.m.Wait(ctx, runID)
}
