package firmware_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/store"
)

// TestReferenceToolFailureAnswer: the reference tools agent's follow-up
// and note are approved, and their files cannot be written (a folder
// stands at their paths, as a full or read-only disk would refuse them
// too). The patient's answer must say plainly that it was not done and
// that staff will be told, and carry neither the tool's error nor the
// file's path; the model must not be given them either. The run records
// the failure: the tool.result event keeps the error, and the run's
// flags, in its state and in its outcome, hold tool_failed.
func TestReferenceToolFailureAnswer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	followups, notesPath := filepath.Join(dir, "followups.jsonl"), filepath.Join(dir, "notes.jsonl")
	notes, err := agent.OpenFileNotes(notesPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{followups, notesPath} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := newRefHarness(t, boltStore, &firmware.Runtime{Notes: notes, Followups: &agent.FileFollowups{Path: followups}})

	cases := []struct {
		name, input, tool string
		approve           bool // the tool asks a person (the note has a standing approval)
		want              []string
	}{
		{"followup", "Please schedule a follow-up call about my refills", agent.ToolScheduleFollowup, true,
			[]string{"could not schedule the follow-up call", "staff will be told"}},
		{"note", "Please tell my doctor the metformin upsets my stomach", agent.ToolRecordNote, false,
			[]string{"could not leave a note", "staff will be told"}},
	}
	runs := map[string]string{} // run id → case
	for _, c := range cases {
		raw, _ := json.Marshal(c.input)
		r, err := h.m.Invoke(ctx, engine.RunRequest{Thread: c.name, Agent: firmware.ReferenceToolsAgent, Input: raw})
		if err != nil {
			t.Fatal(err)
		}
		if c.approve {
			if r.Status != engine.StatusInterrupted || len(r.Interrupts) != 1 {
				t.Fatalf("%s: %s %+v", c.name, r.Status, r.Interrupts)
			}
			if _, err := h.m.Resume(ctx, r.ID, map[string]engine.Decision{r.Interrupts[0].ID: {Kind: engine.Approve, By: "nurse"}}); err != nil {
				t.Fatal(err)
			}
			if r, err = h.m.Wait(ctx, r.ID); err != nil {
				t.Fatal(err)
			}
		}
		runs[r.ID] = c.name
		o := h.observe(r)
		answer := output(o)
		if r.Status != engine.StatusCompleted {
			t.Fatalf("%s: status %s, error %q", c.name, r.Status, r.Error)
		}
		for _, leak := range []string{"tool error", "is a directory", dir} {
			if strings.Contains(answer, leak) {
				t.Errorf("%s: the answer carries %q: %s", c.name, leak, answer)
			}
		}
		for _, w := range c.want {
			if !strings.Contains(answer, w) {
				t.Errorf("%s: the answer lacks %q: %s", c.name, w, answer)
			}
		}
		v, _ := o.state.Value("messages")
		for _, m := range v.([]models.Message) {
			if m.Role == models.RoleTool && (strings.Contains(m.Content, "is a directory") || strings.Contains(m.Content, dir)) {
				t.Errorf("%s: the model was given the tool's error: %s", c.name, m.Content)
			}
		}
		if flags, _ := o.state.Value("flags"); !slices.Contains(flags.([]string), firmware.FlagToolFailed) {
			t.Errorf("%s: flags %v lack %s", c.name, flags, firmware.FlagToolFailed)
		}
	}

	outcomes, err := h.db.Outcomes(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	ended := 0
	for _, oc := range outcomes {
		if _, ok := runs[oc.Run]; ok && oc.Status == engine.StatusCompleted {
			ended++
			if !slices.Contains(oc.Flags, firmware.FlagToolFailed) {
				t.Errorf("%s: outcome flags %v lack %s", runs[oc.Run], oc.Flags, firmware.FlagToolFailed)
			}
			// The outcome's tool list marks the call that failed, and
			// keeps its error home.
			if !slices.ContainsFunc(oc.Tools, func(tl store.OutcomeTool) bool { return tl.Failed }) {
				t.Errorf("%s: outcome tools %+v mark no call as failed", runs[oc.Run], oc.Tools)
			}
		}
	}
	if ended != len(cases) {
		t.Fatalf("%d completed outcomes of %d runs", ended, len(cases))
	}

	h.m.Close()
	h.bus.Close()
	failed := map[string]bool{}
	for e := range h.events.C() {
		var d struct{ Tool, Error string }
		if e.Type == engine.EventToolResult && json.Unmarshal(e.Data, &d) == nil && strings.Contains(d.Error, "is a directory") {
			failed[runs[e.Run]+"/"+d.Tool] = true
		}
	}
	for _, c := range cases {
		if !failed[c.name+"/"+c.tool] {
			t.Errorf("%s: no tool.result event with the error of %s: %v", c.name, c.tool, failed)
		}
	}
}

// TestToolFailedIsAFlagGoldenMayExpect: a tool_loop in a graph with a
// flags channel can raise tool_failed, so a golden conversation of the
// reference tools agent may expect it, and verify takes the bundle.
func TestToolFailedIsAFlagGoldenMayExpect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ref")
	if err := firmware.Export(dir); err != nil {
		t.Fatal(err)
	}
	line := `{"name": "tools-followup-failed", "agent": "` + firmware.ReferenceToolsAgent + `", "turns": [` +
		`{"input": "Please schedule a follow-up call", "expect": {"status": "interrupted"}, "resume": {"decision": "approve"}, ` +
		`"after_resume": {"flags": ["` + firmware.FlagToolFailed + `"], "status": "completed"}}]}` + "\n"
	f, err := os.OpenFile(filepath.Join(dir, "golden", "reference.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := firmware.Sign(dir, devKey); err != nil {
		t.Fatal(err)
	}
	keys, err := firmware.DevKeyring()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := firmware.Load(dir, keys); err != nil {
		t.Fatal(err)
	}
}
