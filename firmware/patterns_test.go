package firmware_test

import (
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// TestPatterns runs one agent per execution pattern from the signed test
// bundle and checks each one's node path and final state.
func TestPatterns(t *testing.T) {
	b := loadPatterns(t)
	resolve := firmware.BundleResolver(b)
	tests := []struct {
		name, agent string
		input       any
		path        []string
		check       func(t *testing.T, o outcome)
	}{
		{name: "sequential", agent: "sequential", input: "I missed a dose of metformin",
			path: []string{"intake", "lookup", "answer"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("question"); got != "Question: I missed a dose of metformin" {
					t.Errorf("question = %q", got)
				}
				if got := o.str("answer"); !strings.Contains(got, "[kb-01] If you miss a dose") {
					t.Errorf("answer = %q", got)
				}
				if string(o.run.Output) == "" || !strings.Contains(string(o.run.Output), "kb-01") {
					t.Errorf("output = %s", o.run.Output)
				}
			}},
		{name: "conditional/red flag", agent: "conditional", input: "I have chest pain after my pills",
			path: []string{"guard", "escalate"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "ESCALATED: This may be an emergency. Call your local emergency number now." {
					t.Errorf("answer = %q", got)
				}
				if join(o.strs("flags")) != "acute" {
					t.Errorf("flags = %v", o.strs("flags"))
				}
			}},
		{name: "conditional/out of scope", agent: "conditional", input: "What is the weather tomorrow?",
			path: []string{"guard"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "I can only help with your medications." {
					t.Errorf("answer = %q", got)
				}
				if join(o.strs("flags")) != "out_of_scope" {
					t.Errorf("flags = %v", o.strs("flags"))
				}
			}},
		{name: "conditional/in scope", agent: "conditional", input: "When should I ask for a refill of my pills?",
			path: []string{"guard", "lookup", "respond"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); !strings.HasPrefix(got, "See [kb-02]") {
					t.Errorf("answer = %q", got)
				}
			}},
		{name: "parallel fan-out and join", agent: "parallel", input: []string{"doses", "refills", "side effects"},
			path: []string{"spread", "research", "combine"}, // one step of three research tasks
			check: func(t *testing.T, o outcome) {
				want := "Summary:\nnotes on doses\nnotes on refills\nnotes on side effects"
				if got := o.str("answer"); got != want {
					t.Errorf("answer = %q, want %q", got, want)
				}
			}},
		{name: "parallel with nothing to fan out", agent: "parallel", input: []string{},
			path: []string{"spread", "combine"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "Summary:\n" {
					t.Errorf("answer = %q", got)
				}
			}},
		{name: "iterative converges", agent: "iterative", input: 3,
			path: []string{"polish", "check", "polish", "check", "polish", "check", "done"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "converged after 3 rounds: ***" {
					t.Errorf("answer = %q", got)
				}
			}},
		{name: "iterative stops at its bound", agent: "iterative", input: 99,
			path: []string{"polish", "check", "polish", "check", "polish", "check", "polish", "check", "polish", "check", "give_up"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "stopped after 5 rounds: *****" {
					t.Errorf("answer = %q", got)
				}
			}},
		{name: "reflect and revise", agent: "reflect", input: "I missed a dose",
			path: []string{"lookup", "generate", "critic", "revise", "critic"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("draft"); !strings.HasPrefix(got, "Take it as soon as you remember.\nSources:\n[kb-01]") {
					t.Errorf("draft = %q", got)
				}
				if join(o.strs("cited")) != "kb-01" || join(o.strs("flags")) != "uncited" {
					t.Errorf("cited = %v, flags = %v", o.strs("cited"), o.strs("flags"))
				}
			}},
		{name: "consensus reaches quorum", agent: "consensus", input: "Take each dose with food",
			path: []string{"voter_safety", "voter_clarity", "voter_policy", "tally", "accept"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "accepted with 2 of 3 votes" {
					t.Errorf("answer = %q", got)
				}
				if got := join(o.strs("votes")); got != "voter_safety:yes,voter_clarity:yes,voter_policy:no" {
					t.Errorf("votes = %s", got)
				}
			}},
		{name: "consensus misses quorum", agent: "consensus", input: "Ask your pharmacist",
			path: []string{"voter_safety", "voter_clarity", "voter_policy", "tally", "reject"},
			check: func(t *testing.T, o outcome) {
				if got := o.str("answer"); got != "rejected with 1 of 3 votes" {
					t.Errorf("answer = %q", got)
				}
			}},
		{name: "hierarchical", agent: "hierarchical", input: "refill reminder",
			path: []string{"supervisor", "research", "supervisor", "writing", "supervisor"},
			check: func(t *testing.T, o outcome) {
				want := "Report on \"refill reminder\"\nnotes: [kb-02] Ask for a refill"
				if got := o.str("report"); !strings.HasPrefix(got, want) {
					t.Errorf("report = %q, want prefix %q", got, want)
				}
			}},
	}
	// The YAML forms of some agents (agents/*.yaml) run the same cases.
	for _, tt := range tests {
		switch tt.agent {
		case "sequential", "conditional", "hierarchical":
			tt.name, tt.agent = "yaml/"+tt.name, tt.agent+"_yaml"
			tests = append(tests, tt)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := invoke(t, resolve, tt.agent, tt.input)
			if o.run.Status != engine.StatusCompleted {
				t.Fatalf("status %s (%s)", o.run.Status, o.run.Error)
			}
			if join(o.path) != join(tt.path) {
				t.Errorf("path = %v\nwant   %v", o.path, tt.path)
			}
			if o.run.Bundle != b.Ref() {
				t.Errorf("run pinned to %+v, want %+v", o.run.Bundle, b.Ref())
			}
			tt.check(t, o)
		})
	}
}
