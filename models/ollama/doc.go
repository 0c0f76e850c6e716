// Package ollama is the models.Provider for a local Ollama server, built on
// github.com/ollama/ollama/api's types. It streams /api/chat itself, into
// memory that grows to the longest line of the answer and no further (where
// api.Client makes an 8 MB line buffer for every call), and lists models
// with api.Client.
//
// [New] returns a [Client] for a base URL (http://127.0.0.1:11434 when
// empty), and [NewWithOptions] one with [Options]: a keep-alive sent with
// every call (so that the model stays loaded between turns) and the stall
// timeout between chunks. [Client.Chat] streams /api/chat with tools, a
// JSON-schema format, sampling options, keep-alive, thinking and a
// per-call timeout, and reads the token counts from the final chunk.
// [Client.Ping] and [Client.HasModel] use /api/tags for health checks.
//
// Every failure is a *models.Error: a 404 for the model names the "ollama
// pull" command (a 404 for the path says the URL is not Ollama's), a
// refused connection names the URL, a timeout, a stream that stalls between
// chunks or a connection dropped mid-stream, even within a line, is
// transient (a line longer than the 8 MB read of a line is not), and an
// answer cut at the token limit (done_reason "length") is a Truncated
// error, never a complete answer. So is a line of the stream longer than an
// answer capped at the request's Options.MaxOutputTokens takes (many tokens
// in one chunk, or the whole answer in one line): it is not read on, so the
// cap holds before the line is in memory. An error status's body holds no
// answer: it is read as the error, capped or not, and an error status with
// an empty body is the server's error too, not a stream that was dropped.
// The tests replay Ollama's NDJSON streams recorded under testdata/ollama;
// run them with -update next to a real Ollama to record fresh ones.
package ollama
