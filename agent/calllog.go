package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Sentinel errors. Test for them with errors.Is.
var (
	// ErrCallNotFound: no record under the key.
	ErrCallNotFound = errors.New("call record not found")
	// ErrCallConflict: a record under the key names another tool or other
	// arguments, or another result is already recorded.
	ErrCallConflict = errors.New("call record conflicts with the recorded one")
	// ErrLaneViolation is wrapped when a model call is refused because the
	// model is outside the agent's lane (it also wraps
	// policy.ErrModelNotInLane).
	ErrLaneViolation = errors.New("model call refused")
	// ErrNoTool: the active set allows a tool that has no implementation.
	ErrNoTool = errors.New("tool has no implementation")
	// ErrBadConfig: a LoopConfig or ModelCall is missing what it needs.
	ErrBadConfig = errors.New("bad agent configuration")
	// ErrTokensUncounted: a resumed run's model call under a token budget
	// is refused, for its call log cannot count what the run spent
	// before (see TokenCounter).
	ErrTokensUncounted = errors.New("the tokens the run spent are not known")
)

// Call record statuses.
const (
	StatusIntent = "intent" // recorded before the call
	StatusDone   = "done"   // the result (or error) is recorded
)

// CallRecord is one recorded call: a tool call, or a model call (whose
// Result is the blob reference of the stored response).
type CallRecord struct {
	Key      string          `json:"key"`
	Run      string          `json:"run"`
	Node     string          `json:"node"`
	Tool     string          `json:"tool"`
	ArgsHash string          `json:"args_hash"`
	Args     json.RawMessage `json:"args,omitempty"`
	Status   string          `json:"status"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	// Decision is how the call was approved: policy.Decision values for a
	// rule ("allow", "deny"), or the operator's engine decision ("approve",
	// "edit", "reject"). DecidedBy is "rule:..." or "operator:...", and
	// Reason says why.
	Decision  string `json:"decision,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// Done reports whether the record holds the call's outcome.
func (r *CallRecord) Done() bool { return r != nil && r.Status == StatusDone }

// CallLog records calls durably. Implementations must make Intent durable
// before it returns: the tool runs right after it.
type CallLog interface {
	// Intent records rec (Status ignored) as an intent. When the key is
	// already known it records nothing and returns the existing record;
	// a known key holding another tool or other arguments is an error
	// wrapping ErrCallConflict.
	Intent(ctx context.Context, rec CallRecord) (existing *CallRecord, err error)
	// Done records the outcome of the call under key: its result, or the
	// error text. Recording the same outcome twice is a no-op.
	Done(ctx context.Context, key string, result json.RawMessage, errText string) error
	// Get returns the record under key, or an error wrapping
	// ErrCallNotFound.
	Get(ctx context.Context, key string) (*CallRecord, error)
}

// HashArgs fingerprints a call's arguments: the sha256 of their compacted
// JSON, so that whitespace does not make two identical calls differ.
func HashArgs(args json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, args); err != nil {
		buf.Reset()
		buf.Write(args)
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:16])
}

// MemoryCallLog is an in-memory CallLog for tests and embedded use. It is
// safe for concurrent use.
type MemoryCallLog struct {
	mu   sync.Mutex
	recs map[string]*CallRecord
}

// NewMemoryCallLog returns an empty log.
func NewMemoryCallLog() *MemoryCallLog {
	return &MemoryCallLog{recs: map[string]*CallRecord{}}
}

var _ CallLog = (*MemoryCallLog)(nil)

// Intent implements CallLog.
func (m *MemoryCallLog) Intent(ctx context.Context, rec CallRecord) (*CallRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if rec.Key == "" {
		return nil, fmt.Errorf("record intent: empty key")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.recs[rec.Key]; ok {
		if old.Tool != rec.Tool || old.ArgsHash != rec.ArgsHash || old.Run != rec.Run {
			return nil, fmt.Errorf("record intent %s: %w: recorded %s(%s), offered %s(%s)",
				rec.Key, ErrCallConflict, old.Tool, old.ArgsHash, rec.Tool, rec.ArgsHash)
		}
		c := cloneRecord(old)
		return &c, nil
	}
	rec.Status, rec.Result, rec.Error = StatusIntent, nil, ""
	c := cloneRecord(&rec)
	m.recs[rec.Key] = &c
	return nil, nil
}

// Done implements CallLog.
func (m *MemoryCallLog) Done(ctx context.Context, key string, result json.RawMessage, errText string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.recs[key]
	if !ok {
		return fmt.Errorf("record result %s: %w", key, ErrCallNotFound)
	}
	if old.Status == StatusDone {
		if !bytes.Equal(old.Result, result) || old.Error != errText {
			return fmt.Errorf("record result %s: %w: a different result is recorded", key, ErrCallConflict)
		}
		return nil
	}
	old.Status, old.Result, old.Error = StatusDone, append(json.RawMessage(nil), result...), errText
	return nil
}

// Get implements CallLog.
func (m *MemoryCallLog) Get(ctx context.Context, key string) (*CallRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.recs[key]
	if !ok {
		return nil, fmt.Errorf("load call %s: %w", key, ErrCallNotFound)
	}
	c := cloneRecord(old)
	return &c, nil
}

// Records returns the records whose keys start with prefix, in key order.
func (m *MemoryCallLog) Records(prefix string) []CallRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []CallRecord
	for k, r := range m.recs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, cloneRecord(r))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func cloneRecord(r *CallRecord) CallRecord {
	c := *r
	c.Args = append(json.RawMessage(nil), r.Args...)
	c.Result = append(json.RawMessage(nil), r.Result...)
	return c
}
