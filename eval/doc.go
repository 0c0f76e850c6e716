// Package eval replays golden conversations against an agent and reports
// where its behaviour differs from what the conversations expect. It is what
// "outpost eval" runs, and what makes the reference bundle's conversations
// part of "make test".
//
// A golden file is JSONL, one conversation a line, in the format DESIGN.md
// fixes ("Golden conversations"). Each turn gives an input and, optionally,
// what the run must produce: the exact node path, the exact set of flags,
// the tools called in order, text the final answer contains or a regular
// expression it matches, the run's status and the node of its pending
// interrupt; and a decision to resume an interrupted turn with, and what the
// run must produce after it. Every expectation is optional; one that is given
// must match.
//
// The entry points:
//
//   - Load and Decode read golden files strictly: an unknown field, a bad
//     decision or status, or a regular expression that does not compile is
//     an error naming the file, line and field.
//   - Run replays conversations through an engine.Manager on a fresh
//     engine.MemoryStore each, resolving agents with any engine.Resolver
//     (the embedded reference bundle, a bundle loaded from disk, or a graph
//     built in Go), several conversations at once.
//   - Report holds a Case per conversation with the first difference of each
//     failure ("turn 2: path differs at index 3: want review_response, got
//     guardrail_post"); WriteTable prints it for people and WriteJSON for
//     machines.
//
// The examples and tests are the best way to understand the package: start
// with ExampleRun, then TestRunPassesAndFails, which shows the message for
// every kind of difference against a small graph built in Go.
package eval
