package firmware_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
)

// countingProvider counts the calls that reach it.
type countingProvider struct {
	models.Provider
	calls atomic.Int64
}

func (p *countingProvider) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	p.calls.Add(1)
	return p.Provider.Chat(ctx, req, stream)
}

// Runtime.Models is asked at each model call, so that an appliance can
// move new calls to a model server that came up after it started: the
// model node and the tool loop both answer from the bundle's scripted
// rules while it says so, and from the provider it names once it does.
func TestRuntimeModelsIsAskedAtEachCall(t *testing.T) {
	inner, err := scripted.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	live := &countingProvider{Provider: inner}
	var switched atomic.Bool
	rt := &firmware.Runtime{Models: func() (models.Provider, string) {
		if switched.Load() {
			return live, "qwen2.5:0.5b"
		}
		return nil, ""
	}}
	h := newRefHarness(t, memoryStore, rt)
	invoke := func(agent, thread string) *engine.Run {
		t.Helper()
		raw, _ := json.Marshal("I forgot my metformin dose")
		run, err := h.m.Invoke(context.Background(), engine.RunRequest{Thread: thread, Agent: agent, Input: raw})
		if err != nil {
			t.Fatalf("invoke: %v", err)
		}
		return run
	}

	for _, agent := range []string{firmware.ReferenceAgent, firmware.ReferenceToolsAgent} {
		if run := invoke(agent, "before-"+agent); run.Status == engine.StatusFailed {
			t.Fatalf("%s on the scripted rules: %s", agent, run.Error)
		}
	}
	if n := live.calls.Load(); n != 0 {
		t.Fatalf("%d calls reached the provider before the switch", n)
	}

	switched.Store(true)
	invoke(firmware.ReferenceAgent, "after")
	afterNode := live.calls.Load()
	if afterNode == 0 {
		t.Fatal("the model node did not call the provider after the switch")
	}
	invoke(firmware.ReferenceToolsAgent, "after-tools")
	if live.calls.Load() == afterNode {
		t.Fatal("the tool loop did not call the provider after the switch")
	}
}
