package crashtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
	"github.com/outpost-edge/outpost/store"
)

// oneCall is the script of a tool-loop node whose model calls tool once,
// then answers.
func oneCall(tool string) string {
	return fmt.Sprintf(`[
	 {"when_no_tool_result": true, "tool_calls": [{"name": %q, "arguments": {"v": "x"}}]},
	 {"when_tool_result": true, "respond": "done: {{context}}"}]`, tool)
}

// chainStep is a node of chainAgent, whose model calls tool once; a
// person approves the call where ask is set.
type chainStep struct {
	node, tool string
	impl       agent.Tool
	ask        bool
}

// chainAgent runs its steps' tool-loop nodes one step after another, each
// on a conversation of its own; their tools are not declared idempotent.
// The input's notes make its checkpoint too large for the recent bucket
// (see letterAgent), where the small checkpoints of the steps that follow
// stay: a lost root page takes them, and the copy's newest checkpoint of
// the thread is behind the run. With bigSteps, the notes take more than a
// page, and each node writes them anew: every checkpoint of the run is
// stored outside the root page, on pages of its own.
func chainAgent(db *store.DB, bigSteps bool, steps ...chainStep) (*engine.Agent, error) {
	b := engine.NewGraph("chain")
	answer := engine.Replace[string](b, "answer")
	size := store.DefaultPageSize / 4
	if bigSteps {
		size = 2 * store.DefaultPageSize
	}
	cs := noteChannels(b, size)
	var convs []engine.Chan[[]models.Message]
	prev := engine.Start
	for _, n := range steps {
		messages := engine.Append[models.Message](b, "messages_"+n.node)
		convs = append(convs, messages)
		decision := policy.DecisionAllow
		if n.ask {
			decision = policy.DecisionAsk
		}
		node, err := loopNode(db, loopSpec{name: "chain",
			tools:  []policy.Tool{{Name: n.tool, Kind: policy.KindWrite, Description: n.tool}},
			script: oneCall(n.tool), impls: map[string]agent.Tool{n.tool: n.impl},
			rules: []policy.ApprovalRule{{Tool: n.tool, Decision: decision}}}, messages, answer)
		if err != nil {
			return nil, err
		}
		if bigSteps {
			node = withNotes(node, cs, n.node)
		}
		b.AddNode(n.node, node)
		b.AddEdge(prev, n.node)
		prev = n.node
	}
	b.AddEdge(prev, engine.End)
	g, err := b.Compile()
	if err != nil {
		return nil, err
	}
	return conversationAgent("chain", g, convs, answer, noted(cs, "n")), nil
}

// withNotes is node, which writes cs full of its name as well.
func withNotes(node engine.NodeFunc, cs []engine.Chan[string], name string) engine.NodeFunc {
	return func(ctx context.Context, st engine.State) ([]engine.Write, error) {
		ws, err := node(ctx, st)
		return append(ws, noted(cs, name)...), err
	}
}

// A run that waits for a person, two steps past the newest checkpoint of
// its thread that the salvaged copy holds (the steps' checkpoints waited
// in the recent bucket, lost with the root page, as were the records of
// its tool calls), resumes from that checkpoint and runs those steps
// again under new checkpoints. Each step's call of a tool not declared
// idempotent may have run before the damage, the second step's as much as
// the first's: each is asked about (uncertain_side_effect), and rejected,
// runs no second time. The run's reach cannot be told from the copy, so
// the mark covers every step. Before, the mark named the copy's newest
// checkpoint: the first step, run from it, asked, and the second, run
// from a checkpoint made after the salvage, called notify_family again
// without asking.
func TestSalvagedRunAsksAboutCallsOfStepsPastTheCopysCheckpoint(t *testing.T) {
	dose, notify, letter := &countingTool{}, &countingTool{}, &countingTool{}
	build := func(db *store.DB) (*engine.Agent, error) {
		return chainAgent(db, false, chainStep{"dose", "record_dose", dose, false},
			chainStep{"notify", "notify_family", notify, false}, chainStep{"letter", "send_letter", letter, true})
	}
	dir, run, _ := salvagedRun(t, build, func(t *testing.T, path string) string { return losePages(t, path, true, true) })
	require.EqualValues(t, 1, dose.calls.Load())
	require.EqualValues(t, 1, notify.calls.Load())
	require.Zero(t, letter.calls.Load())

	r, hist := copiedRun(t, dir, run.ID)
	require.Equal(t, engine.StatusInterrupted, r.Status)
	require.NotEmpty(t, hist)
	require.Equal(t, engine.SourceInput, hist[0].Source, "the copy's newest checkpoint of the thread is not the input's: %+v", hist[0])
	require.Less(t, hist[0].ID, r.Checkpoint)
	assert.Equal(t, store.CallsLostInAnyStep, r.Meta[store.MetaCallsLostThrough])

	final, asked := resumeSalvaged(t, dir, r, build, func(ti agent.ToolInterrupt) string {
		if ti.Reason == agent.ReasonApproval {
			return engine.Approve
		}
		return engine.Reject
	})
	assert.EqualValues(t, 1, dose.calls.Load(), "record_dose ran again")
	assert.EqualValues(t, 1, notify.calls.Load(), "notify_family ran again")
	var uncertain []string
	for _, ti := range asked {
		if ti.Reason == agent.ReasonUncertainSideEffect {
			uncertain = append(uncertain, ti.Tool)
		}
	}
	assert.Subset(t, uncertain, []string{"record_dose", "notify_family"}, "asked: %+v", asked)
	require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
}

