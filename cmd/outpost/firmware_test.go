package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

func TestFirmwareExportVerifyInstallListActivate(t *testing.T) {
	data := t.TempDir()
	embedded := embeddedVersion(t)
	ours := embedded + 1
	ref := filepath.Join(t.TempDir(), "ref")
	code, stdout, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "wrote the reference bundle")

	code, _, stderr = outpost(t, "firmware", "verify", "--data", data, ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no trusted keys")
	code, stdout, stderr = outpost(t, "firmware", "verify", "--data", data, ref, "--trust-dev-key")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("ok: medication-adherence v%d", embedded))

	// A bundle signed by a key we do not trust, then our own key.
	keys := t.TempDir()
	code, stdout, stderr = outpost(t, "firmware", "keygen", "--out", keys)
	require.Zero(t, code, stderr)
	id := strings.Fields(stdout)[1]
	code, _, stderr = outpost(t, "firmware", "verify", "--data", data, "--keys", filepath.Join(keys, id+".pub"), ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "unknown key")
	require.Contains(t, stderr, "pass its .pub with --keys")

	// Edit, re-sign as the version above the embedded one with our key;
	// a tampered file is a hash mismatch.
	setBundleVersion(t, ref, ours)
	code, _, stderr = outpost(t, "firmware", "verify", "--data", data, "--trust-dev-key", ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "bad bundle signature")
	code, _, stderr = outpost(t, "firmware", "sign", "--key", filepath.Join(keys, id+".key"), ref)
	require.Zero(t, code, stderr)
	kb := filepath.Join(ref, "kb", "kb-01.md")
	orig, _ := os.ReadFile(kb)
	require.NoError(t, os.WriteFile(kb, []byte("tampered"), 0o644))
	code, _, stderr = outpost(t, "firmware", "verify", "--keys", keys, ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "does not match its sha256")
	require.NoError(t, os.Remove(kb))
	code, _, stderr = outpost(t, "firmware", "verify", "--keys", keys, ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "missing")
	require.NoError(t, os.WriteFile(kb, orig, 0o644))

	// Install ours, then the dev-signed embedded one is a downgrade.
	code, stdout, stderr = outpost(t, "firmware", "install", "--data", data, "--keys", keys, ref)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("medication-adherence v%d installed and active", ours))
	older := filepath.Join(t.TempDir(), "older")
	code, _, stderr = outpost(t, "firmware", "export", older)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "firmware", "install", "--data", data, "--trust-dev-key", older)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--allow-downgrade")
	code, stdout, stderr = outpost(t, "firmware", "install", "--data", data, "--trust-dev-key", "--allow-downgrade", "--by", "ops", "--reason", "rollback test", older)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "downgrade")

	code, stdout, stderr = outpost(t, "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var list struct {
		Installed []struct {
			Version int64
			Active  bool
		}
		Log []struct{ Action, By, Reason string }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list.Installed, 2)
	require.Contains(t, stdout, `"rollback test"`)

	// New runs use the active bundle (ours), and the appliance no longer
	// says it runs the embedded one.
	code, stdout, stderr = outpost(t, "run", "--data", data, "--thread", "a", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	require.NotContains(t, stderr, "development-signed reference bundle")
	require.Contains(t, stdout, "If you missed a dose of metformin")
	// Going back to the embedded version is a downgrade: refused, then
	// allowed with who and why, which the log keeps.
	back := strconv.FormatInt(embedded, 10)
	code, _, stderr = outpost(t, "firmware", "activate", "--data", data, "medication-adherence", back)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "add --allow-downgrade --by NAME --reason TEXT")
	code, stdout, stderr = outpost(t, "firmware", "activate", "--data", data, "--allow-downgrade", "--by", "ops", "--reason", "ours misroutes", "medication-adherence", back)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "v"+back+" is active")
	_, stdout, _ = outpost(t, "firmware", "list", "--data", data, "--json")
	require.Contains(t, stdout, `"ours misroutes"`)
	code, stdout, _ = outpost(t, "firmware", "list", "--data", data)
	require.Regexp(t, `medication-adherence\s+`+back+`\s+active`, stdout)
	code, _, stderr = outpost(t, "firmware", "activate", "--data", data, "medication-adherence", "7")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not installed")
}

