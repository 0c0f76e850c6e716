package ollama_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
)

// Health check at start, then one streamed call with a timeout. Not run:
// it needs a real Ollama.
func Example() {
	c := ollama.New("", nil) // http://127.0.0.1:11434
	ctx := context.Background()
	if ok, err := c.HasModel(ctx, "llama3.2"); err != nil || !ok {
		fmt.Println("not ready:", err) // "Ollama is not reachable at ..."
		return
	}
	temp, keep := 0.0, 30*time.Minute
	resp, err := c.Chat(ctx, models.Request{
		Model:     "llama3.2",
		Messages:  []models.Message{{Role: models.RoleUser, Content: "I forgot my metformin dose"}},
		Options:   models.Options{Temperature: &temp, NumCtx: 4096},
		KeepAlive: &keep,
		Timeout:   2 * time.Minute,
	}, func(c models.Chunk) error {
		fmt.Print(c.Content)
		return nil
	})
	if errors.Is(err, models.ErrModelNotFound) {
		fmt.Println(err) // model llama3.2 is not installed: run "ollama pull llama3.2"
		return
	}
	if err != nil {
		fmt.Println(err, "retry:", models.IsTransient(err))
		return
	}
	fmt.Println("\ntokens:", resp.PromptTokens, resp.CompletionTokens)
}
