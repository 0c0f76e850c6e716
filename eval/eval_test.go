package eval_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/eval"
	"github.com/outpost-edge/outpost/firmware"
)

// conv builds a golden line for the triage agent.
func conv(name string, turns ...string) string {
	line := fmt.Sprintf(`{"name": %q, "agent": "triage", "turns": [%s]}`, name, strings.Join(turns, ", "))
	return strings.Join(strings.Fields(line), " ") // one line, as JSONL needs
}

const fullPath = `["intake", "guard", "lookup", "answer", "closing"]`

func TestRunPassesAndFails(t *testing.T) {
	tr := newTriage(t)
	cases := []struct {
		name string
		turn string
		fail string // "" to pass; else the exact first difference
	}{
		{"everything matches", `{"input": "I missed my dose", "expect": {"path": ` + fullPath + `,
			"flags": [], "tools": ["kb_search"], "final_contains": ["missed my dose", "turn 1"],
			"final_regex": "^About", "status": "completed"}}`, ""},
		{"no expectations", `{"input": "anything"}`, ""},
		{"acute short-circuit", `{"input": "I have chest pain", "expect": {"path": ["intake", "guard"],
			"flags": ["acute"], "tools": [], "final_regex": "(?i)emergency", "status": "completed"}}`, ""},
		{"status", `{"input": "risky dose", "expect": {"status": "completed"}}`,
			"turn 1: status: want completed, got interrupted at review"},
		{"interrupt node", `{"input": "risky dose", "expect": {"status": "interrupted", "interrupt": "guard"}}`,
			"turn 1: interrupt: want guard, got review"},
		{"interrupt when none", `{"input": "fine dose", "expect": {"interrupt": "review"}}`,
			"turn 1: interrupt: want review, got none"},
		{"path order", `{"input": "fine dose", "expect": {"path": ["intake", "guard", "answer", "lookup", "closing"]}}`,
			"turn 1: path differs at index 2: want answer, got lookup; got [intake guard lookup answer closing]"},
		{"path too long", `{"input": "weather today", "expect": {"path": ["intake", "guard", "closing"]}}`,
			"turn 1: path differs at index 2: want closing, got nothing (ends); got [intake guard]"},
		{"path too short", `{"input": "fine dose", "expect": {"path": ["intake", "guard", "lookup", "answer"]}}`,
			"turn 1: path differs at index 4: want nothing (ends), got closing; got [intake guard lookup answer closing]"},
		{"flags missing", `{"input": "fine dose", "expect": {"flags": ["acute"]}}`,
			"turn 1: flags differ: missing acute; want [acute], got []"},
		{"flags unexpected", `{"input": "weather today", "expect": {"flags": []}}`,
			"turn 1: flags differ: unexpected out_of_scope; want [], got [out_of_scope]"},
		{"flags are a set", `{"input": "weather today", "expect": {"flags": ["out_of_scope", "out_of_scope"]}}`, ""},
		{"tools", `{"input": "take a note", "expect": {"tools": ["record_note", "kb_search"]}}`,
			"turn 1: tools differ at index 0: want record_note, got kb_search; got [kb_search record_note]"},
		{"a denied tool is not a call", `{"input": "delete my note", "expect": {"tools": ["kb_search", "record_note"]}}`, ""},
		{"tools none expected", `{"input": "fine dose", "expect": {"tools": []}}`,
			"turn 1: tools differ at index 0: want nothing (ends), got kb_search; got [kb_search]"},
		{"final contains", `{"input": "fine dose", "expect": {"final_contains": ["About", "aspirin"]}}`,
			`turn 1: final answer lacks "aspirin": "About fine dose (turn 1)"`},
		{"final regex", `{"input": "fine dose", "expect": {"final_regex": "^Call"}}`,
			`turn 1: final answer does not match /^Call/: "About fine dose (turn 1)"`},
		{"resume on a finished run", `{"input": "fine dose", "resume": {"decision": "approve"}}`,
			"turn 1: cannot resume: the run is completed with no pending interrupt"},
		{"after resume differs", `{"input": "risky dose", "expect": {"status": "interrupted"},
			"resume": {"decision": "reject"}, "after_resume": {"final_contains": ["About"]}}`,
			`turn 1: after resume: final answer lacks "About": "A clinician will call you back."`},
		{"paused turn left unanswered", `{"input": "risky dose"}, {"input": "next"}`,
			"turn 2: thread already has an active run: run "},
	}
	var lines []string
	for i, c := range cases {
		lines = append(lines, conv(fmt.Sprintf("c%02d", i), c.turn))
	}
	rep := tr.replay(t, eval.Options{}, lines...)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := rep.Cases[i]
			if got.Name != fmt.Sprintf("c%02d", i) || got.Line != i+1 || got.File != "test.jsonl" {
				t.Fatalf("case %d is %s (%s:%d): the report must keep the input order", i, got.Name, got.File, got.Line)
			}
			switch {
			case c.fail == "" && !got.Passed:
				t.Fatalf("failed: %s", got.Failure)
			case c.fail != "" && got.Passed:
				t.Fatalf("passed, want failure %q", c.fail)
			case c.fail != "" && !strings.HasPrefix(got.Failure, c.fail):
				t.Fatalf("failure:\n got %s\nwant %s", got.Failure, c.fail)
			}
		})
	}
	failed := 0
	for _, c := range cases {
		if c.fail != "" {
			failed++
		}
	}
	if d := rep.Cases[13].Results[0].Observed.Denied; len(d) != 1 || d[0] != "delete_record" {
		t.Fatalf("denied %v, want [delete_record]", d)
	}
	if rep.Failed != failed || rep.Passed != len(cases)-failed || !errors.Is(rep.Err(), eval.ErrFailed) {
		t.Fatalf("report counts %d passed, %d failed (err %v), want %d, %d", rep.Passed, rep.Failed, rep.Err(), len(cases)-failed, failed)
	}
}

