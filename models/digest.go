package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// RequestDigest is what a model call's record keeps of its request: the
// model, a digest of each message and of each tool offered, and one of the
// rest. It is enough for an audit replay to say which part of a request
// differs from the recorded one, without keeping the messages (which may
// hold personal data) a second time. A digest covers what HashRequest
// covers, part by part.
type RequestDigest struct {
	Model    string          `json:"model"`
	Messages []MessageDigest `json:"messages"`
	Tools    []ToolDigest    `json:"tools,omitempty"`
	// Rest covers format, temperature, seed, context size and think.
	Rest string `json:"rest"`
}

// MessageDigest fingerprints one message: its role, its length in
// characters (content and thinking) and the digest of all of it. It is
// stored as the text "role/chars/digest", to keep a call record small: its
// arguments up to 512 bytes are kept inline, longer ones as a blob (which
// the store writes in the record's own commit). Measured, with two tools
// offered: four messages take 257 bytes, eight 385 (as JSON objects, 409
// and 649), so with the record's approval fields about seven messages stay
// inline (three as objects).
type MessageDigest struct {
	Role   string
	Chars  int
	Digest string
}

// ToolDigest fingerprints one tool offered: its name and the digest of
// its description and parameters. It is stored as "name/digest".
type ToolDigest struct {
	Name   string
	Digest string
}

// MarshalText implements encoding.TextMarshaler.
func (m MessageDigest) MarshalText() ([]byte, error) {
	return fmt.Appendf(nil, "%s/%d/%s", m.Role, m.Chars, m.Digest), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *MessageDigest) UnmarshalText(b []byte) error {
	parts := strings.Split(string(b), "/")
	if len(parts) != 3 {
		return fmt.Errorf("message digest %q: want role/chars/digest", b)
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil || n < 0 {
		return fmt.Errorf("message digest %q: bad length", b)
	}
	*m = MessageDigest{Role: parts[0], Chars: n, Digest: parts[2]}
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (t ToolDigest) MarshalText() ([]byte, error) {
	return fmt.Appendf(nil, "%s/%s", t.Name, t.Digest), nil
}

// UnmarshalText implements encoding.TextUnmarshaler. A tool's name may
// not hold "/" (policy's registry names are identifiers), its digest
// never does.
func (t *ToolDigest) UnmarshalText(b []byte) error {
	i := strings.LastIndexByte(string(b), '/')
	if i < 0 {
		return fmt.Errorf("tool digest %q: want name/digest", b)
	}
	*t = ToolDigest{Name: string(b[:i]), Digest: string(b[i+1:])}
	return nil
}

// DigestRequest returns req's digest.
func DigestRequest(req Request) RequestDigest {
	d := RequestDigest{Model: req.Model}
	for _, m := range req.Messages {
		d.Messages = append(d.Messages, MessageDigest{Role: m.Role,
			Chars:  utf8.RuneCountInString(m.Content) + utf8.RuneCountInString(m.Thinking),
			Digest: shortDigest(canonicalMessage(m))})
	}
	for _, t := range req.Tools {
		d.Tools = append(d.Tools, ToolDigest{Name: t.Name, Digest: shortDigest(canonicalTool(t))})
	}
	d.Rest = shortDigest(struct {
		Format      string   `json:"format"`
		Temperature *float64 `json:"temperature"`
		Seed        *int     `json:"seed"`
		NumCtx      int      `json:"num_ctx"`
		Think       bool     `json:"think"`
	}{compactJSON(req.Format), req.Options.Temperature, req.Options.Seed, req.Options.NumCtx, req.Think})
	return d
}

// shortDigest is the first 16 hex digits of the sha256 of v's JSON: 64
// bits tell one message from another; the whole request's HashRequest
// is kept beside it.
func shortDigest(v any) string {
	b, _ := json.Marshal(v) // strings, numbers and bools only
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// RequestDiff is the first part in which two requests differ.
type RequestDiff struct {
	// Part names it: "model", "messages" (their count), "message N"
	// (from 0), "tools" (the names offered), "tool NAME" (its
	// definition), or "options" (format, options, think).
	Part string
	// Message is the index of the message that differs, or -1.
	Message            int
	Original, Replayed string
}

// Diff returns the first part in which now differs from d, or nil when
// they are the same.
func (d RequestDigest) Diff(now RequestDigest) *RequestDiff {
	if d.Model != now.Model {
		return &RequestDiff{Part: "model", Message: -1, Original: d.Model, Replayed: now.Model}
	}
	for i := range min(len(d.Messages), len(now.Messages)) {
		if d.Messages[i] != now.Messages[i] {
			return &RequestDiff{Part: fmt.Sprintf("message %d", i), Message: i,
				Original: d.Messages[i].String(), Replayed: now.Messages[i].String()}
		}
	}
	if len(d.Messages) != len(now.Messages) {
		diff := &RequestDiff{Part: "messages", Message: -1,
			Original: fmt.Sprintf("%d messages", len(d.Messages)), Replayed: fmt.Sprintf("%d messages", len(now.Messages))}
		if len(now.Messages) > len(d.Messages) {
			diff.Message = len(d.Messages) // the first one the original lacks
		}
		return diff
	}
	names := func(ts []ToolDigest) []string {
		out := make([]string, len(ts))
		for i, t := range ts {
			out[i] = t.Name
		}
		return out
	}
	if !slices.Equal(names(d.Tools), names(now.Tools)) {
		return &RequestDiff{Part: "tools", Message: -1, Original: fmt.Sprint(names(d.Tools)), Replayed: fmt.Sprint(names(now.Tools))}
	}
	for i := range d.Tools {
		if d.Tools[i] != now.Tools[i] {
			return &RequestDiff{Part: "tool " + d.Tools[i].Name, Message: -1,
				Original: "definition " + d.Tools[i].Digest, Replayed: "definition " + now.Tools[i].Digest}
		}
	}
	if d.Rest != now.Rest {
		return &RequestDiff{Part: "options", Message: -1, Original: d.Rest, Replayed: now.Rest}
	}
	return nil
}

func (m MessageDigest) String() string {
	return fmt.Sprintf("%s, %d chars, digest %s", m.Role, m.Chars, m.Digest)
}
