package firmware

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// The reference bundle: the medication-adherence assistant on synthetic
// data, signed with the development key that ships in the repository
// (testdata/keys/dev.key). Re-sign it after an edit with
// go test ./firmware -run TestUpdateReference -update.
//
//go:embed all:reference/bundle
var referenceFS embed.FS

//go:embed reference/dev.pub
var devPub []byte

// Names of the reference bundle and its agents.
const (
	ReferenceName       = "medication-adherence"
	ReferenceAgent      = "medication-adherence"
	ReferenceToolsAgent = "medication-adherence-tools"
	referenceRoot       = "reference/bundle"
)

// ReferenceNotice is what an appliance says when it runs the embedded
// bundle: its key is public, so its signature proves nothing about who
// made it.
const ReferenceNotice = "running the development-signed reference bundle (synthetic data; its signing key is public: not for production)"

var (
	referenceOnce  sync.Once
	referenceFiles contents
	referenceErr   error
)

// referenceOverride, when set, is a bundle folder that stands in for the
// embedded reference bundle. Only a binary built with the tag
// outpost_reference_override sets it (from $OUTPOST_TEST_REFERENCE), so
// that a test can replace the binary by one with another embedded bundle.
var referenceOverride string

func referenceContents() (contents, error) {
	referenceOnce.Do(func() {
		if referenceOverride != "" {
			referenceFiles, referenceErr = readDir(referenceOverride)
			return
		}
		files := contents{}
		referenceErr = fs.WalkDir(referenceFS, referenceRoot, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := referenceFS.ReadFile(p)
			if err != nil {
				return err
			}
			rel := p[len(referenceRoot)+1:]
			if err := checkPath(rel); err != nil {
				return err
			}
			files[rel] = data
			return nil
		})
		referenceFiles = files
	})
	return referenceFiles, referenceErr
}

var (
	referenceVerifyOnce sync.Once
	referenceV          *verified
	referenceVErr       error
)

// referenceVerified is the embedded bundle, verified against the
// development key once.
func referenceVerified() (*verified, error) {
	referenceVerifyOnce.Do(func() {
		files, err := referenceContents()
		if err != nil {
			referenceVErr = err
			return
		}
		keys, err := DevKeyring()
		if err != nil {
			referenceVErr = err
			return
		}
		referenceV, referenceVErr = verifyContents(files, keys)
	})
	return referenceV, referenceVErr
}

// DevKeyring trusts only the development key the reference bundle is
// signed with.
// referenceDescription is the embedded reference bundle's description,
// which says that the development key signs it; resignedReferenceDescription
// is the one Sign gives an exported copy that another key signs.
const (
	referenceDescription = "Reference medication-adherence assistant, on synthetic data only. " +
		"Signed with the DEVELOPMENT key that ships in the Outpost repository: not for production use."
	resignedReferenceDescription = "Reference medication-adherence assistant, on synthetic data only: not for production use. " +
		"Made from the Outpost reference bundle; manifest.json's key_id names the key that signs it."
)

// isDevKey reports whether id is the development key's id.
func isDevKey(id string) bool {
	ring, err := DevKeyring()
	if err != nil {
		return false
	}
	_, ok := ring.Key(id)
	return ok
}

func DevKeyring() (*Keyring, error) {
	_, pub, _, err := parseKeyFile("reference/dev.pub", devPub, false)
	if err != nil {
		return nil, err
	}
	return NewKeyring(pub), nil
}

// DevPublicKey returns the development public key file's bytes, to install
// as trusted on a development appliance.
func DevPublicKey() []byte { return append([]byte(nil), devPub...) }

// Reference loads the embedded reference bundle, verifying its signature
// with the embedded development public key, without a Runtime (its model
// nodes answer from the bundle's scripted rules).
func Reference() (*Bundle, error) { return ReferenceWithRuntime(nil) }

var (
	referenceCheckOnce sync.Once
	referenceCheckErr  error
)

// ReferenceWithRuntime loads the embedded reference bundle for rt. The
// bundle is part of the binary, so it is verified at its first load alone,
// and then checked as firmware verify checks a bundle (checkNames): a
// binary whose embedded bundle names a redaction field no outcome has, say,
// refuses to run it rather than keep that field's data home unseen.
func ReferenceWithRuntime(rt *Runtime) (*Bundle, error) {
	v, err := referenceVerified()
	if err != nil {
		return nil, fmt.Errorf("reference bundle: %w", err)
	}
	b, err := load(v, rt)
	if err == nil {
		referenceCheckOnce.Do(func() { referenceCheckErr = b.checkNames(v) })
		err = referenceCheckErr
	}
	if err != nil {
		return nil, fmt.Errorf("reference bundle: %w", err)
	}
	return b, nil
}

// Export writes the embedded reference bundle (signed, as embedded) into
// dir, which must not exist or be empty, as a starting point for one's
// own bundle: edit it, then Sign it with one's own key.
func Export(dir string) error {
	files, err := referenceContents()
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("export: %s is not empty", dir)
	}
	for _, p := range sortedKeys(files) {
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if err := os.WriteFile(dst, files[p], 0o644); err != nil {
			return fmt.Errorf("export: %w", err)
		}
	}
	return nil
}