func TestResumeDecisions(t *testing.T) {
	tr := newTriage(t)
	paused := `"expect": {"status": "interrupted", "interrupt": "review", "path": ["intake", "guard", "lookup", "answer"]}`
	rep := tr.replay(t, eval.Options{},
		conv("approve", `{"input": "risky dose", `+paused+`, "resume": {"decision": "approve"},
			"after_resume": {"status": "completed", "path": ["intake", "guard", "lookup", "answer", "review", "closing"],
			"flags": ["review_approved"], "tools": ["kb_search"], "final_contains": ["About risky dose"]}}`),
		conv("edit", `{"input": "risky dose", `+paused+`, "resume": {"decision": "edit", "value": "Take it with food."},
			"after_resume": {"status": "completed", "flags": ["review_edited"], "final_regex": "^Take it with food\\.$"}}`),
		conv("reject", `{"input": "risky dose", `+paused+`, "resume": {"decision": "reject", "reason": "no source"},
			"after_resume": {"status": "completed", "flags": ["review_rejected"], "final_contains": ["clinician"]}}`),
		conv("resume then go on", `{"input": "risky dose", "resume": {"decision": "approve"}, "after_resume": {"status": "completed"}}`,
			`{"input": "thanks", "expect": {"status": "completed", "path": `+fullPath+`, "flags": [], "final_contains": ["after: risky dose"]}}`),
	)
	for _, c := range rep.Cases {
		if !c.Passed {
			t.Errorf("%s: %s", c.Name, c.Failure)
		}
	}
	// The report keeps what each side of the pause produced.
	r := rep.Cases[0].Results[0]
	if r.Observed.Status != "interrupted" || r.AfterResume == nil || r.AfterResume.Status != "completed" || r.Observed.Run != r.AfterResume.Run {
		t.Fatalf("turn result: %+v / %+v", r.Observed, r.AfterResume)
	}
}

