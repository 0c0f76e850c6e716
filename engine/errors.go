package engine

import (
	"errors"
	"fmt"
)

// Sentinel errors, grouped by phase. Test for them with errors.Is.
var (
	// Building and compiling graphs.
	ErrInvalidGraph = errors.New("invalid graph")

	// Running.
	ErrStepLimit = errors.New("step limit reached")
	// ErrBudgetExceeded, returned (wrapped) by a node, ends the run as
	// budget_exceeded instead of failed: tokens, tool-loop iterations.
	ErrBudgetExceeded   = errors.New("budget exceeded")
	ErrDeadline         = errors.New("run wall-time budget exceeded")
	ErrUnknownChannel   = errors.New("write to an undeclared channel")
	ErrWrongType        = errors.New("value has the wrong type for its channel")
	ErrCancelled        = errors.New("run cancelled")
	ErrRejected         = errors.New("rejected by operator")
	ErrNotInterrupted   = errors.New("run is not interrupted")
	ErrUnknownInterrupt = errors.New("no such pending interrupt")
	ErrBadDecision      = errors.New("decision must be approve, edit or reject")
	// ErrBadDurability refuses a durability other than sync or exit, in a
	// RunConfig, ManagerOptions or a stored run record.
	ErrBadDurability = errors.New("durability must be sync or exit")

	// Storage.
	ErrCheckpointNotFound = errors.New("checkpoint not found")
	ErrBlobNotFound       = errors.New("blob not found")
	ErrBlobCollision      = errors.New("blob digest collision: different bytes share a digest")
	ErrRunNotFound        = errors.New("run not found")
	// ErrRunSummary refuses to commit a run whose input or output is a
	// listing's preview (Run.IsSummary): it would replace the value.
	ErrRunSummary = errors.New("run holds a preview of its input or output, not the value")

	// Run manager.
	ErrThreadBusy    = errors.New("thread already has an active run")
	ErrUnknownAgent  = errors.New("unknown agent")
	ErrManagerClosed = errors.New("run manager is closed")
	// ErrCrashLoop ends a run that was recovered after a crash
	// ManagerOptions.MaxRecoveries times in a row, without making
	// progress in between: it is not run again (see Manager.Recover).
	ErrCrashLoop = errors.New("crash loop")
	// ErrBundleUnavailable, wrapped in a Resolver's error, says that the
	// bundle a run is pinned to is not on disk as it was pinned, and that
	// putting it back as it was (the same bundle installed again) lets
	// the run go on. Recover leaves a run left running on such a bundle
	// as it is, to resume at a later start, rather than failing it (see
	// Manager.Held).
	ErrBundleUnavailable = errors.New("pinned bundle unavailable")
)

// ErrorKind sorts node errors for the retry policy.
type ErrorKind int

// Error kinds.
const (
	// Permanent errors are not retried. Unclassified errors are permanent,
	// so a node with side effects is never re-run by accident.
	Permanent ErrorKind = iota
	// Transient errors (a dropped connection, a busy service) are retried.
	Transient
	// Timeout errors come from a node's own timeout and are retried.
	Timeout
)

func (k ErrorKind) String() string {
	switch k {
	case Transient:
		return "transient"
	case Timeout:
		return "timeout"
	}
	return "permanent"
}

type kindError struct {
	kind ErrorKind
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }
func (e *kindError) Unwrap() error { return e.err }

// MarkTransient marks err as worth retrying.
func MarkTransient(err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: Transient, err: err}
}

// MarkPermanent marks err as not worth retrying.
func MarkPermanent(err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: Permanent, err: err}
}

// KindOf classifies err: an explicit mark wins, then a node timeout; anything
// else is permanent.
func KindOf(err error) ErrorKind {
	var ke *kindError
	if errors.As(err, &ke) {
		return ke.kind
	}
	var te *nodeTimeoutError
	if errors.As(err, &te) {
		return Timeout
	}
	return Permanent
}

type nodeTimeoutError struct {
	node string
	d    fmt.Stringer
}

func (e *nodeTimeoutError) Error() string {
	return fmt.Sprintf("node %q timed out after %s", e.node, e.d)
}

// NodeError is how a run fails because of one node: it names the node, the
// number of attempts and the kind of the last error.
type NodeError struct {
	Node     string
	Attempts int
	Kind     ErrorKind
	Err      error
}

func (e *NodeError) Error() string {
	if e.Attempts > 1 {
		return fmt.Sprintf("node %q failed after %d attempts (%s): %v", e.Node, e.Attempts, e.Kind, e.Err)
	}
	return fmt.Sprintf("node %q failed (%s): %v", e.Node, e.Kind, e.Err)
}

func (e *NodeError) Unwrap() error { return e.Err }

// refusalError is a node's refusal of a person's decision (CheckDecision):
// an ErrBadDecision that gives the node's reason, not the sentinel's words
// about the decision's kind, which the person did choose well.
type refusalError struct {
	node, kind string
	err        error
}

func (e *refusalError) Error() string {
	return fmt.Sprintf("node %q refuses this %s: %v", e.node, e.kind, e.err)
}

func (e *refusalError) Unwrap() []error { return []error{ErrBadDecision, e.err} }

// CompileError lists every problem Compile found.
type CompileError struct {
	Graph    string
	Problems []string
}

func (e *CompileError) Error() string {
	s := fmt.Sprintf("graph %q: %d problem(s):", e.Graph, len(e.Problems))
	for _, p := range e.Problems {
		s += "\n  - " + p
	}
	return s
}

func (e *CompileError) Unwrap() error { return ErrInvalidGraph }
