package agent_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
	"github.com/outpost-edge/outpost/policy"
)

// A model node whose Ollama stream stalls past the node's timeout is tried
// again under its retry policy: the engine's timeout reaches the Ollama
// client as the context's cause, and must come back as a transient error.
func TestStalledModelCallIsRetriedAfterTheNodeTimeout(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if calls.Add(1) == 1 { // a first token, then nothing
			_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":"If"},"done":false}` + "\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":"ok"},"done":false}` + "\n" +
			`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"prompt_eval_count":3,"eval_count":1}` + "\n"))
	}))
	defer srv.Close()
	store := engine.NewMemoryStore()
	mc := &agent.ModelCall{Provider: ollama.New(srv.URL, srv.Client()), Lane: &policy.Lane{Agent: "a", Models: []string{"llama3.2"}},
		Log: agent.NewMemoryCallLog(), Blobs: store}
	b := engine.NewGraph("a")
	out := engine.Replace[string](b, "out")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "llama3.2", Messages: []models.Message{{Role: "user", Content: "hi"}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(resp.Message.Content)}, nil
	}, engine.WithTimeout(200*time.Millisecond), engine.WithRetry(engine.RetryPolicy{MaxAttempts: 2, Initial: time.Millisecond}))
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store})
	require.NotNil(t, res, "%v", err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, int32(2), calls.Load())
	require.Equal(t, "ok", out.Get(res.State))
}

// A call cut off by the run's wall-time budget spent what its server read
// and wrote before then: it is recorded, though the run is stopping, so
// that the outcome and the run's token count hold it.
func TestModelCallStoppedByTheRunsDeadlineIsRecorded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"model":"llama3.2","message":{"role":"assistant","content":"If you missed a dose"},"done":false}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	log := agent.NewMemoryCallLog()
	store := engine.NewMemoryStore()
	mc := &agent.ModelCall{Provider: ollama.New(srv.URL, srv.Client()), Lane: &policy.Lane{Agent: "a", Models: []string{"llama3.2"}},
		Log: log, Blobs: store, TokenLimit: 1000}
	b := engine.NewGraph("a")
	out := engine.Replace[string](b, "out")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		resp, err := mc.Call(ctx, models.Request{Model: "llama3.2", Messages: []models.Message{{Role: "user", Content: "I forgot my dose"}}}, 0)
		if err != nil {
			return nil, err
		}
		return []engine.Write{out.Set(resp.Message.Content)}, nil
	})
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store, MaxDuration: 300 * time.Millisecond})
	require.ErrorIs(t, err, engine.ErrDeadline)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
	tokens, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	// 4 + 5 for the prompt's message (I, forgot, my, dose), 6 for what
	// was streamed (If, you, missed, a, dose).
	require.Equal(t, 15, tokens, "records: %+v", log.Records(agent.ModelKeyPrefix(res.Run.ID)))
}

// cappedModel answers every call with answer tokens of text (4 bytes a
// token), reporting the prompt's estimate as its prompt count; it honours
// the request's answer cap as a model server does, cutting the answer
// there and failing as truncated with what it spent. Its calls can be
// made to wait for one another (together), so that the calls of one
// superstep are in flight at once.
type cappedModel struct {
	answer   int
	prompt   int // the prompt count it reports; 0: the prompt's estimate
	together int
	wait     time.Duration // for the other calls (default 300 ms)
	waited   bool          // a call gave up waiting for the others

	mu      sync.Mutex
	caps    []int
	waiting int
	release chan struct{}
}

func (p *cappedModel) Name() string { return "capped" }

