package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/bench"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// defaultDataDir is ./outpost-data, or $OUTPOST_DATA when set.
func defaultDataDir() string {
	if d := os.Getenv("OUTPOST_DATA"); d != "" {
		return d
	}
	return "./outpost-data"
}

func dataFlag(fs *flag.FlagSet) *string {
	p := new(string)
	*p = defaultDataDir()
	fs.Var(dataValue{p, defaultDataDir}, "data", "data folder `DIR` (or set $OUTPOST_DATA)")
	return p
}

// dataValue is --data: a folder's name, never empty. An empty one (most
// often an unset shell variable, --data "$DIR") would name the current
// folder, and a store would be made there. def says which folder leaving
// --data out gives, for the error.
type dataValue struct {
	p   *string
	def func() string
}

func (d dataValue) String() string {
	if d.p == nil {
		return ""
	}
	return *d.p
}

func (d dataValue) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("an empty folder name: name the data folder, or leave --data out for " + d.def())
	}
	*d.p = s
	return nil
}

// Default budgets of every run the appliance starts. A bundle's agent may
// set less (its step_limit); it never gets more.
const (
	// defaultMaxRunTime bounds a run's active time (the time it waits for
	// a person does not count): a few model calls on a slow CPU, with
	// room to spare, and not an afternoon.
	defaultMaxRunTime = 15 * time.Minute
	// defaultMaxTokens bounds the tokens all of a run's model calls spend:
	// the reference agents spend a few thousand a turn, a tool loop that
	// runs out its five iterations a few tens of thousands.
	defaultMaxTokens = 100_000
)

// budgetChoice is what --max-run-time, --max-tokens, --max-recoveries,
// --max-alone-time and --max-suspect-wait set.
type budgetChoice struct {
	runTime    time.Duration
	tokens     int
	recoveries int
	alone      time.Duration
	wait       time.Duration
	fs         *flag.FlagSet // to tell --max-suspect-wait given from left out
}

// budgetFlags adds --max-run-time and --max-tokens, and, with
// recoveries, --max-recoveries, which only a command that recovers runs
// at start takes (not eval, whose runs live in memory).
func budgetFlags(fs *flag.FlagSet, recoveries bool) *budgetChoice {
	bc := &budgetChoice{}
	fs.DurationVar(&bc.runTime, "max-run-time", defaultMaxRunTime,
		"wall-time budget of each run: its active time, not the time it waits for a person (0 for none); over it, the run ends budget_exceeded")
	fs.IntVar(&bc.tokens, "max-tokens", defaultMaxTokens,
		"token budget of each run: all its model calls, failed ones included (0 for none); over it, the run ends budget_exceeded")
	if !recoveries {
		return bc
	}
	fs.IntVar(&bc.recoveries, "max-recoveries", engine.DefaultMaxRecoveries,
		"times in a row a run left running by a crash is resumed at start without making progress (0 for no limit); "+
			"at the next start it ends failed instead, so that a run that crashes the appliance does not crash it at every start; "+
			"from its second recovery in a row on (with 1, from its first), a run has a turn alone, so that only its own crashes count")
	fs.DurationVar(&bc.alone, "max-alone-time", engine.DefaultMaxAlone,
		"longest a run suspected of crashing the appliance runs alone (0 for no limit); "+
			"then the other runs get workers beside it, and a crash counts against every run it cuts short")
	fs.DurationVar(&bc.wait, "max-suspect-wait", 0,
		"longest a suspect waits for its turn alone while the suspects before it run on after theirs and no other run takes a worker "+
			"(0 for no limit; left out, as long as --max-alone-time); then it runs beside them as any run does")
	bc.fs = fs
	return bc
}

