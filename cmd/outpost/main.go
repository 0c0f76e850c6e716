// Command outpost is the agent appliance: one binary that serves the console,
// runs agents, and operates its store. Run "outpost help" for the commands.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/gctune"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	// subs are the subcommands ("outpost runs list"), if it has any: the
	// command-line tests try each one.
	subs []string
}

var commands = map[string]command{}

// sub is one subcommand of a command: its name and what runs it. A
// command keeps its subcommands in one ordered list of them, which its
// dispatch, its registration and the error naming them read, in the
// order its usage gives.
type sub[F any] struct {
	name string
	run  F
}

// subNames are the names of subs, in their order.
func subNames[F any](subs []sub[F]) []string {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	return names
}

// findSub is what runs the subcommand name of subs.
func findSub[F any](subs []sub[F], name string) (run F, ok bool) {
	for _, s := range subs {
		if s.name == name {
			return s.run, true
		}
	}
	return run, false
}

func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error, subs ...string) {
	commands[name] = command{summary: summary, run: run, subs: subs}
}

// errUsage marks an error already explained by a flag set's usage text.
var errUsage = errors.New("usage")

// usageError is a command called the wrong way (an unknown flag, a flag
// value it refuses, an argument too many or missing, an unknown or missing
// subcommand): it exits 2, as an unknown command does, where a failure of
// the work itself exits 1. An empty one has been explained already.
type usageError string

func (e usageError) Error() string { return string(e) }

// replayError is eval's: a replay that could not be made (no golden file,
// a malformed one, an unknown agent, a bundle that will not load). It
// exits 2, as a bad command line does, so that CI can tell a broken
// harness from a regression (exit 1), but it needs no usage hint.
type replayError struct{ error }

// unknownSubError is a subcommand (or bench workload) that its command
// does not know: it exits 2 as a usageError does, and execute prints the
// error first and then the command's usage, as it does for an unknown
// command, so that the line saying what was wrong is not lost below the
// usage.
type unknownSubError struct{ msg, usage string }

func (e unknownSubError) Error() string { return e.msg }

// unknownSub is the unknownSubError of a command whose usage is usage.
func unknownSub(usage, format string, a ...any) error {
	return unknownSubError{msg: fmt.Sprintf(format, a...), usage: usage}
}

// subFirst is the error of a command of subcommands (or bench's
// workloads) called without one first: none at all, or a flag before it,
// as in "outpost runs --data DIR list". It is nil when args starts with
// something else, which the command judges itself. The error names the
// subcommands, or says the flag goes after one and gives the command line
// with the subcommand first, since the flag package stops at the first
// argument that is not a flag and a flag set before the subcommand cannot
// be told apart from one. The subcommand moved is the first argument that
// is no flag and no flag's value ("outpost runs --thread list show r1" is
// show's), where a flag takes a value if it does in one of the
// subcommands' flag sets; where that argument names no subcommand, the
// first of subs is given.
func subFirst(name, usage, what string, subs, args []string) error {
	if len(args) == 0 {
		return unknownSub(usage, "a %s is needed: %s", what, strings.Join(subs, ", "))
	}
	if !isFlag(args[0]) || isHelp(args[0]) {
		return nil
	}
	flagName, _, _ := strings.Cut(args[0], "=")
	sub, rest := subs[0], args
	if i := firstArg(valuedFlags(name, subs), args); i >= 0 && slices.Contains(subs, args[i]) {
		sub, rest = args[i], slices.Delete(slices.Clone(args), i, i+1)
	}
	return unknownSub(usage, "%s goes after the %s: outpost %s %s %s", flagName, what, name, sub, strings.Join(rest, " "))
}

// firstArg is the index in args of the first argument that is neither a
// flag nor the value of one, a flag taking the next argument for its value
// where valued names it; -1 if there is none.
func firstArg(valued map[string]bool, args []string) int {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--":
			if i+1 < len(args) {
				return i + 1
			}
			return -1
		case !isFlag(a):
			return i
		case !strings.Contains(a, "=") && valued[strings.TrimLeft(a, "-")]:
			i++ // its value
		}
	}
	return -1
}