func (p *cappedModel) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	p.mu.Lock()
	p.caps = append(p.caps, req.Options.MaxOutputTokens)
	if p.release == nil {
		p.release = make(chan struct{})
	}
	if p.waiting++; p.waiting == p.together {
		close(p.release)
	}
	ch := p.release
	p.mu.Unlock()
	if p.together > 0 {
		select {
		case <-ch:
		case <-time.After(cmp.Or(p.wait, 300*time.Millisecond)): // the other was refused
			p.mu.Lock()
			p.waited = true
			p.mu.Unlock()
		}
	}
	prompt, n := cmp.Or(p.prompt, models.EstimatePromptTokens(req)), p.answer
	if c := req.Options.MaxOutputTokens; c > 0 && c < n {
		text := strings.Repeat("abcd", c)
		_ = stream(models.Chunk{Content: text})
		return nil, &models.Error{Kind: models.Truncated, Provider: p.Name(), Model: req.Model,
			Err: errors.New(`done_reason "length"`), PromptTokens: prompt, CompletionTokens: c}
	}
	msg := models.Message{Role: models.RoleAssistant, Content: strings.Repeat("abcd", n)}
	_ = stream(models.Chunk{Content: msg.Content})
	return &models.Response{Provider: p.Name(), Model: req.Model, Message: msg, PromptTokens: prompt,
		CompletionTokens: n, DoneReason: "stop"}, nil
}

func (p *cappedModel) timedOut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waited
}

func (p *cappedModel) sent() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.caps...)
}

// capGraph runs one model call ("hi": a 5-token prompt) in each of nodes
// parallel tasks of one superstep, with the request's own answer cap
// own, under a token budget of limit.
func capGraph(t *testing.T, p models.Provider, log agent.CallLog, nodes, own, limit int) (*engine.Result, error) {
	t.Helper()
	store := engine.NewMemoryStore()
	mc := &agent.ModelCall{Provider: p, Lane: &policy.Lane{Agent: "a", Models: []string{"m"}}, Log: log, Blobs: store, TokenLimit: limit}
	b := engine.NewGraph("a")
	out := engine.Append[string](b, "out")
	for i := range nodes {
		name := "gen" + strconv.Itoa(i)
		b.AddNode(name, func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			// One ModelCall per node: Spent is the node's own count.
			mc := *mc
			req := models.Request{Model: "m", Messages: []models.Message{{Role: "user", Content: "hi"}}}
			req.Options.MaxOutputTokens = own
			resp, err := mc.Call(ctx, req, 0)
			if err != nil {
				return nil, err
			}
			return []engine.Write{out.Set([]string{resp.Message.Content})}, nil
		})
		b.AddEdge(engine.Start, name)
		b.AddEdge(name, engine.End)
	}
	g, err := b.Compile()
	require.NoError(t, err)
	return g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store})
}

// requireCutAtTheBudget checks that a run whose answer was cut at what
// its token budget had left ended over budget, having spent no more than
// limit.
func requireCutAtTheBudget(t *testing.T, log *agent.MemoryCallLog, res *engine.Result, runErr error, limit int) {
	t.Helper()
	spent, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.LessOrEqual(t, spent, limit, "spent %d of a %d-token budget", spent, limit)
	require.ErrorIs(t, runErr, engine.ErrBudgetExceeded)
	require.ErrorIs(t, runErr, models.ErrTruncated)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
}

// One call's answer could take the run past its token budget, for the
// request said nothing of how long an answer might be: it now carries
// what the budget has left after its prompt, and an answer cut there
// ends the run over budget having spent no more than the budget.
func TestTokenBudgetCapsTheAnswer(t *testing.T) {
	p := &cappedModel{answer: 100}
	log := agent.NewMemoryCallLog()
	res, runErr := capGraph(t, p, log, 1, 0, 40)
	requireCutAtTheBudget(t, log, res, runErr, 40)
	require.Equal(t, []int{35}, p.sent(), "the answer's cap: 40 less the prompt's 5")
}

