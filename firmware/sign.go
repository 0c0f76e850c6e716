package firmware

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"
)

// Sign signs the bundle in dir with the private key in keyFile: it records
// the sha256 of every file in the directory in the manifest's files, sets
// the key id (and the created time, when missing), rewrites manifest.json
// and writes manifest.sig over its exact bytes. The exported reference
// bundle (Export), signed with a key other than the development key, gets
// a description that no longer says the development key signs it.
func Sign(dir, keyFile string) error {
	_, err := SignBundle(dir, keyFile)
	return err
}

// Signed is what SignBundle did to a bundle besides signing it.
type Signed struct {
	KeyID string
	// Description, when not "", is the description the manifest was given
	// in place of WasDescription: an exported reference bundle signed by
	// a key other than the development key no longer says that the
	// development key signs it.
	Description, WasDescription string
}

// SignBundle is Sign, and says what it changed in the manifest.
func SignBundle(dir, keyFile string) (*Signed, error) {
	id, priv, err := LoadPrivateKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	files, err := readDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	raw, ok := files[ManifestFile]
	if !ok {
		return nil, fmt.Errorf("sign %s: %w: %s", dir, ErrMissingFile, ManifestFile)
	}
	var m Manifest
	pos, err := decodeStrict(ManifestFile, raw, &m)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", dir, err)
	}
	// A file the manifest names that the folder lacks is the author's to
	// add or unname: say which entry names it, and where.
	for _, r := range m.references() {
		if _, ok := files[r.path]; !ok && checkPath(r.path) == nil {
			return nil, fmt.Errorf("sign %s: %w", dir, malformedAs(ErrMissingFile, ManifestFile, raw, pos.At(r.field), "",
				"%s names %q, which is not in the folder", r.field, r.path))
		}
	}
	m.KeyID = id
	done := &Signed{KeyID: id}
	if m.Description == referenceDescription && !isDevKey(id) {
		// The exported reference bundle, signed by another key: its
		// description no longer says which key signs it.
		done.WasDescription, done.Description = m.Description, resignedReferenceDescription
		m.Description = resignedReferenceDescription
	}
	if m.Created.IsZero() {
		m.Created = time.Now().UTC().Truncate(time.Second)
	}
	m.Files = map[string]string{}
	for p, data := range files {
		if p != ManifestFile && p != SignatureFile {
			m.Files[p] = sha256Hex(data)
		}
	}
	out, err := json.MarshalIndent(&m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", dir, err)
	}
	out = append(out, '\n')
	// Check what we are about to sign the way an appliance will read it.
	if _, err := DecodeManifest(out); err != nil {
		return nil, fmt.Errorf("sign %s: %w", dir, err)
	}
	if err := signManifest(dir, out, id, priv); err != nil {
		return nil, err
	}
	return done, nil
}

func signManifest(dir string, manifest []byte, id string, priv ed25519.PrivateKey) error {
	if err := writeFileAtomic(filepath.Join(dir, ManifestFile), manifest, 0o644); err != nil {
		return fmt.Errorf("sign %s: %w", dir, err)
	}
	sig := ed25519.Sign(priv, manifest)
	if err := writeFileAtomic(filepath.Join(dir, SignatureFile), encodeSignature(id, sig), 0o644); err != nil {
		return fmt.Errorf("sign %s: %w", dir, err)
	}
	return nil
}
