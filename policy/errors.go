package policy

import "errors"

// Sentinel errors, grouped by phase. Test for them with errors.Is; the
// errors returned by this package wrap them with the details (which tool,
// which layer, which JSON path, which budget).
var (
	// Loading bundle data: a registry, a schema, guardrail rules, a
	// redaction policy or a lane that cannot be used as written. Bundle data
	// is refused whole rather than half-applied, so a typo never turns into
	// a missing rule.
	ErrBadRule = errors.New("bad policy rule")

	// Checking a tool call.
	ErrToolUnknown      = errors.New("unknown tool")
	ErrToolDenied       = errors.New("tool not in the active tool set")
	ErrArgsInvalid      = errors.New("tool arguments do not match the schema")
	ErrApprovalRequired = errors.New("tool call needs approval")

	// Running.
	ErrBudgetExceeded = errors.New("budget exceeded")
	ErrModelNotInLane = errors.New("model not in the agent's lane")
)