// A Chinese prompt, counted 4 bytes a token, was set aside at two thirds
// of what a tokenizer makes of it, so the answer's cap left the prompt's
// real count and the answer more than the budget: the run spent past it.
// The prompt's estimate now counts high, and the run spends within it.
func TestTokenBudgetHoldsForANonLatinPrompt(t *testing.T) {
	// 51 characters: 63 tokens for cl100k, 45 for Llama 3.
	const zh = "我今天早上忘记吃二甲双胍了，我该怎么办？如果您漏服了一剂，请在想起时尽快服用，除非快到下一剂的时间了。"
	p := &cappedModel{answer: 100, prompt: models.TokensPerMessage + 63}
	store, log := engine.NewMemoryStore(), agent.NewMemoryCallLog()
	mc := &agent.ModelCall{Provider: p, Lane: &policy.Lane{Agent: "a", Models: []string{"m"}}, Log: log, Blobs: store, TokenLimit: 100}
	b := engine.NewGraph("a")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		_, err := mc.Call(ctx, models.Request{Model: "m", Messages: []models.Message{{Role: "user", Content: zh}}}, 0)
		return nil, err
	})
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, runErr := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: store})
	require.ErrorIs(t, runErr, engine.ErrBudgetExceeded, "the answer was cut at what the budget had left")
	spent, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.LessOrEqual(t, spent, 100, "spent %d of a 100-token budget (caps sent: %v)", spent, p.sent())
}

// Calls of one superstep each reserved only their prompts, so all of them
// were let in together and their answers took the run past its budget.
// The first now sets aside the room its answer may take; the second waits
// for it, and, with nothing left then, is refused before it is sent.
func TestTokenBudgetCapsConcurrentAnswers(t *testing.T) {
	p := &cappedModel{answer: 100, together: 2}
	log := agent.NewMemoryCallLog()
	res, err := capGraph(t, p, log, 2, 0, 100)
	require.ErrorIs(t, err, engine.ErrBudgetExceeded)
	require.Equal(t, engine.StatusBudgetExceeded, res.Run.Status)
	spent, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.LessOrEqual(t, spent, 100, "spent %d of a 100-token budget", spent)
	require.Equal(t, []int{95}, p.sent(), "one call sent, with the room its prompt leaves")
}

// A call that the calls in flight leave no room for waits for them and
// then runs with what they left: parallel calls within the budget all
// run, though the first, with no cap of its own, set aside all of it.
func TestTokenBudgetParallelCallsWaitForRoom(t *testing.T) {
	p := &cappedModel{answer: 10, together: 2}
	res, err := capGraph(t, p, agent.NewMemoryCallLog(), 2, 0, 1000)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, []int{995, 980}, p.sent(), "the second call's cap: what the first's 15 tokens and its prompt left")
}

// Under a budget with room for both, parallel calls whose requests set no
// cap run together, each capped at DefaultAnswerTokens: a call without a
// cap does not set aside all the budget has left.
func TestTokenBudgetDefaultCapLetsParallelCallsRunTogether(t *testing.T) {
	p := &cappedModel{answer: 10, together: 2, wait: 10 * time.Second}
	res, err := capGraph(t, p, agent.NewMemoryCallLog(), 2, 0, 100_000)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, []int{agent.DefaultAnswerTokens, agent.DefaultAnswerTokens}, p.sent())
	require.False(t, p.timedOut(), "the two calls were in flight together")
}

// An answer cut at the default cap is the model's failure, not the
// budget's, and the error says where the cap came from.
func TestTokenBudgetDefaultCapCutsARunawayAnswer(t *testing.T) {
	p := &cappedModel{answer: agent.DefaultAnswerTokens + 1}
	res, err := capGraph(t, p, agent.NewMemoryCallLog(), 1, 0, 100_000)
	require.Error(t, err)
	require.NotErrorIs(t, err, engine.ErrBudgetExceeded)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Contains(t, res.Run.Error, "cut at 8192 tokens, the answer cap of a call under a token budget whose node sets no num_predict")
}

