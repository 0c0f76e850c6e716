// Package agenttest holds the conformance suite every agent.CallLog passes:
// the in-memory one and the store adapter in internal/wiring.
package agenttest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
)

// CallLog runs the conformance suite against logs made by newLog, one fresh
// log per subtest.
func CallLog(t *testing.T, newLog func(t *testing.T) agent.CallLog) {
	ctx := context.Background()
	base := agent.CallRecord{Key: "run_1:3:task_a:0", Run: "run_1", Node: "loop", Tool: "write_x",
		ArgsHash: agent.HashArgs(json.RawMessage(`{"a":1}`)), Args: json.RawMessage(`{"a":1}`),
		Decision: "approve", DecidedBy: "operator:alice", Reason: "checked by phone"}

	t.Run("intent then done", func(t *testing.T) {
		log := newLog(t)
		existing, err := log.Intent(ctx, base)
		require.NoError(t, err)
		require.Nil(t, existing)

		got, err := log.Get(ctx, base.Key)
		require.NoError(t, err)
		require.Equal(t, agent.StatusIntent, got.Status)
		require.JSONEq(t, `{"a":1}`, string(got.Args))
		require.Equal(t, "approve", got.Decision)
		require.Equal(t, "operator:alice", got.DecidedBy)
		require.Equal(t, "checked by phone", got.Reason)
		require.Equal(t, "run_1", got.Run)
		require.Equal(t, "loop", got.Node)

		again, err := log.Intent(ctx, base)
		require.NoError(t, err)
		require.NotNil(t, again, "a known key returns its record")
		require.Equal(t, agent.StatusIntent, again.Status)

		require.NoError(t, log.Done(ctx, base.Key, json.RawMessage(`{"ok":true}`), ""))
		require.NoError(t, log.Done(ctx, base.Key, json.RawMessage(`{"ok":true}`), ""), "same result twice is a no-op")
		require.ErrorIs(t, log.Done(ctx, base.Key, json.RawMessage(`{"ok":false}`), ""), agent.ErrCallConflict)

		done, err := log.Intent(ctx, base)
		require.NoError(t, err)
		require.True(t, done.Done())
		require.JSONEq(t, `{"ok":true}`, string(done.Result))
	})

	t.Run("error outcome", func(t *testing.T) {
		log := newLog(t)
		_, err := log.Intent(ctx, base)
		require.NoError(t, err)
		require.NoError(t, log.Done(ctx, base.Key, nil, "tool error: boom"))
		got, err := log.Get(ctx, base.Key)
		require.NoError(t, err)
		require.True(t, got.Done())
		require.Empty(t, got.Result)
		require.Equal(t, "tool error: boom", got.Error)
	})

	t.Run("conflict", func(t *testing.T) {
		log := newLog(t)
		_, err := log.Intent(ctx, base)
		require.NoError(t, err)
		other := base
		other.ArgsHash = agent.HashArgs(json.RawMessage(`{"a":2}`))
		_, err = log.Intent(ctx, other)
		require.ErrorIs(t, err, agent.ErrCallConflict)
		other = base
		other.Tool = "other"
		_, err = log.Intent(ctx, other)
		require.ErrorIs(t, err, agent.ErrCallConflict)
	})

	t.Run("unknown key", func(t *testing.T) {
		log := newLog(t)
		_, err := log.Get(ctx, "nope")
		require.ErrorIs(t, err, agent.ErrCallNotFound)
		require.ErrorIs(t, log.Done(ctx, "nope", nil, ""), agent.ErrCallNotFound)
	})

	t.Run("large args and result", func(t *testing.T) {
		log := newLog(t)
		big := json.RawMessage(`{"text":"` + strings.Repeat("x", 3000) + `"}`)
		rec := base
		rec.Args, rec.ArgsHash = big, agent.HashArgs(big)
		_, err := log.Intent(ctx, rec)
		require.NoError(t, err)
		res := json.RawMessage(`"` + strings.Repeat("y", 5000) + `"`)
		require.NoError(t, log.Done(ctx, rec.Key, res, ""))
		got, err := log.Get(ctx, rec.Key)
		require.NoError(t, err)
		require.JSONEq(t, string(big), string(got.Args))
		require.Equal(t, string(res), string(got.Result))
	})
}
