package ollama

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/outpost-edge/outpost/models"
)

// DefaultURL is where Ollama listens unless told otherwise.
const DefaultURL = "http://127.0.0.1:11434"

// providerName is Name() and Response.Provider.
const providerName = "ollama"

// DefaultStallTimeout is the longest wait for the next chunk of an answer
// that has begun streaming, unless Options say otherwise. A model that is
// generating sends a chunk every token or so; a pause of this length
// means the runner hung. It is long enough for a slow machine working out
// a tool call, which Ollama holds back until it is whole.
const DefaultStallTimeout = 30 * time.Second

// Client is a models.Provider backed by an Ollama server. It is safe for
// concurrent use.
type Client struct {
	base    string // as shown in error messages
	url     *url.URL
	http    *http.Client
	api     *api.Client // for /api/tags; chats are streamed by chatStream
	baseErr error       // a base URL that cannot be parsed fails every call
	opts    Options
}

// Options tune a Client. The zero value is what New uses.
type Options struct {
	// KeepAlive is sent with every call that sets no Request.KeepAlive of
	// its own: how long Ollama keeps the model loaded after the call (a
	// negative value keeps it loaded until Ollama stops). Nil leaves it
	// to the server (OLLAMA_KEEP_ALIVE, five minutes unless set), after
	// which the next call waits for the model to load again.
	KeepAlive *time.Duration
	// StallTimeout bounds the wait for each chunk after the first: a
	// stream that stops for that long fails as a Timeout, which is
	// transient. The wait for the first chunk (the model loading, the
	// prompt read) is left to Request.Timeout and the caller's context,
	// and the time the caller's stream callback takes does not count.
	// Zero means DefaultStallTimeout; a negative value turns it off.
	StallTimeout time.Duration
}

var _ models.Provider = (*Client)(nil)

// New returns a Client for the Ollama server at baseURL ("host:port" is
// taken as http), with the zero Options. hc may be nil; it must not set an
// overall Timeout, which would cut long streams short: use Request.Timeout
// instead.
func New(baseURL string, hc *http.Client) *Client {
	return NewWithOptions(baseURL, hc, Options{})
}

// NewWithOptions is New with Options.
func NewWithOptions(baseURL string, hc *http.Client, opts Options) *Client {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	baseURL = strings.TrimRight(baseURL, "/")
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	c := &Client{base: baseURL, opts: opts}
	u, err := url.Parse(baseURL)
	if err == nil && u.Host == "" {
		err = errors.New("no host")
	}
	if err != nil {
		c.baseErr = fmt.Errorf("invalid Ollama URL %q: %w", baseURL, err)
		return c
	}
	c.url, c.http = u, hc
	// api.Client reads a reply whole; the model list of an honest server
	// takes kilobytes.
	limited := *hc
	limited.Transport = limitTransport{base: hc.Transport, max: maxListBody}
	c.api = api.NewClient(u, &limited)
	return c
}

// maxListBody bounds the model list's reply (/api/tags), about half a
// kilobyte a model.
const maxListBody = 4 << 20

// limitTransport fails the reading of a response body past max bytes.
type limitTransport struct {
	base http.RoundTripper
	max  int64
}

func (t limitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := cmp.Or(t.base, http.DefaultTransport).RoundTrip(r)
	if err == nil {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: t.max}
	}
	return resp, err
}

type limitedBody struct {
	io.ReadCloser
	left int64
}

// errBodyTooLong ends the reading of a reply longer than its bound.
var errBodyTooLong = fmt.Errorf("the server's reply is longer than the %d MB that is read of it", maxListBody>>20)

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// At the bound: only a body that ends here is whole.
		if n, err := b.ReadCloser.Read(make([]byte, 1)); n == 0 && err != nil {
			return 0, err
		}
		return 0, errBodyTooLong
	}
	n, err := b.ReadCloser.Read(p[:min(int64(len(p)), b.left)])
	b.left -= int64(n)
	return n, err
}