// budget is the runtime budget chosen; negative values are refused.
func (bc *budgetChoice) budget() (policy.Budget, error) {
	if bc == nil {
		return policy.Budget{}, nil
	}
	if bc.runTime < 0 {
		return policy.Budget{}, badUsage("--max-run-time must not be negative (0 for no limit), not %s", bc.runTime)
	}
	if bc.tokens < 0 {
		return policy.Budget{}, badUsage("--max-tokens must not be negative (0 for no limit), not %d", bc.tokens)
	}
	if bc.recoveries < 0 {
		return policy.Budget{}, badUsage("--max-recoveries must not be negative (0 for no limit), not %d", bc.recoveries)
	}
	if bc.alone < 0 {
		return policy.Budget{}, badUsage("--max-alone-time must not be negative (0 for no limit), not %s", bc.alone)
	}
	if bc.wait < 0 {
		return policy.Budget{}, badUsage("--max-suspect-wait must not be negative (0 for no limit), not %s", bc.wait)
	}
	return policy.Budget{WallTime: bc.runTime, Tokens: bc.tokens}, nil
}

// describe says what the budget is, for the appliance's start.
func (bc *budgetChoice) describe() string {
	b, _ := bc.budget()
	wall, tokens := "no wall-time limit", "no token limit"
	if b.WallTime > 0 {
		wall = b.WallTime.String() + " of run time"
	}
	if b.Tokens > 0 {
		tokens = strconv.Itoa(b.Tokens) + " tokens"
	}
	recoveries := "as often as it crashes"
	if bc.recoveries > 0 {
		recoveries = fmt.Sprintf("%d times in a row at most", bc.recoveries)
	}
	alone := "until it makes progress"
	if bc.alone > 0 {
		alone = "for " + bc.alone.String() + " at most"
	}
	wait := "until its turn comes"
	if d := bc.suspectWait(); d > 0 {
		wait = "for " + d.String() + " at most"
	}
	return fmt.Sprintf("budgets: each run at most %s and %s (--max-run-time, --max-tokens; an agent may set less); "+
		"a run a crash left running is resumed %s (--max-recoveries), and one suspected of the crashes runs alone %s (--max-alone-time), "+
		"waiting for its turn %s (--max-suspect-wait)",
		wall, tokens, recoveries, alone, wait)
}

// maxRecoveries is --max-recoveries as engine.ManagerOptions.MaxRecoveries
// takes it, where 0 is the default and a negative number no limit.
func (bc *budgetChoice) maxRecoveries() int {
	if bc == nil {
		return 0
	}
	if bc.recoveries == 0 {
		return -1
	}
	return bc.recoveries
}

// maxAlone is --max-alone-time as engine.ManagerOptions.MaxAlone takes it,
// where 0 is the default and a negative duration no limit.
func (bc *budgetChoice) maxAlone() time.Duration {
	if bc == nil {
		return 0
	}
	if bc.alone == 0 {
		return -1
	}
	return bc.alone
}

// suspectWait is the bound on a suspect's wait for its turn, 0 for none:
// --max-suspect-wait, or --max-alone-time when that is left out.
func (bc *budgetChoice) suspectWait() time.Duration {
	if bc.fs != nil && flagGiven(bc.fs, "max-suspect-wait") {
		return bc.wait
	}
	return bc.alone
}

// maxSuspectWait is suspectWait as engine.ManagerOptions.MaxSuspectWait
// takes it, where a negative duration is no limit.
func (bc *budgetChoice) maxSuspectWait() time.Duration {
	if bc == nil {
		return 0
	}
	if d := bc.suspectWait(); d > 0 {
		return d
	}
	return -1
}

// openStore opens the store in dir, explaining the common failures. The
// outcome.appended events of the outcomes it appends reach the event bus
// through the run manager, which publishes them after the commit's own
// events (engine.Commit.Announce).
func openStore(dir string) (*store.DB, error) {
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return nil, explainOpen(dir, err)
	}
	return db, nil
}

