package modelstest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
)

// RequireCutAtCap calls p through models.ChatCapped with req, whose
// answer cap (req.Options.MaxOutputTokens) p streams on past a token a
// chunk, and checks that the call was cut at the cap: it fails as an
// answer cut at its cap does, charged the cap. It returns what was
// streamed on to the caller.
func RequireCutAtCap(t *testing.T, p models.Provider, req models.Request) string {
	t.Helper()
	var got strings.Builder
	resp, err := models.ChatCapped(context.Background(), p, req, func(c models.Chunk) error {
		got.WriteString(c.Content)
		return nil
	})
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrTruncated)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Truncated, me.Kind)
	require.Equal(t, p.Name(), me.Provider)
	require.Equal(t, req.Options.MaxOutputTokens, me.CompletionTokens, "the answer is charged what it streamed")
	require.Contains(t, err.Error(), fmt.Sprintf("reached its cap of %d tokens (num_predict) and ", req.Options.MaxOutputTokens))
	require.Contains(t, err.Error(), "did not stop it")
	require.False(t, models.IsTransient(err), "the same call would run on again")
	return got.String()
}
