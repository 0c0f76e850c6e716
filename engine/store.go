package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// BlobThreshold is the size above which an encoded value is never inlined in a
// checkpoint or a pending write: it is stored once as a blob and referenced by
// its digest (the claim-check pattern).
const BlobThreshold = 512

// BlobRef addresses a blob by content: the xxhash64 of its bytes plus their
// length. Two different payloads that share both are refused when stored
// (ErrBlobCollision), so a reference never silently names the wrong bytes.
type BlobRef struct {
	Hash uint64
	Len  uint32
}

// RefOf computes the reference for data.
func RefOf(data []byte) BlobRef {
	return BlobRef{Hash: xxhash.Sum64(data), Len: uint32(len(data))}
}

// IsZero reports whether r refers to nothing.
func (r BlobRef) IsZero() bool { return r == BlobRef{} }

// String renders r as "xxh64:<16 hex digits>:<length>".
func (r BlobRef) String() string {
	return "xxh64:" + hex16(r.Hash) + ":" + strconv.FormatUint(uint64(r.Len), 10)
}

// ParseBlobRef parses the form written by BlobRef.String.
func ParseBlobRef(s string) (BlobRef, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 || parts[0] != "xxh64" || len(parts[1]) != 16 {
		return BlobRef{}, fmt.Errorf("blob ref %q: want xxh64:<16 hex>:<len>", s)
	}
	h, err := strconv.ParseUint(parts[1], 16, 64)
	if err != nil {
		return BlobRef{}, fmt.Errorf("blob ref %q: %w", s, err)
	}
	n, err := strconv.ParseUint(parts[2], 10, 32)
	if err != nil {
		return BlobRef{}, fmt.Errorf("blob ref %q: %w", s, err)
	}
	return BlobRef{Hash: h, Len: uint32(n)}, nil
}

// MarshalText implements encoding.TextMarshaler.
func (r BlobRef) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *BlobRef) UnmarshalText(b []byte) error {
	v, err := ParseBlobRef(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Value is an encoded channel value or write: inline bytes when small, a blob
// reference when large. Exactly one of Inline and Blob is set (an empty Inline
// with a zero Blob is the JSON "null").
type Value struct {
	Inline []byte
	Blob   BlobRef
}

// ChannelValue is one channel's change recorded in a checkpoint.
type ChannelValue struct {
	Channel string
	Version uint64
	// Delta marks an append channel whose Value holds only the items added
	// since the parent checkpoint; the full value is the concatenation along
	// the parent chain. Other channels always carry their whole value.
	Delta bool
	Value Value
}

// TaskSpec is a task scheduled for the next superstep.
type TaskSpec struct {
	ID   string
	Node string
	// Input is the encoded fan-out argument (a Send's input); empty for tasks
	// that read the shared state only.
	Input []byte
}

// Checkpoint is the committed state after a superstep. It records only the
// channels that changed since its parent, plus the tasks that run next.
type Checkpoint struct {
	Thread   string
	NS       string // "" for the root graph; "parent/node:task" for subgraphs
	ID       string // sortable: later checkpoints have greater IDs
	ParentID string
	RunID    string
	Step     int
	Source   string   // "input", "loop", "update", "fork"
	Nodes    []string // nodes whose writes produced this checkpoint
	Channels []ChannelValue
	Next     []TaskSpec
	Created  time.Time
}

// Checkpoint sources.
const (
	SourceInput  = "input"
	SourceLoop   = "loop"
	SourceUpdate = "update"
	SourceFork   = "fork"
)

// Pending write kinds.
const (
	WriteKindWrites    = "writes"
	WriteKindInterrupt = "interrupt"
	WriteKindResume    = "resume"
	WriteKindError     = "error"
)

// PendingWrite is what one task left against a checkpoint before the next
// checkpoint was committed: its channel writes, an interrupt it raised, the
// resume values it has been given, or its error.
type PendingWrite struct {
	TaskID string
	Node   string
	Kind   string
	Writes []ChannelValue  // Kind == writes: raw (unreduced) writes, in order
	Data   json.RawMessage // interrupt, resume or error details
}

// RunStatus is the lifecycle state of a run.
type RunStatus string

// Run statuses, as named in the HTTP contract.
const (
	StatusQueued         RunStatus = "queued"
	StatusRunning        RunStatus = "running"
	StatusInterrupted    RunStatus = "interrupted"
	StatusCompleted      RunStatus = "completed"
	StatusFailed         RunStatus = "failed"
	StatusCancelled      RunStatus = "cancelled"
	StatusBudgetExceeded RunStatus = "budget_exceeded"
)

// RunStatuses lists every run status, in lifecycle order.
func RunStatuses() []RunStatus {
	return []RunStatus{StatusQueued, StatusRunning, StatusInterrupted, StatusCompleted, StatusFailed,
		StatusCancelled, StatusBudgetExceeded}
}

// Valid reports whether s is one of RunStatuses.
func (s RunStatus) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusInterrupted, StatusCompleted, StatusFailed, StatusCancelled,
		StatusBudgetExceeded:
		return true
	}
	return false
}

