package firmware

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
)

// sigPrefix opens every signature file: a format tag, the key id, then the
// signature in base64, on one line.
const sigPrefix = "outpost-ed25519-v1"

func encodeSignature(keyID string, sig []byte) []byte {
	return []byte(sigPrefix + " " + keyID + " " + base64.StdEncoding.EncodeToString(sig) + "\n")
}

// checkSignature verifies manifest.sig over the manifest's exact bytes and
// returns the signing key's id. Nothing in the manifest is read before it
// passes.
func checkSignature(files contents, keys *Keyring) (string, error) {
	manifest, ok := files[ManifestFile]
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrMissingFile, ManifestFile)
	}
	sig, ok := files[SignatureFile]
	if !ok {
		return "", fmt.Errorf("%w: %s is missing", ErrBundleSignature, SignatureFile)
	}
	fields := strings.Fields(string(sig))
	if len(fields) != 3 || fields[0] != sigPrefix {
		return "", fmt.Errorf("%w: %s is not an %s signature", ErrBundleSignature, SignatureFile, sigPrefix)
	}
	id := fields[1]
	raw, err := base64.StdEncoding.DecodeString(fields[2])
	if err != nil || len(raw) != ed25519.SignatureSize {
		return "", fmt.Errorf("%w: %s: malformed signature", ErrBundleSignature, SignatureFile)
	}
	pub, ok := keys.Key(id)
	if !ok {
		return "", fmt.Errorf("%w: %q (trusted: %s)", ErrUnknownKey, id, strings.Join(keys.IDs(), ", "))
	}
	if !ed25519.Verify(pub, manifest, raw) {
		return "", fmt.Errorf("%w: the signature by %s does not match %s", ErrBundleSignature, id, ManifestFile)
	}
	return id, nil
}

// verified is a bundle whose signature, manifest and file hashes passed.
type verified struct {
	manifest *Manifest
	raw      []byte // the manifest's exact bytes
	digest   string // "sha256:" + hex of raw
	files    contents
}

// verifications counts verifyContents' calls (see Verifications).
var verifications atomic.Int64

// Verifications is how many times this process has checked a bundle's
// signature and files: each Load, Verify and Install, the first Open of an
// installed version by an Installer, and the embedded reference bundle's
// first load. It shows that a bundle is not verified again where once is
// enough.
func Verifications() int64 { return verifications.Load() }

// verifyContents checks a bundle in the order that keeps unsigned bytes
// away from every parser: the signature over the manifest's bytes, then the
// manifest, then each file against its hash, then files nobody listed.
func verifyContents(files contents, keys *Keyring) (*verified, error) {
	verifications.Add(1)
	id, err := checkSignature(files, keys)
	if err != nil {
		return nil, err
	}
	raw := files[ManifestFile]
	m, err := DecodeManifest(raw)
	if err != nil {
		return nil, err
	}
	if m.KeyID != id {
		return nil, fmt.Errorf("%w: %s names key %q but is signed by %q", ErrBundleSignature, ManifestFile, m.KeyID, id)
	}
	for _, p := range sortedKeys(m.Files) {
		data, ok := files[p]
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrMissingFile, p)
		}
		if got := sha256Hex(data); got != m.Files[p] {
			return nil, fmt.Errorf("%w: %s: sha256 %s, manifest says %s", ErrHashMismatch, p, got, m.Files[p])
		}
	}
	for _, p := range sortedKeys(files) {
		if _, ok := m.Files[p]; !ok && p != ManifestFile && p != SignatureFile {
			return nil, fmt.Errorf("%w: %s", ErrUnlistedFile, p)
		}
	}
	return &verified{manifest: m, raw: bytes.Clone(raw), digest: Digest(raw), files: files}, nil
}

// Digest is a bundle's content address: the sha256 of its manifest's bytes,
// which in turn hold the sha256 of every other file.
func Digest(manifest []byte) string {
	return "sha256:" + sha256Hex(manifest)
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Verify checks the bundle at path (a directory or a .tar) against the
// trusted keys and returns its manifest. It checks the signature over the
// manifest's bytes before it parses anything, then every file's sha256,
// and refuses files the manifest does not list.
func Verify(path string, keys *Keyring) (*Manifest, error) {
	files, err := readBundle(path)
	if err != nil {
		return nil, err
	}
	v, err := verifyContents(files, keys)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", path, err)
	}
	return v.manifest, nil
}