// URLErr says why the base URL cannot be called (it does not parse, or
// names no host), or is nil: a command can refuse such a URL before it
// starts work, where every call would fail on it later.
func (c *Client) URLErr() error { return c.baseErr }

// Name returns "ollama".
func (c *Client) Name() string { return providerName }

// URL returns the server's base URL.
func (c *Client) URL() string { return c.base }

// Chat streams one /api/chat call. See models.Provider.
func (c *Client) Chat(ctx context.Context, req models.Request, stream func(models.Chunk) error) (*models.Response, error) {
	if c.baseErr != nil {
		return nil, c.newError(models.BadRequest, req.Model, c.baseErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, c.contextError(ctx, req.Model)
	}
	if req.KeepAlive == nil {
		req.KeepAlive = c.opts.KeepAlive
	}
	creq, err := chatRequest(req)
	if err != nil {
		return nil, c.newError(models.BadRequest, req.Model, err)
	}

	callCtx := ctx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeoutCause(ctx, req.Timeout, errCallTimeout{req.Timeout})
		defer cancel()
	}

	// The stall watch is armed by each chunk and disarmed while the
	// caller's callback runs; it does not run before the first chunk.
	var watch *stallWatch
	if c.opts.StallTimeout > 0 {
		var cancel context.CancelFunc
		watch = &stallWatch{d: c.opts.StallTimeout}
		callCtx, cancel = watch.start(callCtx)
		defer cancel()
	}

	lineCap := maxLine(req.Options.MaxOutputTokens)
	start := time.Now()
	acc := accumulator{model: req.Model}
	err = c.chatStream(callCtx, creq, cmp.Or(lineCap, maxStreamLine), func(r api.ChatResponse) error {
		watch.pause()
		chunk := acc.add(r)
		if stream == nil || (chunk.Content == "" && chunk.Thinking == "" && len(chunk.ToolCalls) == 0) {
			watch.arm()
			return nil
		}
		if err := stream(chunk); err != nil {
			return callbackError{err}
		}
		watch.arm()
		return nil
	})
	watch.pause()
	var long errLineTooLong
	switch {
	case errors.As(err, &long) && lineCap > 0:
		return nil, c.lineOverCap(req, lineCap, &acc)
	case errors.As(err, &long):
		// The same call would stop at the same line again.
		return nil, c.newError(models.Stream, req.Model, errors.New("a line of the stream is longer than the 8 MB that is read of a line"))
	case err != nil:
		return nil, c.classify(callCtx, req.Model, err)
	}
	if !acc.done {
		// The stream ends without error when the body stops early, whether
		// the context ran out or the server went away: only the missing
		// final chunk tells.
		if callCtx.Err() != nil {
			return nil, c.contextError(callCtx, req.Model)
		}
		return nil, c.newError(models.Stream, req.Model, fmt.Errorf("%w: the stream ended before its final chunk", models.ErrDropped))
	}
	if err := c.unfinished(req, acc.doneReason); err != nil {
		// The answer is refused, but what it cost was spent: budgets count it.
		err.PromptTokens, err.CompletionTokens = acc.metrics.PromptEvalCount, acc.metrics.EvalCount
		return nil, err
	}
	resp := acc.response(time.Since(start))
	resp.RequestHash = models.HashRequest(req)
	return resp, nil
}