func TestFirmwareErrors(t *testing.T) {
	ref := filepath.Join(t.TempDir(), "ref")
	code, _, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	keys := t.TempDir()
	code, stdout, _ := outpost(t, "firmware", "keygen", "--out", keys)
	require.Zero(t, code)
	key := filepath.Join(keys, strings.Fields(stdout)[1]+".key")
	graph := filepath.Join(ref, "agents", "medication-adherence.json")
	raw, err := os.ReadFile(graph)
	require.NoError(t, err)

	// Malformed JSON, with its line and column.
	require.NoError(t, os.WriteFile(graph, []byte(strings.Replace(string(raw), `"name": "intake",`, `"name": "intake" "x",`, 1)), 0o644))
	code, _, stderr = outpost(t, "firmware", "sign", "--key", key, ref)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "firmware", "verify", "--keys", keys, ref)
	require.Equal(t, 1, code)
	require.Regexp(t, `agents/medication-adherence.json:\d+:\d+`, stderr)

	// An unknown node kind.
	require.NoError(t, os.WriteFile(graph, []byte(strings.Replace(string(raw), `"kind": "router"`, `"kind": "teleport"`, 1)), 0o644))
	code, _, stderr = outpost(t, "firmware", "sign", "--key", key, ref)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "firmware", "verify", "--keys", keys, ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `unknown node kind "teleport"`)
	require.Contains(t, stderr, `node "intake"`)

	code, _, stderr = outpost(t, "firmware", "verify", "--keys", keys, filepath.Join(t.TempDir(), "nope"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such file")
	// A bundle path that names nothing is named first, keys or not: it
	// was "no trusted keys", and the mistyped path came up only once the
	// keys were given.
	for _, sub := range []string{"verify", "install"} {
		nope := filepath.Join(t.TempDir(), "nope")
		code, _, stderr = outpost(t, "firmware", sub, "--data", t.TempDir(), nope)
		require.Equal(t, 1, code, sub)
		require.Contains(t, stderr, "read bundle: "+nope+": no such file or folder", sub)
		require.NotContains(t, stderr, "no trusted keys", sub)
	}
	code, _, stderr = outpost(t, "firmware", "frob")
	require.Equal(t, 2, code, "an unknown subcommand is a usage error, as for db and runs")
	require.Contains(t, stderr, `unknown firmware command "frob"`)
	code, _, stderr = outpost(t, "firmware", "sign", t.TempDir())
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "sign needs --key FILE and one bundle folder (usage: outpost firmware sign --key FILE DIR)")
}

// With --model ollama:NAME and nothing listening, run refuses the turn and
// says why, rather than answering with the scripted rules in the model's
// place; nothing is stored. --model scripted runs it.
func TestRunOllamaDownRunsNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // now nothing listens there

	dir := t.TempDir()
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--model", "ollama:llama3.2", "--ollama", "http://"+addr, "When should I take levothyroxine?")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "--model ollama:llama3.2: Ollama is not reachable at http://"+addr)
	require.Contains(t, stderr, "nothing was run")
	require.Contains(t, stderr, "use --model scripted")
	require.NotContains(t, stdout, "Take levothyroxine")
	_, err = os.Stat(filepath.Join(dir, store.FileName))
	require.ErrorIs(t, err, os.ErrNotExist, "no store is made for a turn that did not run")

	code, stdout, stderr = outpost(t, "run", "--data", dir, "--model", "scripted", "When should I take levothyroxine?")
	require.Zero(t, code, stderr)
	require.Contains(t, stderr, "running the development-signed reference bundle")
	require.Contains(t, stdout, "Take levothyroxine as your prescription label says")
	require.Contains(t, stdout, ": completed")

	code, _, stderr = outpost(t, "run", "--data", dir, "--model", "gpt", "hello")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "want scripted or ollama:NAME")
}

