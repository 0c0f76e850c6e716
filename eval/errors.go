package eval

import "errors"

// Sentinel errors. Decoding errors wrap ErrGolden (and, for problems the
// firmware decoder finds, firmware.ErrMalformed); Run's errors describe
// conversations that could not be replayed and land in the Case, not here.
var (
	// ErrGolden marks a golden file that cannot be replayed: malformed
	// JSON, an unknown field, a bad decision, status or regular expression.
	ErrGolden = errors.New("bad golden conversation")
	// ErrFailed is returned by Report.Err when a conversation failed.
	ErrFailed = errors.New("golden conversations failed")
	// ErrNoConversations is returned by Load when the files hold none.
	ErrNoConversations = errors.New("no golden conversations")
)
