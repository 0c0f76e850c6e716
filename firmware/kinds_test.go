package firmware_test

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// Test kinds, registered the way a Go program that embeds the engine adds
// its own: a polisher for the iterative pattern and a voter for consensus.
func init() {
	firmware.RegisterKind("test_polish", buildPolish)
	firmware.RegisterKind("test_vote", buildVote)
}

// test_polish adds a star to the draft each round and raises "converged"
// once the draft has as many stars as the target.
func buildPolish(cfg json.RawMessage, env *firmware.Env) (engine.NodeFunc, error) {
	var c struct {
		Draft  string `json:"draft"`
		Rounds string `json:"rounds"`
		Target string `json:"target"`
	}
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	for _, ch := range []string{c.Draft, c.Rounds, c.Target, env.Flags} {
		if _, ok := env.Channel(ch); !ok {
			return nil, env.Errorf("test_polish: undeclared channel %q", ch)
		}
	}
	return func(_ context.Context, s engine.State) ([]engine.Write, error) {
		d, _ := s.Value(c.Draft)
		draft, _ := d.(string)
		draft += "*"
		tv, _ := s.Value(c.Target)
		target, _ := tv.(int)
		ws := []engine.Write{{Channel: c.Draft, Value: draft}, {Channel: c.Rounds, Value: 1}}
		if len(draft) >= target {
			ws = append(ws, engine.Write{Channel: env.Flags, Value: []string{"converged"}})
		}
		return ws, nil
	}, nil
}

// test_vote approves when the input mentions its keyword.
func buildVote(cfg json.RawMessage, env *firmware.Env) (engine.NodeFunc, error) {
	var c struct {
		ApproveIf string `json:"approve_if"`
		Input     string `json:"input"`
		Approvals string `json:"approvals"`
		Votes     string `json:"votes"`
	}
	if err := env.Decode(cfg, &c); err != nil {
		return nil, err
	}
	node := env.Node
	return func(_ context.Context, s engine.State) ([]engine.Write, error) {
		v, _ := s.Value(c.Input)
		in, _ := v.(string)
		if strings.Contains(strings.ToLower(in), c.ApproveIf) {
			return []engine.Write{{Channel: c.Approvals, Value: 1}, {Channel: c.Votes, Value: []string{node + ":yes"}}}, nil
		}
		return []engine.Write{{Channel: c.Votes, Value: []string{node + ":no"}}}, nil
	}, nil
}
