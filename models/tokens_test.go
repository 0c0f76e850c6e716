package models_test

import (
	"encoding/json"
	"testing"

	"github.com/outpost-edge/outpost/models"
)

func TestTokenEstimates(t *testing.T) {
	if got := models.EstimateTokens(""); got != 0 {
		t.Fatalf("empty text: %d", got)
	}
	if got := models.EstimateTokens("abcde"); got != 2 {
		t.Fatalf("5 bytes: %d tokens, want 2 (rounded up)", got)
	}
	req := models.Request{Messages: []models.Message{
		{Role: models.RoleSystem, Content: "12345678"},
		{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{Name: "kb", Arguments: json.RawMessage(`{}`)}}},
	}, Tools: []models.ToolDef{{Name: "kb", Description: "search", Parameters: json.RawMessage(`{"type":"object"}`)}}}
	// 4+2 for the first message, 4+1 for the second, 7 for the tool (25 bytes).
	if got := models.EstimatePromptTokens(req); got != 18 {
		t.Fatalf("prompt estimate %d, want 18", got)
	}
	answer := models.Message{Content: "12345678"}
	if got := models.Spent(req, 100, 7, answer); got != 107 {
		t.Fatalf("reported counts: %d, want 107", got)
	}
	if got := models.Spent(req, 0, 7, answer); got != 25 {
		t.Fatalf("missing prompt count: %d, want 18+7", got)
	}
	if got := models.Spent(req, 100, 0, answer); got != 102 {
		t.Fatalf("missing answer count: %d, want 100+2", got)
	}
}
