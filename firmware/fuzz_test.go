package firmware

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/outpost-edge/outpost/policy"
)

const fuzzBundle = "../testdata/bundles/patterns"

func FuzzDecodeManifest(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join(fuzzBundle, ManifestFile)); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{"format": 1, "name": "x", "version": 1, "created": "2025-01-01T00:00:00Z", "key_id": "k", "agents": {"a": "a.json"}, "files": {"a.json": "` + sha256Hex(nil) + `"}}`))
	f.Add([]byte(`{"files": {"../x": ""}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest(data)
		if err != nil {
			var fe *FileError
			if errors.As(err, &fe) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("FileError without ErrMalformed: %v", err)
			}
			return
		}
		for p := range m.Files {
			if checkPath(p) != nil {
				t.Fatalf("accepted escaping path %q", p)
			}
		}
		for _, r := range m.references() {
			if _, ok := m.Files[r.path]; !ok {
				t.Fatalf("accepted unlisted reference %q", r.path)
			}
		}
	})
}

func FuzzReadTar(f *testing.F) {
	var buf bytes.Buffer
	if err := WriteTar(fuzzBundle, &buf); err == nil {
		f.Add(buf.Bytes())
	}
	for _, h := range []tar.Header{
		{Name: "../x", Typeflag: tar.TypeReg, Size: 1},
		{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		{Name: "d/", Typeflag: tar.TypeDir},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&h)
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
		tw.Close()
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		files, err := readTar(bytes.NewReader(data))
		if err != nil {
			return
		}
		for p := range files {
			if checkPath(p) != nil {
				t.Fatalf("accepted escaping path %q", p)
			}
		}
	})
}

func FuzzCompileGraph(f *testing.F) {
	matches, _ := filepath.Glob(filepath.Join(fuzzBundle, "agents", "*.json"))
	for _, m := range matches {
		if data, err := os.ReadFile(m); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"name": "x", "channels": [], "nodes": [{"name": "a", "kind": "router"}], "edges": [{"from": "START", "to": "a"}]}`))
	f.Add([]byte(`{"name": "x", "channels": [], "tools": ["kb_search", "kb_search"], "nodes": [{"name": "a", "kind": "router"}], "edges": [{"from": "START", "to": "a"}]}`))
	f.Add([]byte(`{"name": "x", "channels": [], "tools": null, "nodes": [{"name": "a", "kind": "router"}], "edges": [{"from": "START", "to": "a"}]}`))
	f.Add([]byte(`{"name": "x", "channels": [{"name": "m", "type": "messages", "reducer": "append"}], "tools": [],
  "nodes": [{"name": "a", "kind": "tool_loop", "config": {"messages": "m"}}], "edges": [{"from": "START", "to": "a"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		reg, _ := policy.NewRegistry([]policy.Tool{{Name: "kb_search", Kind: policy.KindRead}})
		b := &Bundle{Manifest: &Manifest{Name: "fuzz", Version: 1}, Prompts: map[string]string{}, Registry: reg}
		gc := newGraphCompiler(b, contents{"g.json": data})
		cg, err := gc.compile("g.json")
		var fe *FileError
		if err != nil && !errors.As(err, &fe) && !errors.Is(err, ErrMissingFile) {
			t.Fatalf("error without a file position: %v", err)
		}
		if err != nil {
			return
		}
		// An allowlist is either refused with a position or holds only
		// tools of the registry, each once.
		if err := cg.spec.checkTools("fuzz"); err != nil {
			if !errors.As(err, &fe) || fe.Line == 0 {
				t.Fatalf("allowlist error without a position: %v", err)
			}
			return
		}
		if l := cg.spec.Allowlist(); len(l) > 1 || (len(l) == 1 && l[0] != "kb_search") {
			t.Fatalf("allowlist %q accepted", l)
		}
	})
}

func FuzzDecodeGolden(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join(fuzzBundle, "golden", "patterns.jsonl")); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = DecodeGolden("g.jsonl", data)
	})
}

