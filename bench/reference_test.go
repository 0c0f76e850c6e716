package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/stretchr/testify/require"
)

// testdata/reference/finals.json holds finals computed by the shared
// LangGraph.js reference (see testdata/reference/README.md).
func TestReferenceFinalsMatchLangGraph(t *testing.T) {
	raw, err := os.ReadFile("../testdata/reference/finals.json")
	require.NoError(t, err)
	var want map[string]string
	require.NoError(t, json.Unmarshal(raw, &want))

	g, c, err := ReferenceGraph()
	require.NoError(t, err)
	store := engine.NewMemoryStore()
	cache := engine.NewStateCache(4, 0)
	for _, th := range []int{0, 5, 63} {
		for i := 0; i < 200; i++ {
			res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: fmt.Sprint(th), Store: store, Cache: cache}, c.Input.Set(TurnInput(th, i)))
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Run.Status)
			if w, ok := want[fmt.Sprintf("%d/%d", th, i)]; ok {
				require.Equal(t, w, c.Final.Get(res.State), "thread %d turn %d", th, i)
			}
			if th == 0 && i == 199 {
				require.Len(t, c.Messages.Get(res.State), 400)
				require.Equal(t, 200, c.Turns.Get(res.State))
			}
		}
	}
}

func TestRunCountsFinals(t *testing.T) {
	res, err := Run(context.Background(), Options{Saver: "memory", Threads: 4, Turns: 20})
	require.NoError(t, err)
	require.Equal(t, 80, res.Finals)
	require.Greater(t, res.TurnsPerS, 0.0)
}

func TestWordSetMatchesRegexpSplit(t *testing.T) {
	nonWord := regexp.MustCompile(`[^A-Za-z0-9_]+`)
	for _, s := range []string{TurnInput(3, 4), TurnInput(0, 16), "  leading, trailing!! ", "", "a", "dose?", "x__y 9"} {
		want := map[string]bool{}
		for _, w := range nonWord.Split(strings.ToLower(s), -1) {
			want[w] = true
		}
		require.Equal(t, want, wordSet(s), "%q", s)
	}
}

func TestRedFlagMatchesRegexp(t *testing.T) {
	re := regexp.MustCompile(`(?i)chest pain|overdose|can't breathe`)
	for _, s := range []string{TurnInput(0, 16), TurnInput(1, 3), "CHEST PAIN", "an Overdose?", "I can't breathe", "cant breathe", "chest  pain", ""} {
		require.Equal(t, re.MatchString(s), hasRedFlag(s), "%q", s)
	}
}
