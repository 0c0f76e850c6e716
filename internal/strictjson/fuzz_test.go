package strictjson

import (
	"bytes"
	"encoding/json"
	"testing"
)

// ElementAt finds the i-th element of the array at off wherever it is,
// or says there is none: its offset is always within data, and what
// begins there is the element a full decode of the array has at i.
func FuzzElementAt(f *testing.F) {
	for _, s := range []struct {
		data   string
		off, i int
	}{
		{`["a", "b" , "c"]`, 0, 2},
		{`{"fields": [ "x",  {"y": [1, 2]}, null ]}`, 11, 1},
		{`{"fields": [ "x" ]}`, 11, 3},
		{`[1, 2`, 0, 1},
		{`  [ ]`, 0, 0},
		{`["\u00e9", "\"]"]`, 0, 1},
		{`[1,]`, 0, 1},
		{`"not an array"`, 0, 0},
		{`[1]`, -1, 0},
		{`[1]`, 0, -1},
		{`[1]`, 3, 0},
	} {
		f.Add([]byte(s.data), s.off, s.i)
	}
	f.Fuzz(func(t *testing.T, data []byte, off, i int) {
		at := ElementAt(data, off, i)
		if at == -1 {
			if elems, ok := arrayAt(data, off); ok && i >= 0 && i < len(elems) {
				t.Fatalf("ElementAt(%q, %d, %d) found nothing; the array has %d elements", data, off, i, len(elems))
			}
			return
		}
		if at < off || at >= len(data) {
			t.Fatalf("ElementAt(%q, %d, %d) = %d, outside [%d, %d)", data, off, i, at, off, len(data))
		}
		var got json.RawMessage
		if err := json.NewDecoder(bytes.NewReader(data[at:])).Decode(&got); err != nil {
			t.Fatalf("ElementAt(%q, %d, %d) = %d, where no value begins: %v", data, off, i, at, err)
		}
		if elems, ok := arrayAt(data, off); ok {
			if i >= len(elems) {
				t.Fatalf("ElementAt(%q, %d, %d) = %d; the array has %d elements", data, off, i, at, len(elems))
			}
			if !bytes.Equal(compact(t, got), compact(t, elems[i])) {
				t.Fatalf("ElementAt(%q, %d, %d) = %d, where %s begins; element %d is %s", data, off, i, at, got, i, elems[i])
			}
		}
	})
}

// arrayAt decodes the array that begins at off of data, if one does and
// is whole.
func arrayAt(data []byte, off int) ([]json.RawMessage, bool) {
	if off < 0 || off >= len(data) {
		return nil, false
	}
	var elems []json.RawMessage
	tok, err := json.NewDecoder(bytes.NewReader(data[off:])).Token()
	if err != nil || tok != json.Delim('[') {
		return nil, false
	}
	if err := json.NewDecoder(bytes.NewReader(data[off:])).Decode(&elems); err != nil {
		return nil, false
	}
	return elems, true
}

func compact(t *testing.T, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("compact %s: %v", raw, err)
	}
	return b.Bytes()
}
