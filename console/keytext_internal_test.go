package console

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestKeyText(t *testing.T) {
	for key, want := range map[string]string{
		"run_18ed08621e3344b8": "run_18ed08621e3344b8",
		"run é":                "run é",
		"run_1\x00o":           `"run_1\x00o"`,
		"\xff":                 `"\xff"`,
		`"run_1"`:              `"\"run_1\""`,
		"":                     `""`,
	} {
		assert.Equal(t, want, keyText(key), "%q", key)
	}
}
