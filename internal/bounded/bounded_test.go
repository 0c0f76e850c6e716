package bounded

import "testing"

func keys(m *Map[string, int], ks ...string) map[string]bool {
	got := map[string]bool{}
	for _, k := range ks {
		if _, ok := m.Get(k); ok {
			got[k] = true
		}
	}
	return got
}

func TestMapKeepsItsCapacity(t *testing.T) {
	m := New[string, int](3)
	for i, k := range []string{"a", "b", "c", "d"} {
		m.Put(k, i)
	}
	if got := keys(m, "a", "b", "c", "d"); got["a"] || len(got) != 3 || m.Len() != 3 {
		t.Fatalf("after 4 puts into 3: kept %v, len %d; want b, c, d", got, m.Len())
	}
	// Putting a kept key replaces its value and keeps its place: b, put
	// longest ago, goes next, not d.
	m.Put("d", 30)
	m.Put("e", 4)
	if got := keys(m, "b", "c", "d", "e"); got["b"] || len(got) != 3 {
		t.Fatalf("kept %v; want c, d, e", got)
	}
	if v, _ := m.Get("d"); v != 30 {
		t.Fatalf("d = %d, want 30", v)
	}
}

// A key deleted and put again counts from its new put: when its old place
// comes round, it is not forgotten.
func TestMapKeyPutAgain(t *testing.T) {
	m := New[string, int](3)
	m.Put("a", 1)
	m.Put("b", 2)
	m.Put("c", 3)
	m.Delete("b")
	m.Put("b", 4) // the next place, a's: a goes
	m.Put("x", 5) // b's old place: nothing held there now
	if got := keys(m, "a", "b", "c", "x"); got["a"] || !got["b"] || !got["c"] || !got["x"] {
		t.Fatalf("kept %v; want b, c, x", got)
	}
	m.Delete("x")
	if m.Len() != 2 {
		t.Fatalf("len %d after a delete, want 2", m.Len())
	}
}
