package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/agent"
	"github.com/outpost-edge/outpost/internal/fsync"
	"github.com/outpost-edge/outpost/policy"
)

func TestBuiltinDefsFormARegistry(t *testing.T) {
	reg, err := policy.NewRegistry(agent.BuiltinDefs())
	require.NoError(t, err)
	require.Equal(t, []string{"current_time", "kb_search", "record_note", "schedule_followup"}, reg.Names())
	note, _ := reg.Lookup(agent.ToolRecordNote)
	require.True(t, note.Idempotent)
	require.Equal(t, policy.KindWrite, note.Kind)
	fu, _ := reg.Lookup(agent.ToolScheduleFollowup)
	require.False(t, fu.Idempotent)
}

func TestKBSearch(t *testing.T) {
	kb := agent.NewKBSearch([]agent.Document{
		{ID: "a", Title: "Metformin", Text: "Metformin is taken with meals. Metformin and missed doses."},
		{ID: "b", Title: "Insulin", Text: "Insulin storage: keep it cool."},
		{ID: "c", Title: "Walking", Text: "Walking after meals helps blood sugar."},
	})
	cases := []struct {
		query string
		want  []string
	}{
		{"metformin", []string{"a"}},
		{"MEALS", []string{"c", "a"}}, // the shorter document ranks first (length normalization)
		{"missed metformin dose", []string{"a"}},
		{"insulin storage", []string{"b"}},
		{"aspirin", nil},
		{"", nil},
	}
	for _, tc := range cases {
		t.Run(tc.query, func(t *testing.T) {
			var ids []string
			for _, h := range kb.Search(tc.query, 5) {
				ids = append(ids, h.ID)
			}
			require.Equal(t, tc.want, ids)
		})
	}
	out, err := kb.Call(context.Background(), json.RawMessage(`{"query":"meals","limit":1}`), "k")
	require.NoError(t, err)
	var res struct{ Results []agent.Hit }
	require.NoError(t, json.Unmarshal(out, &res))
	require.Len(t, res.Results, 1)
	_, err = kb.Call(context.Background(), json.RawMessage(`{"query":"x","extra":1}`), "k")
	require.Error(t, err, "unknown arguments are refused")
}

func TestCurrentTime(t *testing.T) {
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	out, err := agent.CurrentTime{Now: func() time.Time { return at }}.Call(context.Background(), nil, "k")
	require.NoError(t, err)
	require.JSONEq(t, `{"time":"2025-03-04T05:06:07Z","weekday":"Tuesday","zone":"UTC"}`, string(out))
}

func TestRecordNoteIsIdempotentByKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notes.jsonl")
	notes, err := agent.OpenFileNotes(path)
	require.NoError(t, err)
	tool := agent.RecordNote{Notes: notes}
	ctx := context.Background()
	out, err := tool.Call(ctx, json.RawMessage(`{"text":"called back"}`), "run_1:1:t:0")
	require.NoError(t, err)
	require.JSONEq(t, `{"note":"run_1:1:t:0","created":true}`, string(out))
	out, err = tool.Call(ctx, json.RawMessage(`{"text":"called back"}`), "run_1:1:t:0")
	require.NoError(t, err)
	require.JSONEq(t, `{"note":"run_1:1:t:0","created":false}`, string(out))

	// A torn last line, then a reopen: keys already present are skipped.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"key":"torn`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	notes, err = agent.OpenFileNotes(path)
	require.NoError(t, err)
	tool = agent.RecordNote{Notes: notes}
	out, err = tool.Call(ctx, json.RawMessage(`{"text":"again"}`), "run_1:1:t:0")
	require.NoError(t, err)
	require.JSONEq(t, `{"note":"run_1:1:t:0","created":false}`, string(out))
	_, err = tool.Call(ctx, json.RawMessage(`{"text":"other"}`), "run_1:1:t:1")
	require.NoError(t, err)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 3, "two notes and the torn line")
	require.True(t, json.Valid([]byte(lines[2])), "the new note starts on its own line")
}