// The default agent is the reference medication-adherence assistant; a
// high-risk draft waits for an operator, and resume finishes it.
func TestRunReviewThenResume(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--json", "Can I stop taking lisinopril?")
	require.Zero(t, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var run struct {
		ID, Status string
		Interrupts []struct{ ID, Node string }
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &run))
	require.Equal(t, "interrupted", run.Status)
	require.Equal(t, "review_response", run.Interrupts[0].Node)
	code, stdout, stderr = outpost(t, "resume", "--data", dir, run.ID, "--decision", "reject", "--reason", "unsafe")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "A clinician reviewed this answer and withheld it.")
	require.Contains(t, stdout, ": completed")
}

// The public development key is trusted for the one command that says
// --trust-dev-key: an install with it keeps the key in DATA/keys, but that
// does not make the next dev-signed bundle trusted without the flag.
func TestDevKeyIsTrustedOneCommandAtATime(t *testing.T) {
	data, ref := installedReference(t)
	for _, cmd := range [][]string{{"verify"}, {"install"}} {
		code, _, stderr := outpost(t, append(append([]string{"firmware"}, cmd...), "--data", data, ref)...)
		require.Equal(t, 1, code, "%v", cmd)
		require.Contains(t, stderr, "no trusted keys", "%v: the kept development key does not count", cmd)
		require.Contains(t, stderr, "--trust-dev-key", "%v", cmd)
	}
	// With a key of its own in DATA/keys too, the bundle's key is unknown.
	keys := t.TempDir()
	code, stdout, stderr := outpost(t, "firmware", "keygen", "--out", keys)
	require.Zero(t, code, stderr)
	pub := strings.Fields(stdout)[1] + ".pub"
	raw, err := os.ReadFile(filepath.Join(keys, pub))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(data, "keys", pub), raw, 0o644))
	code, _, stderr = outpost(t, "firmware", "verify", "--data", data, ref)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "unknown key")
	require.Contains(t, stderr, "needs --trust-dev-key on each command")
	code, stdout, stderr = outpost(t, "firmware", "verify", "--data", data, "--trust-dev-key", ref)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("ok: medication-adherence v%d", embeddedVersion(t)))
	// The installed bundle still runs: the appliance checks it at start
	// against the keys it keeps.
	code, _, stderr = outpost(t, "run", "--data", data, "I forgot my metformin dose")
	require.Zero(t, code, stderr)
}

// While another process owns the data folder (serve), install and activate
// are refused, since serve reads the installed bundles at start; nothing is
// changed.
func TestFirmwareChangesRefusedWhileServeOwnsTheFolder(t *testing.T) {
	data := t.TempDir()
	ref := filepath.Join(t.TempDir(), "ref")
	code, _, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "run", "--data", data, "I forgot my metformin dose") // makes the store
	require.Zero(t, code, stderr)
	db, err := store.OpenDir(data, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	was := folderTree(t, filepath.Join(data, "firmware"))
	for _, args := range [][]string{
		{"firmware", "install", "--data", data, "--trust-dev-key", ref},
		{"firmware", "activate", "--data", data, "medication-adherence", "1"},
	} {
		code, _, stderr = outpost(t, args...)
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, stderr, "is in use by another outpost process", "%v", args)
		require.Contains(t, stderr, "serve reads the installed bundles when it starts: stop it", "%v", args)
	}
	require.Equal(t, was, folderTree(t, filepath.Join(data, "firmware")), "nothing was installed")
}

