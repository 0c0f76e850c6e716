package agent_test

import (
	"testing"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/agenttest"
)

func TestMemoryCallLog(t *testing.T) {
	agenttest.CallLog(t, func(*testing.T) agent.CallLog { return agent.NewMemoryCallLog() })
}
