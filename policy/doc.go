// Package policy decides what an agent may do: which tools a run may call
// and with what arguments, which calls need a person, what a model may read
// back from a tool, what may leave the appliance, how much a run may
// consume, and which models an agent may use. It imports nothing else of
// Outpost's; firmware loads its rules from a bundle and the engine consults
// it on every call. Everything here fails closed: what cannot be checked is
// refused, with an error that says which rule refused it.
//
// The entry points:
//
//   - DecodeRegistry or NewRegistry build the tool registry, the ceiling of
//     every run's tools. Resolve narrows it by the agent's allowlist, the
//     appliance's runtime restriction and the request's override, in that
//     order, into an ActiveSet, which is pinned on the run (MarshalJSON,
//     DecodeActiveSet). ActiveSet.Check judges each call and names the
//     layer that denied it: "registry", "agent", "appliance", "request" or
//     "schema".
//   - CompileSchema and Schema.Validate check tool arguments against a JSON
//     Schema subset, reporting JSON paths ("$.query: want string, got
//     number").
//   - Approval (and Decide, OperatorDecision) decide whether a write tool may
//     run: allow, ask an operator, or deny, with an ApprovalRecord of who
//     decided and why. Once untrusted text has entered a run, every write
//     asks.
//   - Neutralize prepares a tool result for a model: it strips invisible and
//     control characters, caps the length, wraps the text in data markers
//     with a per-call nonce, and flags text that looks like instructions.
//     Put SpotlightInstruction in the system prompt.
//   - DecodeRules loads guardrails: Rules.Pre screens input for red flags
//     and scope, Rules.Citations and Rules.HighRisk check a draft's
//     citations against what was retrieved.
//   - NewRedactor masks phone numbers, e-mail addresses, SSNs, MRNs, dates
//     of birth and street addresses (Redactor.Redact), and keeps only the
//     listed fields of outgoing records (Redactor.RedactJSON);
//     RedactionPolicy.CheckFields refuses a field no record has.
//   - NewTracker counts steps, tool iterations, tokens and wall time against
//     a Budget, returning a *BudgetError when one is exceeded.
//   - NewTokenMeter counts one run's tokens across concurrent model calls:
//     Reserve before a call (its prompt and the cap on its answer, waiting
//     while calls in flight hold the room), Settle after it.
//   - Lane.Allow keeps an agent to its models.
//
// The examples are the best way to understand the package: start with
// ExampleResolve and ExampleNeutralize.
package policy
