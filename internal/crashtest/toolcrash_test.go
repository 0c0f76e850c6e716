package crashtest

// The tool crash test: many threads run a tool-loop agent whose tool is a
// non-idempotent write that appends its idempotency key to a side file. The
// child process is killed with SIGKILL at random moments and restarted. A
// side effect must never be silently repeated: every run ends completed or
// interrupted with reason uncertain_side_effect, and after a person's
// recorded decisions resolve those, no key is in the side file twice unless
// an operator approved the re-run.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

const toolThreads = 8

// The child runs from init, before TestMain: the crash test's TestMain owns
// the OUTPOST_CRASH_CHILD mode.
func init() {
	if dir := os.Getenv("OUTPOST_TOOLCRASH_CHILD"); dir != "" {
		if err := toolChild(dir); err != nil {
			fmt.Fprintln(os.Stderr, "tool child:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
}

// appendTool writes its key to the side file with one write call, between
// two short sleeps so that kills land before, during and after the effect.
type appendTool struct {
	mu sync.Mutex
	f  *os.File
}

func (a *appendTool) Call(_ context.Context, _ json.RawMessage, key string) (json.RawMessage, error) {
	time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
	a.mu.Lock()
	_, err := a.f.WriteString(key + "\n")
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
	return json.RawMessage(`{"appended":true}`), nil
}

func toolAgent(db *store.DB, tool agent.Tool) (*engine.Agent, error) {
	return loopAgent(db, loopSpec{name: "writer",
		tools: []policy.Tool{{Name: "append_line", Kind: policy.KindWrite, Idempotent: false, Description: "append a line"}},
		script: `[
	 {"when_no_tool_result": true, "tool_calls": [
	   {"name": "append_line", "arguments": {"v": "{{input}}/1"}},
	   {"name": "append_line", "arguments": {"v": "{{input}}/2"}}]},
	 {"when_tool_result": true, "respond": "appended: {{context}}"}]`,
		impls: map[string]agent.Tool{"append_line": tool},
		rules: []policy.ApprovalRule{{Tool: "append_line", Decision: policy.DecisionAllow}},
	})
}

// loopSpec describes an agent of one tool-loop node on a scripted model,
// whose call log is the store's.
type loopSpec struct {
	name  string
	tools []policy.Tool // each takes {"v": string}
	// script is the scripted model's rules.
	script string
	impls  map[string]agent.Tool
	rules  []policy.ApprovalRule
	// extra declares more channels, and returns the writes the input
	// makes to them.
	extra func(b *engine.Builder) []engine.Write
	// subgraph, when set, runs the node inside a subgraph node of that
	// name, on the same conversation.
	subgraph string
	// allow, when set, is the agent's allowlist (policy.Resolve's agent
	// layer): the registry's other tools are outside the active set.
	allow []string
	// provider, when set, wraps the scripted model.
	provider func(models.Provider) models.Provider
}

func loopAgent(db *store.DB, spec loopSpec) (*engine.Agent, error) {
	b := engine.NewGraph(spec.name)
	messages := engine.Append[models.Message](b, "messages")
	answer := engine.Replace[string](b, "answer")
	var extra []engine.Write
	if spec.extra != nil {
		extra = spec.extra(b)
	}
	g, err := loopGraph(db, b, spec, messages, answer)
	if err != nil {
		return nil, err
	}
	return conversationAgent(spec.name, g, []engine.Chan[[]models.Message]{messages}, answer, extra), nil
}

// conversationAgent is the agent name of g whose input, a JSON string, is
// the user's message in each of convs, with the writes extra, and whose
// output is answer.
func conversationAgent(name string, g *engine.Graph, convs []engine.Chan[[]models.Message], answer engine.Chan[string], extra []engine.Write) *engine.Agent {
	return &engine.Agent{Name: name, Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			ws := slices.Clone(extra)
			for _, c := range convs {
				ws = append(ws, engine.Push(c, models.Message{Role: models.RoleUser, Content: s}))
			}
			return ws, nil
		},
		Output: func(s engine.State) json.RawMessage {
			out, _ := json.Marshal(answer.Get(s))
			return out
		}}
}

// loopGraph compiles b with spec's node, alone or in its subgraph.
func loopGraph(db *store.DB, b *engine.Builder, spec loopSpec, messages engine.Chan[[]models.Message], answer engine.Chan[string]) (*engine.Graph, error) {
	name := "loop"
	if spec.subgraph != "" {
		inner := spec
		inner.subgraph = ""
		ib := engine.NewGraph(spec.name + "/" + spec.subgraph)
		sub, err := loopGraph(db, ib, inner, engine.Append[models.Message](ib, messages.Name()), engine.Replace[string](ib, answer.Name()))
		if err != nil {
			return nil, err
		}
		name = spec.subgraph
		b.AddSubgraph(name, sub)
	} else {
		node, err := loopNode(db, spec, messages, answer)
		if err != nil {
			return nil, err
		}
		b.AddNode(name, node)
	}
	b.AddEdge(engine.Start, name)
	b.AddEdge(name, engine.End)
	return b.Compile()
}

// loopNode is the tool-loop node of spec (its extra aside), on the
// channels given.
func loopNode(db *store.DB, spec loopSpec, messages engine.Chan[[]models.Message], answer engine.Chan[string]) (engine.NodeFunc, error) {
	for i := range spec.tools {
		spec.tools[i].Schema = json.RawMessage(`{"type":"object","properties":{"v":{"type":"string"}}}`)
	}
	reg, err := policy.NewRegistry(spec.tools)
	if err != nil {
		return nil, err
	}
	rules, err := scripted.ParseRules([]byte(spec.script))
	if err != nil {
		return nil, err
	}
	provider, err := scripted.New(rules)
	if err != nil {
		return nil, err
	}
	var model models.Provider = provider
	if spec.provider != nil {
		model = spec.provider(provider)
	}
	return agent.ToolLoop(agent.LoopConfig{
		Provider: model, Model: "scripted", Lane: policy.Lane{Agent: spec.name, Models: []string{"scripted"}},
		ActiveTools: func(context.Context, engine.State) (*policy.ActiveSet, error) {
			return policy.Resolve(reg, spec.allow, nil, nil)
		},
		Impls: spec.impls,
		Rules: spec.rules,
		Log:   wiring.CallLog(db, db), Blobs: db,
		Messages: messages, Answer: answer,
	})
}

// toolChild runs turns on toolThreads workers until each has its turns
// completed. Runs that wait for a person are decided by the parent after
// the kills.
func toolChild(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "writes.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	db, err := store.OpenDir(dir, store.Options{})
	if err != nil {
		return err
	}
	ag, err := toolAgent(db, &appendTool{f: f})
	if err != nil {
		return err
	}
	// The kills are the test's, not the runs': a run they cut short
	// again and again before it commits its step is not a crash loop.
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil },
		engine.ManagerOptions{Workers: 6, MaxRecoveries: -1})
	ctx := context.Background()
	if _, err := m.Recover(ctx); err != nil {
		return err
	}
	turns := turns()
	var wg sync.WaitGroup
	errs := make(chan error, toolThreads)
	for t := 0; t < toolThreads; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A thread whose run waits for a person is left to the parent;
			// the worker goes on with its next thread.
			gen, prior := 0, 0
			for {
				thread := fmt.Sprintf("w%02d.%d", t, gen)
				runs, err := db.Runs(ctx, engine.RunFilter{Thread: thread})
				if err != nil {
					errs <- err
					return
				}
				done, waiting, blocked := 0, false, false
				for _, r := range runs {
					switch {
					case r.Status == engine.StatusCompleted:
						done++
					case r.Status == engine.StatusInterrupted:
						blocked = true
					case !r.Status.Terminal():
						if _, err := m.Wait(ctx, r.ID); err != nil {
							errs <- err
							return
						}
						waiting = true
					default:
						errs <- fmt.Errorf("run %s ended %s: %s", r.ID, r.Status, r.Error)
						return
					}
				}
				switch {
				case waiting:
					continue
				case blocked:
					prior += done
					gen++
					continue
				case prior+done >= turns:
					return
				}
				input, _ := json.Marshal(fmt.Sprintf("%s-%d", thread, done))
				run, err := m.Invoke(ctx, engine.RunRequest{Thread: thread, Agent: "writer", Input: input, WaitForThread: true})
				if err != nil {
					errs <- err
					return
				}
				if run.Status != engine.StatusCompleted && run.Status != engine.StatusInterrupted {
					errs <- fmt.Errorf("run %s ended %s: %s", run.ID, run.Status, run.Error)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	m.Close()
	return db.Close()
}

func TestToolCrashKill9(t *testing.T) {
	dir := t.TempDir()
	n := 30
	if s := os.Getenv("OUTPOST_CRASH_KILLS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	nturns := 4 + n/2
	start := childStarter(t, "OUTPOST_TOOLCRASH_CHILD="+dir, "OUTPOST_CRASH_TURNS="+strconv.Itoa(nturns))
	if k := killAtRandom(t, start, n); k < n {
		// Every thread is done or waits for a person: nothing left to
		// interrupt.
		t.Logf("the child finished after %d of %d kills", k, n)
	}
	cmd := start()
	require.NoError(t, cmd.Wait(), "final child failed")

	verifyToolCrash(t, dir)
}

func verifyToolCrash(t *testing.T, dir string) {
	ctx := context.Background()
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	f, err := os.OpenFile(filepath.Join(dir, "writes.log"), os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	defer f.Close()
	ag, err := toolAgent(db, &appendTool{f: f})
	require.NoError(t, err)
	m := engine.NewManager(db, func(string, engine.BundleRef) (*engine.Agent, error) { return ag, nil },
		engine.ManagerOptions{Workers: 4})
	defer m.Close()
	recovered, err := m.Recover(ctx)
	require.NoError(t, err)
	require.Zero(t, recovered, "the final child left no run in flight")

	// Every run ended completed, or waits for a person about an uncertain
	// side effect; a person approves the re-runs, on record.
	resolved := 0
	for round := 0; ; round++ {
		require.Less(t, round, 10, "interrupts keep coming back")
		runs, err := db.Runs(ctx, engine.RunFilter{})
		require.NoError(t, err)
		var waiting []*engine.Run
		for _, r := range runs {
			switch r.Status {
			case engine.StatusCompleted:
			case engine.StatusInterrupted:
				waiting = append(waiting, r)
			default:
				t.Fatalf("run %s ended %s: %s", r.ID, r.Status, r.Error)
			}
		}
		if len(waiting) == 0 {
			break
		}
		for _, r := range waiting {
			decisions := map[string]engine.Decision{}
			for _, in := range r.Interrupts {
				var ti agent.ToolInterrupt
				require.NoError(t, json.Unmarshal(in.Payload, &ti))
				require.Equal(t, agent.ReasonUncertainSideEffect, ti.Reason, "run %s", r.ID)
				require.Equal(t, "append_line", ti.Tool)
				decisions[in.ID] = engine.Decision{Kind: engine.Approve, By: "tester", Reason: "crash test re-run"}
			}
			_, err := m.Resume(ctx, r.ID, decisions)
			require.NoError(t, err)
			done, err := m.Wait(ctx, r.ID)
			require.NoError(t, err)
			require.Contains(t, []engine.RunStatus{engine.StatusCompleted, engine.StatusInterrupted}, done.Status, done.Error)
			resolved++
		}
	}

	// Approved re-runs per key, from the call log.
	recs, err := wiring.Records(ctx, wiring.CallLog(db, db), "")
	require.NoError(t, err)
	approved := map[string]int{}
	outcome := map[string]bool{} // call key -> it, or a re-run of it, has a recorded outcome
	calls := 0
	for _, r := range recs {
		if strings.HasPrefix(r.Key, "model:") {
			continue
		}
		base, suffix, retry := strings.Cut(r.Key, "#")
		switch {
		case !retry:
			calls++
			outcome[base] = outcome[base] || r.Status == agent.StatusDone
		case strings.HasPrefix(suffix, "retry"):
			outcome[base] = outcome[base] || r.Status == agent.StatusDone
			if r.Decision == engine.Approve && strings.HasPrefix(r.DecidedBy, "operator:") {
				approved[base]++
			}
		}
	}

	for key, ok := range outcome {
		require.True(t, ok, "call %s has no recorded outcome, on its own or in a re-run", key)
	}

	sf, err := os.Open(filepath.Join(dir, "writes.log"))
	require.NoError(t, err)
	defer sf.Close()
	lines := map[string]int{}
	sc := bufio.NewScanner(sf)
	for sc.Scan() {
		lines[sc.Text()]++
	}
	require.NoError(t, sc.Err())
	repeated := 0
	for key, count := range lines {
		require.LessOrEqual(t, count, 1+approved[key],
			"key %s written %d times with %d approved re-runs", key, count, approved[key])
		if count > 1 {
			repeated++
		}
	}
	t.Logf("%d tool calls, %d side effects, %d interrupts resolved by a person, %d keys written again on approval",
		calls, len(lines), resolved, repeated)
	require.GreaterOrEqual(t, calls, len(lines))

	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "db check: %v", rep.Problems)
}