// explainOpen adds to a failed open of the store in dir what to do about
// it. A file that holds nothing of a store has nothing to salvage, and
// the store's own message says so.
func explainOpen(dir string, err error) error {
	switch {
	case errors.Is(err, store.ErrInUse):
		return fmt.Errorf("%w\n(another outpost process, such as serve, owns it; stop it or use its HTTP API)", err)
	case errors.Is(err, store.ErrBucketsMissing), errors.Is(err, store.ErrOlderFormat):
		return err // its own message says what to do
	case errors.Is(err, store.ErrFormat):
		return fmt.Errorf("%w\n(this data folder was written by an incompatible outpost version, or is not an outpost store)", err)
	case errors.Is(err, store.ErrDamaged) && !errors.Is(err, store.ErrHollow):
		return fmt.Errorf("%w\n(with no backup to restore, copy out what can still be read: outpost db salvage --data %s FILE)", err, dir)
	}
	return explainDenied(dir, err)
}

// explainDenied says what a permission error in the data folder dir
// means and what to do: the folder, or a file in it, is not this user's
// to write, most often because outpost runs as another user than the one
// the appliance's data belongs to. Other errors are returned as they are.
func explainDenied(dir string, err error) error {
	if !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return fmt.Errorf("%w\n(the data folder %s, or the store's files in it, cannot be written by this user (uid %d): "+
		"run outpost as the appliance's user, the one that owns the folder (ls -ld %s), or fix the folder's permissions)",
		err, dir, os.Getuid(), shellQuote(dir))
}

// storeExists says "no store in DIR" when dir holds no store file, in the
// words the db commands use.
func storeExists(dir string) error {
	_, err := os.Stat(filepath.Join(dir, store.FileName))
	if err == nil {
		return nil
	}
	fi, serr := os.Stat(dir)
	switch {
	case serr == nil && !fi.IsDir():
		return fmt.Errorf("no store in %s: it is a file: --data names the folder that holds %s (db check --file checks a store file)", dir, store.FileName)
	case errors.Is(err, os.ErrNotExist):
		// Most often the wrong folder: --data left out (or run from
		// another folder than serve's), or mistyped.
		what := "there is no folder " + dir
		if serr == nil {
			what = "the folder holds no " + store.FileName
		}
		return fmt.Errorf("no store in %s: %s: give the data folder that serve uses, with --data DIR or $OUTPOST_DATA "+
			"(./outpost-data unless told); only run and serve make a store", dir, what)
	}
	return fmt.Errorf("no store in %s: %w", dir, err)
}

// dataFolderExists refuses a data folder dir that is not there, or is a
// file, for a command that reads more of the folder than its store, as
// storeExists refuses a folder without one; whose says whose folder it is
// and how it is given ("that serve uses, with --data DIR ...").
func dataFolderExists(dir, whose string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no data folder %s: there is no folder %s: give the data folder %s", dir, dir, whose)
	case err != nil:
		return fmt.Errorf("no data folder %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("no data folder %s: it is a file: give the data folder %s", dir, whose)
	}
	return nil
}

// runArg refuses, as a bad command line, a RUN argument that is not shaped
// like a run id (a thread name, a checkpoint id, a typo), before anything
// is opened: it could name no run.
func runArg(id string) error {
	if engine.IsRunID(id) {
		return nil
	}
	return badUsage("%q is not a run id (run ids look like %s; outpost runs list lists them)", id, "run_0123456789abcdef")
}

// runNotFound adds to a run that the store does not hold which data
// folder was looked in, and how to list the runs it holds.
func runNotFound(err error, dir string, fs *flag.FlagSet) error {
	if !errors.Is(err, engine.ErrRunNotFound) {
		return err
	}
	return fmt.Errorf("%w\n(looked in the data folder %s; outpost runs list%s lists the runs it holds)", err, absFolder(dir), dataHint(fs))
}