// Every firmware command, and token, takes --json.
func TestFirmwareCommandsTakeJSON(t *testing.T) {
	ref := filepath.Join(t.TempDir(), "ref")
	code, stdout, stderr := outpost(t, "firmware", "export", "--json", ref)
	require.Zero(t, code, stderr)
	var exp struct{ Wrote, Name string }
	require.NoError(t, json.Unmarshal([]byte(stdout), &exp), stdout)
	require.Equal(t, ref, exp.Wrote)

	keys := t.TempDir()
	code, stdout, stderr = outpost(t, "firmware", "keygen", "--out", keys, "--json")
	require.Zero(t, code, stderr)
	var kg struct {
		KeyID   string `json:"key_id"`
		Private string
		Public  string
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &kg), stdout)
	require.FileExists(t, kg.Private)
	require.FileExists(t, kg.Public)

	code, stdout, stderr = outpost(t, "firmware", "sign", "--key", kg.Private, "--json", ref)
	require.Zero(t, code, stderr)
	raw, err := os.ReadFile(filepath.Join(ref, firmware.ManifestFile))
	require.NoError(t, err)
	m, err := firmware.DecodeManifest(raw)
	require.NoError(t, err)
	desc, _ := json.Marshal(m.Description) // an exported reference, re-signed: sign changed it
	require.JSONEq(t, `{"signed": "`+ref+`", "key_id": "`+kg.KeyID+`", "description": `+string(desc)+`}`, stdout)

	data := t.TempDir()
	code, _, stderr = outpost(t, "firmware", "install", "--data", data, "--keys", kg.Public, ref)
	require.Zero(t, code, stderr)
	v := strconv.FormatInt(embeddedVersion(t), 10)
	code, stdout, stderr = outpost(t, "firmware", "activate", "--data", data, "--json", "medication-adherence", v)
	require.Zero(t, code, stderr)
	require.JSONEq(t, `{"name": "medication-adherence", "version": `+v+`, "active": true}`, stdout)

	tok, _, err := console.LoadOrCreateToken(data)
	require.NoError(t, err)
	code, stdout, stderr = outpost(t, "token", "--data", data, "--json")
	require.Zero(t, code, stderr)
	require.JSONEq(t, `{"token": "`+tok+`"}`, stdout)
}

// A build whose version reads as none (dev, a bare commit hash) cannot
// hold a bundle to its min_appliance_version: version says so, and verify
// and install say so and go on. A release build, and one that git describe
// stamps past a release, hold it: verify, as install, refuses a bundle
// that needs a newer appliance and says what to do, and nothing is
// installed.
func TestMinApplianceVersion(t *testing.T) {
	for _, v := range []string{"1.2.3", "v0.1.0", "1.2", "v1.2.0-3-gabc1234-dirty"} {
		require.True(t, firmware.ChecksApplianceVersion(v), v)
	}
	for _, v := range []string{"dev", "dev-98b7d71", "98b7d71", "1.2.x", "1..3", ""} {
		require.False(t, firmware.ChecksApplianceVersion(v), v)
	}
	defer func(v string) { version = v }(version)
	ref := filepath.Join(t.TempDir(), "ref")
	code, _, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	needy := referenceNeeding(t, "99.0.0")

	for _, v := range []string{"dev", "98b7d71"} {
		version = v
		code, stdout, stderr := outpost(t, "version")
		require.Zero(t, code, stderr)
		require.Equal(t, "outpost "+v+"\n", stdout)
		require.Contains(t, stderr, "a development build: it installs a bundle without holding it to its min_appliance_version", v)
		code, stdout, stderr = outpost(t, "version", "--json")
		require.Zero(t, code, stderr)
		require.JSONEq(t, `{"version": "`+v+`", "go": "`+runtime.Version()+`", "checks_min_appliance_version": false}`, stdout)
		for _, cmd := range []string{"verify", "install"} {
			code, _, stderr = outpost(t, "firmware", cmd, "--data", t.TempDir(), "--trust-dev-key", needy)
			require.Zero(t, code, stderr)
			require.Contains(t, stderr, "warning: this build ("+v+") is not a release, so the bundle's min_appliance_version 99.0.0 is not checked", cmd)
		}
	}
	for _, v := range []string{"1.0.0", "v1.0.0-3-gabc1234"} {
		version = v
		code, stdout, stderr := outpost(t, "version")
		require.Zero(t, code, stderr)
		require.Empty(t, stderr, "a release says nothing of the check")
		code, stdout, stderr = outpost(t, "version", "--json")
		require.Zero(t, code, stderr)
		require.Contains(t, stdout, `"checks_min_appliance_version": true`)
		for _, cmd := range []string{"verify", "install"} {
			data := t.TempDir()
			code, _, stderr = outpost(t, "firmware", cmd, "--data", data, "--trust-dev-key", needy)
			require.Equal(t, 1, code, cmd)
			require.Contains(t, stderr, "needs appliance 99.0.0 or later, this is "+v, cmd)
			require.Contains(t, stderr, "(upgrade the outpost binary on this appliance first", cmd)
			code, stdout, stderr = outpost(t, "firmware", "list", "--data", data)
			require.Zero(t, code, stderr)
			require.Contains(t, stdout, "no bundles installed", cmd)
		}
		code, _, stderr = outpost(t, "firmware", "install", "--data", t.TempDir(), "--trust-dev-key", ref)
		require.Zero(t, code, stderr)
		require.NotContains(t, stderr, "warning")
	}
}

