package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/eval"
	"github.com/outpost-edge/outpost/firmware"
)

func init() {
	register("eval", "replay golden conversations and report where an agent departs from them", runEval)
}

const evalSynopsis = "eval [--bundle PATH [--keys DIR]] [--json] [--parallel N] [--timeout DURATION] [--max-run-time DURATION] [--max-tokens N] [--flags-channel NAME] [--final-channel NAME] [FILE.jsonl...]"

func runEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("eval", evalSynopsis, stdout, stderr)
	fs.About = `Replay the golden conversations of each FILE.jsonl (one conversation a line, its turns and
what each must give) against the embedded reference bundle's agents, or --bundle's, and report
the turns that depart from them. With no FILE, replay the ones the bundle ships (its manifest's
golden files). Exit 1 when one departs; exit 2 when the replay cannot be made (no file and none
in the bundle, a malformed one, an agent no bundle has, a node of a path or an interrupt that
the agent's graph lacks, a tool the bundle's registry or the agent's allowlist lacks, an
expected flag the agent can never raise on --flags-channel, a bundle that will not load).`
	bundle := fs.String("bundle", "", "resolve agents from the bundle at `PATH` (a directory or .tar) instead of the embedded reference bundle")
	keys := fs.String("keys", "", "trusted public keys for --bundle, at `PATH`: a folder of .pub files, or one file (default: the development key)")
	asJSON := fs.Bool("json", false, "write the report as JSON on stdout")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "conversations replayed at once")
	flagsCh := fs.String("flags-channel", "flags", "the channel `NAME` that a turn's expected flags are checked against")
	finalCh := fs.String("final-channel", "final", "the channel `NAME` holding the final answer (the run's output when the agent has none)")
	timeout := fs.Duration("timeout", time.Minute, "the longest one conversation may take")
	bc := budgetFlags(fs.FlagSet, false)
	// Exit 1 says a conversation failed; 2 says the replay could not be
	// made (a flag it does not take, no file, a malformed one, an agent no
	// bundle has, a bundle that will not load), so that CI can tell a
	// regression from a broken harness.
	if err := fs.parse(args, false); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError(err.Error())
	}
	files := fs.Args()
	if *parallel < 1 {
		return usageError("--parallel must be at least 1")
	}
	if *timeout <= 0 {
		return badUsage("--timeout must be more than 0, not %s: it is the longest one conversation may take", *timeout)
	}
	budget, err := bc.budget()
	if err != nil {
		return usageError(err.Error())
	}
	var convs []eval.Conversation
	if len(files) > 0 {
		if convs, err = eval.Load(files...); err != nil {
			return replayError{err}
		}
	}
	resolve, b, err := evalResolver(*bundle, *keys)
	if err != nil {
		return replayError{err}
	}
	if len(files) == 0 {
		if convs, err = eval.Bundled(b); errors.Is(err, eval.ErrNoConversations) {
			fs.printUsage(stderr)
			return usageError(fmt.Sprintf("no FILE.jsonl given, and %s ships no golden conversations", b.Manifest))
		} else if err != nil {
			return replayError{err}
		}
	}
	if err := eval.CheckAgents(convs, resolve); err != nil {
		return replayError{err}
	}
	if err := eval.CheckNames(convs, b); err != nil {
		return replayError{err}
	}
	if err := eval.CheckFlags(convs, b, *flagsCh); err != nil {
		return replayError{err}
	}
	opts := eval.Options{Resolver: resolve, Parallel: *parallel, FlagsChannel: *flagsCh, FinalChannel: *finalCh, Timeout: *timeout,
		MaxDuration: budget.WallTime, MaxTokens: budget.Tokens}
	if isTerminal(stderr) {
		opts.Progress = eval.TerminalProgress(stderr)
	}
	rep, err := eval.Run(ctx, convs, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	return rep.Err()
}

// evalResolver resolves agents from the bundle at path, verified against
// the keys in keyDir, or from the embedded reference bundle when path is "".
func evalResolver(path, keyDir string) (engine.Resolver, *firmware.Bundle, error) {
	if path == "" {
		if keyDir != "" {
			return nil, nil, fmt.Errorf("--keys applies to --bundle only (the embedded bundle is checked at build time)")
		}
		b, err := firmware.Reference()
		if err != nil {
			return nil, nil, err
		}
		resolve, err := referenceResolver(b)
		return resolve, b, err
	}
	ring, err := evalKeyring(keyDir)
	if err != nil {
		return nil, nil, err
	}
	b, err := firmware.Load(path, ring)
	if errors.Is(err, firmware.ErrUnknownKey) {
		return nil, nil, fmt.Errorf("%w\n(eval trusts the development key alone unless --keys names the signer's .pub file, or a folder of them)", err)
	}
	if err != nil {
		return nil, nil, explain(err)
	}
	return firmware.BundleResolver(b), b, nil
}

// evalKeyring trusts the keys in dir, or only the development key.
func evalKeyring(dir string) (*firmware.Keyring, error) {
	if dir == "" {
		return firmware.DevKeyring()
	}
	return firmware.LoadKeyring(dir)
}