// valuedFlags names the flags that take a value (are not boolean) in the
// flag set of one or more of the subcommands subs of the command name.
// Each flag set is the one the subcommand makes itself, for its -h.
func valuedFlags(name string, subs []string) map[string]bool {
	valued := map[string]bool{}
	for _, sub := range subs {
		p := &flagProbe{}
		_ = commands[name].run(context.Background(), []string{sub, "-h"}, p, p)
		if p.fs == nil {
			continue
		}
		p.fs.VisitAll(func(f *flag.Flag) {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				valued[f.Name] = true
			}
		})
	}
	return valued
}

// flagProbe is the output a command is run with for its -h to learn its
// flags: it takes in the first flag set made to write to it (newCmdFlags),
// and drops what is written.
type flagProbe struct{ fs *flag.FlagSet }

func (p *flagProbe) Write(b []byte) (int, error) { return len(b), nil }

// isFlag reports whether arg is a flag ("-" alone is an argument).
func isFlag(arg string) bool { return len(arg) > 1 && arg[0] == '-' }

// isHelp reports whether arg, given where a subcommand goes, asks for help.
func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "help" }

// groupHelp prints usage, the help of a command of subcommands, to stdout
// and returns flag.ErrHelp, as a flag set's -h does: every such command
// answers help, -h and --help so, where a subcommand goes.
func groupHelp(usage string, stdout io.Writer) error {
	fmt.Fprint(stdout, usage)
	if !strings.HasSuffix(usage, "\n") {
		fmt.Fprintln(stdout)
	}
	return flag.ErrHelp
}

// badUsage is a usageError that says what was wrong with the command line.
func badUsage(format string, a ...any) error { return usageError(fmt.Sprintf(format, a...)) }