// A bundle folder reached through a link is read (the links inside are
// still refused), and a damaged tar is named as one, not as a file to fix
// at a line and column.
func TestFirmwareBundlePathsAndDamagedTars(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref")
	code, _, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	link := filepath.Join(dir, "current")
	require.NoError(t, os.Symlink(ref, link))
	code, stdout, stderr := outpost(t, "firmware", "verify", "--data", t.TempDir(), "--trust-dev-key", link)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("ok: medication-adherence v%d", embeddedVersion(t)))

	notTar := filepath.Join(dir, "bundle.tar")
	require.NoError(t, os.WriteFile(notTar, []byte("\x1f\x8b\x08 this is gzip, not a tar ........................................"), 0o644))
	code, _, stderr = outpost(t, "firmware", "verify", "--data", t.TempDir(), "--trust-dev-key", notTar)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the tar is damaged, cut short or not a tar")
	require.NotContains(t, stderr, "line and column")
}

// TestFirmwareListShowsDamage changes a file of an installed bundle:
// firmware list names the version as damaged and exits 1, and installing
// the same bundle again repairs it.
func TestFirmwareListShowsDamage(t *testing.T) {
	data, ref := installedReference(t)
	v := strconv.FormatInt(embeddedVersion(t), 10)
	code, stdout, stderr := outpost(t, "firmware", "list", "--data", data)
	require.Zero(t, code, stderr)
	require.Regexp(t, `medication-adherence\s+`+v+`\s+active\s.*\sverified\n`, stdout)

	kb := filepath.Join(data, "firmware", "medication-adherence", v, "kb", "kb-01.md")
	require.FileExists(t, kb)
	require.NoError(t, os.WriteFile(kb, []byte("changed on the appliance"), 0o644))
	code, stdout, stderr = outpost(t, "firmware", "list", "--data", data)
	require.Equal(t, 1, code)
	require.Regexp(t, `medication-adherence\s+`+v+`\s+active\s.*\sDAMAGED: .*kb-01.md`, stdout)
	require.Contains(t, stderr, "medication-adherence v"+v+": changed or damaged on disk since install")
	require.Contains(t, stderr, "install the same bundle again")
	code, stdout, _ = outpost(t, "firmware", "list", "--data", data, "--json")
	require.Equal(t, 1, code)
	var list struct {
		Installed []struct {
			Version  int64
			Verified bool
			Problem  string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list.Installed, 1)
	require.False(t, list.Installed[0].Verified)
	require.Contains(t, list.Installed[0].Problem, "sha256")

	code, stdout, stderr = outpost(t, "firmware", "install", "--data", data, "--trust-dev-key", ref)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "medication-adherence v"+v+" repaired")
	code, stdout, stderr = outpost(t, "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.True(t, list.Installed[0].Verified)
	require.Contains(t, stdout, `"action": "repair"`)
}

// embeddedVersion is the version of the reference bundle embedded in the
// binary: what firmware export writes, and so what a test that installs
// such a copy finds installed.
func embeddedVersion(t *testing.T) int64 {
	t.Helper()
	b, err := firmware.Reference()
	require.NoError(t, err)
	return b.Manifest.Version
}

// setBundleVersion sets the version in the manifest of the bundle folder
// dir, which is then to be signed again.
func setBundleVersion(t *testing.T, dir string, v int64) {
	t.Helper()
	mf := filepath.Join(dir, firmware.ManifestFile)
	raw, err := os.ReadFile(mf)
	require.NoError(t, err)
	re := regexp.MustCompile(`"version": \d+,`)
	require.Len(t, re.FindAll(raw, -1), 1, "the version in %s", mf)
	require.NoError(t, os.WriteFile(mf, re.ReplaceAll(raw, []byte(fmt.Sprintf(`"version": %d,`, v))), 0o644))
}

// installedReference exports the reference bundle and installs it, trusting
// the development key, into a new data folder.
func installedReference(t *testing.T) (data, ref string) {
	data = t.TempDir()
	ref = filepath.Join(t.TempDir(), "ref")
	code, _, stderr := outpost(t, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "firmware", "install", "--data", data, "--trust-dev-key", ref)
	require.Zero(t, code, stderr)
	return data, ref
}

// firmware sign says, in one line, that it changed the description of an
// exported reference bundle signed with one's own key, and says nothing of
// it where it changed none (signed again, or with the development key).
func TestSignSaysItChangedTheDescription(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := outpostBin(t, dir, "firmware", "keygen", "--out", "keys")
	require.Zero(t, code, stderr)
	keys, err := filepath.Glob(filepath.Join(dir, "keys", "*.key"))
	require.NoError(t, err)
	require.Len(t, keys, 1)
	devKey, err := filepath.Abs(filepath.Join("..", "..", "testdata", "keys", "dev.key"))
	require.NoError(t, err)
	description := func(bundle string) string {
		raw, err := os.ReadFile(filepath.Join(dir, bundle, firmware.ManifestFile))
		require.NoError(t, err)
		m, err := firmware.DecodeManifest(raw)
		require.NoError(t, err)
		return m.Description
	}
	const says = "changed the description in "

	for _, b := range []string{"mine", "dev"} {
		code, _, stderr = outpostBin(t, dir, "firmware", "export", b)
		require.Zero(t, code, stderr)
	}
	was := description("mine")
	code, stdout, stderr := outpostBin(t, dir, "firmware", "sign", "--key", keys[0], "mine")
	require.Zero(t, code, stderr)
	now := description("mine")
	require.NotEqual(t, was, now)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2, stdout)
	require.Equal(t, fmt.Sprintf("%s%s, which said the development key signs the bundle, to: %q",
		says, filepath.Join("mine", firmware.ManifestFile), now), lines[1])

	code, stdout, stderr = outpostBin(t, dir, "firmware", "sign", "--key", keys[0], "--json", "mine")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, "description", "signed again, nothing changed")
	code, stdout, stderr = outpostBin(t, dir, "firmware", "sign", "--key", devKey, "dev")
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout, says)
	require.Equal(t, was, description("dev"))

	code, _, stderr = outpostBin(t, dir, "firmware", "export", "json")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpostBin(t, dir, "firmware", "sign", "--key", keys[0], "--json", "json")
	require.Zero(t, code, stderr)
	var out map[string]string
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.Equal(t, description("json"), out["description"])
}