func TestTurnsShareOneThread(t *testing.T) {
	tr := newTriage(t)
	rep := tr.replay(t, eval.Options{},
		conv("three turns",
			`{"input": "missed metformin", "expect": {"final_contains": ["(turn 1)"]}}`,
			`{"input": "chest pain now", "expect": {"flags": ["acute"], "path": ["intake", "guard"]}}`,
			`{"input": "better now", "expect": {"flags": [], "final_contains": ["(turn 3)", "after: missed metformin; chest pain now"]}}`),
		// A second conversation with the same inputs starts on its own
		// thread and store: its first turn is turn 1 again.
		conv("fresh thread", `{"input": "missed metformin", "expect": {"final_regex": "\\(turn 1\\)$"}}`),
	)
	for _, c := range rep.Cases {
		if !c.Passed {
			t.Errorf("%s: %s", c.Name, c.Failure)
		}
	}
	if n := len(rep.Cases[0].Results); n != 3 {
		t.Fatalf("%d turn results, want 3", n)
	}
	if a, b := rep.Cases[0].Results[0].Observed.Run, rep.Cases[0].Results[1].Observed.Run; a == b {
		t.Fatalf("two turns share run %s: each turn is a run", a)
	}
}

func TestParallelIsBounded(t *testing.T) {
	tr := newTriage(t)
	tr.hold = 20 * time.Millisecond
	var lines []string
	for i := range 24 {
		lines = append(lines, conv(fmt.Sprintf("conv-%02d", i),
			fmt.Sprintf(`{"input": "dose %d", "expect": {"status": "completed", "final_contains": ["dose %d (turn 1)"]}}`, i, i),
			fmt.Sprintf(`{"input": "again %d", "expect": {"final_contains": ["after: dose %d"]}}`, i, i)))
	}
	var calls []int
	start := time.Now()
	rep := tr.replay(t, eval.Options{Parallel: 4, Progress: func(done, total int, c *eval.Case) {
		calls = append(calls, done) // Run calls Progress one at a time
		if total != 24 {
			t.Errorf("progress total %d", total)
		}
	}}, lines...)
	if err := rep.Err(); err != nil {
		for _, c := range rep.Cases {
			t.Log(c.Name, c.Failure)
		}
		t.Fatal(err)
	}
	if peak := tr.peak.Load(); peak > 4 || peak < 2 {
		t.Fatalf("peak concurrency %d, want 2..4", peak)
	}
	// 48 turns of 20ms, four at a time, take about 240ms; one at a time 960.
	if d := time.Since(start); d > 800*time.Millisecond {
		t.Logf("slow: %s (a loaded machine?)", d)
	}
	for i, d := range calls {
		if d != i+1 {
			t.Fatalf("progress counts %v", calls)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	good := conv("good", `{"input": "hi"}`)
	cases := []struct {
		name, line string
		want       []string // every one appears in the error
	}{
		{"unknown top-level field", `{"name": "x", "agent": "triage", "turns": [{"input": "hi"}], "tags": []}`,
			[]string{"test.jsonl:3:", `unknown field "tags"`}},
		{"unknown expect field", conv("x", `{"input": "hi", "expect": {"paths": []}}`),
			[]string{"test.jsonl:3:", `unknown field "turns.0.expect.paths"`}},
		{"unknown resume field", conv("x", `{"input": "hi"}`, `{"input": "risky", "resume": {"decision": "approve", "note": "x"}}`),
			[]string{"test.jsonl:3:", `unknown field "turns.1.resume.note"`}},
		{"unknown after_resume field", conv("x", `{"input": "risky", "resume": {"decision": "approve"}, "after_resume": {"final": "x"}}`),
			[]string{"test.jsonl:3:", `unknown field "turns.0.after_resume.final"`}},
		{"wrong type", conv("x", `{"input": "hi", "expect": {"flags": "acute"}}`), []string{"test.jsonl:3:"}},
		{"bad decision", conv("x", `{"input": "risky", "resume": {"decision": "maybe"}}`),
			[]string{"test.jsonl:3:", "turns.0.resume.decision", `"maybe"`}},
		{"edit without value", conv("x", `{"input": "risky", "resume": {"decision": "edit"}}`),
			[]string{"test.jsonl:3:", "turns.0.resume.decision", "edit needs a value"}},
		{"bad status", conv("x", `{"input": "hi", "expect": {"status": "done"}}`),
			[]string{"test.jsonl:3:", "turns.0.expect.status", `"done"`}},
		{"bad regex", conv("x", `{"input": "hi", "expect": {"final_regex": "(unclosed"}}`),
			[]string{"test.jsonl:3:", "turns.0.expect.final_regex"}},
		{"after_resume alone", conv("x", `{"input": "hi", "after_resume": {"status": "completed"}}`),
			[]string{"test.jsonl:3:", "turns.0.after_resume: given without a resume"}},
		{"resume of a completed turn", conv("x", `{"input": "hi", "expect": {"status": "completed"}, "resume": {"decision": "approve"}}`),
			[]string{"test.jsonl:3:", "turns.0.resume", "nothing to resume"}},
		{"no input", conv("x", `{"expect": {"status": "completed"}}`), []string{"test.jsonl:3:", "turns.0.input"}},
		{"no turns", `{"name": "x", "agent": "triage", "turns": []}`, []string{"test.jsonl:3:"}},
		{"duplicate name", conv("good", `{"input": "hi"}`), []string{"test.jsonl:3:", "already used on line 1"}},
		{"not json", `{"name": "x", `, []string{"test.jsonl:", "unexpected end of input"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Line 2 is a comment: the error must count file lines.
			_, err := eval.Decode("test.jsonl", []byte(good+"\n# a comment\n"+c.line+"\n"))
			if !errors.Is(err, eval.ErrGolden) {
				t.Fatalf("error %v, want ErrGolden", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
	for _, line := range []string{`{"name": "x", "agent": "a", "turns": [{"input": "hi", "extra": 1}]}`, `{"name": "x", "agent": "a", "turns": []}`} {
		_, err := eval.Decode("test.jsonl", []byte(line))
		if !errors.Is(err, firmware.ErrMalformed) {
			t.Fatalf("a malformed line is firmware.ErrMalformed too, got %v", err)
		}
		// outpost eval reads a file of one's own, which no bundle holds.
		if msg := err.Error(); strings.Contains(msg, "bundle") || !strings.Contains(msg, "malformed golden file") {
			t.Fatalf("error %q: want it to call the file a malformed golden file, not a bundle file", msg)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	os.WriteFile(a, []byte(conv("one", `{"input": "hi"}`)+"\n"), 0o644)
	os.WriteFile(b, []byte("# nothing yet\n\n"+conv("two", `{"input": "hi"}`)+"\n"), 0o644)
	convs, err := eval.Load(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(convs) != 2 || convs[1].File != b || convs[1].Line != 3 {
		t.Fatalf("loaded %+v", convs)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, []byte("# none\n"), 0o644)
	if _, err := eval.Load(empty); !errors.Is(err, eval.ErrNoConversations) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := eval.Load(filepath.Join(dir, "missing.jsonl")); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, eval.ErrGolden) {
		t.Fatalf("missing: %v", err)
	}
}

func TestReportOutput(t *testing.T) {
	tr := newTriage(t)
	rep := tr.replay(t, eval.Options{},
		conv("passes", `{"input": "fine dose", "expect": {"status": "completed"}}`),
		conv("fails", `{"input": "fine dose"}`, `{"input": "again", "expect": {"path": ["intake", "guard", "lookup", "review_response"]}}`),
	)
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"CASE", "passes", "pass", "fails", "FAIL",
		"FAIL fails (test.jsonl:2): turn 2: path differs at index 3: want review_response, got answer",
		"2 conversations: 1 passed, 1 failed"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
	var out bytes.Buffer
	if err := rep.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Passed, Failed int
		DurationMS     *float64 `json:"duration_ms"`
		Cases          []struct {
			Name    string
			Turns   int
			Passed  bool
			Failure string
			Results []struct {
				Turn     int
				Observed struct {
					Status string
					Path   []string
					Flags  []string
					Tools  []string
					Final  string
				}
			}
		}
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Passed != 1 || got.Failed != 1 || got.DurationMS == nil || len(got.Cases) != 2 {
		t.Fatalf("json report: %s", out.String())
	}
	f := got.Cases[1]
	if f.Passed || f.Turns != 2 || !strings.HasPrefix(f.Failure, "turn 2: path differs") || len(f.Results) != 2 ||
		f.Results[1].Observed.Status != "completed" || len(f.Results[1].Observed.Path) != 5 || f.Results[1].Observed.Flags == nil {
		t.Fatalf("failed case in json: %+v", f)
	}
	var progress bytes.Buffer
	p := eval.TerminalProgress(&progress)
	for i := range rep.Cases {
		p(i+1, len(rep.Cases), &rep.Cases[i])
	}
	if want := "\r\x1b[K[1/2] passes\r\x1b[K[2/2] fails (1 failed)\n"; progress.String() != want {
		t.Fatalf("progress %q, want %q", progress.String(), want)
	}
}

func TestRunNeedsResolver(t *testing.T) {
	if _, err := eval.Run(context.Background(), nil, eval.Options{}); err == nil {
		t.Fatal("Run without a resolver succeeded")
	}
}

func TestUnknownAgentFails(t *testing.T) {
	tr := newTriage(t)
	rep := tr.replay(t, eval.Options{}, `{"name": "x", "agent": "nobody", "turns": [{"input": "hi"}]}`)
	if rep.Cases[0].Passed || !strings.Contains(rep.Cases[0].Failure, `turn 1: start run: unknown agent "nobody"`) || strings.Contains(rep.Cases[0].Failure, "start run: start run") {
		t.Fatalf("failure %q", rep.Cases[0].Failure)
	}
}

// CheckAgents tells a conversation whose agent the resolver does not know
// before anything is replayed, as a bad golden file naming the file and
// the line; conversations of known agents pass.
func TestCheckAgents(t *testing.T) {
	tr := newTriage(t)
	known := conv("a", `{"input": "hi"}`)
	convs, err := eval.Decode("g.jsonl", []byte(known+"\n\n"+`{"name": "b", "agent": "nobody", "turns": [{"input": "hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := eval.CheckAgents(convs[:1], tr.resolver); err != nil {
		t.Fatalf("a known agent: %v", err)
	}
	err = eval.CheckAgents(convs, tr.resolver)
	if !errors.Is(err, eval.ErrGolden) || !strings.Contains(err.Error(), `g.jsonl:3: conversation "b": unknown agent "nobody"`) {
		t.Fatalf("an unknown agent: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(conv("a", `{"input": "hi", "expect": {"path": ["x"], "flags": [], "tools": [], "final_regex": "a+", "status": "completed"}}`)))
	f.Add([]byte(conv("b", `{"input": "risky", "expect": {"status": "interrupted", "interrupt": "review"}, "resume": {"decision": "edit", "value": "x"}, "after_resume": {"status": "completed"}}`)))
	f.Add([]byte("# only a comment\n\n"))
	f.Add([]byte(`{"name": "x", "agent": "a", "turns": [{"input": 1, "expect": {"final_regex": "("}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		convs, err := eval.Decode("fuzz.jsonl", data)
		if err != nil {
			if !errors.Is(err, eval.ErrGolden) {
				t.Fatalf("error %v is not ErrGolden", err)
			}
			return
		}
		for _, c := range convs {
			if c.Name == "" || c.Agent == "" || len(c.Turns) == 0 || c.Line < 1 {
				t.Fatalf("decoded an incomplete conversation: %+v", c)
			}
			for _, turn := range c.Turns {
				if len(turn.Input) == 0 || (turn.AfterResume != nil && turn.Resume == nil) {
					t.Fatalf("decoded a turn Decode should refuse: %+v", turn)
				}
			}
		}
	})
}