func main() {
	tuneRuntime()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(execute(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// tuneRuntime sets the collector and the scheduler for an appliance, unless
// GOGC or GOMAXPROCS says otherwise. It returns the collector's tuner, or
// nil when GOGC is set.
func tuneRuntime() (tuner *gctune.Tuner) {
	// While the heap is small, trading a little of it for a quarter of the
	// collection work is worth it (GOGC 400); as long conversations grow it,
	// the growth between collections stays within 64 MiB, down to Go's
	// default (see gctune). GOGC, when set, wins.
	if os.Getenv("GOGC") == "" {
		tuner = gctune.Start()
	}
	// One processor more than the CPUs: a goroutine back from an fsync,
	// the group commit's leader above all, then finds one free instead of
	// queueing behind the steps that ran meanwhile, and the kernel gives
	// its thread a CPU soon after waking it. On 2 CPUs, bench S2 (64 x 20)
	// ran sync 1.046, 1.060 and 1.079 times as many turns a second (12,
	// 12 and 20 interleaved pairs, medians) and exit 1.054 times; S1 sync
	// 1.011 times. With the memory saver, which never waits on the disk,
	// S2 ran 0.947 times and S1 0.989. GOMAXPROCS, when set, wins.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
	}
	return tuner
}

func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		// No command is a mistake in a script, not a request for help:
		// the usage goes to stderr, with the exit of a bad command line.
		usage(stderr)
		return 2
	}
	if args[0] == "help" && len(args) > 1 && args[1] != "help" {
		// "outpost help db check" is "outpost db check -h", as git's and
		// go's help are: the command's own help, or its unknown-command
		// error.
		return execute(ctx, append(slices.Clone(args[1:]), "-h"), stdout, stderr)
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "outpost: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if re := (replayError{}); errors.As(err, &re) {
			fmt.Fprintf(stderr, "outpost %s: %v\n", args[0], err)
			return 2
		}
		if us := (unknownSubError{}); errors.As(err, &us) {
			fmt.Fprintf(stderr, "outpost %s: %v\n\n%s", args[0], err, us.usage)
			if !strings.HasSuffix(us.usage, "\n") {
				fmt.Fprintln(stderr)
			}
			return 2
		}
		var ue usageError
		if errors.As(err, &ue) {
			if ue != "" {
				fmt.Fprintf(stderr, "outpost %s: %v\n", args[0], err)
				// A command of subcommands has no flags of its own: the
				// pointer is to a subcommand's.
				name := commandName(args)
				if !strings.Contains(string(ue), "usage") && (name != args[0] || len(cmd.subs) == 0) {
					fmt.Fprintf(stderr, "(outpost %s -h lists its flags)\n", name)
				}
			}
			return 2
		}
		fmt.Fprintf(stderr, "outpost %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// commandName is the command args call, with its subcommand if it has
// one: "runs list".
func commandName(args []string) string {
	if len(args) > 1 && slices.Contains(commands[args[0]].subs, args[1]) {
		return args[0] + " " + args[1]
	}
	return args[0]
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Outpost %s: an agent appliance for sites that cannot count on the network.\n\nUsage: outpost <command> [flags]\n\nCommands:\n", version)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nStart with \"outpost serve\", then open http://127.0.0.1:7070/ and paste the token that\n"+
		"\"outpost token\" prints. Run \"outpost <command> -h\" (or \"outpost help <command>\") for a\n"+
		"command's flags.\n\n"+
		"Exit status: 0 done; 1 the work failed (for eval, a conversation departed from its golden file);\n"+
		"2 a bad command line (an unknown command, subcommand or flag, a flag value refused, an argument\n"+
		"missing or one too many, a RUN that is not a run id), with nothing done (for eval, also a replay\n"+
		"that could not be made).\n")
}

// parse parses flags given before, between or after the positional
// arguments ("outpost db backup FILE --json"), which fs.Args then holds in
// their order. "--" ends the flags.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := parseFlagsFirst(fs, args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if i := len(args) - len(rest); i > 0 && args[i-1] == "--" { // Parse stopped at "--"
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

// parseFlagsFirst parses flags up to the first positional argument; the
// rest are positional, whatever they look like. For commands whose
// arguments are free text ("outpost run take -3 units").
func parseFlagsFirst(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}

func init() {
	register("version", "print the version", func(_ context.Context, args []string, stdout, stderr io.Writer) error {
		fs := newCmdFlags("version", "version [--json]", stdout, stderr)
		asJSON := fs.Bool("json", false, "print JSON: {\"version\", \"go\", \"checks_min_appliance_version\"}")
		if err := fs.parse(args, false); err != nil {
			return err
		}
		if _, err := fs.args(); err != nil {
			return err
		}
		checks := firmware.ChecksApplianceVersion(version)
		if *asJSON {
			return printJSON(stdout, map[string]any{"version": version, "go": runtime.Version(), "checks_min_appliance_version": checks})
		}
		fmt.Fprintf(stdout, "outpost %s\n", version)
		if !checks {
			// On stderr: stdout stays the one line scripts read.
			fmt.Fprintf(stderr, "a development build: it installs a bundle without holding it to its min_appliance_version (a release build does)\n")
		}
		return nil
	})
}

// subcommand splits "outpost NAME SUB ..." and returns SUB with a flag set
// for it; SUB is "" when only usage was asked for (err is then
// flag.ErrHelp) or the command line is wrong (err says how).
func subcommand(name, usage string, subs, args []string, stdout, stderr io.Writer) (string, *cmdFlags, error) {
	if err := subFirst(name, usage, "subcommand", subs, args); err != nil {
		return "", nil, err
	}
	if isHelp(args[0]) {
		return "", nil, groupHelp(usage, stdout)
	}
	sub := args[0]
	return sub, newCmdFlags(name+" "+sub, name+" "+sub+" [flags]", stdout, stderr), nil
}

// cmdFlags is one command's flag set. Its help goes to stdout when asked for
// (-h, exit 0) and lists only this command's flags, under a usage line that
// names its arguments and what About says. A flag error is one short
// message that points to -h.
type cmdFlags struct {
	*flag.FlagSet
	name     string // "runs show"
	synopsis string // "runs show [flags] RUN"
	// About, when set, is what -h says of the command above its flags.
	About          string
	msgs           bytes.Buffer // what the flag package says of an error
	stdout, stderr io.Writer
	aliases        map[string]string // another name of a flag -> its name
}

func newCmdFlags(name, synopsis string, stdout, stderr io.Writer) *cmdFlags {
	c := &cmdFlags{FlagSet: flag.NewFlagSet("outpost "+name, flag.ContinueOnError), name: name, synopsis: synopsis, stdout: stdout, stderr: stderr}
	c.SetOutput(&c.msgs)
	if p, ok := stdout.(*flagProbe); ok && p.fs == nil {
		p.fs = c.FlagSet
	}
	// The flag package calls Usage for -h and for an error alike; parse
	// says what fits.
	c.Usage = func() {}
	return c
}

// alias makes alias another name of the flag name, which takes the same
// value; help lists the flag once, naming the alias in its line.
func (c *cmdFlags) alias(alias, name string) {
	f := c.Lookup(name)
	c.Var(f.Value, alias, f.Usage)
	if c.aliases == nil {
		c.aliases = map[string]string{}
	}
	c.aliases[alias] = name
}

func (c *cmdFlags) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: outpost %s\n", c.synopsis)
	if c.About != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.About))
	}
	// The flags without their aliases, each alias named in its flag's line.
	listed := flag.NewFlagSet(c.Name(), flag.ContinueOnError)
	c.VisitAll(func(f *flag.Flag) {
		if _, isAlias := c.aliases[f.Name]; isAlias {
			return
		}
		usage := f.Usage
		for alias, name := range c.aliases {
			if name == f.Name {
				usage += " (or --" + alias + ")"
			}
		}
		listed.Var(f.Value, f.Name, usage)
		listed.Lookup(f.Name).DefValue = f.DefValue
	})
	n := 0
	listed.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintf(w, "\nFlags:\n")
		listed.SetOutput(w)
		listed.PrintDefaults()
	}
}