// Terminal reports whether a run in status s has ended for good.
func (s RunStatus) Terminal() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusCancelled, StatusBudgetExceeded:
		return true
	}
	return false
}

// BundleRef pins a run to the firmware bundle it started on.
type BundleRef struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	Digest  string `json:"digest"`
}

// PendingInterrupt is an open question to a person, listed on an
// interrupted run.
type PendingInterrupt struct {
	ID      string          `json:"id"`
	Node    string          `json:"node"`
	NS      string          `json:"ns,omitempty"`
	TaskID  string          `json:"task_id,omitempty"`
	Index   int             `json:"index"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Path is the path through the subgraphs of the node that asked, as
// events name it (Event.Node): "team/review" for the node review of the
// subgraph that the node team runs. Node is the bare name, which every
// instance of a subgraph shares with any node of that name elsewhere. It
// is read from NS, whose parts are "node:task" (node names hold neither
// '/' nor ':').
func (p PendingInterrupt) Path() string {
	if p.NS == "" {
		return p.Node
	}
	var b strings.Builder
	for part := range strings.SplitSeq(p.NS, "/") {
		node, _, _ := strings.Cut(part, ":")
		b.WriteString(node)
		b.WriteByte('/')
	}
	return b.String() + p.Node
}

// DecisionRecord is the audit entry for one approve, edit or reject.
type DecisionRecord struct {
	Interrupt string          `json:"interrupt"`
	Decision  string          `json:"decision"`
	Value     json.RawMessage `json:"value,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	By        string          `json:"by,omitempty"`
	At        time.Time       `json:"at"`
}

