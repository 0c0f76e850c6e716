package uplink

import (
	"testing"
)

// FuzzDecodeRecord feeds the collector's record decoder arbitrary lines: it
// must refuse or accept, never panic, and what it accepts must carry a hash
// it verified.
func FuzzDecodeRecord(f *testing.F) {
	db := openAppliance(f, f.TempDir(), "fuzz-1")
	makeOutcomes(f, db, 3)
	outs, err := db.Outcomes(bg, 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	db.Close()
	for _, o := range outs {
		for _, r := range []Redactor{nil, keepAll{}} {
			line, err := EncodeRecord(o, r)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(line)
		}
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"redacted":{"x":{}}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		rec, err := DecodeRecord(line)
		if err != nil {
			return
		}
		if rec.Seq == 0 || rec.ApplianceID == "" || !isHexHash(rec.Hash) || !isHexHash(rec.PrevHash) {
			t.Fatalf("accepted an incomplete record: %+v", rec)
		}
	})
}