// The keys FileNotes remembers are bounded, at open and as notes come:
// the newest ones, where a call cut short by a crash finds its note.
func TestNoteKeysAreBounded(t *testing.T) {
	defer func(n int) { agent.NoteKeys = n }(agent.NoteKeys)
	agent.NoteKeys = 8
	path := filepath.Join(t.TempDir(), "notes.jsonl")
	notes, err := agent.OpenFileNotes(path)
	require.NoError(t, err)
	ctx := context.Background()
	put := func(notes *agent.FileNotes, i int) bool {
		created, err := notes.Put(ctx, agent.Note{Key: fmt.Sprintf("run_1:%d:t:0", i), Text: "n"})
		require.NoError(t, err)
		return created
	}
	for i := range 20 {
		require.True(t, put(notes, i))
	}
	assert.Equal(t, 8, agent.NoteKeysHeld(notes))
	assert.False(t, put(notes, 19), "the newest keys are remembered")
	assert.False(t, put(notes, 12))

	notes, err = agent.OpenFileNotes(path)
	require.NoError(t, err)
	assert.Equal(t, 8, agent.NoteKeysHeld(notes), "a reopen loads the newest keys only")
	assert.False(t, put(notes, 19))
	assert.False(t, put(notes, 12))
}

// The notes file's name is made durable when the first note makes the
// file: a note whose call is recorded done must survive a power cut.
func TestNotesFileIsNamedDurably(t *testing.T) {
	dir := t.TempDir()
	var synced []string
	defer fsync.Observe(func(d string) { synced = append(synced, d) })()
	notes, err := agent.OpenFileNotes(filepath.Join(dir, "notes.jsonl"))
	require.NoError(t, err)
	tool := agent.RecordNote{Notes: notes}
	_, err = tool.Call(context.Background(), json.RawMessage(`{"text":"first"}`), "run_1:1:t:0")
	require.NoError(t, err)
	assert.Equal(t, []string{dir}, synced)
	synced = nil
	_, err = tool.Call(context.Background(), json.RawMessage(`{"text":"second"}`), "run_1:1:t:1")
	require.NoError(t, err)
	assert.Empty(t, synced, "the file already had its name")
}

func TestScheduleFollowupIsNotIdempotent(t *testing.T) {
	list := &agent.MemoryFollowups{}
	tool := agent.ScheduleFollowup{Followups: list}
	for range 2 {
		_, err := tool.Call(context.Background(), json.RawMessage(`{"when":"tomorrow 9:00"}`), "same-key")
		require.NoError(t, err)
	}
	require.Len(t, list.List(), 2)

	path := filepath.Join(t.TempDir(), "followups.jsonl")
	ft := agent.ScheduleFollowup{Followups: &agent.FileFollowups{Path: path}}
	_, err := ft.Call(context.Background(), json.RawMessage(`{"when":"friday","note":"check dose"}`), "k")
	require.NoError(t, err)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), `"when":"friday"`)
}

