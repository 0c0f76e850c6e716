package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// runs show names the node a run waits in by its path through the
// subgraphs, as events do: two instances of a subgraph, and the run's own
// graph, may each hold a node of the same name.
func TestPrintInterruptsNamesTheNodesPath(t *testing.T) {
	for _, tc := range []struct {
		ns, want string
	}{
		{"", "at loop:"},
		{"a:1f2e", "at a/loop:"},
		{"b:77aa", "at b/loop:"},
		{"team:1f2e/b:77aa", "at team/b/loop:"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			r := &engine.Run{ID: "run_1", Interrupts: []engine.PendingInterrupt{
				{ID: "int_1", Node: "loop", NS: tc.ns, Payload: []byte(`{"reason":"uncertain_side_effect"}`)}}}
			var out bytes.Buffer
			printInterrupts(&out, r, "")
			require.Contains(t, out.String(), "waiting for a decision on int_1 "+tc.want)
		})
	}
}
