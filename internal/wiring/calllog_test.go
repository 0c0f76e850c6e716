package wiring_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/agent/agenttest"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/store"
)

func TestStoreCallLog(t *testing.T) {
	agenttest.CallLog(t, func(t *testing.T) agent.CallLog {
		db, err := store.OpenDir(t.TempDir(), store.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return wiring.CallLog(db, db)
	})
}
