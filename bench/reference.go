package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/outpost-edge/outpost/engine"
)

// The reference workload v1: the six-node guarded conversation turn, with a
// deterministic stand-in model. Strings and rules match the shared
// specification exactly, so finals compare across implementations.

// Meds are the medications of the workload.
var Meds = []string{"metformin", "lisinopril", "atorvastatin", "amlodipine", "levothyroxine", "omeprazole", "losartan", "albuterol"}

// Message is one conversation entry.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Doc is one knowledge-base document.
type Doc struct {
	ID   string `json:"id"`
	Text string `json:"text"`
	med  string
}

const (
	emergency = "This may be an emergency. Call your local emergency number now."
	refusal   = "I can only help with questions about your medications."
	filler    = "Keep taking your medication as prescribed and ask your pharmacist. "
)

var (
	kb = func() []Doc {
		docs := make([]Doc, 64)
		for i := range docs {
			med := Meds[i%len(Meds)]
			id := fmt.Sprintf("kb-%02d", i)
			docs[i] = Doc{ID: id, med: med,
				Text: fmt.Sprintf("Document %s about %s: take %s at the same time each day; ", id, med, med) +
					strings.Repeat(fmt.Sprintf("if a dose of %s is missed, take it when remembered unless the next dose is near. ", med), 3)}
		}
		return docs
	}()
)

// hasRedFlag is /chest pain|overdose|can't breathe/i.
func hasRedFlag(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "chest pain") || strings.Contains(s, "overdose") || strings.Contains(s, "can't breathe")
}

// wordSet splits lowercased s on runs of non-word characters, as
// s.toLowerCase().split(/\W+/) does in JavaScript (ASCII word characters).
func wordSet(s string) map[string]bool {
	words := make(map[string]bool, 16)
	s = strings.ToLower(s)
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && isWordByte(s[i]) {
			continue
		}
		words[s[start:i]] = true
		for i+1 < len(s) && !isWordByte(s[i+1]) {
			i++
		}
		start = i + 1
	}
	return words
}

func isWordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// TurnInput is the input of turn i on thread t.
func TurnInput(t, i int) string {
	switch {
	case i%17 == 16:
		return fmt.Sprintf("thread %d turn %d: I have chest pain after my pills", t, i)
	case i%13 == 12:
		return fmt.Sprintf("thread %d turn %d: what is the weather tomorrow?", t, i)
	}
	return fmt.Sprintf("thread %d turn %d: I forgot my %s dose this morning, what should I do?", t, i, Meds[(t+i)%len(Meds)])
}

// standInModel is the workload's deterministic model: exactly 1,200
// characters citing the first context document.
func standInModel(input string, context []Doc) string {
	cite := ""
	if len(context) > 0 {
		cite = "[" + context[0].ID + "]"
	}
	parts := make([]string, len(context))
	for i, c := range context {
		parts[i] = c.Text[:min(80, len(c.Text))]
	}
	var sb strings.Builder
	sb.Grow(1300)
	sb.WriteString(`Answer to "` + input + `": Based on ` + cite + " " + strings.Join(parts, " ") + " ")
	for sb.Len() < 1200 {
		sb.WriteString(filler)
	}
	return sb.String()[:1200]
}

// Channels of the reference graph.
type Channels struct {
	Messages engine.Chan[[]Message]
	Input    engine.Chan[string]
	Flags    engine.Chan[[]string]
	Context  engine.Chan[[]Doc]
	Draft    engine.Chan[string]
	Final    engine.Chan[string]
	Turns    engine.Chan[int]
}