// A request's own answer cap holds when it is the smaller, and sets aside
// no more than it: parallel calls that fit in the budget together run.
func TestTokenBudgetKeepsTheRequestsSmallerCap(t *testing.T) {
	p := &cappedModel{answer: 10, together: 2}
	res, err := capGraph(t, p, agent.NewMemoryCallLog(), 2, 20, 100)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Run.Status, res.Run.Error)
	require.Equal(t, []int{20, 20}, p.sent())

	p = &cappedModel{answer: 10}
	res, err = capGraph(t, p, agent.NewMemoryCallLog(), 1, 20, 0)
	require.NoError(t, err, "no budget: the request's own cap is sent as it is")
	require.Equal(t, []int{20}, p.sent())
	require.Equal(t, engine.StatusCompleted, res.Run.Status)
}

// opaqueLog is a CallLog that cannot count tokens: it hides the memory
// log's ModelTokens.
type opaqueLog struct{ agent.CallLog }

// A run resumed with a call log that cannot count its tokens started its
// token count from zero again, with its whole budget. Its model calls are
// now refused (fail closed), with an error that says what to do; a run
// that began in the same call counts from zero, as it should.
func TestResumedRunWithALogThatCannotCountIsRefused(t *testing.T) {
	p := &cappedModel{answer: 10}
	store, log := engine.NewMemoryStore(), agent.NewMemoryCallLog()
	mc := &agent.ModelCall{Provider: p, Lane: &policy.Lane{Agent: "a", Models: []string{"m"}},
		Log: opaqueLog{log}, Blobs: store, TokenLimit: 25}
	b := engine.NewGraph("a")
	out := engine.Append[string](b, "out")
	gen := func(call string) engine.NodeFunc {
		return func(ctx context.Context, s engine.State) ([]engine.Write, error) {
			resp, err := mc.Call(ctx, models.Request{Model: "m", Messages: []models.Message{{Role: "user", Content: call}}}, 0)
			if err != nil {
				return nil, err
			}
			return []engine.Write{out.Set([]string{resp.Message.Content})}, nil
		}
	}
	b.AddNode("first", gen("hi"))
	b.AddNode("review", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		_, err := engine.Interrupt(ctx, "go on?")
		return nil, err
	})
	b.AddNode("second", gen("hi again"))
	b.AddEdge(engine.Start, "first")
	b.AddEdge("first", "review")
	b.AddEdge("review", "second")
	b.AddEdge("second", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	cfg := engine.RunConfig{Thread: "t", Store: store}
	res, err := g.Invoke(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInterrupted, res.Run.Status, "the first call, 15 of 25 tokens, ran: %s", res.Run.Error)

	cfg.Run = res.Run
	res, err = g.Resume(context.Background(), cfg, map[string]engine.Decision{res.Run.Interrupts[0].ID: {Kind: engine.Approve}})
	require.NotEqual(t, engine.StatusCompleted, res.Run.Status, "the second call (16 more tokens) ran as if the run had spent none")
	require.ErrorIs(t, err, agent.ErrTokensUncounted)
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Contains(t, res.Run.Error, "agent.TokenCounter")
	require.Len(t, p.sent(), 1, "the second call was not sent")
}

// panicky panics on its first call, once a second call is waiting.
type panicky struct {
	cappedModel
	calls atomic.Int32
}

func (p *panicky) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	if p.calls.Add(1) == 1 {
		time.Sleep(50 * time.Millisecond) // the other call waits for room
		panic("provider bug")
	}
	return p.cappedModel.Chat(ctx, req, stream)
}

// A call whose provider panics never settles; what it set aside is given
// back all the same, or the calls waiting for room would wait for it
// until the run ended (or forever, with no wall-time budget).
func TestTokenBudgetPanickingCallGivesItsRoomBack(t *testing.T) {
	p := &panicky{cappedModel: cappedModel{answer: 10}}
	done := make(chan struct{})
	var res *engine.Result
	var err error
	go func() {
		defer close(done)
		res, err = capGraph(t, p, agent.NewMemoryCallLog(), 2, 0, 100)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call waiting for room waited for a call that had panicked")
	}
	require.ErrorContains(t, err, "provider bug")
	require.Equal(t, engine.StatusFailed, res.Run.Status)
	require.Equal(t, int32(2), p.calls.Load(), "the waiting call ran once the room came back")
}

