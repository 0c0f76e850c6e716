package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/policy"
)

// A recorded call answers only the question it was asked. ReplayLog
// compares each call of a replay with its record before it serves the
// record: a model call's request with the recorded request's hash and
// digest (agent.RequestVerifier; a failed attempt's record, through
// Intent, likewise), a tool call's name and arguments with the recorded
// ones. A tool call that an operator edited is recorded with
// the edited arguments (agent's tool loop replaces them before the intent
// is recorded), and the replay answers the same interrupt with the same
// recorded decision, so a faithful replay asks for the edited arguments
// too. A call that asks something else is a divergence named by its key;
// a record that keeps nothing to compare with (an older one) is noted in
// the report, and served.

// findings collects what ReplayLog finds during one Replay, which puts it
// in the context the replay's nodes run under.
type findings struct {
	mu    sync.Mutex
	diffs []*Difference
	notes []string
}

type findingsKey struct{}

func withFindings(ctx context.Context) (context.Context, *findings) {
	f := &findings{}
	return context.WithValue(ctx, findingsKey{}, f), f
}

func (f *findings) diverged(d *Difference) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.diffs = append(f.diffs, d)
}

func (f *findings) note(n string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.notes, n) { // a task that runs again asks again
		f.notes = append(f.notes, n)
	}
}

// first is the earliest divergence: concurrent tasks of one step may each
// find one, in any order.
func (f *findings) first() *Difference {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.diffs) == 0 {
		return nil
	}
	return slices.MinFunc(f.diffs, func(a, b *Difference) int {
		return cmp.Or(cmp.Compare(a.Step, b.Step), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Call, b.Call))
	})
}

func (f *findings) sortedNotes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(slices.Values(f.notes))
}

func findingsFrom(ctx context.Context) *findings {
	f, _ := ctx.Value(findingsKey{}).(*findings)
	return f
}

// callDivergence records that the call under key asks something other than
// its record, and returns the error that stops it.
func callDivergence(ctx context.Context, key, tool, part, original, replayed string) error {
	d := &Difference{Call: key, Tool: tool, Part: part, Original: original, Replayed: replayed,
		Detail: fmt.Sprintf("call %s (%s) asks something other than the original: its %s differs", key, tool, part)}
	if info, ok := engine.InfoFrom(ctx); ok {
		d.Step, d.Namespace, d.Checkpoint, d.Nodes = info.Step, info.NS, info.Checkpoint, []string{info.Node}
	}
	findingsFrom(ctx).diverged(d)
	return fmt.Errorf("%w: %s (original %s, replay %s)", ErrDiverged, d.Detail, original, replayed)
}

// VerifyRequest implements agent.RequestVerifier.
func (l ReplayLog) VerifyRequest(ctx context.Context, rec agent.CallRecord, req models.Request) error {
	digest := models.DigestRequest(req)
	return verifyModelCall(ctx, rec, askedRequest{model: req.Model, hash: models.HashRequest(req), digest: &digest, messages: req.Messages})
}

// askedRequest is what a replay's model call asks, as a record keeps it:
// its model, its request's hash and digest (nil when not known), and the
// messages themselves when known, for the report to show the start of
// the one that differs.
type askedRequest struct {
	model, hash string
	digest      *models.RequestDigest
	messages    []models.Message
}

// askedBy is what the replay's record of a model call says its request
// was: a failed attempt's (agent's "#spent" records), which the replay
// makes as the original did.
func askedBy(rec agent.CallRecord) askedRequest {
	return askedRequest{model: strings.TrimPrefix(rec.Tool, "model:"), hash: rec.ArgsHash, digest: recordedDigest(rec)}
}

// recordedDigest is the request digest a model call's record keeps, or
// nil for a record that keeps none (an older one).
func recordedDigest(rec agent.CallRecord) *models.RequestDigest {
	var d models.RequestDigest
	if len(rec.Args) == 0 || json.Unmarshal(rec.Args, &d) != nil || d.Model == "" {
		return nil
	}
	return &d
}