// absFolder is dir made absolute, as a message names the data folder it
// looked in: a relative one says nothing once the shell has moved on.
func absFolder(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// servesFolder is how serve's data folder is given, for dataFolderExists.
const servesFolder = "that serve uses, with --data DIR or $OUTPOST_DATA (./outpost-data unless told)"

// dataHint is " --data DIR" for a command line printed as a hint, when the
// data folder was chosen (by --data or $OUTPOST_DATA), so that the hint
// works when pasted elsewhere; "" for the default folder.
func dataHint(fs *flag.FlagSet) string {
	f := fs.Lookup("data")
	if f == nil {
		return ""
	}
	set := os.Getenv("OUTPOST_DATA") != ""
	fs.Visit(func(v *flag.Flag) { set = set || v.Name == "data" })
	if !set {
		return ""
	}
	return " --data " + shellQuote(f.Value.String())
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./,:@%+=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// resolver returns the agents this binary can run without a store: the
// embedded reference bundle's agents (medication-adherence and
// medication-adherence-tools, answering from the bundle's scripted rules,
// with model calls recorded in memory) and the bench workload's agent
// "reference".
func resolver() (engine.Resolver, error) {
	b, err := firmware.Reference()
	if err != nil {
		return nil, err
	}
	return referenceResolver(b)
}

// referenceResolver is resolver's, for the embedded bundle b loaded already.
func referenceResolver(b *firmware.Bundle) (engine.Resolver, error) {
	return withBench(firmware.BundleResolver(b), b.AgentNames())
}

// withBench adds the bench workload's agent, "reference", to resolve.
func withBench(resolve engine.Resolver, names []string) (engine.Resolver, error) {
	return namingAgents(resolve, names, true)
}

// namingAgents makes resolve's unknown-agent error list the agents there
// are, and, withBench, adds the bench workload's agent "reference". The
// bench agent belongs to no bundle (no signature, no tool registry, no
// pinned version), so serve leaves it out: only the command line's run
// (and replay of such a run) and the bench have it. The error leaves it
// out too, so that it lists what serve's API and the firmware listing
// show a user: run starts it only when asked for it by name.
func namingAgents(resolve engine.Resolver, names []string, withBench bool) (engine.Resolver, error) {
	var ref *engine.Agent
	if withBench {
		var err error
		if ref, err = bench.ReferenceAgent(); err != nil {
			return nil, err
		}
	}
	return func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		if ref != nil && name == ref.Name && pinned.Name == "" {
			return ref, nil
		}
		a, err := resolve(name, pinned)
		if err != nil && errors.Is(err, engine.ErrUnknownAgent) && pinned.Name == "" {
			return nil, fmt.Errorf("%w %q (available: %s)", engine.ErrUnknownAgent, name, strings.Join(names, ", "))
		}
		return a, err
	}, nil
}

// loadedBundles is what a command loaded of a data folder's bundles
// before it opened the store (checkNewRun's check of run's flags), for its
// session to run, so that no bundle is verified or compiled twice. They
// were loaded for rt, which the session binds to the store (bindRuntime).
type loadedBundles struct {
	rt  *firmware.Runtime
	in  *firmware.Installer // the folder's installer; nil: none opened yet
	ref *firmware.Bundle    // the embedded bundle, loaded for rt; nil: not loaded yet
}

// keeping is what a session's resolver writes in the firmware folder for
// the runs pinned to the binary's embedded bundle (applianceResolver).
type keeping int

const (
	// keepNothing writes nothing: the embedded bundle serves the runs
	// pinned to it as it is (runs replay).
	keepNothing keeping = iota
	// keepInFolder keeps a copy of the embedded bundle where the data
	// folder has a firmware folder, and makes none (runs fork).
	keepInFolder
	// keepPinning makes the firmware folder and keeps a copy of the
	// embedded bundle there, for the runs the session starts or resumes.
	keepPinning
)

// applianceResolver resolves agents for a store-backed session. When
// bundles are installed under dir, new runs get the active bundles' agents
// and resumed runs the exact version they are pinned to; otherwise (and for
// runs pinned to it) the embedded reference bundle serves, and notice is
// told so. A run pinned to the embedded bundle of an earlier binary goes
// on with the copy kept of it in dir's firmware folder. Model nodes run with lb.rt. With benchAgent, the bench workload's
// agent is there too (see namingAgents). What lb holds loaded already is
// used as it is, and the rest is loaded. A session that pins runs (it
// starts or resumes them) opens the installer, which makes the firmware
// folder to keep the embedded bundle in; any other opens it only where
// there is one, and keeps the embedded bundle there as keep says.
func applianceResolver(dir string, lb loadedBundles, notice func(string), benchAgent bool, keep keeping) (engine.Resolver, error) {
	ref, in, rt := lb.ref, lb.in, lb.rt
	var err error
	if ref == nil {
		if ref, err = firmware.ReferenceWithRuntime(rt); err != nil {
			return nil, err
		}
	}
	if in == nil {
		open := openInstalled
		if keep == keepPinning {
			open = openInstaller
		}
		if in, err = open(dir, rt); err != nil {
			return nil, err
		}
	} else {
		in.SetRuntime(rt)
	}
	// A run that pins the embedded bundle keeps a copy of it in the
	// firmware folder, with which it goes on under a later binary.
	embedded := firmware.EmbeddedResolver(in, ref)
	if keep == keepNothing {
		embedded = firmware.PinnedResolver(in, ref)
	}
	installed := in != nil && len(in.List()) > 0
	told := false
	tell := func() {
		if !told && notice != nil {
			told = true
			notice(firmware.ReferenceNotice)
		}
	}
	names := newRunAgents(in, ref)
	if !installed {
		return namingAgents(func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
			a, err := embedded(name, pinned)
			if err == nil {
				tell()
			}
			return a, err
		}, names, benchAgent)
	}
	fromInstaller := firmware.Resolver(in)
	return namingAgents(func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		if pinned.Name != "" && pinned == ref.Ref() {
			tell()
			return embedded(name, pinned)
		}
		return fromInstaller(name, pinned)
	}, names, benchAgent)
}

