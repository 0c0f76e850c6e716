// Package outcomefields names the fields of an outcome record for the
// packages that need them but may not import store, which defines the
// record: firmware checks a bundle's redaction policy against Names, so
// that a policy naming a field no outcome has is refused, not left to keep
// nothing. A test in store holds Names to store.OutcomeFields.
package outcomefields

// Names are the fields of an outcome record that its hash covers (all of
// it but prev_hash and hash), in store.OutcomeFields' order. The uplink
// sends appliance_id, seq and outcome_id in clear whatever the redaction
// policy says; the policy decides of the others.
var Names = []string{
	"appliance_id", "seq", "outcome_id", "correlation_id", "causation_id", "thread", "run", "agent",
	"bundle", "status", "started_at", "ended_at", "steps", "tokens", "model_calls", "tools", "flags",
	"output", "error",
}
