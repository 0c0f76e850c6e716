package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/auth"
	"github.com/ollama/ollama/envconfig"
	"github.com/ollama/ollama/version"
)

// A chat's answer is streamed here rather than by api.Client.Chat, which
// makes an 8 MB line buffer for every call, a cost that several calls at
// once on a small appliance cannot carry. The request, the answer's lines
// and the errors are api's types, and are read as api.Client reads them.

// maxStreamLine is the longest line of a stream that is read at all (the
// 8 MB of api.Client's). A line is held whole to be decoded, so memory
// grows to the longest line read, and no further.
const maxStreamLine = 8_000_000

// streamBufSize is what a stream is read into: a line of Ollama's (a token
// a line, or a tool call) fits, and a longer one is gathered from it.
const streamBufSize = 16 << 10

// errLineTooLong ends a stream at a line longer than max bytes, which is
// not read on.
type errLineTooLong struct{ max int }

func (e errLineTooLong) Error() string {
	return fmt.Sprintf("a line of the stream is longer than %d bytes", e.max)
}

// chatStream posts creq to /api/chat and hands fn each line of the NDJSON
// answer, decoded, reading no line longer than maxLine bytes and passing
// over blank (or white-space-only) lines. It returns
// fn's error, the server's (an error status or an {"error": ...} line, as
// api.Client returns them), that of a line that does not decode, or an
// errLineTooLong. Like api.Client it returns nil when a 2xx body ends,
// whether at its end or cut short (the connection dropped, the context
// ended): only a missing final chunk tells those apart.
func (c *Client) chatStream(ctx context.Context, creq *api.ChatRequest, maxLine int, fn func(api.ChatResponse) error) error {
	body, err := json.Marshal(creq)
	if err != nil {
		return err
	}
	resp, err := c.post(ctx, "/api/chat", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= http.StatusBadRequest {
		// An error's body holds no answer, so no answer's cap bounds it.
		maxLine = maxStreamLine
	}
	lines := lineReader{r: bufio.NewReaderSize(resp.Body, streamBufSize), max: maxLine}
	for {
		line, err := lines.next()
		var long errLineTooLong
		switch {
		case errors.As(err, &long) && resp.StatusCode >= http.StatusBadRequest:
			return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: err.Error()}
		case errors.As(err, &long):
			return err
		case err != nil && resp.StatusCode >= http.StatusBadRequest:
			// Every line of an error's body ends the stream with the error,
			// so this one had none. api.Client would end it without an
			// error, as if an answer had been dropped.
			return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: "the server sent no error message"}
		case err != nil:
			return nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			// Ollama ends each object with one newline and writes no
			// blank lines, but a proxy between may (keep-alives, a
			// pretty-printer's \r\n\r\n); a blank line holds no object,
			// as the NDJSON spec lets a reader take it. api.Client
			// would fail the call with the empty line as its message.
			continue
		}
		if err := chatLine(resp, line, fn); err != nil {
			return err
		}
	}
}

// chatLine hands fn one line of the stream, or returns the error that the
// line, or the response's status, makes of it, as api.Client does, save
// that a line that does not decode is named as such, not only quoted.
func chatLine(resp *http.Response, line []byte, fn func(api.ChatResponse) error) error {
	var errorResponse struct {
		Error     string `json:"error,omitempty"`
		SigninURL string `json:"signin_url,omitempty"`
	}
	if err := json.Unmarshal(line, &errorResponse); err != nil {
		if resp.StatusCode >= http.StatusBadRequest {
			return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: string(line)}
		}
		return fmt.Errorf("a line of the stream is not a JSON object: %s", line)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return api.AuthorizationError{StatusCode: resp.StatusCode, Status: resp.Status, SigninURL: errorResponse.SigninURL}
	case resp.StatusCode >= http.StatusBadRequest:
		return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: errorResponse.Error}
	case errorResponse.Error != "":
		return errors.New(errorResponse.Error)
	}
	var r api.ChatResponse
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("a line of the stream is not a chat answer: %w", err)
	}
	return fn(r)
}

// post sends body to the server's path as api.Client sends a stream's
// request: the same headers, and signed when Ollama's settings (or
// ollama.com as the host) ask for it.
func (c *Client) post(ctx context.Context, path string, body []byte) (*http.Response, error) {
	u := c.url.JoinPath(path)
	var token string
	if envconfig.UseAuth() || c.url.Hostname() == "ollama.com" {
		now := strconv.FormatInt(time.Now().Unix(), 10)
		var err error
		token, err = auth.Sign(ctx, []byte(fmt.Sprintf("%s,%s?ts=%s", http.MethodPost, path, now)))
		if err != nil {
			return nil, err
		}
		q := u.Query()
		q.Set("ts", now)
		u.RawQuery = q.Encode()
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/x-ndjson")
	r.Header.Set("User-Agent", fmt.Sprintf("ollama/%s (%s %s) Go/%s", version.Version, runtime.GOARCH, runtime.GOOS, runtime.Version()))
	if token != "" {
		r.Header.Set("Authorization", token)
	}
	return c.http.Do(r)
}

// lineReader reads a stream's lines as bufio.ScanLines splits them (a
// final line may lack its newline; a carriage return before the newline
// is dropped), holding a line no longer than r's buffer in it and a longer
// one in long, and refusing a line longer than max bytes as soon as that
// many have been read.
type lineReader struct {
	r    *bufio.Reader
	max  int
	long []byte
}

// next returns the next line, valid until the next call, or io.EOF after
// the last, or the error that cut the stream (a line of it read in part is
// lost with it), or an errLineTooLong.
func (l *lineReader) next() ([]byte, error) {
	l.long = l.long[:0]
	for {
		frag, err := l.r.ReadSlice('\n')
		n := len(l.long) + len(frag)
		if err == nil {
			n-- // the newline
		}
		if n > l.max {
			return nil, errLineTooLong{l.max}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			l.long = append(l.long, frag...)
			continue
		case err == nil:
			frag = frag[:len(frag)-1]
		case errors.Is(err, io.EOF) && n > 0:
		default:
			return nil, err
		}
		line := frag
		if len(l.long) > 0 {
			l.long = append(l.long, frag...)
			line = l.long
		}
		return bytes.TrimSuffix(line, []byte{'\r'}), nil
	}
}
