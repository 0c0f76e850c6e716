package firmware_test

import (
	"archive/tar"
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// signRaw signs manifest bytes as they are, for manifests Sign would refuse
// to write.
func signRaw(t testing.TB, dir string, manifest []byte) {
	t.Helper()
	id, priv, err := firmware.LoadPrivateKey(testKey)
	if err != nil {
		t.Fatal(err)
	}
	sig := ed25519.Sign(priv, manifest)
	writeFile(t, dir, firmware.ManifestFile, string(manifest))
	writeFile(t, dir, firmware.SignatureFile, "outpost-ed25519-v1 "+id+" "+base64.StdEncoding.EncodeToString(sig)+"\n")
}

type tarEntry struct {
	hdr  tar.Header
	body string
}

// tarOf packs a bundle directory (under prefix) and extra entries into a
// tar file.
func tarOf(t testing.TB, dir, prefix string, extra ...tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if dir != "" {
		err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Name: prefix + filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range extra {
		h := e.hdr
		h.Size = int64(len(e.body))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bundle.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVerify(t *testing.T) {
	keys := testKeyring(t)
	other := firmware.NewKeyring()
	otherPub, _, _ := ed25519.GenerateKey(nil)
	other.Add(otherPub)
	reg := func(name, body string) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg}, body: body}
	}

	tests := []struct {
		name   string
		bundle func(t *testing.T) string
		keys   *firmware.Keyring
		want   error
	}{
		{name: "valid directory", bundle: func(t *testing.T) string { return patternsDir }},
		{name: "valid tar", bundle: func(t *testing.T) string { return tarOf(t, patternsDir, "") }},
		{name: "valid tar of a directory", bundle: func(t *testing.T) string { return tarOf(t, patternsDir, "patterns/") }},
		{name: "valid tar with ./ paths", bundle: func(t *testing.T) string { return tarOf(t, patternsDir, "./") }},
		{name: "manifest changed after signing", want: firmware.ErrBundleSignature, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			data, _ := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
			writeFile(t, dir, firmware.ManifestFile, strings.Replace(string(data), `"version": 1`, `"version": 9`, 1))
			return dir
		}},
		{name: "signature missing", want: firmware.ErrBundleSignature, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			os.Remove(filepath.Join(dir, firmware.SignatureFile))
			return dir
		}},
		{name: "signature garbled", want: firmware.ErrBundleSignature, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			writeFile(t, dir, firmware.SignatureFile, "not a signature")
			return dir
		}},
		{name: "unknown key", keys: other, want: firmware.ErrUnknownKey, bundle: func(t *testing.T) string { return patternsDir }},
		{name: "hash mismatch", want: firmware.ErrHashMismatch, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			writeFile(t, dir, "kb/kb-01.md", "# Missed doses\nTake two doses at once.\n")
			return dir
		}},
		{name: "missing file", want: firmware.ErrMissingFile, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			os.Remove(filepath.Join(dir, "kb", "kb-02.md"))
			return dir
		}},
		{name: "unlisted file", want: firmware.ErrUnlistedFile, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			writeFile(t, dir, "agents/extra.json", "{}")
			return dir
		}},
		{name: "unlisted file in tar", want: firmware.ErrUnlistedFile, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", reg("kb/kb-99.md", "smuggled"))
		}},
		{name: "symlink in directory", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			if err := os.Symlink("/etc/passwd", filepath.Join(dir, "kb", "kb-04.md")); err != nil {
				t.Skip(err)
			}
			return dir
		}},
		{name: "manifest lists a path with ..", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			data, _ := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
			signRaw(t, dir, []byte(strings.Replace(string(data), `"files": {`,
				`"files": {"../outside.txt": "0000000000000000000000000000000000000000000000000000000000000000",`, 1)))
			return dir
		}},
		{name: "manifest names an absolute path", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			data, _ := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
			signRaw(t, dir, []byte(strings.Replace(string(data), `"rules": "rules.json"`, `"rules": "/etc/rules.json"`, 1)))
			return dir
		}},
		{name: "tar entry with ..", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", reg("../evil.txt", "x"))
		}},
		{name: "tar entry with absolute path", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", reg("/etc/cron.d/evil", "x"))
		}},
		{name: "tar symlink", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", tarEntry{hdr: tar.Header{Name: "kb/link.md", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}})
		}},
		{name: "tar hard link", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", tarEntry{hdr: tar.Header{Name: "kb/hard.md", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}})
		}},
		{name: "tar device", want: firmware.ErrPathEscape, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", tarEntry{hdr: tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}})
		}},
		{name: "tar entry twice", want: firmware.ErrMalformed, bundle: func(t *testing.T) string {
			return tarOf(t, patternsDir, "", reg("rules.json", "{}"))
		}},
		{name: "not a tar", want: firmware.ErrMalformed, bundle: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "bundle.tar")
			os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 100), 0o644)
			return p
		}},
		{name: "manifest with an unknown field", want: firmware.ErrMalformed, bundle: func(t *testing.T) string {
			dir := copyDir(t, patternsDir)
			data, _ := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
			signRaw(t, dir, []byte(strings.Replace(string(data), `"tools":`, `"toolz": "x", "tools":`, 1)))
			return dir
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := keys
			if tt.keys != nil {
				k = tt.keys
			}
			m, err := firmware.Verify(tt.bundle(t), k)
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if m.Name != "patterns" || m.Version != 1 || len(m.Agents) != 11 {
					t.Fatalf("manifest %+v", m)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			t.Log(err)
		})
	}
}

