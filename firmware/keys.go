package firmware

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/outpost-edge/outpost/internal/fsync"
)

// KeyID derives a key's id from its public key: "ed25519-" and the first
// 16 hex digits of the key's sha256. Ids name keys in manifests and
// signatures; the id is checked against the key, so it cannot be forged.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519-" + hex.EncodeToString(sum[:8])
}

// keyFile is the on-disk form of a key, private or public.
type keyFile struct {
	Algorithm  string `json:"algorithm"`
	KeyID      string `json:"key_id"`
	PublicKey  string `json:"public_key"`
	PrivateKey string `json:"private_key,omitempty"`
}

// Keygen makes a new ed25519 key pair in dir: KEYID.key (the private key,
// mode 0600) and KEYID.pub (the public key, to configure as trusted on
// appliances). It returns the key id.
func Keygen(dir string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	id := KeyID(pub)
	if err := fsync.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("keygen: %w", err)
	}
	pubf := keyFile{Algorithm: "ed25519", KeyID: id, PublicKey: base64.StdEncoding.EncodeToString(pub)}
	privf := pubf
	privf.PrivateKey = base64.StdEncoding.EncodeToString(priv.Seed())
	for _, f := range []struct {
		name string
		v    keyFile
		mode os.FileMode
	}{{id + ".key", privf, 0o600}, {id + ".pub", pubf, 0o644}} {
		raw, _ := json.MarshalIndent(f.v, "", "  ")
		if err := writeFileAtomic(filepath.Join(dir, f.name), append(raw, '\n'), f.mode); err != nil {
			return "", fmt.Errorf("keygen: %w", err)
		}
	}
	return id, nil
}

// WritePublicKey writes pub as KEYID.pub in dir, the form Keygen writes
// and a keyring loads, unless that file is already there. The write is
// atomic and durable: a power cut leaves no torn key behind, which would
// make every bundle it signed fail to verify at the next start.
func WritePublicKey(dir string, pub ed25519.PublicKey) error {
	id := KeyID(pub)
	name := filepath.Join(dir, id+".pub")
	if _, err := os.Stat(name); err == nil {
		return nil
	}
	if err := fsync.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write key %s: %w", id, err)
	}
	raw, _ := json.MarshalIndent(keyFile{Algorithm: "ed25519", KeyID: id, PublicKey: base64.StdEncoding.EncodeToString(pub)}, "", "  ")
	if err := writeFileAtomic(name, append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("write key %s: %w", id, err)
	}
	return nil
}

func readKeyFile(file string, wantPrivate bool) (keyFile, ed25519.PublicKey, ed25519.PrivateKey, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return keyFile{}, nil, nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	return parseKeyFile(file, data, wantPrivate)
}

func parseKeyFile(file string, data []byte, wantPrivate bool) (keyFile, ed25519.PublicKey, ed25519.PrivateKey, error) {
	var kf keyFile
	if _, err := decodeStrict(filepath.Base(file), data, &kf); err != nil {
		return kf, nil, nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	if kf.Algorithm != "ed25519" {
		return kf, nil, nil, fmt.Errorf("%w: %s: algorithm %q, want ed25519", ErrKeyFile, file, kf.Algorithm)
	}
	pubRaw, err := base64.StdEncoding.DecodeString(kf.PublicKey)
	if err != nil || len(pubRaw) != ed25519.PublicKeySize {
		return kf, nil, nil, fmt.Errorf("%w: %s: public_key is not a base64 ed25519 public key", ErrKeyFile, file)
	}
	pub := ed25519.PublicKey(pubRaw)
	if KeyID(pub) != kf.KeyID {
		return kf, nil, nil, fmt.Errorf("%w: %s: key_id %q does not match the key (%s)", ErrKeyFile, file, kf.KeyID, KeyID(pub))
	}
	if !wantPrivate {
		return kf, pub, nil, nil
	}
	if kf.PrivateKey == "" {
		// The .pub beside the .key that Keygen wrote: name the one to use.
		return kf, nil, nil, fmt.Errorf("%w: %s is a public key, which cannot sign: sign with the private key, %s",
			ErrKeyFile, file, filepath.Join(filepath.Dir(file), kf.KeyID+".key"))
	}
	seed, err := base64.StdEncoding.DecodeString(kf.PrivateKey)
	if err != nil || len(seed) != ed25519.SeedSize {
		return kf, nil, nil, fmt.Errorf("%w: %s: private_key is not a base64 ed25519 seed", ErrKeyFile, file)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	if !pub.Equal(priv.Public()) {
		return kf, nil, nil, fmt.Errorf("%w: %s: private and public keys do not belong together", ErrKeyFile, file)
	}
	return kf, pub, priv, nil
}

// LoadPrivateKey reads a private key file written by Keygen.
func LoadPrivateKey(file string) (id string, key ed25519.PrivateKey, err error) {
	kf, _, priv, err := readKeyFile(file, true)
	if err != nil {
		return "", nil, err
	}
	return kf.KeyID, priv, nil
}

// Keyring is the set of public keys an appliance trusts, by key id. To
// rotate, add the new key and keep the old one until every bundle in use is
// re-signed with the new one.
type Keyring struct {
	keys map[string]ed25519.PublicKey
}

// NewKeyring returns a keyring trusting the given keys.
func NewKeyring(keys ...ed25519.PublicKey) *Keyring {
	k := &Keyring{keys: map[string]ed25519.PublicKey{}}
	for _, pub := range keys {
		k.Add(pub)
	}
	return k
}

// Add trusts pub and returns its id.
func (k *Keyring) Add(pub ed25519.PublicKey) string {
	id := KeyID(pub)
	k.keys[id] = append(ed25519.PublicKey(nil), pub...)
	return id
}

// Key returns the trusted key with the given id.
func (k *Keyring) Key(id string) (ed25519.PublicKey, bool) {
	if k == nil {
		return nil, false
	}
	pub, ok := k.keys[id]
	return pub, ok
}

// IDs lists the trusted key ids, sorted.
func (k *Keyring) IDs() []string {
	if k == nil {
		return nil
	}
	ids := make([]string, 0, len(k.keys))
	for id := range k.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// LoadKeyring reads public key files: each path is a .pub file or a
// directory whose *.pub files are all read.
func LoadKeyring(paths ...string) (*Keyring, error) {
	k := NewKeyring()
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
		}
		files := []string{p}
		if fi.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
			}
			files = files[:0]
			for _, e := range entries {
				if !e.IsDir() && strings.HasSuffix(e.Name(), ".pub") {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
		}
		for _, f := range files {
			_, pub, _, err := readKeyFile(f, false)
			if err != nil {
				return nil, err
			}
			k.Add(pub)
		}
	}
	return k, nil
}

// writeFileAtomic writes data to a temporary file beside name, syncs it and
// renames it over name, then syncs the directory: a crash leaves the old
// file or the new one, never a torn one.
func writeFileAtomic(name string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		return err
	}
	return fsync.Dir(dir)
}
