package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/outpost-edge/outpost/internal/bounded"
	"github.com/outpost-edge/outpost/internal/fsync"
	"github.com/outpost-edge/outpost/policy"
)

// Names of the built-in tools.
const (
	ToolKBSearch         = "kb_search"
	ToolCurrentTime      = "current_time"
	ToolRecordNote       = "record_note"
	ToolScheduleFollowup = "schedule_followup"
)

// BuiltinDefs returns the registry entries of the built-in tools, for a
// bundle's registry (policy.NewRegistry).
func BuiltinDefs() []policy.Tool {
	return []policy.Tool{KBSearchDef(), CurrentTimeDef(), RecordNoteDef(), ScheduleFollowupDef()}
}

// decodeArgs decodes a tool's arguments strictly. The policy check has
// validated them against the schema already; this is the second lock.
func decodeArgs(args json.RawMessage, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(normalizeArgs(args))))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	return nil
}

// ---- kb_search ----

// Document is one knowledge-base document.
type Document struct {
	ID    string `json:"id"`
	Title string `json:"title,omitempty"`
	Text  string `json:"text"`
}

// KBSearch ranks documents with BM25 (k1 = 1.2, b = 0.75). It is built
// once over a bundle's documents and is safe for concurrent use.
type KBSearch struct {
	docs   []Document
	terms  []map[string]int // term frequencies per document
	lens   []int
	avgLen float64
	df     map[string]int
}

// BM25 parameters: the usual defaults of Lucene and Elasticsearch.
const (
	bm25K1 = 1.2
	bm25B  = 0.75
)

// NewKBSearch indexes docs (title and text).
func NewKBSearch(docs []Document) *KBSearch {
	k := &KBSearch{docs: append([]Document(nil), docs...), df: map[string]int{}}
	total := 0
	for _, d := range k.docs {
		tf := map[string]int{}
		toks := tokenize(d.Title + " " + d.Text)
		for _, t := range toks {
			tf[t]++
		}
		for t := range tf {
			k.df[t]++
		}
		k.terms = append(k.terms, tf)
		k.lens = append(k.lens, len(toks))
		total += len(toks)
	}
	if len(k.docs) > 0 {
		k.avgLen = float64(total) / float64(len(k.docs))
	}
	return k
}

// tokenize lowercases s and splits it into runs of letters and digits.
func tokenize(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

// Hit is one search result.
type Hit struct {
	ID      string  `json:"id"`
	Title   string  `json:"title,omitempty"`
	Score   float64 `json:"score"`
	Snippet string  `json:"snippet"`
}

// Search returns at most limit documents matching query, best first (ties
// in document order).
func (k *KBSearch) Search(query string, limit int) []Hit {
	q := tokenize(query)
	n := float64(len(k.docs))
	var hits []Hit
	for i, d := range k.docs {
		score := 0.0
		seen := map[string]bool{}
		for _, t := range q {
			if seen[t] {
				continue
			}
			seen[t] = true
			f := float64(k.terms[i][t])
			if f == 0 {
				continue
			}
			df := float64(k.df[t])
			idf := math.Log(1 + (n-df+0.5)/(df+0.5))
			norm := 1 - bm25B + bm25B*float64(k.lens[i])/math.Max(k.avgLen, 1)
			score += idf * f * (bm25K1 + 1) / (f + bm25K1*norm)
		}
		if score > 0 {
			hits = append(hits, Hit{ID: d.ID, Title: d.Title, Score: math.Round(score*1000) / 1000, Snippet: snippet(d.Text, 240)})
		}
	}
	sort.SliceStable(hits, func(a, b int) bool { return hits[a].Score > hits[b].Score })
	if limit > 0 && len(hits) > limit {
		hits = hits[:limit]
	}
	return hits
}

func snippet(s string, n int) string {
	r := []rune(strings.Join(strings.Fields(s), " "))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n]) + "…"
}

