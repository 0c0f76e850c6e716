package models

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrorKind classifies a failed model call by what the caller can do about it.
type ErrorKind int

const (
	// Unknown is the zero kind; providers do not return it.
	Unknown ErrorKind = iota
	// NotFound: the model is not installed on the server.
	NotFound
	// Unreachable: the server could not be reached, or the connection
	// dropped before it answered.
	Unreachable
	// Timeout: the call's Timeout, or the caller's deadline, ran out.
	Timeout
	// Stream: the server failed after it began answering (an error line in
	// the stream, a malformed line, or a connection dropped mid-stream).
	Stream
	// BadRequest: the server refused the request as given (for example a
	// model that does not support tools); retrying will not help.
	BadRequest
	// Server: the server failed with a 5xx (or 429) status.
	Server
	// Canceled: the caller canceled the context.
	Canceled
	// Truncated: the model stopped at its token limit (Ollama's done_reason
	// "length"), so the answer is cut short. The same call would stop the
	// same way: it needs a larger context or a shorter answer.
	Truncated
)

var kindNames = [...]string{
	Unknown:     "unknown",
	NotFound:    "not_found",
	Unreachable: "unreachable",
	Timeout:     "timeout",
	Stream:      "stream",
	BadRequest:  "bad_request",
	Server:      "server",
	Canceled:    "canceled",
	Truncated:   "truncated",
}

// String returns the kind's snake_case name, as used in events.
func (k ErrorKind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("ErrorKind(%d)", int(k))
	}
	return kindNames[k]
}

// ParseErrorKind is the inverse of ErrorKind.String.
func ParseErrorKind(s string) (ErrorKind, bool) {
	for k, name := range kindNames {
		if name == s && k != int(Unknown) {
			return ErrorKind(k), true
		}
	}
	return Unknown, false
}

// Sentinels for errors.Is. An *Error matches the sentinel of its kind, so
// callers need not unpack it to branch on the common cases.
var (
	ErrModelNotFound = errors.New("model not found")
	ErrUnreachable   = errors.New("model server unreachable")
	ErrTimeout       = errors.New("model call timed out")
	// ErrDropped is wrapped by a Stream error whose connection closed before
	// the final chunk. Unlike an error line it is worth a retry.
	ErrDropped = errors.New("connection dropped mid-stream")
	// ErrTruncated is matched by a Truncated error: the answer stopped at
	// the token limit and must not be taken for a complete one.
	ErrTruncated = errors.New("answer cut short at the token limit")
)

// Error is a failed model call. Its message says what to do: the URL that
// was unreachable, or the command that installs a missing model.
type Error struct {
	Kind     ErrorKind
	Provider string // "ollama", "scripted", ...
	Model    string
	URL      string // the server's base URL, when there is one
	Status   int    // HTTP status, when the server sent one
	Err      error  // the underlying cause
	// Hint is the remedy the provider knows, such as `run "ollama pull llama3.2"`.
	Hint string
	// PromptTokens and CompletionTokens are what the server reported the
	// call spent, when it reported it before the call failed (a Truncated
	// answer's final chunk holds them); zero when it did not.
	PromptTokens, CompletionTokens int
}

func (e *Error) Error() string {
	var b strings.Builder
	switch e.Kind {
	case NotFound:
		fmt.Fprintf(&b, "model %s is not installed", e.Model)
	case Unreachable:
		fmt.Fprintf(&b, "%s is not reachable at %s", displayName(e.Provider), e.URL)
	case Timeout:
		fmt.Fprintf(&b, "model %s did not answer in time", e.Model)
	case Stream:
		fmt.Fprintf(&b, "model %s failed mid-answer", e.Model)
	case BadRequest:
		fmt.Fprintf(&b, "%s refused the request for model %s", displayName(e.Provider), e.Model)
	case Server:
		fmt.Fprintf(&b, "%s failed serving model %s", displayName(e.Provider), e.Model)
	case Canceled:
		fmt.Fprintf(&b, "call to model %s canceled", e.Model)
	case Truncated:
		fmt.Fprintf(&b, "model %s stopped at its token limit: the answer is cut short", e.Model)
	default:
		fmt.Fprintf(&b, "model %s call failed", e.Model)
	}
	if e.Status != 0 && e.Kind != NotFound {
		fmt.Fprintf(&b, " (status %d %s)", e.Status, http.StatusText(e.Status))
	}
	// The cause of a 404 only repeats what the message says; elsewhere it is
	// the detail an operator needs ("connection refused", the server's text).
	if e.Err != nil && e.Kind != NotFound {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, ": %s", e.Hint)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of e's kind.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrModelNotFound:
		return e.Kind == NotFound
	case ErrUnreachable:
		return e.Kind == Unreachable
	case ErrTimeout:
		return e.Kind == Timeout
	case ErrTruncated:
		return e.Kind == Truncated
	}
	return false
}

// IsTransient reports whether err is worth retrying as is: the server was
// unreachable, the call timed out, the server failed with a 5xx or 429, or
// the connection dropped mid-stream. A missing model, a refused request or an
// error the model reported are not: the same call would fail the same way.
func IsTransient(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Kind {
	case Unreachable, Timeout:
		return true
	case Server:
		return e.Status == 0 || e.Status >= 500 || e.Status == http.StatusTooManyRequests
	case Stream:
		return errors.Is(e.Err, ErrDropped)
	}
	return false
}

// displayName capitalizes a provider's name for the start of a sentence:
// "ollama" reads as "Ollama is not reachable at ...".
func displayName(provider string) string {
	if provider == "" {
		return "the model server"
	}
	if c := provider[0]; c >= 'a' && c <= 'z' {
		return string(c-'a'+'A') + provider[1:]
	}
	return provider
}
