package uplink

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Sentinel errors, grouped by side. Test for them with errors.Is.
var (
	// Sending.

	// ErrNotConfigured means the uplink has no collector URL or secret.
	ErrNotConfigured = errors.New("uplink is not configured")
	// ErrParked means the collector refused a batch for good (a 4xx other
	// than 408 and 429): the batch is kept, and sending stops until the
	// cause is fixed and Flush is called (or the parked retry comes round).
	ErrParked = errors.New("batch parked: the collector refused it")
	// errResend: the collector answered a gap before the cursor; the next
	// batch goes from its expected seq, at once.
	errResend = errors.New("the collector lost acknowledged outcomes; resending them")

	// Receiving.

	// ErrMalformed means a batch or record is not in the wire format.
	ErrMalformed = errors.New("malformed batch")
	// ErrUnknownAppliance means the collector has no secret for the
	// appliance a batch names.
	ErrUnknownAppliance = errors.New("unknown appliance")
	// ErrSignature means a batch's HMAC does not match its body.
	ErrSignature = errors.New("bad signature")
	// ErrChain is matched by every *ChainError.
	ErrChain = errors.New("chain verification failed")
)

// Chain error codes, as sent in the collector's error answers.
const (
	// CodeGap: the batch starts past the collector's next expected seq.
	CodeGap = "gap"
	// CodeFork: a seq the collector already holds arrived with another hash.
	CodeFork = "fork"
	// CodeBadLink: a record's prev_hash is not the hash of the one before.
	CodeBadLink = "bad_link"
	// CodeBadHash: a record does not match its own hash (it was altered).
	CodeBadHash = "bad_hash"
)

// ChainError is a batch the collector refused because it would break an
// appliance's chain. Seq names the record at fault; Expected is the next
// seq the collector wants (for a gap).
type ChainError struct {
	Code     string
	Seq      uint64
	Expected uint64
	Msg      string
}

func (e *ChainError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrChain) true for every ChainError.
func (e *ChainError) Is(target error) bool { return target == ErrChain }

// HTTPStatus is the status a collector answers a ChainError with: 409 for a
// gap or a fork (the batch conflicts with what is stored), 422 for a bad
// hash or link (the batch itself is wrong).
func (e *ChainError) HTTPStatus() int {
	if e.Code == CodeGap || e.Code == CodeFork {
		return http.StatusConflict
	}
	return http.StatusUnprocessableEntity
}

// StatusError is a collector's answer other than 200.
type StatusError struct {
	StatusCode int
	Code       string // the error code of the collector's JSON answer, if any
	Message    string
}

func (e *StatusError) Error() string {
	status := strconv.Itoa(e.StatusCode)
	if e.Code != "" {
		status += " " + e.Code
	}
	msg := e.Message
	if msg == "" {
		// An answer with no body (a web server or proxy in place of the
		// collector, most often) still says what answered.
		msg = "an empty answer"
		if text := http.StatusText(e.StatusCode); text != "" {
			msg = text + ", with an empty answer"
		}
	}
	if e.StatusCode == http.StatusNotFound && e.Code == "" {
		// Not the collector's own answer, which names a code: the URL
		// leads to something that has no /v1/outcomes.
		msg += " (nothing at this URL takes outcomes: check that it is the collector's base URL, the address outpost collector --listen serves)"
	}
	return fmt.Sprintf("collector answered %s: %s", status, msg)
}

// retriable reports whether a status is worth sending again unchanged.
func retriable(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}
