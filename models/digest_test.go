package models_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/modelstest"
)

func digestRequest() models.Request {
	req := modelstest.SuiteRequest()
	req.Tools = []models.ToolDef{{Name: "kb_search", Description: "search", Parameters: []byte(`{"type": "object"}`)}}
	req.Messages = append(req.Messages, models.Message{Role: "assistant",
		ToolCalls: []models.ToolCall{{ID: "1", Name: "kb_search", Arguments: []byte(`{"q": "a"}`)}}})
	return req
}

// Recorded hashes are compared with hashes made now: the value made before
// the request's parts were digested one by one is pinned.
func TestHashRequestIsStable(t *testing.T) {
	require.Equal(t, "sha256:c71a7646b695b423238b3cb989a68806e53672f7a2b26ca3e2b6a1d535a7342a", models.HashRequest(digestRequest()))
}

func TestRequestDigestDiff(t *testing.T) {
	base := digestRequest()
	d := models.DigestRequest(base)
	require.Len(t, d.Messages, len(base.Messages))
	require.Nil(t, d.Diff(models.DigestRequest(digestRequest())))

	same := digestRequest()
	same.Timeout, same.Options.MaxOutputTokens = 7, 99
	same.Tools[0].Parameters = []byte(`{ "type" : "object" }`)
	require.Nil(t, d.Diff(models.DigestRequest(same)), "what HashRequest leaves out, the digest leaves out")

	for _, tc := range []struct {
		name               string
		change             func(*models.Request)
		part               string
		message            int
		original, replayed string
	}{
		{"model", func(r *models.Request) { r.Model = "other" }, "model", -1, "llama3.2", "other"},
		{"a message", func(r *models.Request) { r.Messages[1].Content += "!" }, "message 1", 1, "user, ", "user, "},
		{"a tool call's arguments", func(r *models.Request) { r.Messages[2].ToolCalls[0].Arguments = []byte(`{"q":"b"}`) },
			"message 2", 2, "assistant, 0 chars", "assistant, 0 chars"},
		{"one message more", func(r *models.Request) { r.Messages = append(r.Messages, models.Message{Role: "tool", Content: "x"}) },
			"messages", 3, "3 messages", "4 messages"},
		{"one message fewer", func(r *models.Request) { r.Messages = r.Messages[:2] }, "messages", -1, "3 messages", "2 messages"},
		{"tools offered", func(r *models.Request) { r.Tools = nil }, "tools", -1, "[kb_search]", "[]"},
		{"a tool's definition", func(r *models.Request) { r.Tools[0].Description = "find" }, "tool kb_search", -1, "definition ", "definition "},
		{"options", func(r *models.Request) { r.Think = true }, "options", -1, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := digestRequest()
			tc.change(&r)
			diff := d.Diff(models.DigestRequest(r))
			require.NotNil(t, diff)
			require.Equal(t, tc.part, diff.Part)
			require.Equal(t, tc.message, diff.Message)
			require.Contains(t, diff.Original, tc.original)
			require.Contains(t, diff.Replayed, tc.replayed)
			require.NotEqual(t, diff.Original, diff.Replayed)
		})
	}
}

func TestRequestDigestRoundTrip(t *testing.T) {
	d := models.DigestRequest(digestRequest())
	b, err := json.Marshal(d)
	require.NoError(t, err)
	require.Contains(t, string(b), `"user/`)
	var back models.RequestDigest
	require.NoError(t, json.Unmarshal(b, &back))
	require.Nil(t, d.Diff(back))
	require.Equal(t, d, back)
	for _, bad := range []string{`{"messages":["user/12"]}`, `{"messages":["user/x/ab"]}`, `{"messages":["user/-1/ab"]}`, `{"tools":["nodigest"]}`} {
		require.Error(t, json.Unmarshal([]byte(bad), &back), bad)
	}
}

func FuzzRequestDigest(f *testing.F) {
	b, _ := json.Marshal(models.DigestRequest(digestRequest()))
	f.Add(b)
	f.Add([]byte(`{"messages":["a/1/b/c"],"tools":["/"]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var d models.RequestDigest
		if json.Unmarshal(data, &d) != nil {
			return
		}
		again, err := json.Marshal(d)
		require.NoError(t, err)
		var back models.RequestDigest
		if err := json.Unmarshal(again, &back); err == nil {
			require.Nil(t, d.Diff(back))
		}
	})
}
