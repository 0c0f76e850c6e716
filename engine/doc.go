// Package engine is Outpost's graph runtime: agents written as explicit
// graphs of named steps, run in supersteps, checkpointed after every step,
// paused for people and resumed, even after a restart. It can be used alone,
// as a library, the way LangGraph's StateGraph is.
//
// The entry points:
//
//   - NewGraph starts a Builder. Declare the graph's state as typed channels
//     with Replace, Append, Merge, Sum or Custom (each returns a Chan[T] to
//     read with Get and write with Set or Push), add nodes with AddNode and
//     AddSubgraph, and wire them with AddEdge, AddConditionalEdge and
//     AddFanout between Start and End.
//   - Builder.Compile validates the graph and reports every problem at once
//     (a *CompileError wrapping ErrInvalidGraph). InterruptBefore and
//     InterruptAfter add static pauses for debugging.
//   - Graph.Invoke runs a turn on a thread; Graph.Resume continues it after
//     an interrupt, a failure or a crash. History, StateAt, Fork and
//     UpdateState travel in a thread's past.
//   - Interrupt pauses a running node for a person's Decision (approve, edit
//     or reject); Emit publishes live progress events from a node.
//   - MemoryStore is the in-memory Checkpointer, BlobStore and RunStore; the
//     durable one lives in package store.
//   - Bus fans events out to subscribers, after the state they describe has
//     been committed, and never blocks on a slow one.
//   - NewManager runs agents on a bounded worker pool, one active run per
//     thread, and recovers runs left running by a crash, except a run that
//     crashed the process at each of its last MaxRecoveries recoveries. A
//     run recovered a second time in a row, or one crash short of the
//     limit, has a turn alone (of MaxAlone at most), so that a crash
//     counts against the run that caused it, not the ones beside it (see
//     Manager.Recover). A manager recovers before it takes a run of its
//     own: Start, Invoke, Resume and Cancel wait for that pass, and run it when
//     Recover has not been called, so that a new run never takes the
//     thread of a crashed one.
//
// The examples are the best way to understand the package: start with
// ExampleGraph_Invoke and ExampleInterrupt.
//
// A node may run more than once: after a crash, after a retryable error, and
// after an interrupt. On resume, a node that called Interrupt runs again from
// its start, and Interrupt then returns the decision instead of pausing. Code
// before an Interrupt call must therefore be idempotent: compute, read, and
// prepare there, but perform side effects only after the decision (and use
// InfoFrom for idempotency keys when a side effect may repeat). Call
// EnsureDurable before a side effect: in exit durability nothing of a run
// may be committed yet, and a crash would otherwise leave the effect
// behind a run that recovery does not know.
package engine