// A run that waits for a person inside a subgraph, whose inner node called
// record_dose (not idempotent) before it paused, is resumed from a copy
// that lost the records of its tool calls. Where the root page is lost,
// the subgraph's checkpoints are lost with the recent bucket: the subgraph
// runs again from its start, under checkpoints made after the salvage, and
// the mark, which covers every step, makes its node ask. Where only the
// page of the tool-call records is lost, the copy holds the run's newest
// state and is marked with its newest checkpoint, of any namespace: the
// subgraph goes on from its own newest checkpoint, which the mark covers,
// and its node asks as well. Rejected, record_dose runs no second time.
// Before, with the root page lost, the subgraph's node ran from a new
// checkpoint, past the mark, and called record_dose again without asking.
func TestSalvagedRunAsksAboutACallInASubgraph(t *testing.T) {
	for _, tc := range []struct {
		name string
		root bool
		any  bool
	}{
		{"root page lost", true, true},
		{"tool-call page lost", false, false},
	} {
		damage := func(t *testing.T, path string) string {
			if !tc.root {
				// The tool-call records of other turns give those of the
				// run a page of their own, outside the root page.
				callsOfOtherTurns(t, path)
			}
			return losePages(t, path, tc.root, !tc.root)
		}
		t.Run(tc.name, func(t *testing.T) {
			dose, letter := &countingTool{}, &countingTool{}
			build := func(db *store.DB) (*engine.Agent, error) {
				spec := letterSpec(false, dose, letter)
				spec.subgraph = "care"
				return loopAgent(db, spec)
			}
			dir, run, _ := salvagedRun(t, build, damage)
			require.EqualValues(t, 1, dose.calls.Load())
			assert.Empty(t, recordsOf(t, dir, run.ID), "tool-call records came back")

			r, _ := copiedRun(t, dir, run.ID)
			require.Equal(t, engine.StatusInterrupted, r.Status)
			if tc.any {
				assert.Equal(t, store.CallsLostInAnyStep, r.Meta[store.MetaCallsLostThrough])
			} else {
				assert.Greater(t, r.Meta[store.MetaCallsLostThrough], r.Checkpoint, "the mark does not reach the subgraph's checkpoints")
			}

			final, asked := resumeSalvaged(t, dir, r, build, approveLetters(engine.Reject))
			assert.EqualValues(t, 1, dose.calls.Load(), "record_dose ran again")
			i := slices.IndexFunc(asked, func(ti agent.ToolInterrupt) bool { return ti.Tool == "record_dose" })
			require.NotEqual(t, -1, i, "record_dose was not asked about: %+v", asked)
			assert.Equal(t, agent.ReasonUncertainSideEffect, asked[i].Reason)
			assert.Contains(t, asked[i].Detail, "may have been lost when the store was salvaged")
			require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
		})
	}
}

