package console_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/console"
)

// A run list shows a summary of each run: a large input (here 1 MB) is a
// short preview, a JSON string ending in "…", marked input_truncated, and
// the page stays small. GET /api/v1/runs/{id} returns the input whole.
func TestListRunsPreviewsALargeInput(t *testing.T) {
	e := newEnv(t, func(c *console.Config) { c.MaxBody = 4 << 20 })
	input := strings.Repeat("I forgot my metformin dose. ", 40000)
	_, big := e.startRun("big", input, "20s")
	require.Equal(t, "completed", big["status"])
	_, small := e.startRun("small", "hi", "20s")

	for _, query := range []string{"", "?status=completed", "?order=desc", "?thread=big"} {
		t.Run(query, func(t *testing.T) {
			r := e.do("GET", "/api/v1/runs"+query, nil)
			require.Equal(t, http.StatusOK, r.status)
			assert.Less(t, len(r.body), 8<<10, "a page of two runs")
			for _, item := range r.json(t)["runs"].([]any) {
				run := item.(map[string]any)
				switch run["id"] {
				case big["id"]:
					preview, ok := run["input"].(string)
					require.True(t, ok, "the input's preview is a string: %v", run["input"])
					assert.True(t, strings.HasPrefix(preview, "I forgot my metformin dose. I forgot"), preview)
					assert.True(t, strings.HasSuffix(preview, "…"), preview)
					assert.Less(t, len(preview), 200)
					assert.Equal(t, true, run["input_truncated"])
				case small["id"]:
					assert.Equal(t, "hi", run["input"])
					assert.NotContains(t, run, "input_truncated")
					assert.NotContains(t, run, "output_truncated")
				}
			}
		})
	}

	one := e.do("GET", "/api/v1/runs/"+big["id"].(string), nil).json(t)
	assert.Equal(t, input, one["input"])
	assert.NotContains(t, one, "input_truncated")
}
