package console

import (
	"encoding/json"
	"testing"
	"time"
)

// A wait in seconds is capped before it becomes a duration: a number past
// what int64 nanoseconds hold came out negative, and was refused as such.
func TestParseWait(t *testing.T) {
	s := &Server{cfg: Config{MaxWait: 5 * time.Minute}}
	for _, c := range []struct {
		raw  string
		want time.Duration
		code string
	}{
		{`"30s"`, 30 * time.Second, ""},
		{`2.5`, 2500 * time.Millisecond, ""},
		{`1e300`, 5 * time.Minute, ""},
		{`"9999h"`, 5 * time.Minute, ""},
		{`-1`, 0, "bad_wait"},
		{`"-1s"`, 0, "bad_wait"},
		{`"soon"`, 0, "bad_wait"},
		{`true`, 0, "bad_wait"},
		{`null`, 0, ""},
	} {
		got, err := s.parseWait(json.RawMessage(c.raw))
		switch {
		case c.code != "" && (err == nil || err.Code != c.code):
			t.Errorf("wait %s: got %v, %v; want error %s", c.raw, got, err, c.code)
		case c.code == "" && (err != nil || got != c.want):
			t.Errorf("wait %s: got %v, %v; want %v", c.raw, got, err, c.want)
		}
	}
}