// runawayModel ignores the answer cap: it streams " dose" (a token a
// chunk) until its context ends or the stream callback refuses a chunk,
// up to a 1,000 chunks, and then answers with all it streamed, counted.
type runawayModel struct{ sent atomic.Int32 }

func (p *runawayModel) Name() string { return "runaway" }

func (p *runawayModel) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	n := 0
	for ; n < 1000; n++ {
		if err := ctx.Err(); err != nil {
			return nil, &models.Error{Kind: models.Canceled, Provider: p.Name(), Model: req.Model, Err: context.Cause(ctx)}
		}
		if err := stream(models.Chunk{Content: " dose"}); err != nil {
			return nil, err
		}
		p.sent.Add(1)
	}
	return &models.Response{Provider: p.Name(), Model: req.Model, PromptTokens: 5, CompletionTokens: n, DoneReason: "stop",
		Message: models.Message{Role: models.RoleAssistant, Content: strings.Repeat(" dose", n)}}, nil
}

// A provider that ignores the answer's cap streamed on until it was
// done, and the run spent many times its budget before the count after
// the call found it out. It is now cut when its answer reaches the cap:
// the run ends over budget having spent no more than the budget.
func TestTokenBudgetHoldsAgainstAProviderThatIgnoresTheCap(t *testing.T) {
	p := &runawayModel{}
	log := agent.NewMemoryCallLog()
	res, runErr := capGraph(t, p, log, 1, 0, 40)
	requireCutAtTheBudget(t, log, res, runErr, 40)
	require.LessOrEqual(t, p.sent.Load(), int32(35), "the provider was stopped at the cap: 40 less the prompt's 5")
}

// Under a budget with room to spare, a provider that ignores the cap of
// the node's own (num_predict) is cut at it: the node fails, as with an
// answer its server cut there, and the error names the cap.
func TestNodeAnswerCapHoldsAgainstAProviderThatIgnoresIt(t *testing.T) {
	p := &runawayModel{}
	log := agent.NewMemoryCallLog()
	res, runErr := capGraph(t, p, log, 1, 10, 100_000)
	require.Equal(t, engine.StatusFailed, res.Run.Status, "the answer passed its cap of 10 tokens")
	require.ErrorIs(t, runErr, models.ErrTruncated)
	require.NotErrorIs(t, runErr, engine.ErrBudgetExceeded)
	require.Contains(t, res.Run.Error, "reached its cap of 10 tokens (num_predict) and Runaway did not stop it")
	spent, err := log.ModelTokens(context.Background(), res.Run.ID)
	require.NoError(t, err)
	require.Equal(t, 5+10, spent, "the prompt's estimate and the answer up to its cap are charged")
}

