package engine_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func TestMermaidGolden(t *testing.T) {
	sb := engine.NewGraph("research")
	sb.AddNode("search", noop)
	sb.AddEdge(engine.Start, "search")
	sub := mustCompile(t, sb)

	b := engine.NewGraph("assistant")
	b.AddNode("plan", noop)
	b.AddNode("worker", noop)
	b.AddSubgraph("research", sub)
	b.AddNode("review", noop)
	b.AddNode("answer", noop)
	b.AddEdge(engine.Start, "plan")
	b.AddFanout("plan", func(engine.State) []engine.Send { return nil }, "worker")
	b.AddEdge("worker", "research")
	b.AddConditionalEdge("research", func(engine.State) []string { return nil }, "review", "answer")
	b.AddEdge("review", "answer")
	b.AddEdge("answer", engine.End)
	g := mustCompile(t, b)

	got := g.Mermaid()
	path := filepath.Join("testdata", "mermaid.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run TestMermaidGolden -update to create it")
	require.Equal(t, string(want), got)
}

func TestMermaidQuotesAwkwardNames(t *testing.T) {
	b := engine.NewGraph("awkward")
	names := []string{"end", "two words", `say "hi"`, "a-b", "plain_1"}
	prev := engine.Start
	for _, n := range names {
		b.AddNode(n, noop)
		b.AddEdge(prev, n)
		prev = n
	}
	g := mustCompile(t, b)
	got := g.Mermaid()
	for _, want := range []string{
		`  __n0["end"]`,
		`  __n1["two words"]`,
		`  __n2["say #quot;hi#quot;"]`,
		`  __n3["a-b"]`,
		`  plain_1[plain_1]`,
		`  __start__ --> __n0`,
		`  __n0 --> __n1`,
		`  __n3 --> plain_1`,
		`  plain_1 --> __end__`,
	} {
		require.Contains(t, got, want+"\n")
	}
	// Every edge line joins two plain ids.
	for _, line := range strings.Split(strings.TrimSpace(got), "\n")[1:] {
		require.Regexp(t, `^  [A-Za-z0-9_]+(\[|\(|( (-->|-\.->|==>\|fan-out\|) [A-Za-z0-9_]+$))`, line)
	}
}
