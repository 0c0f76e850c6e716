package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/engine"
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
	sub  *engine.Subscription
	done sync.WaitGroup
}

func openSession(dir string, durability engine.Durability, out io.Writer, asJSON bool) (*session, error) {
	db, err := openStore(dir)
	if err != nil {
		return nil, err
	}
	resolve, err := resolver()
	if err != nil {
		db.Close()
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &session{db: db, bus: engine.NewBus(), stop: stop}
	// While this process owns the store, db backup and db check reach it
	// through the control socket.
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		if err := store.ServeControl(ctx, db, dir); err != nil {
			fmt.Fprintf(out, "control socket: %v\n", err)
		}
	}()
	s.sub = s.bus.Subscribe(4096, nil)
	s.m = engine.NewManager(db, resolve, engine.ManagerOptions{Durability: durability, Events: s.bus})
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
	if len(data) > 160 {
		data = data[:157] + "..."
	}
	fmt.Fprintf(w, "%s %-16s %-18s %s\n", e.Time.Local().Format("15:04:05.000"), e.Type, node, data)
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "run [--data DIR] [--agent NAME] [--thread ID] [--json] INPUT", stderr)
	data := dataFlag(fs)
	agent := fs.String("agent", "reference", "agent to run")
	thread := fs.String("thread", "default", "thread (conversation) to run the turn on")
	durability := fs.String("durability", "sync", "sync or exit")
	asJSON := fs.Bool("json", false, "print events and the run as JSON lines")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("no input given")
	}
	input, _ := json.Marshal(strings.Join(fs.Args(), " "))
	s, err := openSession(*data, engine.Durability(*durability), stdout, *asJSON)
	if err != nil {
		return err
	}
	if n, err := s.m.Recover(ctx); err != nil {
		s.close()
		return err
	} else if n > 0 {
		fmt.Fprintf(stderr, "resumed %d run(s) left running by an earlier process\n", n)
	}
	run, err := s.m.Invoke(ctx, engine.RunRequest{Thread: *thread, Agent: *agent, Input: input})
	// Closing waits for every run, including recovered ones, and for the
	// event printer to drain, so the summary comes last.
	s.close()
	if err != nil {
		return err
	}
	return reportRun(run, stdout, *asJSON)
}

func reportRun(run *engine.Run, stdout io.Writer, asJSON bool) error {
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
		for _, in := range run.Interrupts {
			fmt.Fprintf(stdout, "waiting for a decision on %s at %s: %s\n  outpost resume %s --interrupt %s --decision approve|edit|reject\n",
				in.ID, in.Node, in.Payload, run.ID, in.ID)
		}
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
	fs := newFlags("resume", "resume [--data DIR] RUN [--interrupt ID] --decision approve|edit|reject [--value JSON] [--reason TEXT] [--by NAME]", stderr)
	data := dataFlag(fs)
	interrupt := fs.String("interrupt", "", "interrupt to answer (default: the run's only one)")
	decision := fs.String("decision", "", "approve, edit or reject")
	value := fs.String("value", "", "edit: the new value, as JSON")
	reason := fs.String("reason", "", "why (recorded with the decision)")
	by := fs.String("by", "cli", "who decides (recorded with the decision)")
	asJSON := fs.Bool("json", false, "print events and the run as JSON lines")
	if err := parse(fs, reorder(args)); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("give exactly one run id")
	}
	d := engine.Decision{Kind: *decision, Reason: *reason, By: *by, At: time.Now().UTC()}
	if *value != "" {
		if !json.Valid([]byte(*value)) {
			return fmt.Errorf("--value is not valid JSON")
		}
		d.Value = json.RawMessage(*value)
	}
	if err := d.Validate(); err != nil {
		return err
	}
	s, err := openSession(*data, engine.DurabilitySync, stdout, *asJSON)
	if err != nil {
		return err
	}
	run, err := resumeOne(ctx, s, fs.Arg(0), *interrupt, d)
	s.close()
	if err != nil {
		return err
	}
	return reportRun(run, stdout, *asJSON)
}

func resumeOne(ctx context.Context, s *session, runID, interrupt string, d engine.Decision) (*engine.Run, error) {
	if _, err := s.m.Recover(ctx); err != nil {
		return nil, err
	}
	run, err := s.db.Run(ctx, runID)
	if err != nil {
		return nil, err
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

// reorder moves flags before positional arguments, so "resume RUN --decision
// approve" parses like "resume --decision approve RUN".
func reorder(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
			if !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && a != "--json" && a != "-json" {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}