// newRunAgents names the agents new runs have, which an unknown agent's
// error and firmware list name: with bundles installed in in (nil: none),
// the active ones' agents alone (one that cannot be opened has none);
// otherwise the embedded bundle ref's. The bench workload's agent is not
// among them (see namingAgents).
func newRunAgents(in *firmware.Installer, ref *firmware.Bundle) []string {
	if in == nil || len(in.List()) == 0 {
		return ref.AgentNames()
	}
	var names []string
	for _, rec := range in.List() {
		if !rec.Active {
			continue
		}
		if b, err := in.Open(rec.Name, rec.Version); err == nil {
			names = append(names, b.AgentNames()...)
		}
	}
	return names
}

// keysDir is where an appliance keeps the public keys it trusts.
func keysDir(dataDir string) string { return filepath.Join(dataDir, "keys") }

// trustedKeys is the keyring of DATA/keys/*.pub plus extra key files or
// folders.
func trustedKeys(dataDir string, extra ...string) (*firmware.Keyring, error) {
	var paths []string
	if fi, err := os.Stat(keysDir(dataDir)); err == nil && fi.IsDir() {
		paths = append(paths, keysDir(dataDir))
	}
	for _, p := range extra {
		if p != "" {
			paths = append(paths, p)
		}
	}
	return firmware.LoadKeyring(paths...)
}

// openInstalled opens the firmware installer of dir to read what is
// installed there, or returns nil when dir has no firmware folder, where
// nothing was ever installed: opening the installer makes the folder,
// which a command that installs nothing must not do.
func openInstalled(dir string, rt *firmware.Runtime) (*firmware.Installer, error) {
	if _, err := os.Stat(filepath.Join(dir, "firmware")); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return openInstaller(dir, rt)
}

// openInstaller opens the firmware installer of dir.
func openInstaller(dir string, rt *firmware.Runtime) (*firmware.Installer, error) {
	keys, err := trustedKeys(dir)
	if err != nil {
		return nil, err
	}
	return firmware.NewInstaller(dir, keys, firmware.InstallerOptions{ApplianceVersion: version, Runtime: rt})
}