// FuzzCheckGolden decodes and checks arbitrary golden files. An error, of
// either, is a *FileError wrapping ErrMalformed with a message, at a line
// of the file that holds a conversation and a column within that line.
// Each conversation keeps its own line, and one that holds a null where a
// value is wanted is refused. The conversations re-encoded, one a line,
// decode to the same conversations and check the same way, but for a null
// that an encoding leaves out as the field not given.
func FuzzCheckGolden(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join(fuzzBundle, "golden", "patterns.jsonl")); err == nil {
		f.Add(data)
	}
	f.Add([]byte("# a comment\n\n" + `{"name": "a", "agent": "x", "turns": [{"input": "hi", "expect": {"status": "done"}}]}` + "\n"))
	f.Add([]byte(`{"name": "a", "agent": "x", "turns": [{"input": 1, "resume": {"decision": "edit"}, "after_resume": {"final_regex": "("}}]}`))
	f.Add([]byte("\r\n" + `{"name": "a", "agent": "x", "turns": [{"input": 1, "expect": {"interrupt": "n", "status": "failed"}}]}` + "\r\n"))
	f.Add([]byte(`{"name": "a", "agent": "x", "turns": [{"input": {"a": [null]}, "expect": {"path": ["n", null], "flags": []}, "resume": {"decision": "edit", "value": null}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := bytes.Split(data, []byte("\n"))
		checkFault := func(what string, err error) {
			var fe *FileError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMalformed) || err.Error() == "" {
				t.Fatalf("%s: not a *FileError wrapping ErrMalformed: %v", what, err)
			}
			if fe.Line == 0 {
				return // the scanner's own error, of no one line
			}
			if fe.Line < 1 || fe.Line > len(lines) {
				t.Fatalf("%s: line %d of a file of %d: %v", what, fe.Line, len(lines), err)
			}
			line := bytes.TrimSpace(lines[fe.Line-1])
			if len(line) == 0 || line[0] == '#' {
				t.Fatalf("%s: line %d holds no conversation (%q): %v", what, fe.Line, lines[fe.Line-1], err)
			}
			if fe.Column < 0 || fe.Column > len(lines[fe.Line-1])+1 {
				t.Fatalf("%s: column %d of a line of %d bytes: %v", what, fe.Column, len(lines[fe.Line-1]), err)
			}
		}
		cs, err := DecodeGolden("g.jsonl", data)
		if err != nil {
			checkFault("decode", err)
			return
		}
		for _, c := range cs {
			if got := bytes.TrimSuffix(lines[c.Line-1], []byte("\r")); !bytes.Equal(c.raw, got) {
				t.Fatalf("conversation %q of line %d holds %q, the line is %q", c.Name, c.Line, c.raw, got)
			}
		}
		checked := CheckGolden(cs)
		if checked != nil {
			checkFault("check", checked)
		}
		nulls := false
		for _, c := range cs {
			if at := c.nullAt(); at != "" {
				nulls = true
				if checked == nil {
					t.Fatalf("conversation %q holds a null at %s, and passed", c.Name, at)
				}
			}
		}

		var again []byte
		for _, c := range cs {
			b, err := json.Marshal(c)
			if err != nil {
				t.Fatalf("encode %q: %v", c.Name, err)
			}
			again = append(append(again, b...), '\n')
		}
		cs2, err := DecodeGolden("g.jsonl", again)
		if err != nil {
			t.Fatalf("re-encoded conversations do not decode: %v\n%s", err, again)
		}
		var again2 []byte
		for _, c := range cs2 {
			b, _ := json.Marshal(c)
			again2 = append(append(again2, b...), '\n')
		}
		if !bytes.Equal(again, again2) {
			t.Fatalf("re-encoded conversations decode to others:\n%s\n%s", again, again2)
		}
		if checked2 := CheckGolden(cs2); !nulls && (checked == nil) != (checked2 == nil) {
			t.Fatalf("checked %v, re-encoded %v", checked, checked2)
		}
	})
}

func FuzzCompileYAMLGraph(f *testing.F) {
	matches, _ := filepath.Glob(filepath.Join(fuzzBundle, "agents", "*.yaml"))
	for _, m := range matches {
		if data, err := os.ReadFile(m); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("name: x\nchannels: []\nnodes: [{name: a, kind: router}]\nedges: [{from: START, to: a}]\n"))
	f.Add([]byte("name: x\nchannels: []\ntools: ~\nnodes: [{name: a, kind: router}]\nedges: [{from: START, to: a}]\n"))
	f.Add([]byte("name: x\nchannels: [{name: m, type: messages, reducer: append}]\ntools: [a, a]\nnodes: [{name: a, kind: tool_loop, config: {messages: m}}]\nedges: [{from: START, to: a}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		compile := func(file string, data []byte) error {
			b := &Bundle{Manifest: &Manifest{Name: "fuzz", Version: 1}, Prompts: map[string]string{}}
			gc := newGraphCompiler(b, contents{file: data})
			_, err := gc.compile(file)
			return err
		}
		err := compile("g.yaml", data)
		var fe *FileError
		if err != nil && !errors.As(err, &fe) && !errors.Is(err, ErrMissingFile) {
			t.Fatalf("error without a file position: %v", err)
		}
		if fe != nil && fe.File == "g.yaml" {
			if lines := 1 + bytes.Count(data, []byte{'\n'}); fe.Line < 0 || fe.Line > lines || fe.Column < 0 {
				t.Fatalf("position %d:%d outside a file of %d lines: %v", fe.Line, fe.Column, lines, err)
			}
		}
		// The YAML decodes exactly as the JSON it converts to.
		js, _, yerr := yamlToJSON("g.yaml", data)
		if yerr != nil {
			if err == nil {
				t.Fatalf("conversion failed (%v) but the graph compiled", yerr)
			}
			return
		}
		if !json.Valid(js) {
			t.Fatalf("converted to invalid JSON: %s", js)
		}
		if jerr := compile("g.json", js); (jerr == nil) != (err == nil) {
			t.Fatalf("YAML: %v; its JSON: %v", err, jerr)
		}
	})
}
