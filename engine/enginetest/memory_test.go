package enginetest_test

import (
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
)

func TestMemoryStore(t *testing.T) {
	enginetest.RunStoreSuite(t, func(t *testing.T) engine.Store { return engine.NewMemoryStore() })
}
