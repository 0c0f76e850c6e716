package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLaneAllow(t *testing.T) {
	lane := Lane{Agent: "medication-adherence", Models: []string{"llama3.2:*", "qwen2.5:7b", "scripted", "registry.local:5000/team/med:1b"}}
	tests := []struct {
		model string
		ok    bool
	}{
		{"llama3.2:3b", true},
		{"llama3.2:1b-instruct-q4_K_M", true},
		{"llama3.2", true}, // no tag means latest, which the family covers
		{"LLAMA3.2:3B", true},
		{"qwen2.5:7b", true},
		{"qwen2.5:14b", false},
		{"qwen2.5", false}, // latest is not 7b
		{"scripted", true},
		{"scripted:latest", true},
		{"registry.local:5000/team/med:1b", true},
		{"registry.local:5000/team/med", false},
		{"llama3.1:8b", false},
		{"llama3.2-vision:11b", false},
		{"llama3.2:*", false}, // a pattern is not a model
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			err := lane.Allow(tt.model)
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, ErrModelNotInLane)
			assert.ErrorContains(t, err, `agent "medication-adherence" may not use model "`+tt.model+`"`)
			assert.ErrorContains(t, err, "lane: llama3.2:*, qwen2.5:7b")
		})
	}
	assert.ErrorIs(t, Lane{Agent: "a"}.Allow("llama3.2"), ErrModelNotInLane, "an empty lane allows nothing")
}

func TestLaneValidate(t *testing.T) {
	assert.NoError(t, Lane{Agent: "a", Models: []string{"llama3.2:*", "x"}}.Validate())
	for name, l := range map[string]Lane{
		"no agent":        {Models: []string{"x"}},
		"no models":       {Agent: "a"},
		"catch-all":       {Agent: "a", Models: []string{"*"}},
		"partial pattern": {Agent: "a", Models: []string{"llama*:3b"}},
		"tag prefix":      {Agent: "a", Models: []string{"llama3.2:3*"}},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorIs(t, l.Validate(), ErrBadRule)
		})
	}
}