// ReferenceGraph builds the workload's graph.
func ReferenceGraph() (*engine.Graph, Channels, error) {
	b := engine.NewGraph("reference")
	c := Channels{
		Messages: engine.Append[Message](b, "messages"),
		Input:    engine.Replace[string](b, "input"),
		Flags:    engine.Replace[[]string](b, "flags"),
		Context:  engine.Replace[[]Doc](b, "context"),
		Draft:    engine.Replace[string](b, "draft"),
		Final:    engine.Replace[string](b, "final"),
		Turns:    engine.Sum[int](b, "turns"),
	}
	b.AddNode("intake", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{
			engine.Push(c.Messages, Message{Role: "user", Content: c.Input.Get(s)}),
			c.Flags.Set([]string{}), c.Context.Set([]Doc{}), c.Draft.Set(""),
		}, nil
	})
	b.AddNode("guardrail_pre", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		in := c.Input.Get(s)
		if hasRedFlag(in) {
			return []engine.Write{c.Flags.Set([]string{"acute"}), c.Draft.Set(emergency)}, nil
		}
		if !slices.ContainsFunc(Meds, func(m string) bool { return strings.Contains(in, m) }) {
			return []engine.Write{c.Flags.Set([]string{"refusal"}), c.Draft.Set(refusal)}, nil
		}
		return []engine.Write{c.Flags.Set([]string{})}, nil
	})
	b.AddNode("retrieve_context", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		words := wordSet(c.Input.Get(s))
		type scored struct{ score, i int }
		var buf [64]scored
		hits := buf[:0]
		for i, d := range kb {
			sc := 0
			if words[d.med] {
				sc += 10
			}
			if words["dose"] {
				sc++
			}
			if sc > 0 {
				hits = append(hits, scored{sc, i})
			}
		}
		slices.SortStableFunc(hits, func(a, b scored) int {
			if a.score != b.score {
				return b.score - a.score
			}
			return strings.Compare(kb[a.i].ID, kb[b.i].ID)
		})
		ctx := make([]Doc, 0, 3)
		for _, h := range hits[:min(3, len(hits))] {
			ctx = append(ctx, Doc{ID: kb[h.i].ID, Text: kb[h.i].Text})
		}
		return []engine.Write{c.Context.Set(ctx)}, nil
	})
	b.AddNode("generate_response", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		content := c.Draft.Get(s)
		if len(c.Flags.Get(s)) == 0 {
			content = standInModel(c.Input.Get(s), c.Context.Get(s))
		}
		return []engine.Write{engine.Push(c.Messages, Message{Role: "assistant", Content: content}), c.Draft.Set(content)}, nil
	})
	b.AddNode("guardrail_post", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		ctx, draft := c.Context.Get(s), c.Draft.Get(s)
		if len(ctx) > 0 && !slices.ContainsFunc(ctx, func(d Doc) bool { return strings.Contains(draft, "["+d.ID+"]") }) {
			return []engine.Write{c.Flags.Set(append(slices.Clone(c.Flags.Get(s)), "uncited"))}, nil
		}
		return nil, nil
	})
	b.AddNode("closing", func(_ context.Context, s engine.State) ([]engine.Write, error) {
		return []engine.Write{c.Final.Set(c.Draft.Get(s)), c.Turns.Set(1)}, nil
	})
	b.AddEdge(engine.Start, "intake")
	b.AddEdge("intake", "guardrail_pre")
	b.AddConditionalEdge("guardrail_pre", func(s engine.State) []string {
		if len(c.Flags.Get(s)) > 0 {
			return []string{"generate_response"}
		}
		return []string{"retrieve_context"}
	}, "generate_response", "retrieve_context")
	b.AddEdge("retrieve_context", "generate_response")
	b.AddEdge("generate_response", "guardrail_post")
	b.AddEdge("guardrail_post", "closing")
	b.AddEdge("closing", engine.End)
	g, err := b.Compile()
	return g, c, err
}

// ReferenceAgent wraps the graph for the run manager: the input is a JSON
// string, the output the final answer.
func ReferenceAgent() (*engine.Agent, error) {
	g, c, err := ReferenceGraph()
	if err != nil {
		return nil, err
	}
	return &engine.Agent{
		Name:  "reference",
		Graph: g,
		Input: func(raw json.RawMessage) ([]engine.Write, error) {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("reference input must be a JSON string: %w", err)
			}
			return []engine.Write{c.Input.Set(s)}, nil
		},
		Output: func(s engine.State) json.RawMessage {
			b, _ := json.Marshal(c.Final.Get(s))
			return b
		},
	}, nil
}