func TestHTTPTool(t *testing.T) {
	var seen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, "other "+r.URL.RequestURI())
		_, _ = w.Write([]byte(`{"secret":true}`))
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Site"))
		switch {
		case strings.HasPrefix(r.URL.Path, "/redirect"):
			http.Redirect(w, r, other.URL+"/stolen", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/big"):
			_, _ = w.Write([]byte(strings.Repeat("z", 100)))
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"patient":"` + r.URL.Query().Get("id") + `"}`))
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	mk := func(spec agent.HTTPSpec) (*agent.HTTPTool, error) {
		if spec.Name == "" {
			spec.Name = "lookup"
		}
		if spec.Kind == "" {
			spec.Kind = policy.KindRead
		}
		if spec.Method == "" {
			spec.Method = "GET"
		}
		if spec.Hosts == nil {
			spec.Hosts = []string{host}
		}
		return agent.NewHTTPTool(spec, srv.Client())
	}
	ctx := context.Background()

	t.Run("allowed host with template", func(t *testing.T) {
		seen = nil
		tool, err := mk(agent.HTTPSpec{URL: srv.URL + "/patients/{{ward}}?id={{id}}", Headers: map[string]string{"X-Site": "clinic-{{ward}}"}})
		require.NoError(t, err)
		_, err = policy.NewRegistry([]policy.Tool{tool.Def()})
		require.NoError(t, err)
		out, err := tool.Call(ctx, json.RawMessage(`{"ward":"north","id":"p-17"}`), "key-1")
		require.NoError(t, err)
		require.JSONEq(t, `{"status":200,"body":{"patient":"p-17"}}`, string(out))
		require.Equal(t, []string{"GET /patients/north?id=p-17 clinic-north"}, seen)
	})

	t.Run("template injection stays inside its placeholder", func(t *testing.T) {
		seen = nil
		tool, err := mk(agent.HTTPSpec{URL: srv.URL + "/patients/{{ward}}?id={{id}}"})
		require.NoError(t, err)
		out, err := tool.Call(ctx, json.RawMessage(`{"ward":"../admin/x?y=1#f","id":"1&admin=true@`+other.URL+`"}`), "k")
		require.NoError(t, err)
		require.Len(t, seen, 1)
		require.Equal(t, "GET /patients/..%2Fadmin%2Fx%3Fy%3D1%23f?id=1%26admin%3Dtrue%40http%3A%2F%2F"+
			url.QueryEscape(strings.TrimPrefix(other.URL, "http://"))+" ", seen[0])
		require.Contains(t, string(out), `"patient":"1\u0026admin=true@`+other.URL)
	})

	t.Run("redirect to another host is refused", func(t *testing.T) {
		seen = nil
		tool, err := mk(agent.HTTPSpec{URL: srv.URL + "/redirect"})
		require.NoError(t, err)
		_, err = tool.Call(ctx, nil, "k")
		require.ErrorIs(t, err, agent.ErrRedirect)
		require.Len(t, seen, 1, "the other host was never asked")
	})

	t.Run("response size is capped", func(t *testing.T) {
		tool, err := mk(agent.HTTPSpec{URL: srv.URL + "/big", MaxBytes: 10})
		require.NoError(t, err)
		out, err := tool.Call(ctx, nil, "k")
		require.NoError(t, err)
		require.JSONEq(t, `{"status":200,"body":"zzzzzzzzzz","truncated":true}`, string(out))
	})

	bad := []struct {
		name string
		spec agent.HTTPSpec
	}{
		{"host not allowlisted", agent.HTTPSpec{URL: other.URL + "/x"}},
		{"placeholder in host", agent.HTTPSpec{URL: "http://{{host}}/x", Hosts: []string{"{{host}}"}}},
		{"placeholder in port", agent.HTTPSpec{URL: "http://127.0.0.1:{{port}}/x", Hosts: []string{"127.0.0.1"}}},
		{"credentials", agent.HTTPSpec{URL: "http://u:p@" + host + "/x"}},
		{"scheme", agent.HTTPSpec{URL: "file:///etc/passwd", Hosts: []string{""}}},
		{"method", agent.HTTPSpec{URL: srv.URL, Method: "CONNECT"}},
		{"no hosts", agent.HTTPSpec{URL: srv.URL, Hosts: []string{}}},
		{"header line break", agent.HTTPSpec{URL: srv.URL, Headers: map[string]string{"X": "a\r\nB: c"}}},
	}
	for _, tc := range bad {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := mk(tc.spec)
			require.ErrorIs(t, err, policy.ErrBadRule)
		})
	}

	t.Run("header injection through an argument", func(t *testing.T) {
		tool, err := mk(agent.HTTPSpec{URL: srv.URL + "/h", Headers: map[string]string{"X-Site": "{{site}}"}})
		require.NoError(t, err)
		_, err = tool.Call(ctx, json.RawMessage(`{"site":"a\r\nX-Admin: 1"}`), "k")
		require.ErrorContains(t, err, "line break")
	})
}