// callsOfOtherTurns records, in the store at path, the finished tool calls
// of a turn that no run of the store holds any more (pruned).
func callsOfOtherTurns(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(path, store.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	for i := range 10 {
		key := fmt.Sprintf("run_0000000000000001:1:0000000000000000:%d", i)
		require.NoError(t, db.PutToolIntent(ctx, key, store.ToolCall{RunID: "run_0000000000000001", Node: "loop", Tool: "record_dose",
			ArgsHash: "h", Args: engine.Value{Inline: []byte(`{"args":{"v":"x"}}`)}}))
		require.NoError(t, db.PutToolResult(ctx, key, store.ToolCall{Result: engine.Value{Inline: []byte(`{"done":true}`)}}))
	}
}

// A run that waits for a person, in a store that lost the page holding
// the checkpoints of its last steps (its root page and its tool-call
// records whole), is resumed from the newest checkpoint of its thread that
// the copy holds, and runs those steps again: the first from the
// checkpoint it ran from before, whose call's record it reuses, and the
// others under checkpoints made after the salvage, whose calls have new
// keys that no record answers. The copy cannot tell how far the run got,
// so salvage marks it though none of its calls' records is lost, and each
// step asks before it calls its tool again; rejected, none runs twice.
// Before, the run was not marked, and the steps past the first called
// their tools a second time without asking.
func TestSalvagedRunAsksAboutCallsOfStepsWhoseCheckpointsAreLost(t *testing.T) {
	var steps []chainStep
	for _, tool := range []string{"record_dose", "notify_family", "remind_patient", "log_visit", "book_visit"} {
		steps = append(steps, chainStep{tool, tool, &countingTool{}, false})
	}
	steps = append(steps, chainStep{"letter", "send_letter", &countingTool{}, true})
	build := func(db *store.DB) (*engine.Agent, error) { return chainAgent(db, true, steps...) }
	var kept string
	var lost int
	dir, run, rep := salvagedRun(t, build, func(t *testing.T, path string) string {
		var damaged string
		damaged, kept, lost = loseNewestCheckpoints(t, path)
		return damaged
	})
	require.GreaterOrEqual(t, lost, 2, "fewer than two steps' checkpoints are lost: the test shows nothing")
	require.Len(t, recordsOf(t, dir, run.ID), 5, "tool-call records were lost: %v", rep.Lost)
	assert.True(t, slices.ContainsFunc(rep.Lost, func(p store.Problem) bool {
		return p.Bucket == "runs" && p.Key == run.ID && strings.Contains(p.Message, "may not hold its newest record or checkpoints") &&
			strings.Contains(p.Message, "in any step, waits for a person's decision")
	}), "the report does not say what resuming the run does: %v", rep.Lost)

	r, hist := copiedRun(t, dir, run.ID)
	require.Equal(t, engine.StatusInterrupted, r.Status)
	require.NotEmpty(t, hist)
	require.Equal(t, kept, hist[0].ID, "the copy's newest checkpoint of the thread")
	assert.Equal(t, store.CallsLostInAnyStep, r.Meta[store.MetaCallsLostThrough])

	final, asked := resumeSalvaged(t, dir, r, build, approveLetters(engine.Reject))
	for _, s := range steps[:len(steps)-1] {
		assert.EqualValues(t, 1, s.impl.(*countingTool).calls.Load(), "%s ran again; asked: %+v", s.tool, asked)
	}
	require.Equal(t, engine.StatusCompleted, final.Status, final.Error)
}

// loseNewestCheckpoints writes a compacted copy of the store at path with
// the leaf pages lost that hold the newest checkpoints of thread "w" (the
// page of its newest one and any after it), and returns the copy's path,
// the newest checkpoint of "w" left, and how many were lost.
func loseNewestCheckpoints(t *testing.T, path string) (string, string, int) {
	t.Helper()
	db, err := store.Open(path, store.Options{ReadOnly: true})
	require.NoError(t, err)
	hist, err := db.History(context.Background(), "w", "", "", 0)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	image, err := os.ReadFile(compactedCopy(t, path))
	require.NoError(t, err)
	// bbolt's pages: a header of id (8 bytes), flags (2), count (2) and
	// overflow (4); a leaf's elements (flags, pos, ksize, vsize: 4 bytes
	// each) follow, pos counted from the element.
	le := binary.LittleEndian
	ps := int(le.Uint32(image[16+8:]))
	type leaf struct{ off, end int }
	pageOf := map[string]leaf{}
	for off, next := 2*ps, 0; off < len(image); off = next {
		next = off + ps*(1+int(le.Uint32(image[off+12:]))) // past its overflow
		if le.Uint16(image[off+8:])&0x02 == 0 {
			continue // not a leaf
		}
		for i := range int(le.Uint16(image[off+10:])) {
			e := off + 16 + 16*i
			pos, ksize := int(le.Uint32(image[e+4:])), int(le.Uint32(image[e+8:]))
			key := image[e+pos : e+pos+ksize]
			for _, c := range hist {
				if bytes.HasPrefix(key, []byte(c.ID+"\x00w\x00")) {
					pageOf[c.ID] = leaf{off, next}
				}
			}
		}
	}
	newest, ok := pageOf[hist[0].ID]
	require.True(t, ok, "the thread's newest checkpoint is on no leaf page of its own")
	lost := 0
	for _, c := range hist {
		if pageOf[c.ID].off < newest.off {
			clear(image[newest.off:newest.end])
			return writeImage(t, image), c.ID, lost
		}
		lost++
	}
	t.Fatal("all the thread's checkpoints share the page of its newest")
	return "", "", 0
}
