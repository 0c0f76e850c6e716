package firmware

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outpost-edge/outpost/policy"
)

// Sentinel errors, grouped by phase. Test for them with errors.Is; the
// errors returned by this package wrap them with the file, position, node or
// version concerned.
var (
	// Checking a bundle: signature first, then the files it lists.
	ErrBundleSignature = errors.New("bad bundle signature")
	ErrUnknownKey      = errors.New("bundle signed by an unknown key")
	ErrHashMismatch    = errors.New("file does not match its sha256 in the manifest")
	ErrMissingFile     = errors.New("file listed in the manifest is missing")
	ErrUnlistedFile    = errors.New("file not listed in the manifest")
	ErrPathEscape      = errors.New("path escapes the bundle")

	// Reading what a bundle holds: manifest, graphs, rules and the rest.
	// Malformed errors are *FileError values that carry the line and column.
	ErrMalformed        = errors.New("malformed bundle file")
	ErrUnknownNodeKind  = errors.New("unknown node kind")
	ErrMinVersion       = errors.New("bundle needs a newer appliance")
	ErrUnknownAgent     = errors.New("unknown agent")
	ErrDuplicateKind    = errors.New("node kind already registered")
	ErrKeyFile          = errors.New("bad key file")
	ErrVersionInstalled = errors.New("bundle version already installed with different contents")

	// Installing and running.
	ErrDowngrade      = errors.New("bundle version is lower than one already installed")
	ErrNotInstalled   = errors.New("bundle version not installed")
	ErrInUse          = errors.New("bundle version is in use")
	ErrNoActive       = errors.New("no active bundle")
	ErrPinnedMismatch = errors.New("pinned bundle changed on disk")
	// ErrUnexplained is a removal that does not say who removes the
	// version and why, which the firmware log records.
	ErrUnexplained = errors.New("a removal needs who removes the version and why")
	// ErrPinnedMissing is ErrPinnedMismatch where the bundle a run is
	// pinned to is not on disk at all.
	ErrPinnedMissing error = &kindError{text: "pinned bundle not on disk", kind: ErrPinnedMismatch}
)

// FileError locates a problem in a bundle file: the file, the line and
// column (1-based, 0 when unknown) and the node it concerns, if any. Err
// wraps the sentinel (ErrMalformed, ErrUnknownNodeKind, ...).
type FileError struct {
	File   string
	Line   int
	Column int
	Node   string
	Err    error
}

func (e *FileError) Error() string {
	s := e.File
	if e.Line > 0 {
		s += fmt.Sprintf(":%d:%d", e.Line, e.Column)
	}
	if e.Node != "" {
		s += fmt.Sprintf(": node %q", e.Node)
	}
	return s + ": " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

// UnknownToolsError refuses a run whose narrower tool set (Meta[MetaTools])
// names tools the run could never have: not in its bundle's registry, or
// left out by the agent's allowlist or by the appliance. Names lists them,
// sorted; Unlisted lists those of them that the registry has and the
// agent's allowlist (GraphSpec.Tools) leaves out, and Appliance those that
// the agent allows and the appliance's restriction (Runtime.Tools) leaves
// out. It wraps policy.ErrToolUnknown.
type UnknownToolsError struct {
	Agent     string
	Names     []string
	Unlisted  []string
	Appliance []string
}

func (e *UnknownToolsError) Error() string {
	who := "the run"
	if e.Agent != "" {
		who = fmt.Sprintf("agent %q", e.Agent)
	}
	return fmt.Sprintf("%s cannot have tool %s here: %s: %v", who, strings.Join(e.Names, ", "), e.Why(), policy.ErrToolUnknown)
}

// Why says what leaves the names out: the bundle's registry, the agent's
// allowlist, the appliance, or (naming them) each for its own.
func (e *UnknownToolsError) Why() string {
	other := map[string]bool{}
	for _, n := range append(slices.Clone(e.Unlisted), e.Appliance...) {
		other[n] = true
	}
	var registry []string
	for _, n := range e.Names {
		if !other[n] {
			registry = append(registry, n)
		}
	}
	switch {
	case len(e.Unlisted) == 0 && len(e.Appliance) == 0:
		return "it is not in its bundle's registry"
	case len(registry) == 0 && len(e.Unlisted) == 0:
		return "this appliance does not allow it"
	case len(registry) == 0 && len(e.Appliance) == 0:
		return "the agent's allowlist leaves it out"
	}
	var parts []string
	if len(registry) > 0 {
		parts = append(parts, "its bundle's registry lacks "+strings.Join(registry, ", "))
	}
	if len(e.Unlisted) > 0 {
		parts = append(parts, "the agent's allowlist leaves out "+strings.Join(e.Unlisted, ", "))
	}
	if len(e.Appliance) > 0 {
		parts = append(parts, "this appliance does not allow "+strings.Join(e.Appliance, ", "))
	}
	return strings.Join(parts[:len(parts)-1], ", ") + ", and " + parts[len(parts)-1]
}

func (e *UnknownToolsError) Unwrap() error { return policy.ErrToolUnknown }

// errMalformedGolden is ErrMalformed as a golden file reports it: outpost
// eval reads golden files of one's own, which no bundle holds, so "bundle
// file" would send the reader looking for a bundle.
var errMalformedGolden = &kindError{text: "malformed golden file", kind: ErrMalformed}

// kindError is a sentinel under another text: errors.Is finds kind.
type kindError struct {
	text string
	kind error
}

func (e *kindError) Error() string { return e.text }
func (e *kindError) Unwrap() error { return e.kind }

// malformed returns a FileError wrapping ErrMalformed at a byte offset of
// data (off < 0 for no position).
func malformed(file string, data []byte, off int, node, format string, args ...any) *FileError {
	return malformedAs(ErrMalformed, file, data, off, node, format, args...)
}

// malformedAs is malformed with the sentinel kind, ErrMalformed or one
// that wraps it.
func malformedAs(kind error, file string, data []byte, off int, node, format string, args ...any) *FileError {
	e := &FileError{File: file, Node: node, Err: fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))}
	if off >= 0 && data != nil {
		e.Line, e.Column = lineCol(data, off)
	}
	return e
}