// KBSearchDef is kb_search's registry entry: a read tool.
func KBSearchDef() policy.Tool {
	return policy.Tool{Name: ToolKBSearch, Kind: policy.KindRead, Idempotent: true,
		Description: "Search the knowledge base by keywords; returns the best matching documents with their ids.",
		Schema: json.RawMessage(`{"type":"object","properties":{` +
			`"query":{"type":"string","minLength":1,"maxLength":500},` +
			`"limit":{"type":"integer","minimum":1,"maximum":10}},` +
			`"required":["query"],"additionalProperties":false}`)}
}

// Call implements Tool: {"query", "limit"?} → {"results": [Hit...]}.
func (k *KBSearch) Call(_ context.Context, args json.RawMessage, _ string) (json.RawMessage, error) {
	var a struct {
		Query string `json:"query"`
		Limit int    `json:"limit"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	if a.Limit <= 0 {
		a.Limit = 3
	}
	hits := k.Search(a.Query, min(a.Limit, 10))
	if hits == nil {
		hits = []Hit{}
	}
	return json.Marshal(map[string]any{"results": hits})
}

// ---- current_time ----

// CurrentTime tells the time. Now is the clock (default time.Now) and Loc
// the appliance's zone (default UTC).
type CurrentTime struct {
	Now func() time.Time
	Loc *time.Location
}

// CurrentTimeDef is current_time's registry entry: a read tool without
// arguments.
func CurrentTimeDef() policy.Tool {
	return policy.Tool{Name: ToolCurrentTime, Kind: policy.KindRead, Idempotent: true,
		Description: "Return the current date and time of the appliance.",
		Schema:      json.RawMessage(`{"type":"object","additionalProperties":false}`)}
}

// Call implements Tool: {} → {"time": RFC 3339, "weekday", "zone"}.
func (c CurrentTime) Call(_ context.Context, args json.RawMessage, _ string) (json.RawMessage, error) {
	var a struct{}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	loc := c.Loc
	if loc == nil {
		loc = time.UTC
	}
	t := now().In(loc)
	zone, _ := t.Zone()
	return json.Marshal(map[string]string{"time": t.Format(time.RFC3339), "weekday": t.Weekday().String(), "zone": zone})
}

// ---- record_note ----

// Note is one note in the appliance's notes.
type Note struct {
	Key     string    `json:"key"`
	Subject string    `json:"subject,omitempty"`
	Text    string    `json:"text"`
	At      time.Time `json:"at"`
}

// Notes stores notes by idempotency key: putting a key already present
// stores nothing and reports created false.
type Notes interface {
	Put(ctx context.Context, n Note) (created bool, err error)
}

// FileNotes keeps notes in a file of JSON lines, one note per key. It is
// safe for concurrent use within one process.
//
// It remembers the keys of the newest NoteKeys notes, not of all: the file
// grows for as long as the appliance runs, and its memory must not. A key
// comes back only when a call's intent was recorded and its result was
// not, the call that a crash cut short, which recovery runs again at the
// next start: its note, if it was written, is among the last ones.
type FileNotes struct {
	mu   sync.Mutex
	path string
	keys *bounded.Map[string, struct{}]
}

// NoteKeys is how many of the newest notes' keys FileNotes remembers.
var NoteKeys = 1 << 16

// OpenFileNotes opens (or creates) a notes file and loads its newest keys.
// A torn last line, left by a crash mid-write, is ignored: its note was
// never reported as stored.
func OpenFileNotes(path string) (*FileNotes, error) {
	n := &FileNotes{path: path, keys: bounded.New[string, struct{}](NoteKeys)}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return n, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open notes: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var note Note
		if json.Unmarshal(sc.Bytes(), &note) == nil && note.Key != "" {
			n.keys.Put(note.Key, struct{}{})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read notes %s: %w", path, err)
	}
	return n, nil
}

// Put implements Notes: it appends the note and syncs the file, unless its
// key is already present.
func (n *FileNotes) Put(_ context.Context, note Note) (bool, error) {
	if note.Key == "" {
		return false, errors.New("note without a key")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.keys.Get(note.Key); ok {
		return false, nil
	}
	line, err := json.Marshal(note)
	if err != nil {
		return false, err
	}
	if err := appendLine(n.path, line); err != nil {
		return false, fmt.Errorf("write note: %w", err)
	}
	n.keys.Put(note.Key, struct{}{})
	return true, nil
}

// appendLine appends line and a newline with one write, and syncs. A
// previous torn line (no trailing newline) is terminated first, so the new
// line is never glued to it.
func appendLine(path string, line []byte) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := append(line, '\n')
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			buf = append([]byte{'\n'}, buf...)
		}
	}
	if _, err := f.Write(buf); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// A new file: its name must survive a power cut as the line does.
		return fsync.Dir(filepath.Dir(path))
	}
	return nil
}

// RecordNote writes a note keyed by the call's idempotency key, so running
// it again with the same key stores nothing new: it is declared idempotent.
type RecordNote struct {
	Notes Notes
	Now   func() time.Time
}

// RecordNoteDef is record_note's registry entry: a write tool, idempotent.
func RecordNoteDef() policy.Tool {
	return policy.Tool{Name: ToolRecordNote, Kind: policy.KindWrite, Idempotent: true,
		Description: "Record a note in the appliance's notes.",
		Schema: json.RawMessage(`{"type":"object","properties":{` +
			`"text":{"type":"string","minLength":1,"maxLength":4000},` +
			`"subject":{"type":"string","maxLength":200}},` +
			`"required":["text"],"additionalProperties":false}`)}
}

// Call implements Tool: {"text", "subject"?} → {"note": key, "created"}.
func (r RecordNote) Call(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error) {
	var a struct {
		Text    string `json:"text"`
		Subject string `json:"subject"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	created, err := r.Notes.Put(ctx, Note{Key: key, Subject: a.Subject, Text: a.Text, At: now().UTC()})
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"note": key, "created": created})
}

