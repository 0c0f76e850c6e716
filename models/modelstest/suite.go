// Package modelstest holds the conformance suite that every models.Provider
// passes: run [RunProviderSuite] from the implementation's tests.
package modelstest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
)

// SuiteModel is the model name the suite asks for.
const SuiteModel = "llama3.2"

// SuiteInput is the user message the suite sends. A provider under test must
// answer it with text or tool calls: a scripted rule set, a recorded stream
// or a real model all can.
const SuiteInput = "I forgot my metformin dose"

// SuiteRequest is the request every subtest sends.
func SuiteRequest() models.Request {
	return models.Request{
		Model: SuiteModel,
		Messages: []models.Message{
			{Role: models.RoleSystem, Content: "You help patients keep to their medication plan."},
			{Role: models.RoleUser, Content: SuiteInput},
		},
	}
}

// RunProviderSuite checks the models.Provider contract. newProvider is
// called once per subtest, so each starts from a fresh provider.
func RunProviderSuite(t *testing.T, newProvider func() models.Provider) {
	t.Helper()

	t.Run("Name", func(t *testing.T) {
		p := newProvider()
		require.NotEmpty(t, p.Name())
		require.Equal(t, p.Name(), p.Name(), "Name must be stable")
	})

	t.Run("Answers", func(t *testing.T) {
		p := newProvider()
		req := SuiteRequest()
		resp, err := p.Chat(context.Background(), req, nil)
		require.NoError(t, err)
		require.NotNil(t, resp)
		require.Equal(t, p.Name(), resp.Provider, "a response names the provider that gave it")
		require.Equal(t, models.RoleAssistant, resp.Message.Role)
		require.True(t, strings.TrimSpace(resp.Message.Content) != "" || len(resp.Message.ToolCalls) > 0,
			"an answer has text or tool calls")
		for _, tc := range resp.Message.ToolCalls {
			require.NotEmpty(t, tc.Name)
			require.True(t, json.Valid(tc.Arguments), "tool call arguments are JSON: %s", tc.Arguments)
		}
		require.NotEmpty(t, resp.Model)
		require.Positive(t, resp.PromptTokens)
		require.Positive(t, resp.CompletionTokens)
		require.NotEmpty(t, resp.DoneReason)
		require.GreaterOrEqual(t, resp.Duration, 0*resp.Duration)
		require.Equal(t, models.HashRequest(req), resp.RequestHash)
	})

	t.Run("StreamAddsUpToResponse", func(t *testing.T) {
		p := newProvider()
		var content, thinking strings.Builder
		var calls []models.ToolCall
		chunks := 0
		resp, err := p.Chat(context.Background(), SuiteRequest(), func(c models.Chunk) error {
			chunks++
			content.WriteString(c.Content)
			thinking.WriteString(c.Thinking)
			calls = append(calls, c.ToolCalls...)
			return nil
		})
		require.NoError(t, err)
		require.Positive(t, chunks)
		require.Equal(t, resp.Message.Content, content.String())
		require.Equal(t, resp.Message.Thinking, thinking.String())
		require.Equal(t, len(resp.Message.ToolCalls), len(calls))
		for i := range calls {
			require.Equal(t, resp.Message.ToolCalls[i].Name, calls[i].Name)
			require.JSONEq(t, string(resp.Message.ToolCalls[i].Arguments), string(calls[i].Arguments))
		}
	})

	t.Run("StreamErrorStops", func(t *testing.T) {
		p := newProvider()
		stop := errors.New("listener went away")
		calls := 0
		resp, err := p.Chat(context.Background(), SuiteRequest(), func(models.Chunk) error {
			calls++
			return stop
		})
		require.ErrorIs(t, err, stop)
		require.Nil(t, resp)
		require.Equal(t, 1, calls, "no chunk may follow the callback's error")
		var me *models.Error
		require.False(t, errors.As(err, &me), "the callback's error comes back unwrapped, not as a provider failure")
	})

	t.Run("CanceledContext", func(t *testing.T) {
		p := newProvider()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		resp, err := p.Chat(ctx, SuiteRequest(), nil)
		require.Nil(t, resp)
		var me *models.Error
		require.ErrorAs(t, err, &me)
		require.Equal(t, models.Canceled, me.Kind)
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, models.IsTransient(err), "a cancel is the caller's decision, not a fault to retry")
	})

	t.Run("Concurrent", func(t *testing.T) {
		p := newProvider()
		const n = 4
		var wg sync.WaitGroup
		answers := make([]string, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				resp, err := p.Chat(context.Background(), SuiteRequest(), func(models.Chunk) error { return nil })
				errs[i] = err
				if err == nil {
					answers[i] = resp.Message.Content
				}
			})
		}
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, answers[0], answers[i], "the same request gets the same answer")
		}
	})

	t.Run("ResponseEncodes", func(t *testing.T) {
		p := newProvider()
		resp, err := p.Chat(context.Background(), SuiteRequest(), nil)
		require.NoError(t, err)
		b, err := models.EncodeResponse(resp)
		require.NoError(t, err)
		got, err := models.DecodeResponse(b)
		require.NoError(t, err)
		require.Equal(t, resp, got)
	})
}
