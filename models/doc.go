// Package models is the one seam through which Outpost calls a language model.
//
// Every model call goes through [Provider.Chat]: a [Request] (messages, tool
// definitions, an optional output schema, sampling options and a per-call
// timeout) in, a [Response] (the assistant [Message], its tool calls and the
// tokens used) out, with the answer streamed as [Chunk]s to an optional
// callback that can stop the stream by returning an error.
//
// Implementations live in subpackages:
//
//   - models/ollama talks to a local Ollama server.
//   - models/scripted answers from deterministic rules, for demos, tests and
//     the offline eval; it always names itself "scripted".
//   - models/replay returns the responses recorded for an earlier run, so an
//     audit can re-execute that run exactly.
//   - models/modelstest holds the conformance suite every Provider passes.
//
// A request's answer cap (Options.MaxOutputTokens) is asked of the
// provider; [ChatCapped] also holds the provider to it, counting the
// answer low as it streams ([AnswerFloor]: a token a chunk, or a third of
// the estimate of [EstimateTokens], which is made to count high for every
// script, with a run of one symbol counted a token per 16) and stopping the call once the answer passes the cap. Token budgets count with [Spent]: the server's counts, or that
// estimate where it gives none.
//
// Failures are [*Error] values whose [ErrorKind] says what went wrong and whose
// message says what to do about it. [IsTransient] tells a retry policy which
// of them are worth another attempt; [ErrModelNotFound], [ErrUnreachable],
// [ErrTimeout] and [ErrTruncated] work with errors.Is.
//
// Responses are stored by the caller as blobs: [EncodeResponse] and
// [DecodeResponse] give them a versioned, strictly decoded JSON form, and
// [HashRequest] fingerprints the request that produced them so a replay can
// tell when a re-executed run asks something different.
package models