// A golden conversation that no replay could pass is a mistake in the
// bundle that verify and install refuse, at its line and column, naming
// the conversation and the field: not something that only eval finds.
func TestFirmwareRefusesABadGoldenExpectation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ref")
	code, _, stderr := outpostBin(t, "", "firmware", "export", dir)
	require.Zero(t, code, stderr)
	golden := filepath.Join(dir, "golden", "reference.jsonl")
	raw, err := os.ReadFile(golden)
	require.NoError(t, err)
	lines := strings.Count(string(raw), "\n")
	bad := `{"name": "misspelt-status", "agent": "medication-adherence", "turns": [{"input": "hi", "expect": {"status": "complete"}}]}`
	require.NoError(t, os.WriteFile(golden, append(raw, bad+"\n"...), 0o644))
	code, _, stderr = outpostBin(t, "", "firmware", "sign", "--key", filepath.Join("..", "..", "testdata", "keys", "dev.key"), dir)
	require.Zero(t, code, stderr)

	where := fmt.Sprintf("golden/reference.jsonl:%d:%d: ", lines+1, strings.Index(bad, `{"status"`)+1)
	for _, cmd := range []string{"verify", "install"} {
		data := t.TempDir()
		code, _, stderr = outpostBin(t, "", "firmware", cmd, "--data", data, "--trust-dev-key", dir)
		require.Equal(t, 1, code, "%s: %s", cmd, stderr)
		require.Contains(t, stderr, where, cmd)
		require.Contains(t, stderr, `conversation "misspelt-status": turns.0.expect.status: "complete" is not a status a turn ends in`, cmd)
		code, stdout, stderr := outpostBin(t, "", "firmware", "list", "--data", data)
		require.Zero(t, code, stderr)
		require.Contains(t, stdout, "no bundles installed", cmd)
	}
}