// keepWaitingPins is recoverRuns' pass over the runs waiting for a person.
// A bundle it cannot resolve is said, and stops nothing: the other runs go
// on. A bundle that needs a newer binary is said at the run's resume, and
// so is the bundle own (the one a run that the caller resumes next is
// pinned to), whose error the resume gives in the same words.
func keepWaitingPins(ctx context.Context, st engine.Store, resolve engine.Resolver, own engine.BundleRef, stderr io.Writer) error {
	stranded, err := strandedRuns(ctx, st, resolve, true)
	for _, s := range stranded {
		if own.Name != "" && s.Bundle == own {
			continue
		}
		fmt.Fprintf(stderr, "WARNING: run %s, and any other run pinned to %s v%d (%s), waits for a person but cannot go on: %s\n",
			s.Run, s.Bundle.Name, s.Bundle.Version, s.Bundle.Digest, s.Reason)
	}
	return err
}

// strandedRuns resolves the bundles of the runs waiting for a person, as
// their resumes will (resolve), and returns those that cannot go on: with
// oncePerBundle, the first such run of each bundle, else every one. A
// bundle that needs a newer binary is said at the run's resume.
func strandedRuns(ctx context.Context, rs engine.RunStore, resolve engine.Resolver, oncePerBundle bool) ([]store.StrandedRun, error) {
	waiting, err := rs.Runs(ctx, engine.RunFilter{Status: engine.StatusInterrupted, Summary: true,
		Damaged: func(string, error) {}}) // left out: recovery and db check name them
	if err != nil {
		return nil, err
	}
	var stranded []store.StrandedRun
	failed := map[engine.BundleRef]error{}
	for _, r := range waiting {
		if r.Bundle.Name == "" {
			continue
		}
		err, seen := failed[r.Bundle]
		if !seen {
			if _, err = resolve(r.Agent, r.Bundle); errors.Is(err, firmware.ErrMinVersion) {
				err = nil
			}
			failed[r.Bundle] = err
		} else if oncePerBundle {
			continue
		}
		if err != nil {
			stranded = append(stranded, store.StrandedRun{Run: r.ID, Bundle: r.Bundle, Reason: err.Error()})
		}
	}
	return stranded, nil
}

