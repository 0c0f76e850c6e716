package engine_test

import (
	"testing"

	"github.com/outpost-edge/outpost/engine"
)

// TestEventTypesAsDesignNamesThem pins the event types as DESIGN's events
// contract spells them: other tests name them through the constants, which
// a rename would carry along.
func TestEventTypesAsDesignNamesThem(t *testing.T) {
	for want, got := range map[string]string{
		"run.started":       engine.EventRunStarted,
		"node.started":      engine.EventNodeStarted,
		"node.completed":    engine.EventNodeCompleted,
		"model.token":       engine.EventModelToken,
		"tool.called":       engine.EventToolCalled,
		"tool.result":       engine.EventToolResult,
		"tool.unauthorized": engine.EventToolDenied,
		"interrupt":         engine.EventInterrupt,
		"run.resumed":       engine.EventRunResumed,
		"checkpoint":        engine.EventCheckpoint,
		"run.completed":     engine.EventRunCompleted,
		"run.failed":        engine.EventRunFailed,
		"budget.exceeded":   engine.EventBudgetExceeded,
		"outcome.appended":  engine.EventOutcomeAppended,
		"uplink.sent":       engine.EventUplinkSent,
	} {
		if got != want {
			t.Errorf("event type %q is sent as %q", want, got)
		}
	}
}