// ---- schedule_followup ----

// Followup is one scheduled follow-up.
type Followup struct {
	When string    `json:"when"`
	Note string    `json:"note"`
	Key  string    `json:"key"`
	At   time.Time `json:"at"`
}

// Followups is where follow-ups go. Add appends: it is not idempotent.
type Followups interface {
	Add(ctx context.Context, f Followup) error
}

// FileFollowups appends follow-ups to a file of JSON lines.
type FileFollowups struct {
	mu   sync.Mutex
	Path string
}

// Add implements Followups.
func (f *FileFollowups) Add(_ context.Context, fu Followup) error {
	line, err := json.Marshal(fu)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return appendLine(f.Path, line)
}

// MemoryFollowups keeps follow-ups in a list.
type MemoryFollowups struct {
	mu   sync.Mutex
	list []Followup
}

// Add implements Followups.
func (m *MemoryFollowups) Add(_ context.Context, f Followup) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.list = append(m.list, f)
	return nil
}

// List returns the follow-ups added so far.
func (m *MemoryFollowups) List() []Followup {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Followup(nil), m.list...)
}

// ScheduleFollowup schedules a follow-up. It is a write tool and not
// idempotent: a repeated call schedules twice.
type ScheduleFollowup struct {
	Followups Followups
	Now       func() time.Time
}

// ScheduleFollowupDef is schedule_followup's registry entry.
func ScheduleFollowupDef() policy.Tool {
	return policy.Tool{Name: ToolScheduleFollowup, Kind: policy.KindWrite, Idempotent: false,
		Description: "Schedule a follow-up contact at a given date or time.",
		Schema: json.RawMessage(`{"type":"object","properties":{` +
			`"when":{"type":"string","minLength":1,"maxLength":100},` +
			`"note":{"type":"string","maxLength":1000}},` +
			`"required":["when"],"additionalProperties":false}`)}
}

// Call implements Tool: {"when", "note"?} → {"scheduled": true, "when"}.
func (s ScheduleFollowup) Call(ctx context.Context, args json.RawMessage, key string) (json.RawMessage, error) {
	var a struct {
		When string `json:"when"`
		Note string `json:"note"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	if err := s.Followups.Add(ctx, Followup{When: a.When, Note: a.Note, Key: key, At: now().UTC()}); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"scheduled": true, "when": a.When})
}
