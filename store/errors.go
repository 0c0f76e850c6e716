package store

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Sentinel errors, grouped by phase. Test for them with errors.Is.
var (
	// Opening.

	// ErrInUse means another process (or another Open in this one) holds the
	// store's file lock. The wrapped message names the data folder.
	ErrInUse = errors.New("in use by another outpost process")
	// ErrFormat means the file is not an Outpost store, or is one of a
	// format version this binary does not read.
	ErrFormat = errors.New("unsupported store format")
	// ErrBucketsMissing means a read-only open refused a store of the
	// format this binary reads that lacks a bucket a later binary added
	// (a backup an older binary made, say): a writable open adds it. It
	// is an ErrFormat too, but not one of an incompatible version.
	ErrBucketsMissing = errors.New("store lacks buckets that a writable open adds")
	// ErrOlderFormat means a read-only open refused a store of an older
	// format version that this binary upgrades at the first writable open
	// (format 2, whose blobs must be moved before they can be read). It
	// is an ErrFormat too, but not one of an incompatible version.
	ErrOlderFormat = errors.New("store of an older format that a writable open upgrades")
	// ErrDamaged means the store file's pages are not whole: it was cut
	// short, or a page was overwritten; or the file holds nothing of a
	// store at all (empty, all zeros). The wrapped message names the
	// first fault found. Nothing in the file is changed.
	ErrDamaged = errors.New("store file is damaged")
	// ErrClosed is returned by operations on a closed store.
	ErrClosed = errors.New("store is closed")

	// Writing.

	// ErrInvalidKey means a thread, namespace or ID cannot be used in a
	// key: it is empty where a value is required, or holds a NUL byte,
	// which separates the parts of composite keys.
	ErrInvalidKey = errors.New("invalid key")
	// ErrBlobMismatch means a commit offered bytes under a reference that
	// is not theirs.
	ErrBlobMismatch = errors.New("blob bytes do not match their reference")
	// ErrWriteFailed means writing or fsyncing a transaction failed (a
	// disk error, a full disk). Whether that transaction reached the disk
	// is unknown, and the open store's view of its own pages can no longer
	// be trusted, so it takes no more writes; reads go on. Restarting
	// outpost, once the disk is sound, goes on from what the file holds.
	ErrWriteFailed = errors.New("a write to the store file failed; the store takes no more writes until outpost restarts")

	// Tool calls.

	// ErrToolCallNotFound means no intent is recorded under the key.
	ErrToolCallNotFound = errors.New("tool call not found")
	// ErrToolCallConflict means a second record under the same idempotency
	// key disagrees with the first (another tool, other arguments, another
	// result).
	ErrToolCallConflict = errors.New("tool call conflicts with the recorded one")
	// ErrToolCallDone means an intent was offered for a call whose result
	// is already recorded: the caller must reuse the result, not run the
	// tool again.
	ErrToolCallDone = errors.New("tool call already has a result")

	// The outcome ledger.

	// ErrApplianceID means an appliance id was refused: the ledger already
	// holds outcomes chained under another one.
	ErrApplianceID = errors.New("appliance id cannot change")
	// ErrCursorAhead means the uplink cursor was asked to move past the
	// ledger's last outcome.
	ErrCursorAhead = errors.New("uplink cursor past the last outcome")

	// Reading.

	// ErrHollow is matched, with ErrDamaged, by a store file that holds
	// nothing of a store (empty, all zeros, shorter than its meta pages):
	// there is nothing in it to salvage.
	ErrHollow = errors.New("the store file holds nothing of a store")
	// ErrCorrupt is matched by every *CorruptError.
	ErrCorrupt = errors.New("corrupt record")
)

// CorruptError reports a stored record that failed to decode: a bad
// checksum, an unknown version, a truncated or overlong payload. It names
// the record so an operator can find it (outpost db check lists them all).
type CorruptError struct {
	Bucket string
	Key    string // the raw key bytes
	Err    error
}

// Error names the record and the way out. It is written here, once for
// every read that meets a corrupt record, because the error reaches the
// operator through whatever made the read (listing runs, starting serve),
// which cannot say more; db check, which names such records itself, and
// Salvage report the decoding error alone.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("corrupt record in bucket %s, key %s: %v (run outpost db check; "+
		"outpost db salvage --data DIR FILE copies what can still be read)", e.Bucket, renderKey(e.Bucket, []byte(e.Key)), e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrCorrupt) true for every CorruptError.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

func corrupt(bucket string, key []byte, err error) *CorruptError {
	return &CorruptError{Bucket: bucket, Key: string(key), Err: err}
}

// renderKey prints a key for people and for JSON (Problem.Key, a
// CorruptError's message): blob keys as references, outcome keys as seq
// numbers, pending-write keys as their quoted prefix and sequence number,
// and the rest as keyText shows them. A key of a bucket with its own form
// that does not parse is quoted, so that it cannot pass for that form.
func renderKey(bucket string, key []byte) string {
	switch bucket {
	case bucketBlobLog:
		if seq, ref, ok := parseBlobLogKey(key); ok {
			return ref.String() + " #" + strconv.FormatUint(seq, 10)
		}
		return strconv.Quote(string(key))
	case bucketBlobIndex:
		if ref, ok := parseBlobKey(key); ok {
			return ref.String()
		}
		return strconv.Quote(string(key))
	case bucketOutcomes:
		if len(key) == 8 {
			return "seq " + strconv.FormatUint(beUint64(key), 10)
		}
		return strconv.Quote(string(key))
	case bucketWrites:
		if len(key) > 8 {
			return strconv.Quote(string(key[:len(key)-8])) + "#" +
				strconv.FormatUint(beUint64(key[len(key)-8:]), 10)
		}
		return strconv.Quote(string(key))
	}
	return keyText(key)
}

// keyText is key as it is when it is printable text (a run ID, a tool
// call's idempotency key), and Go-quoted when it holds anything else: a
// NUL separator, a control byte, bytes that are not UTF-8. A printable key
// that begins with a quote is quoted too, so that the two forms never
// meet. Quoting every key made JSON output quote twice
// ("key": "\"run_1\"").
func keyText(key []byte) string {
	if len(key) > 0 && key[0] != '"' && utf8.Valid(key) &&
		!bytes.ContainsFunc(key, func(c rune) bool { return !strconv.IsPrint(c) }) {
		return string(key)
	}
	return strconv.Quote(string(key))
}