// stallWatch cancels a call's context, with errStalled as the cause, when
// it stays armed for d. A nil *stallWatch does nothing.
type stallWatch struct {
	d      time.Duration
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

func (w *stallWatch) start(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	w.cancel = cancel
	w.timer = time.AfterFunc(w.d, func() { cancel(errStalled{w.d}) })
	w.timer.Stop()
	return ctx, func() { w.timer.Stop(); cancel(context.Canceled) }
}

// arm starts the wait for the next chunk.
func (w *stallWatch) arm() {
	if w != nil {
		w.timer.Reset(w.d)
	}
}

// pause stops the wait: a chunk came, or the call is over.
func (w *stallWatch) pause() {
	if w != nil {
		w.timer.Stop()
	}
}

// unfinished refuses a final chunk that does not end an answer. "stop" (and
// no reason, from servers too old to give one) is a complete answer;
// "length" is one cut at the token limit, which must not pass for a whole
// answer (at the request's answer cap, num_predict, when it has one, or
// else at the model's context window); "load" and "unload" answer a
// request to load or unload the model, not to chat.
func (c *Client) unfinished(req models.Request, reason string) *models.Error {
	switch reason {
	case "length":
		e := c.newError(models.Truncated, req.Model, fmt.Errorf("done_reason %q", reason))
		e.Hint = "raise the model's num_ctx, or ask for a shorter answer"
		if n := req.Options.MaxOutputTokens; n > 0 {
			e.Hint = fmt.Sprintf("the answer reached its cap of %d tokens (num_predict): raise the cap (or the run's token budget it follows), or ask for a shorter answer", n)
		}
		return e
	case "load", "unload":
		return c.newError(models.Stream, req.Model, fmt.Errorf("the stream ended with done_reason %q and no answer", reason))
	}
	return nil
}

// Ping checks that the server answers /api/tags.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.list(ctx)
	return err
}

// HasModel reports whether the server has the model installed. A name
// without a tag matches ":latest", as the Ollama CLI does.
func (c *Client) HasModel(ctx context.Context, name string) (bool, error) {
	list, err := c.list(ctx)
	if err != nil {
		return false, err
	}
	want := withTag(name)
	for _, m := range list.Models {
		if withTag(m.Name) == want || withTag(m.Model) == want {
			return true, nil
		}
	}
	return false, nil
}

func (c *Client) list(ctx context.Context) (*api.ListResponse, error) {
	if c.baseErr != nil {
		return nil, c.newError(models.BadRequest, "", c.baseErr)
	}
	list, err := c.api.List(ctx)
	if err != nil {
		return nil, c.classify(ctx, "", err)
	}
	return list, nil
}

// Bounds of a stream's line while the answer is capped (see maxLine).
const (
	lineOverhead  = 16 << 10 // a chunk's fields besides its text, and a token of any length
	bytesPerToken = 64       // far more than a tokenizer's tokens take on average, escaped as JSON
)

// maxLine is the most bytes a line of the stream of an answer capped at
// limit tokens (0: none) may hold. A line is read whole before it is
// handed on, up to maxStreamLine, so a provider that sends many tokens in
// one chunk, or its whole answer in one line, would be read whole before
// its answer could be counted against the cap. No honest chunk comes near
// the bound: Ollama streams a token a line, and even an answer that comes
// whole (a proxy that drops "stream") takes less than bytesPerToken a
// token. A line that runs past it is taken for an answer past the cap
// (what else it could hold, padding or fields Ollama does not send, is no
// answer either). 0 means no bound but maxStreamLine.
func maxLine(limit int) int {
	if limit <= 0 || limit > (maxStreamLine-lineOverhead)/bytesPerToken {
		return 0
	}
	return lineOverhead + limit*bytesPerToken
}

// lineOverCap is the error of a call whose stream held a line past
// maxLine bytes, of an answer capped at req's MaxOutputTokens: refused as
// over its cap. The line was not read, so what it held is charged as an
// answer that stopped at its cap would be, the cap (or the estimate of
// what streamed before it, when that is more).
func (c *Client) lineOverCap(req models.Request, maxLine int, acc *accumulator) *models.Error {
	limit := req.Options.MaxOutputTokens
	e := models.CapError(providerName, req.Model, limit,
		fmt.Sprintf("a line of its stream ran past %d bytes, more than an answer of %d tokens takes, and was not read", maxLine, limit))
	e.URL = c.base
	e.CompletionTokens = max(limit, models.EstimateAnswerTokens(acc.message()))
	return e
}

func withTag(name string) string {
	// A tag follows the last ':' after the last '/', so a registry host's
	// port ("host:5000/model") is not mistaken for one.
	if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		return name + ":latest"
	}
	return name
}