// A bad signature is reported even when the files it would vouch for are
// broken too: nothing is parsed before the signature passes.
func TestVerifySignatureComesFirst(t *testing.T) {
	dir := copyDir(t, patternsDir)
	writeFile(t, dir, firmware.ManifestFile, "{ this is not JSON")
	writeFile(t, dir, "unlisted.txt", "x")
	_, err := firmware.Verify(dir, testKeyring(t))
	if !errors.Is(err, firmware.ErrBundleSignature) {
		t.Fatalf("err = %v, want ErrBundleSignature", err)
	}
}

func TestMalformedManifestPosition(t *testing.T) {
	dir := copyDir(t, patternsDir)
	data, _ := os.ReadFile(filepath.Join(dir, firmware.ManifestFile))
	signRaw(t, dir, []byte(strings.Replace(string(data), `"tools":`, `"toolz": "x", "tools":`, 1)))
	_, err := firmware.Verify(dir, testKeyring(t))
	var fe *firmware.FileError
	if !errors.As(err, &fe) || !errors.Is(err, firmware.ErrMalformed) {
		t.Fatalf("err = %v, want a *FileError wrapping ErrMalformed", err)
	}
	lines := strings.Split(string(data), "\n")
	wantLine := 0
	for i, l := range lines {
		if strings.Contains(l, `"tools":`) {
			wantLine = i + 1
		}
	}
	if fe.File != firmware.ManifestFile || fe.Line != wantLine || fe.Column != 3 || !strings.Contains(fe.Error(), `unknown field "toolz"`) {
		t.Fatalf("got %s (line %d, column %d), want line %d, column 3", fe, fe.Line, fe.Column, wantLine)
	}
}

func TestMinApplianceVersion(t *testing.T) {
	m, err := firmware.Verify(patternsDir, testKeyring(t))
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]error{"0.0.9": firmware.ErrMinVersion, "0.1.0": nil, "v1.2.3": nil, "dev": nil} {
		if err := m.CheckApplianceVersion(v); !errors.Is(err, want) {
			t.Errorf("appliance %s: err = %v, want %v", v, err, want)
		}
	}
	in, err := firmware.NewInstaller(t.TempDir(), testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Install(patternsDir, firmware.InstallOptions{}); !errors.Is(err, firmware.ErrMinVersion) {
		t.Fatalf("install on an old appliance: err = %v", err)
	}
}

// A binary rolled back below a bundle's min_appliance_version after the
// bundle was installed starts no new run on it, does not make it active
// again, and does not run it for a run pinned to it either (see
// TestPinnedRunsDoNotGoOnAfterARollback). A development build holds no
// bundle to its minimum.
func TestMinApplianceVersionAfterARollback(t *testing.T) {
	dir := t.TempDir()
	in, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "0.1.0"})
	require.NoError(t, err)
	rec, err := in.Install(patternsDir, firmware.InstallOptions{})
	require.NoError(t, err)
	require.NoError(t, in.Activate(rec.Name, rec.Version), "the version it needs activates it")

	old, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "0.0.9"})
	require.NoError(t, err)
	_, err = firmware.Resolver(old)("sequential", engine.BundleRef{})
	require.ErrorIs(t, err, firmware.ErrMinVersion, "a new run on the rolled-back binary")
	require.ErrorContains(t, err, "needs appliance 0.1.0 or later, this is 0.0.9")
	_, err = firmware.Resolver(old)("sequential", rec.Ref())
	require.ErrorIs(t, err, firmware.ErrMinVersion, "a run pinned to the version, on the rolled-back binary")
	err = old.Activate(rec.Name, rec.Version)
	require.ErrorIs(t, err, firmware.ErrMinVersion, "activate on the rolled-back binary")

	dev, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{ApplianceVersion: "dev"})
	require.NoError(t, err)
	_, err = firmware.Resolver(dev)("sequential", engine.BundleRef{})
	require.NoError(t, err, "a development build")
	_, err = firmware.Resolver(dev)("sequential", rec.Ref())
	require.NoError(t, err, "a pinned run on a development build")
	require.NoError(t, dev.Activate(rec.Name, rec.Version))
}