// pinnedResolver resolves the bundles runs are pinned to in the data
// folder dir without writing anything (firmware.PinnedResolver): an
// installed version or a kept copy of an embedded bundle, or the bundle
// embedded in this binary, whose copy a start of serve, run or resume
// keeps.
func pinnedResolver(dir string) (engine.Resolver, error) {
	ref, err := firmware.Reference()
	if err != nil {
		return nil, err
	}
	in, err := openInstalled(dir, nil)
	if err != nil {
		return nil, err
	}
	return firmware.PinnedResolver(in, ref), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// recoverRuns resumes the runs an earlier process left running. Run
// records that cannot be read are left out with a warning on stderr, so
// that one damaged record does not keep the appliance from starting. A
// run whose pinned bundle is unavailable but can be put back (an
// installed version's folder deleted or changed by hand) is left as it
// is, and said on stderr with the way back (engine.Manager.Held).
//
// Then the bundles of the runs waiting for a person are resolved, once a
// bundle, as their resumes will resolve them (resolve): the embedded bundle
// one waits pinned to is kept on disk (firmware.EmbeddedResolver), for a
// run that pinned it before copies were kept too, so that the run outlives
// the next upgrade of the binary; and a bundle that is not on disk any
// more is said now, on stderr, not first at a resume: but for own, the
// bundle of the run that resume resumes next (zero for none), whose resume
// says it.
func recoverRuns(ctx context.Context, m *engine.Manager, resolve engine.Resolver, own engine.BundleRef, stderr io.Writer) (int, error) {
	n, err := m.Recover(ctx)
	for _, h := range m.Held() {
		fmt.Fprintf(stderr, "WARNING: run %s was left running and cannot go on: %v; it is left as it is (stored as %s), not failed, "+
			"holding its thread (runs list shows it held; POST /api/v1/runs/%s/cancel through serve gives it up): "+
			"once its bundle is back, the next start of outpost serve, run or resume resumes it from its last checkpoint\n", h.ID, h.Err, h.Status, h.ID)
	}
	if err == nil {
		err = keepWaitingPins(ctx, m.Store(), resolve, own, stderr)
	}
	if s := m.Suspects(); s > 0 {
		fmt.Fprintf(stderr, "crash-loop guard: %d of the runs resumed were cut short by crashes without progress at two starts in a row, or at one where one more would fail them: they run first, one at a time and alone, each until it makes progress or for --max-alone-time at most, and the other runs wait for them meanwhile (see the README)\n", s)
	}
	var dmg *engine.DamagedRunsError
	if errors.As(err, &dmg) {
		fmt.Fprintf(stderr, "WARNING: %v\n", err)
		for _, k := range dmg.Keys {
			fmt.Fprintf(stderr, "  damaged run record %s\n", k)
		}
		err = nil
	}
	return n, err
}

// applianceToolsFlag adds --appliance-tools, the appliance's restriction
// of every run's tools (firmware.Runtime.Tools), to a command that starts
// or resumes runs.
func applianceToolsFlag(fs *flag.FlagSet) *toolsFlag {
	f := &toolsFlag{}
	fs.Var(f, "appliance-tools", "allow the runs only these `NAMES` of their bundle's tools (comma-separated; \"\" for none; a name that no bundle here has is refused); "+
		"without it, every tool of the bundle's registry; a run keeps the set it started with")
	return f
}

// restriction is the flag's names as firmware.Runtime.Tools takes them:
// nil when the flag is left out, no restriction.
func (f *toolsFlag) restriction() []string {
	if !f.set {
		return nil
	}
	return firmware.ParseToolList(f.names)
}

// checkApplianceTools refuses --appliance-tools naming a tool that no
// bundle this appliance can run has: the embedded bundle and every
// installed version, active or not, since runs pinned to any of them may
// resume here, and an operator may activate another. A name that only
// some of them have is fine: the restriction leaves the others whole
// there (policy.Resolve ignores it). It loads what lb lacks of the
// bundles, for lb.rt, and returns lb with it, so that the command's
// session does not load them again.
func checkApplianceTools(dir string, lb loadedBundles) (loadedBundles, error) {
	if lb.rt.Tools == nil {
		return lb, nil
	}
	var err error
	if lb.ref == nil {
		if lb.ref, err = firmware.ReferenceWithRuntime(lb.rt); err != nil {
			return lb, err
		}
	}
	if lb.in == nil {
		if lb.in, err = openInstalled(dir, lb.rt); err != nil {
			return lb, err
		}
	}
	known := map[string]bool{}
	add := func(b *firmware.Bundle) {
		if b.Registry != nil {
			for _, n := range b.Registry.Names() {
				known[n] = true
			}
		}
	}
	add(lb.ref)
	if lb.in != nil {
		for _, rec := range lb.in.List() {
			// One that cannot be opened cannot run either.
			if b, err := lb.in.Open(rec.Name, rec.Version); err == nil {
				add(b)
			}
		}
	}
	var unknown []string
	for _, n := range lb.rt.Tools {
		if !known[n] {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) == 0 {
		return lb, nil
	}
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	return lb, badUsage("--appliance-tools: no bundle this appliance can run has tool %s (its bundles have: %s)",
		strings.Join(unknown, ", "), strings.Join(names, ", "))
}

// describeApplianceTools is serve's start line for --appliance-tools.
func describeApplianceTools(tools []string) string {
	switch {
	case tools == nil:
		return "tools: each run may call the tools its agent's allowlist names in its bundle (no --appliance-tools restriction)"
	case len(tools) == 0:
		return "tools: none; the appliance allows runs no tool (--appliance-tools \"\")"
	}
	return "tools: the appliance allows runs only " + strings.Join(tools, ", ") + ", within their agent's allowlist (--appliance-tools)"
}