// Run is one turn on a thread.
type Run struct {
	ID            string             `json:"id"`
	Thread        string             `json:"thread"`
	Agent         string             `json:"agent"`
	Status        RunStatus          `json:"status"`
	Bundle        BundleRef          `json:"bundle"`
	CorrelationID string             `json:"correlation_id"`
	Input         json.RawMessage    `json:"input,omitempty"`
	Output        json.RawMessage    `json:"output,omitempty"`
	Error         string             `json:"error,omitempty"`
	Interrupts    []PendingInterrupt `json:"interrupts,omitempty"`
	Decisions     []DecisionRecord   `json:"decisions,omitempty"`
	Checkpoint    string             `json:"checkpoint,omitempty"`
	// Steps counts the run's supersteps, its subgraphs' (at any depth)
	// included: what RunConfig.StepLimit bounds.
	Steps      int               `json:"steps"`
	Durability Durability        `json:"durability,omitempty"`
	Meta       map[string]string `json:"meta,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	StartedAt  time.Time         `json:"started_at,omitzero"`
	EndedAt    time.Time         `json:"ended_at,omitzero"`
	// InputTruncated and OutputTruncated say that Input or Output is not
	// the value but a short preview of it, a JSON string (or nothing, when
	// the store keeps no preview): a run as a listing with
	// RunFilter.Summary returns it. RunStore.Run returns the whole run.
	// Such a run is never committed (ErrRunSummary).
	InputTruncated  bool `json:"input_truncated,omitempty"`
	OutputTruncated bool `json:"output_truncated,omitempty"`
	// Held, set by the run manager that holds the run (Manager.Held),
	// says that it is not executing though its status is queued or
	// running: a crash left it so, and its pinned bundle is unavailable.
	// It is no part of the record: a store neither keeps nor returns it.
	Held *Hold `json:"held,omitempty"`
}

// Hold says why a run is held (Manager.Held): Reason is the resolver's
// error, which names what is missing and how to put it back, and Bundle
// the bundle the run waits for, the one it is pinned to.
type Hold struct {
	Reason string    `json:"reason"`
	Bundle BundleRef `json:"bundle"`
}

// comesAfter reports whether run id comes after f.After in f's order
// (every id does when After is empty).
func (f RunFilter) comesAfter(id string) bool {
	switch {
	case f.After == "":
		return true
	case f.Desc:
		return id < f.After
	}
	return id > f.After
}

// IsSummary reports whether r holds a preview in place of its input or
// output (see Run.InputTruncated).
func (r *Run) IsSummary() bool { return r.InputTruncated || r.OutputTruncated }

// Clone returns a copy that shares nothing mutable with r. Input and Output
// are shared: they are replaced, never modified in place.
func (r *Run) Clone() *Run {
	if r == nil {
		return nil
	}
	c := *r
	if r.Interrupts != nil {
		c.Interrupts = append([]PendingInterrupt(nil), r.Interrupts...)
	}
	if r.Decisions != nil {
		c.Decisions = append([]DecisionRecord(nil), r.Decisions...)
	}
	if r.Meta != nil {
		c.Meta = make(map[string]string, len(r.Meta))
		for k, v := range r.Meta {
			c.Meta[k] = v
		}
	}
	return &c
}

// Commit is everything that one superstep makes durable, in one transaction:
// the new checkpoint, the blobs it refers to, the run record and the events
// that describe them. Any field may be empty.
type Commit struct {
	// Earlier are checkpoints that go into the same transaction before
	// Checkpoint, oldest first: a run's input checkpoint when its first
	// step commits with it.
	Earlier    []*Checkpoint
	Checkpoint *Checkpoint
	Blobs      map[BlobRef][]byte
	// Writes are pending writes to store with the commit (an interrupt or an
	// error leaves the step's finished tasks' writes here).
	Writes []CommitWrites
	Run    *Run
	Events []Event
	// Announce is the store's to fill during Commit: events about what it
	// recorded besides c itself (the outcome record that a run's end or
	// pause appends to a ledger). The commit's maker publishes them right
	// after Events, so that no subscriber hears what a step's end recorded
	// before it hears of the step.
	Announce []Event
	// Sync asks for the commit to be fsynced before Commit returns. When
	// false a store may defer durability (the "exit" durability mode).
	Sync bool
}

// CommitWrites attaches pending writes to a checkpoint.
type CommitWrites struct {
	Thread, NS, CheckpointID string
	Write                    PendingWrite
}

// Checkpointer persists checkpoints and pending writes. Implementations must
// make Commit atomic: after a crash either all of it is visible or none.
type Checkpointer interface {
	// Commit takes ownership of c: the caller must not modify c or anything
	// it points to afterwards, so a store may keep it without copying.
	Commit(ctx context.Context, c *Commit) error
	// Checkpoint returns one checkpoint; id "" means the newest of the
	// thread's namespace. It returns ErrCheckpointNotFound when absent.
	Checkpoint(ctx context.Context, thread, ns, id string) (*Checkpoint, error)
	// History lists a namespace's checkpoints newest first, starting below
	// before ("" for the newest), at most limit (0 for all).
	History(ctx context.Context, thread, ns, before string, limit int) ([]*Checkpoint, error)
	// Writes returns the pending writes saved against a checkpoint, in the
	// order they were saved.
	Writes(ctx context.Context, thread, ns, checkpointID string) ([]PendingWrite, error)
}

// BlobStore stores payloads out of line, by content.
type BlobStore interface {
	PutBlob(ctx context.Context, data []byte) (BlobRef, error)
	// Blob returns a blob's bytes or ErrBlobNotFound.
	Blob(ctx context.Context, ref BlobRef) ([]byte, error)
}

// RunFilter selects runs in RunStore.Runs. Zero fields match everything.
type RunFilter struct {
	Status RunStatus
	Agent  string
	Thread string
	After  string // run ID to start after, for paging
	Limit  int
	// Desc lists newest first (IDs are time-ordered): the runs before
	// After, in descending ID order. The zero value lists oldest first.
	Desc bool
	// Summary lets a store leave out what a list does not show: a large
	// input or output that it keeps out of line (the bbolt store: over 8
	// KiB, store.SummaryBytes) comes back as a short preview, marked by
	// Run.InputTruncated or Run.OutputTruncated, and costs no blob read.
	// A list of many runs with large inputs then stays small. Without it
	// every run comes back whole.
	Summary bool
	// Damaged, when set, is told of each run record that cannot be read
	// (a failed checksum or decoding), which is then left out, instead of
	// failing the whole list. A store that never holds such records never
	// calls it.
	Damaged func(key string, err error) `json:"-"`
}

// RunStore persists run records. Runs are written through Commit.
type RunStore interface {
	Run(ctx context.Context, id string) (*Run, error)
	Runs(ctx context.Context, f RunFilter) ([]*Run, error)
}

// Store is what the run manager needs: checkpoints, blobs and runs.
type Store interface {
	Checkpointer
	BlobStore
	RunStore
}

// Durability says when a run's progress is made durable.
type Durability string

// Durability modes. There are exactly two: any other value is refused with
// ErrBadDurability, never read as one of them, since reading a typo as exit
// would silently give up the commit after every step.
const (
	// DurabilitySync commits and fsyncs a checkpoint after every superstep,
	// before the next one starts. It is the default.
	DurabilitySync Durability = "sync"
	// DurabilityExit commits only when the run ends, pauses at an interrupt
	// or fails. A crash loses the progress of runs in flight, but for the
	// steps a node made durable with EnsureDurable before a side effect
	// (the tool loop does before each tool call): a run that has one is
	// on record, and recovery resumes it from the newest.
	DurabilityExit Durability = "exit"
)

// ParseDurability returns the durability named s, exactly "sync" or "exit".
// Anything else, the empty string included, is ErrBadDurability.
func ParseDurability(s string) (Durability, error) {
	switch d := Durability(s); d {
	case DurabilitySync, DurabilityExit:
		return d, nil
	}
	return "", fmt.Errorf("%w, not %q", ErrBadDurability, s)
}

// check accepts sync, exit and "" (the default, sync) and refuses the rest.
func (d Durability) check() error {
	if d == "" {
		return nil
	}
	_, err := ParseDurability(string(d))
	return err
}
