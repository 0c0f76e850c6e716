package ollama

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/outpost-edge/outpost/models"
)

// callbackError carries the stream callback's error through chatStream so
// that Chat can return it unchanged, told apart from the stream's own.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// errCallTimeout is the context cause when Request.Timeout runs out. It
// wraps context.DeadlineExceeded so callers testing for that still match.
type errCallTimeout struct{ d time.Duration }

func (e errCallTimeout) Error() string {
	return fmt.Sprintf("no complete answer within the call's timeout of %s", e.d)
}
func (e errCallTimeout) Unwrap() error { return context.DeadlineExceeded }

// errStalled is the context cause when a stream sent no chunk for the
// client's stall timeout. It wraps context.DeadlineExceeded: it is a
// timeout, worth a retry, like the call's own.
type errStalled struct{ d time.Duration }

func (e errStalled) Error() string {
	return fmt.Sprintf("the stream stalled: no chunk of the answer for %s", e.d)
}
func (e errStalled) Unwrap() error { return context.DeadlineExceeded }

func (c *Client) newError(kind models.ErrorKind, model string, err error) *models.Error {
	return &models.Error{Kind: kind, Provider: providerName, Model: model, URL: c.base, Err: err}
}

// contextError reports why ctx ended: its own deadline or the call's
// timeout (Timeout, transient) or the caller's cancel (Canceled). A deadline
// is told by ctx.Err, not by the cause, which a caller may have set to its
// own error (the engine's node timeout does).
func (c *Client) contextError(ctx context.Context, model string) *models.Error {
	cause := context.Cause(ctx)
	var stalled errStalled
	if errors.As(cause, &stalled) {
		e := c.newError(models.Timeout, model, cause)
		e.Hint = "the model stopped mid-answer; retry, or check Ollama's log for a runner that hung or ran out of memory"
		return e
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(cause, context.DeadlineExceeded) {
		e := c.newError(models.Timeout, model, cause)
		e.Hint = "the model may still be loading; retry, raise the timeout, or use a smaller model"
		return e
	}
	return c.newError(models.Canceled, model, cause)
}

// classify turns what chatStream or api.Client returned into a
// *models.Error, or returns the stream callback's own error unchanged.
func (c *Client) classify(ctx context.Context, model string, err error) error {
	var cb callbackError
	if errors.As(err, &cb) {
		return cb.err
	}
	if ctx.Err() != nil {
		return c.contextError(ctx, model)
	}

	var se api.StatusError
	if errors.As(err, &se) {
		return c.statusError(model, se.StatusCode, errors.New(shorten(se.ErrorMessage)))
	}
	var ae api.AuthorizationError
	if errors.As(err, &ae) {
		e := c.newError(models.BadRequest, model, errors.New("authorization required"))
		e.Status = ae.StatusCode
		return e
	}

	var ue *url.Error
	if errors.As(err, &ue) {
		// The request never got an answer: refused, unresolvable, reset or
		// closed before the headers. All of them mean "not reachable now".
		if ue.Timeout() {
			return c.newError(models.Timeout, model, rootCause(err))
		}
		e := c.newError(models.Unreachable, model, rootCause(err))
		e.Hint = `start it with "ollama serve", or point Outpost at the right URL`
		return e
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return c.newError(models.Stream, model, fmt.Errorf("%w: %v", models.ErrDropped, err))
	}
	// What remains came from the body of a 200 stream: an {"error": ...}
	// line, or a line that was not JSON, which chatStream returns whole.
	if msg := err.Error(); len(msg) > maxQuoted {
		err = errors.New(shorten(msg))
	}
	return c.newError(models.Stream, model, err)
}

// maxQuoted bounds the server's text quoted in an error. A line that is
// not JSON comes back whole (up to maxStreamLine), and an error
// travels into events, the run's record and its outcome.
const maxQuoted = 300

func shorten(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	// A rune cut in two at the end is dropped.
	return fmt.Sprintf("%s… (%d bytes in all)", strings.ToValidUTF8(s[:maxQuoted], ""), len(s))
}

func (c *Client) statusError(model string, status int, cause error) *models.Error {
	var e *models.Error
	switch {
	case status == http.StatusNotFound && strings.Contains(cause.Error(), "model"):
		// Ollama's own 404 names the model: "model 'x' not found".
		e = c.newError(models.NotFound, model, cause)
		if model != "" {
			e.Hint = fmt.Sprintf("run \"ollama pull %s\"", model)
		}
	case status == http.StatusNotFound:
		// A 404 that names no model is a path the server does not serve
		// ("404 page not found"): the URL is not Ollama's base URL, or
		// something else answers there. Pulling the model will not help.
		e = c.newError(models.BadRequest, model, cause)
		e.Hint = fmt.Sprintf("%s does not serve Ollama's API: is it Ollama's base URL, such as %s?", c.base, DefaultURL)
	case status >= 500 || status == http.StatusTooManyRequests:
		e = c.newError(models.Server, model, cause)
	default:
		e = c.newError(models.BadRequest, model, cause)
	}
	e.Status = status
	return e
}

// rootCause strips the *url.Error and *net.OpError layers, whose text repeats
// the URL the message already names: "connection refused" is what matters.
func rootCause(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}