// verifyModelCall compares what a replay's model call asks with the
// original's record of it: an answered call's (VerifyRequest) and a failed
// attempt's (Intent) alike.
func verifyModelCall(ctx context.Context, rec agent.CallRecord, now askedRequest) error {
	if rec.ArgsHash == "" && len(rec.Args) == 0 {
		findingsFrom(ctx).note(fmt.Sprintf("call %s (%s): its record keeps no digest of the request, so the replay's request could not be checked against it",
			rec.Key, rec.Tool))
		return nil
	}
	if rec.ArgsHash != "" && rec.ArgsHash == now.hash {
		return nil
	}
	recorded := recordedDigest(rec)
	if recorded == nil || now.digest == nil {
		// A record with the request's hash alone: it says that the
		// request differs, and the model, but not which message.
		if was := strings.TrimPrefix(rec.Tool, "model:"); was != now.model {
			return callDivergence(ctx, rec.Key, rec.Tool, "model", was, now.model)
		}
		return callDivergence(ctx, rec.Key, rec.Tool, "request", "digest "+rec.ArgsHash,
			"digest "+now.hash+" (the record keeps no digest of each message, so which one differs is not known)")
	}
	d := recorded.Diff(*now.digest)
	if d == nil {
		// Every part has the same digest but the hash differs: a part
		// the digests do not cover.
		d = &models.RequestDiff{Part: "request", Message: -1, Original: "digest " + rec.ArgsHash, Replayed: "digest " + now.hash}
	}
	replayed := d.Replayed
	if d.Message >= 0 && d.Message < len(now.messages) {
		replayed += ", begins " + preview(now.messages[d.Message].Content)
	}
	return callDivergence(ctx, rec.Key, rec.Tool, d.Part, d.Original, replayed)
}

// verifyToolCall compares a replay's tool call with the original's record.
func verifyToolCall(ctx context.Context, orig *agent.CallRecord, rec agent.CallRecord) error {
	if orig.Tool != rec.Tool {
		return callDivergence(ctx, rec.Key, orig.Tool, "tool", orig.Tool, rec.Tool)
	}
	if orig.ArgsHash == "" {
		findingsFrom(ctx).note(fmt.Sprintf("call %s (%s): its record keeps no digest of the arguments, so the replay's could not be checked against them",
			rec.Key, rec.Tool))
		return nil
	}
	if orig.ArgsHash == rec.ArgsHash {
		return nil
	}
	var was, now map[string]json.RawMessage
	if json.Unmarshal(orig.Args, &was) != nil || json.Unmarshal(rec.Args, &now) != nil {
		return callDivergence(ctx, rec.Key, rec.Tool, "arguments", "digest "+orig.ArgsHash, "digest "+rec.ArgsHash)
	}
	names := map[string]bool{}
	for k := range was {
		names[k] = true
	}
	for k := range now {
		names[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(names)) {
		w, okW := was[k]
		n, okN := now[k]
		if okW && okN && agent.HashArgs(w) == agent.HashArgs(n) {
			continue
		}
		return callDivergence(ctx, rec.Key, rec.Tool, "argument "+k, argument(w, okW), argument(n, okN))
	}
	// Same members, one of them duplicated or the JSON otherwise unlike.
	return callDivergence(ctx, rec.Key, rec.Tool, "arguments", "digest "+orig.ArgsHash, "digest "+rec.ArgsHash)
}

// argument shows one argument's value as a report may: its digest, and
// the start of it with personal data masked.
func argument(v json.RawMessage, ok bool) string {
	if !ok {
		return "absent"
	}
	return fmt.Sprintf("digest %s, begins %s", agent.HashArgs(v), preview(string(v)))
}

// previewChars is how much of a message or an argument a report shows:
// enough to recognize a prompt, not to copy a conversation.
const previewChars = 40

// redactor masks personal data in what a report shows of a message or an
// argument, with every detector, as outcome records are masked.
var redactor = sync.OnceValues(func() (*policy.Redactor, error) {
	return policy.NewRedactor(policy.RedactionPolicy{})
})

// preview is the first previewChars characters of s, quoted, after
// personal data in the whole of s is masked (masking the cut text could
// let a number cut in two through).
func preview(s string) string {
	red, err := redactor()
	if err != nil {
		return "(not shown: " + err.Error() + ")"
	}
	r := []rune(red.Redact(s))
	if len(r) > previewChars {
		return fmt.Sprintf("%q...", string(r[:previewChars]))
	}
	return fmt.Sprintf("%q", string(r))
}
