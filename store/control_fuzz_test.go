package store

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The /owner answer, as uplink status reads it from the control socket:
// an owner's own answer reads back as it wrote it, an error status is an
// error, and any answer taken is one JSON object of ControlOwner's fields
// alone, read as encoding/json reads it.
func FuzzControlOwner(f *testing.F) {
	for _, s := range []struct {
		status  uint16
		body    string
		command string
		sends   bool
		url     string
	}{
		{0, `{"command":"serve","sends_uplink":true,"uplink_url":"http://collector:8080"}`, "serve", true, "http://collector:8080"},
		{0, `{"command":"run","sends_uplink":false}`, "run", false, ""},
		{0, `{"command":"serve","sends_uplink":true,"secret":"x"}`, "serve", true, "https://c.example"},
		{0, `{"command":"serve","command":"run"}`, "run", false, ""},
		{0, `{"Command":"serve"}`, "serve", false, ""},
		{0, `{"command":"serve"} {}`, "serve", false, ""},
		{0, `null`, "", false, ""},
		{0, `{"command":"\ud800"}`, "\xff", false, "\x00"},
		{204, `{"error":"the store is closing"}`, "serve", true, ""},
		{204, `{"error":"x","kind":"run_not_found"}`, "serve", true, ""},
		{204, `not json`, "serve", true, ""},
		{200, `{"command":"serve"}`, "serve", false, ""},
	} {
		f.Add(s.status, []byte(s.body), s.command, s.sends, s.url)
	}
	dir := f.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, ControlSocket))
	if err != nil {
		f.Fatal(err)
	}
	var mu sync.Mutex
	var status int
	var body []byte
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/owner" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		w.Write(body)
	}), ReadHeaderTimeout: time.Second}
	go srv.Serve(l)
	f.Cleanup(func() { srv.Close() })
	c, err := DialControl(dir)
	if err != nil {
		f.Fatal(err)
	}
	answer := func(code int, b []byte) (ControlOwner, error) {
		mu.Lock()
		status, body = code, b
		mu.Unlock()
		return c.Owner(context.Background())
	}

	f.Fuzz(func(t *testing.T, st uint16, raw []byte, command string, sends bool, url string) {
		// An owner's own answer reads back as it wrote it.
		own, err := json.Marshal(ControlOwner{Command: command, SendsUplink: sends, UplinkURL: url})
		if err != nil {
			t.Fatal(err)
		}
		var want ControlOwner
		if err := json.Unmarshal(own, &want); err != nil {
			t.Fatal(err)
		}
		got, err := answer(http.StatusOK, own)
		if err != nil || got != want {
			t.Fatalf("the owner's answer %s read as %+v, %v; want %+v", own, got, err, want)
		}

		// Any other answer: 200 OK for st 0, else a status from 201 to 599.
		code := http.StatusOK
		if st > 0 {
			code = 201 + int(st)%399
		}
		got, err = answer(code, raw)
		if code != http.StatusOK {
			if err == nil {
				t.Fatalf("status %d with %q was taken as %+v", code, raw, got)
			}
			return
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("an empty error for %q", raw)
			}
			return
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var std ControlOwner
		if err := dec.Decode(&std); err != nil || dec.More() {
			t.Fatalf("%q was taken as %+v; encoding/json refuses it (%v) or finds more after it", raw, got, err)
		}
		if std != got {
			t.Fatalf("%q was taken as %+v; encoding/json reads %+v", raw, got, std)
		}
	})
}