// parse parses the flags, anywhere among the arguments, or, with
// flagsFirst, up to the first argument (see parse and parseFlagsFirst).
func (c *cmdFlags) parse(args []string, flagsFirst bool) error {
	var err error
	if flagsFirst {
		err = parseFlagsFirst(c.FlagSet, args)
	} else {
		err = parse(c.FlagSet, args)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.printUsage(c.stdout)
		return err
	case err != nil:
		msg := strings.TrimSpace(c.msgs.String())
		if msg == "" {
			msg = err.Error()
		}
		return badUsage("%s\nusage: outpost %s (outpost %s -h lists its flags)", msg, c.synopsis, c.name)
	}
	// A flag given under both its names would take the last one silently.
	set := map[string]bool{}
	c.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for alias, name := range c.aliases {
		if set[alias] && set[name] {
			return badUsage("--%s and --%s are one flag: give it once\nusage: outpost %s (outpost %s -h lists its flags)", alias, name, c.synopsis, c.name)
		}
	}
	return nil
}

// args checks that exactly len(names) arguments were given, names being
// how the usage calls them ("RUN"), and returns them.
func (c *cmdFlags) args(names ...string) ([]string, error) {
	got := c.Args()
	if len(got) > len(names) {
		return nil, badUsage("unexpected argument %q (usage: outpost %s)", got[len(names)], c.synopsis)
	}
	if len(got) < len(names) {
		return nil, badUsage("missing %s (usage: outpost %s)", names[len(got)], c.synopsis)
	}
	return got, nil
}