func TestKeygenAndRotation(t *testing.T) {
	dir := t.TempDir()
	oldID, err := firmware.Keygen(dir)
	if err != nil {
		t.Fatal(err)
	}
	newID, err := firmware.Keygen(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, oldID+".key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key file: %v, mode %v", err, fi.Mode())
	}
	oldBundle := copyDir(t, patternsDir)
	if err := firmware.Sign(oldBundle, filepath.Join(dir, oldID+".key")); err != nil {
		t.Fatal(err)
	}
	newBundle := copyDir(t, patternsDir)
	if err := firmware.Sign(newBundle, filepath.Join(dir, newID+".key")); err != nil {
		t.Fatal(err)
	}
	onlyOld, err := firmware.LoadKeyring(filepath.Join(dir, oldID+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	both, err := firmware.LoadKeyring(dir) // every .pub in the directory
	if err != nil {
		t.Fatal(err)
	}
	if got := both.IDs(); len(got) != 2 {
		t.Fatalf("keyring ids %v", got)
	}
	onlyNew := firmware.NewKeyring()
	pub, _ := both.Key(newID)
	onlyNew.Add(pub)

	for _, c := range []struct {
		name   string
		bundle string
		keys   *firmware.Keyring
		want   error
	}{
		{"old key, old keyring", oldBundle, onlyOld, nil},
		{"new key, old keyring", newBundle, onlyOld, firmware.ErrUnknownKey},
		{"old key during rotation", oldBundle, both, nil},
		{"new key during rotation", newBundle, both, nil},
		{"old key after rotation", oldBundle, onlyNew, firmware.ErrUnknownKey},
		{"new key after rotation", newBundle, onlyNew, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := firmware.Verify(c.bundle, c.keys)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if err == nil && m.KeyID == "" {
				t.Fatal("no key id")
			}
		})
	}

	// A key file whose id does not match its key is refused.
	data, _ := os.ReadFile(filepath.Join(dir, newID+".pub"))
	bad := filepath.Join(t.TempDir(), "bad.pub")
	os.WriteFile(bad, []byte(strings.Replace(string(data), newID, oldID, 1)), 0o644)
	if _, err := firmware.LoadKeyring(bad); !errors.Is(err, firmware.ErrKeyFile) {
		t.Fatalf("mismatched key id: err = %v", err)
	}
}

func TestWriteTarRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := firmware.WriteTar(patternsDir, &buf); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "patterns.tar")
	os.WriteFile(p, buf.Bytes(), 0o644)
	b, err := firmware.Load(p, testKeyring(t))
	if err != nil {
		t.Fatal(err)
	}
	if b.Digest != loadPatterns(t).Digest {
		t.Fatalf("digest changed through a tar")
	}
}

// A tar cut short anywhere, at an entry's boundary too, is refused as a
// damaged tar, not read as a bundle that lacks files.
func TestTarCutShort(t *testing.T) {
	var buf bytes.Buffer
	if err := firmware.WriteTar(patternsDir, &buf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for cut := 0; cut < buf.Len(); cut += 512 {
		p := filepath.Join(dir, fmt.Sprintf("cut-%d.tar", cut))
		os.WriteFile(p, buf.Bytes()[:cut], 0o644)
		_, err := firmware.Load(p, testKeyring(t))
		if !errors.Is(err, firmware.ErrMalformed) || !strings.Contains(err.Error(), "read bundle tar") {
			t.Fatalf("cut at %d of %d bytes: %v", cut, buf.Len(), err)
		}
	}
}

// A public key written for trust loads into a keyring, leaves no temporary
// file, is written once, and its file and new folder are named durably.
func TestWritePublicKey(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	var synced []string
	defer fsync.Observe(func(d string) { synced = append(synced, d) })()
	base := t.TempDir()
	dir := filepath.Join(base, "keys")
	if err := firmware.WritePublicKey(dir, pub); err != nil {
		t.Fatal(err)
	}
	if want := []string{base, dir}; !slices.Equal(synced, want) {
		t.Fatalf("folders fsynced: %q, want %q", synced, want)
	}
	ring, err := firmware.LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ring.Key(firmware.KeyID(pub)); !ok || !got.Equal(pub) {
		t.Fatalf("the keyring does not hold the key: %v", ring.IDs())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("files left in %s: %v", dir, entries)
	}
	// Written once: a second call leaves the file as it is.
	name := filepath.Join(dir, firmware.KeyID(pub)+".pub")
	if err := os.WriteFile(name, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := firmware.WritePublicKey(dir, pub); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(name); string(b) != "kept" {
		t.Fatalf("an existing key file was rewritten: %q", b)
	}
}

// Signing with the public half of a key pair, an easy slip with two files
// side by side, says so and names the file to sign with. It said
// "private_key is not a base64 ed25519 seed", about a field the file has
// no reason to hold.
func TestLoadPrivateKeyOfAPublicKeyFile(t *testing.T) {
	dir := t.TempDir()
	id, err := firmware.Keygen(dir)
	if err != nil {
		t.Fatal(err)
	}
	pub := filepath.Join(dir, id+".pub")
	_, _, err = firmware.LoadPrivateKey(pub)
	if !errors.Is(err, firmware.ErrKeyFile) {
		t.Fatalf("err = %v, want ErrKeyFile", err)
	}
	want := pub + " is a public key, which cannot sign: sign with the private key, " + filepath.Join(dir, id+".key")
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to say %q", err, want)
	}
	if _, _, err := firmware.LoadPrivateKey(filepath.Join(dir, id+".key")); err != nil {
		t.Fatal(err)
	}
}
