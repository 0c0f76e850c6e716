package models_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/scripted"
)

// A model node streams the answer, stores the response as a blob, and lets
// its retry policy decide on failures.
func Example() {
	var p models.Provider
	p, _ = scripted.Load([]byte(`[{"match": "(?i)metformin", "respond": "Take the missed dose with your next meal."}]`))

	req := models.Request{
		Model:    "llama3.2",
		Messages: []models.Message{{Role: models.RoleUser, Content: "I forgot my metformin dose"}},
	}
	var streamed strings.Builder
	resp, err := p.Chat(context.Background(), req, func(c models.Chunk) error {
		streamed.WriteString(c.Content) // a model.token event per chunk
		return nil
	})
	switch {
	case models.IsTransient(err):
		fmt.Println("retry later:", err)
		return
	case errors.Is(err, models.ErrModelNotFound):
		fmt.Println("operator action needed:", err)
		return
	case err != nil:
		fmt.Println("failed:", err)
		return
	}
	blob, _ := models.EncodeResponse(resp) // stored before the node's writes
	back, _ := models.DecodeResponse(blob)
	fmt.Println(resp.Provider, streamed.String() == resp.Message.Content, back.Message.Content)
	// Output:
	// scripted true Take the missed dose with your next meal.
}
