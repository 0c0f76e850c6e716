package ollama

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/models"
)

// A call holds only what its answer needs: on an appliance that runs
// several model calls at once within a small memory budget, a short answer
// must not cost megabytes of heap (a line buffer sized for the longest
// line the stream may hold, made afresh for every call).
func TestChatAllocatesLittlePerCall(t *testing.T) {
	srv := newFakeOllama(t, replayStream(t, "plain.ndjson"))
	c := New(srv.URL, srv.Client())
	capped := chatRequestFor("llama3.2")
	capped.Options.MaxOutputTokens = 8192
	for name, call := range map[string]func() error{
		"chat":        func() error { _, err := c.Chat(context.Background(), chatRequestFor("llama3.2"), nil); return err },
		"capped chat": func() error { _, err := c.Chat(context.Background(), capped, nil); return err },
		"ping":        func() error { return c.Ping(context.Background()) },
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, call()) // the connection is made once, and kept alive for the rest
			const calls = 20
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for range calls {
				require.NoError(t, call())
			}
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / calls
			t.Logf("%d bytes allocated per call", perCall)
			require.Less(t, perCall, uint64(512<<10), "a call of a short answer allocated %d bytes", perCall)
		})
	}
}

// A line longer than any that is read fails the call once that much of it
// has been read, however long it goes on: memory grows to the bound, and
// no further.
func TestChatLineOverTheBoundIsNotReadOn(t *testing.T) {
	s := &bigChunk{before: 2, bytes: 64 << 20, after: []string{ollamaFinal}}
	srv := newFakeOllama(t, s.chat)
	var read atomic.Int64
	hc := &http.Client{Transport: countingTransport{srv.Client().Transport, &read}}
	streamed := 0
	resp, err := New(srv.URL, hc).Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error {
		streamed++
		return nil
	})
	require.Nil(t, resp)
	var me *models.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, models.Stream, me.Kind, "error: %v", err)
	require.False(t, models.IsTransient(err), "the same call would stop at the same line")
	require.Contains(t, err.Error(), "a line of the stream is longer than the 8 MB")
	require.Equal(t, 2, streamed, "the lines before it were streamed")
	require.Less(t, read.Load(), int64(maxStreamLine+1<<20), "the client read %d bytes of the stream", read.Load())
}

// A connection that drops in the middle of a line is dropped as one that
// drops between lines is: worth a retry, not a line to quote as the
// server's error.
func TestChatDroppedMidLine(t *testing.T) {
	plain := fixtureLines(t, "plain.ndjson")
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		fmt.Fprint(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, line := range plain[:2] {
			fmt.Fprintf(buf, "%x\r\n%s\n\r\n", len(line)+1, line)
		}
		half := plain[2][:len(plain[2])/2]
		fmt.Fprintf(buf, "%x\r\n%s\r\n", len(half), half)
		_ = buf.Flush()
	})
	chunks := 0
	resp, err := New(srv.URL, srv.Client()).Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error {
		chunks++
		return nil
	})
	require.Nil(t, resp)
	require.ErrorIs(t, err, models.ErrDropped, "error: %v", err)
	require.True(t, models.IsTransient(err))
	require.Equal(t, 2, chunks)
}

// lineReader splits a stream into the lines bufio.ScanLines makes of it,
// whether a line fits its buffer or is gathered from many reads of it.
func FuzzLineReaderSplitsAsScanLines(f *testing.F) {
	for _, name := range []string{"plain.ndjson", "tool_calls.ndjson"} {
		f.Add(readFixture(f, name))
	}
	f.Add([]byte("a\r\nb\n\n\rc\r"))
	f.Add([]byte("no newline at the end, and longer than a buffer of sixteen bytes"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want [][]byte
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, len(b)+1)
		for sc.Scan() {
			want = append(want, append([]byte{}, sc.Bytes()...))
		}
		require.NoError(t, sc.Err())

		// The smallest buffer bufio allows, so that most lines are gathered.
		lines := lineReader{r: bufio.NewReaderSize(bytes.NewReader(b), 16), max: len(b)}
		var got [][]byte
		for {
			line, err := lines.next()
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			got = append(got, append([]byte{}, line...))
		}
		require.Equal(t, want, got)
	})
}