// run checks its --agent against the active bundle before it opens the
// store, then runs the turn on that bundle, and serve resolves agents and
// lists the bundles for the console: each reads and verifies the active
// bundle once, not once for every use.
func TestRunAndServeVerifyTheActiveBundleOnce(t *testing.T) {
	data, _ := installedReference(t)
	_, err := firmware.Reference() // the embedded bundle, verified once a process
	require.NoError(t, err)

	before := firmware.Verifications()
	code, stdout, stderr := outpost(t, "run", "--data", data, "--agent", firmware.ReferenceAgent, "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "completed")
	require.Equal(t, int64(1), firmware.Verifications()-before, "run verified the active bundle this many times")

	before = firmware.Verifications()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	go func() {
		var out, errb bytes.Buffer
		served <- execute(ctx, []string{"serve", "--data", data, "--listen", "127.0.0.1:0"}, &out, &errb)
	}()
	awaitControl(t, data) // serve has resolved its agents and listed its bundles
	verified := firmware.Verifications() - before
	cancel()
	require.Zero(t, <-served)
	require.Equal(t, int64(1), verified, "serve verified the active bundle this many times")
}

// A release binary rolled back below the min_appliance_version of the
// bundle a run waiting for a person is pinned to refuses to resume it,
// saying why and what to do, and the run waits on; the binary upgraded
// again resumes it.
func TestResumeAfterARollbackBelowTheBundlesMinimum(t *testing.T) {
	defer func(v string) { version = v }(version)
	data := installedNeeding(t, "1.0.0")

	code, stdout, stderr := outpost(t, "run", "--data", data, "--json", "Can I stop taking lisinopril?")
	require.Zero(t, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var run struct{ ID, Status string }
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &run))
	require.Equal(t, "interrupted", run.Status)

	version = "0.9.0"
	code, _, stderr = outpost(t, "resume", "--data", data, run.ID, "--decision", "approve")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, fmt.Sprintf("medication-adherence v%d needs appliance 1.0.0 or later, this is 0.9.0", embeddedVersion(t)))
	require.Contains(t, stderr, "upgrade the outpost binary to 1.0.0 or later again")
	code, stdout, stderr = outpost(t, "runs", "show", "--data", data, run.ID)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "interrupted")

	version = "1.0.0"
	code, stdout, stderr = outpost(t, "resume", "--data", data, run.ID, "--decision", "approve")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, ": completed")
}

// installedNeeding installs, as a release build of version min, the
// reference bundle needing appliance min into a new data folder, and
// returns the folder. The caller restores version.
func installedNeeding(t *testing.T, min string) string {
	t.Helper()
	version = min
	data, needy := t.TempDir(), referenceNeeding(t, min)
	code, _, stderr := outpost(t, "firmware", "install", "--data", data, "--trust-dev-key", needy)
	require.Zero(t, code, stderr)
	return data
}

// referenceNeeding exports the reference bundle with min_appliance_version
// set to min, signed again with the development key, and returns its
// folder.
func referenceNeeding(t *testing.T, min string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "needy")
	code, _, stderr := outpost(t, "firmware", "export", dir)
	require.Zero(t, code, stderr)
	manifest := filepath.Join(dir, firmware.ManifestFile)
	raw, err := os.ReadFile(manifest)
	require.NoError(t, err)
	edited := strings.Replace(string(raw), `"min_appliance_version": "0.1.0"`, `"min_appliance_version": "`+min+`"`, 1)
	require.NotEqual(t, string(raw), edited)
	require.NoError(t, os.WriteFile(manifest, []byte(edited), 0o644))
	code, _, stderr = outpost(t, "firmware", "sign", "--key", filepath.Join("..", "..", "testdata", "keys", "dev.key"), dir)
	require.Zero(t, code, stderr)
	return dir
}