// An Ollama that ignores num_predict streams on past the budget's cap:
// its stream is cut there, the server sees the client go away, and the
// run ends over budget having spent no more than its budget.
func TestTokenBudgetHoldsAgainstAnOllamaThatIgnoresNumPredict(t *testing.T) {
	var (
		mu         sync.Mutex
		numPredict any
		streamed   int
		gone       bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Options map[string]any `json:"options"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		numPredict = body.Options["num_predict"]
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		for range 5000 {
			if _, err := w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":" dose"},"done":false}` + "\n")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			mu.Lock()
			streamed++
			mu.Unlock()
			select {
			case <-r.Context().Done():
				mu.Lock()
				gone = true
				mu.Unlock()
				return
			case <-time.After(time.Millisecond):
			}
		}
		_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:07.118394Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"prompt_eval_count":12,"eval_count":5000}` + "\n"))
	}))
	defer srv.Close()
	log := agent.NewMemoryCallLog()
	res, runErr := capGraph(t, ollama.New(srv.URL, srv.Client()), log, 1, 0, 40)
	requireCutAtTheBudget(t, log, res, runErr, 40)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return gone
	}, 5*time.Second, 5*time.Millisecond, "the server never saw the client go away")
	mu.Lock()
	defer mu.Unlock()
	require.EqualValues(t, 35, numPredict, "the cap was asked of the server: 40 less the prompt's 5")
	require.Less(t, streamed, 1000, "the server streamed %d of its 5000 chunks", streamed)
}

// A provider that sends its answer in one line of many megabytes (a proxy
// that buffers Ollama's stream, or drops "stream") is held to the answer's
// cap too: the line is not read whole, the run ends over budget having
// spent no more than its budget, and its error (the outcome's) says the
// answer reached its cap.
func TestTokenBudgetHoldsAgainstAnAnswerInOneHugeLine(t *testing.T) {
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"model":"llama3.2","created_at":"2025-06-12T09:14:02.118394Z","message":{"role":"assistant","content":"`))
		piece := []byte(strings.Repeat(" dose", 1<<12))
		for written.Load() < 6<<20 {
			n, err := w.Write(piece)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`"},"done_reason":"stop","done":true,"prompt_eval_count":12,"eval_count":1258291}` + "\n"))
	}))
	defer srv.Close()
	log := agent.NewMemoryCallLog()
	res, runErr := capGraph(t, ollama.New(srv.URL, srv.Client()), log, 1, 0, 40)
	requireCutAtTheBudget(t, log, res, runErr, 40)
	require.Contains(t, res.Run.Error, "the answer reached its cap of 35 tokens (num_predict) and Ollama did not stop it")
}

// failingModel fails every call after streaming a few words of answer.
type failingModel struct{}

func (failingModel) Name() string { return "failing" }

func (failingModel) Chat(_ context.Context, _ models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	if err := stream(models.Chunk{Content: "If you missed"}); err != nil {
		return nil, err
	}
	return nil, errors.New("the model server went away")
}

// A failed attempt's record keeps its request's hash and digest, as an
// answered call's does, so that a replay can check it as well.
func TestFailedModelCallRecordKeepsTheRequestsDigest(t *testing.T) {
	log := agent.NewMemoryCallLog()
	mc := &agent.ModelCall{Provider: failingModel{}, Lane: &policy.Lane{Agent: "a", Models: []string{"llama3.2"}},
		Log: log, Blobs: engine.NewMemoryStore()}
	req := models.Request{Model: "llama3.2", Messages: []models.Message{{Role: "system", Content: "Answer briefly."}, {Role: "user", Content: "I forgot my dose"}},
		Tools: []models.ToolDef{{Name: "kb_search", Description: "search", Parameters: json.RawMessage(`{"type":"object"}`)}}}
	b := engine.NewGraph("a")
	b.AddNode("gen", func(ctx context.Context, s engine.State) ([]engine.Write, error) {
		_, err := mc.Call(ctx, req, 0)
		return nil, err
	})
	b.AddEdge(engine.Start, "gen")
	b.AddEdge("gen", engine.End)
	g, err := b.Compile()
	require.NoError(t, err)
	res, err := g.Invoke(context.Background(), engine.RunConfig{Thread: "t", Store: engine.NewMemoryStore()})
	require.Error(t, err)
	recs := log.Records(agent.ModelKeyPrefix(res.Run.ID))
	require.Len(t, recs, 1)
	rec := recs[0]
	require.True(t, strings.HasSuffix(rec.Key, "#spent1"), rec.Key)
	require.Equal(t, models.HashRequest(req), rec.ArgsHash)
	require.NotEmpty(t, rec.Args, "the failed attempt's record keeps no digest")
	var kept models.RequestDigest
	require.NoError(t, json.Unmarshal(rec.Args, &kept))
	require.Nil(t, kept.Diff(models.DigestRequest(req)))
	require.Equal(t, models.DigestRequest(req), kept)
}