// A line longer than the bound is refused, and one as long as the bound
// is read.
func TestLineReaderBound(t *testing.T) {
	for _, tc := range []struct {
		stream  string
		max     int
		lines   []string
		tooLong bool // the stream ends at a line too long, not at its end
	}{
		{"abcd\nefgh\n", 4, []string{"abcd", "efgh"}, false},
		{"abcd\r\nefgh", 5, []string{"abcd", "efgh"}, false},
		{"abcd\nefghi\nj\n", 4, []string{"abcd"}, true},
		{strings.Repeat("x", 40) + "\n", 39, nil, true},
		{strings.Repeat("x", 40), 40, []string{strings.Repeat("x", 40)}, false},
	} {
		lines := lineReader{r: bufio.NewReaderSize(strings.NewReader(tc.stream), 16), max: tc.max}
		var got []string
		var err error
		for {
			var line []byte
			if line, err = lines.next(); err != nil {
				break
			}
			got = append(got, string(line))
		}
		require.Equal(t, tc.lines, got, "%q", tc.stream)
		if tc.tooLong {
			require.Equal(t, errLineTooLong{tc.max}, err, "%q", tc.stream)
		} else {
			require.ErrorIs(t, err, io.EOF, "%q", tc.stream)
		}
	}
}

// Ollama writes one object a line and no blank lines, but something between
// it and the appliance (a proxy's keep-alive, a server that writes \r\n
// twice) may: a blank or white-space-only line holds no object and is
// passed over, in an answer and in an error's body alike.
func TestChatPassesOverBlankLines(t *testing.T) {
	want := expectFixture(t, "plain.ndjson")
	plain := fixtureLines(t, "plain.ndjson")
	blanks := []string{"", "   ", "\t", "\r", " \r"}
	srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i, line := range plain {
			fmt.Fprintf(w, "%s\n%s\n", blanks[i%len(blanks)], line)
			w.(http.Flusher).Flush()
		}
	})
	chunks := 0
	resp, err := New(srv.URL, srv.Client()).Chat(context.Background(), chatRequestFor("llama3.2"), func(models.Chunk) error {
		chunks++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, want.content, resp.Message.Content)
	require.Equal(t, want.doneReason, resp.DoneReason)
	require.Equal(t, want.completionTokens, resp.CompletionTokens)
	require.Equal(t, want.chunks, chunks)

	for name, body := range map[string]string{
		"blank line before the error": "\n  \n" + `{"error":"llama runner process has terminated: signal: killed"}` + "\n",
		"blank lines only":            "\n \n\t\n",
	} {
		t.Run(name, func(t *testing.T) {
			srv := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(body))
			})
			_, err := New(srv.URL, srv.Client()).Chat(context.Background(), chatRequestFor("llama3.2"), nil)
			var me *models.Error
			require.ErrorAs(t, err, &me)
			require.Equal(t, models.Server, me.Kind, "error: %v", err)
			require.NotEmpty(t, strings.TrimSpace(me.Err.Error()), "error: %v", err)
			if strings.Contains(body, "error") {
				require.Contains(t, err.Error(), "llama runner process has terminated")
			} else {
				require.Contains(t, err.Error(), "no error message")
			}
		})
	}
}

// A line of a 2xx stream that is not an answer fails the call with an error
// that says so, whatever the line holds: never with the bare line, which may
// be nothing an operator can read.
func TestChatUndecodableLineIsNamed(t *testing.T) {
	plain := fixtureLines(t, "plain.ndjson")
	for name, bad := range map[string]string{
		"not JSON":          "data: [DONE]",
		"JSON, no object":   `"keep-alive"`,
		"a wrong field":     `{"model":"llama3.2","message":"If","done":false}`,
		"control character": "\x00\x01",
	} {
		t.Run(name, func(t *testing.T) {
			chunks, err := failingStream(t, plain[0], []byte(bad), plain[len(plain)-1])
			require.Equal(t, 1, chunks, "the line before it was streamed")
			require.Regexp(t, `failed mid-answer: a line of the stream is not a (JSON object|chat answer)`, err.Error())
		})
	}
}
