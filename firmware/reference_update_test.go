package firmware_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/outpost-edge/outpost/firmware"
)

const (
	// The development key: it is public, in the repository, and signs only
	// the reference bundle. Never trust it on a production appliance.
	devKey       = "../testdata/keys/dev.key"
	devPub       = "../testdata/keys/dev.pub"
	embeddedPub  = "reference/dev.pub"
	referenceDir = "reference/bundle"
)

// TestUpdateReference re-signs the embedded reference bundle with the
// development key when run with -update (making the key if it is missing).
func TestUpdateReference(t *testing.T) {
	if !*update {
		t.Skip("run with -update to re-sign the reference bundle")
	}
	if _, err := os.Stat(devKey); errors.Is(err, fs.ErrNotExist) {
		dir := t.TempDir()
		id, err := firmware.Keygen(dir)
		if err != nil {
			t.Fatal(err)
		}
		for src, dst := range map[string]string{id + ".key": devKey, id + ".pub": devPub} {
			data, err := os.ReadFile(filepath.Join(dir, src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	pub, err := os.ReadFile(devPub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(embeddedPub, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := firmware.Sign(referenceDir, devKey); err != nil {
		t.Fatal(err)
	}
}
