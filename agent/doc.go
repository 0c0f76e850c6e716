// Package agent provides the built-in nodes agents are made of: a model call
// that records every response, and the tool loop (model → tool calls →
// policy check → execute → neutralize → re-prompt) that makes side effects
// safe across crashes, plus the built-in tools a bundle can name.
//
// The entry points:
//
//   - CallLog is what the tool loop needs to make side effects safe: an
//     intent recorded before each call and its result after, under an
//     idempotency key made from run, step, task and call index.
//     NewMemoryCallLog serves tests; internal/wiring adapts the bbolt store.
//   - ModelCall calls a models.Provider within the agent's lane, streams
//     tokens as live model.token events, stores each response as a blob and
//     records it in the CallLog before the node's writes are returned, so a
//     re-executed task reuses the response instead of asking the model again.
//     Every call, failed ones included, counts against the run's token
//     budget, shared by all the run's calls (RunMeter).
//   - ToolLoop (a LoopConfig) returns an engine.NodeFunc running the loop.
//     Every call is checked against the run's pinned policy.ActiveSet, write
//     tools go through policy.Approval (an engine interrupt when the answer
//     is "ask"), results pass through policy.Neutralize, a tool's error is
//     recorded but the model is told only that the call failed (and the
//     turn marked, LoopConfig.Failed), and the iteration and token budgets
//     end the run as budget_exceeded.
//   - Tool is a tool implementation. KBSearch, CurrentTime, RecordNote,
//     ScheduleFollowup and HTTPTool are the built-in ones; each has its
//     policy.Tool registry entry (Def).
//
// On recovery a recorded result is reused; an intent without a result is run
// again only for a tool declared idempotent (with the same key); for any
// other tool the run pauses with an interrupt whose payload's reason is
// "uncertain_side_effect", and a person decides. A CallLog that may have
// lost records of a run (LostCalls: a store salvaged after damage) has the
// same question asked about a call of such a tool that has no record and
// may have run before. ExampleToolLoop shows a whole turn.
package agent
