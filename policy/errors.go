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

// ItemError is an error in one item of a bundle's policy file. Path is the
// item's JSON path ("tools.2", "red_flags.1", "citations"), so that a
// caller holding the file can say at which line it stands; the message is
// Err's alone.
type ItemError struct {
	Path string
	Err  error
}

func (e *ItemError) Error() string { return e.Err.Error() }
func (e *ItemError) Unwrap() error { return e.Err }

// itemError wraps err as the error of the item at path.
func itemError(path string, err error) error { return &ItemError{Path: path, Err: err} }