// A release binary rolled back below an installed version's
// min_appliance_version marks that version in firmware list, in text and
// JSON, and says what it means; the binary upgraded again lists it
// unmarked. A development build checks no minimum and marks nothing.
func TestFirmwareListMarksVersionsNeedingANewerAppliance(t *testing.T) {
	defer func(v string) { version = v }(version)
	data := installedNeeding(t, "1.0.0")

	type entry struct {
		Name           string
		Version        int64
		Verified       bool
		NeedsAppliance *string `json:"needs_appliance"`
	}
	list := func() []entry {
		t.Helper()
		code, stdout, stderr := outpost(t, "firmware", "list", "--data", data, "--json")
		require.Zero(t, code, stderr)
		var out struct{ Installed []entry }
		require.NoError(t, json.Unmarshal([]byte(stdout), &out), stdout)
		require.Len(t, out.Installed, 1)
		return out.Installed
	}
	for _, v := range []string{"1.0.0", "1.2.0", "dev"} {
		version = v
		got := list()
		require.Nil(t, got[0].NeedsAppliance, v)
		code, stdout, stderr := outpost(t, "firmware", "list", "--data", data)
		require.Zero(t, code, stderr)
		require.NotContains(t, stdout, "needs appliance", v)
	}

	version = "0.9.0"
	got := list()
	require.True(t, got[0].Verified)
	require.NotNil(t, got[0].NeedsAppliance)
	require.Equal(t, "1.0.0", *got[0].NeedsAppliance)
	code, stdout, stderr := outpost(t, "firmware", "list", "--data", data)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "active (needs appliance 1.0.0)")
	require.Contains(t, stdout, fmt.Sprintf("medication-adherence v%d needs appliance 1.0.0 or later, this is 0.9.0: it cannot be activated", embeddedVersion(t)))
}

// A bundle whose redaction policy names a field that no outcome has (here
// "flags" misspelt, which would keep the guardrail flags home unseen) is
// refused by firmware verify and install as any other mistake in a bundle
// file is: exit 1, the file, the field and the fields an outcome has, and
// the hint to fix it and sign again; install leaves nothing. The bundle as
// exported verifies. A binary whose embedded bundle names such a field
// refuses to run it.
func TestFirmwareRefusesARedactionFieldNoOutcomeHas(t *testing.T) {
	dir := t.TempDir()
	data, good, bad := filepath.Join(dir, "data"), filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	for _, b := range []string{good, bad} {
		code, _, stderr := outpostBin(t, dir, "firmware", "export", b)
		require.Zero(t, code, stderr)
	}
	code, stdout, stderr := outpostBin(t, dir, "firmware", "verify", "--data", data, "--trust-dev-key", good)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "ok: medication-adherence")

	policy := filepath.Join(bad, "redaction.json")
	raw, err := os.ReadFile(policy)
	require.NoError(t, err)
	misspelt := strings.Replace(string(raw), `"flags"`, `"flgas"`, 1)
	require.NotEqual(t, string(raw), misspelt, "the policy names flags")
	require.NoError(t, os.WriteFile(policy, []byte(misspelt), 0o644))
	require.NoError(t, firmware.Sign(bad, filepath.Join("..", "..", "testdata", "keys", "dev.key")))

	// The policy is one line; the column is that of the misspelt field.
	col := strings.Index(misspelt, `"flgas"`) + 1
	says := fmt.Sprintf("redaction.json:1:%d: ", col) + `malformed bundle file: bad policy rule: redaction: field "flgas" keeps nothing: ` +
		`an outcome record has no field "flgas" (its fields: appliance_id, seq, outcome_id, correlation_id, causation_id, thread, run, ` +
		"agent, bundle, status, started_at, ended_at, steps, tokens, model_calls, tools, flags, output, error)\n"
	const hint = "(fix the file at the line and column given, then sign the bundle again)\n"
	code, stdout, stderr = outpostBin(t, dir, "firmware", "verify", "--data", data, "--trust-dev-key", bad)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, says+hint)
	code, stdout, stderr = outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", bad)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, says+hint)
	require.NoDirExists(t, filepath.Join(data, "firmware", "medication-adherence"), "the refused bundle was installed")

	code, stdout, stderr = outpostBinEnv(t, builtOutpostTagged(t), []string{"OUTPOST_TEST_REFERENCE=" + bad}, dir,
		"run", "--data", data, "I forgot my metformin dose")
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "reference bundle: "+says)
}
