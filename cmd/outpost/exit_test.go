package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/store"
)

// commandLines is every command, and every subcommand of the commands that
// have them, as "outpost" is called for it.
func commandLines() [][]string {
	var lines [][]string
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		if subs := commands[name].subs; len(subs) > 0 {
			for _, sub := range slices.Sorted(slices.Values(subs)) {
				lines = append(lines, []string{name, sub})
			}
			continue
		}
		lines = append(lines, []string{name})
	}
	return lines
}

// helpFlags are the flags a command's -h lists, split into those that
// take no value (bool) and those that do.
func helpFlags(help string) (bools, valued []string) {
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)( \S+)?$`).FindAllStringSubmatch(help, -1) {
		if m[2] == "" {
			bools = append(bools, m[1])
		} else {
			valued = append(valued, m[1])
		}
	}
	return bools, valued
}

// usageHint is what a refused command line says of how to call it.
var usageHint = regexp.MustCompile(`usage: outpost |Usage: outpost |\(outpost [a-z ]+ -h lists its flags\)`)

// requireRefused runs outpost with args in the empty folder dir and
// checks that it refuses them as a bad command line: exit 2, nothing on
// stdout, a usage hint on stderr, and nothing made in dir.
func requireRefused(t *testing.T, dir string, args []string) {
	t.Helper()
	code, stdout, stderr := outpostBin(t, dir, args...)
	require.Equal(t, 2, code, "%v: %s", args, stderr)
	require.Empty(t, stdout, args)
	require.Regexp(t, usageHint, stderr, args)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "%v: nothing is made", args)
}

// Every command and subcommand exits 2 for a bad command line (an unknown
// flag, a flag value it cannot take, a flag with no value, an argument too
// many), says how it is called on stderr, and does nothing: the folder it
// runs in stays empty. The lines come from the commands the binary
// registers, so a command added later is tried too. run takes free text and
// eval any number of files, so no argument is one too many for them.
func TestBadCommandLineExits2(t *testing.T) {
	code, help, _ := outpostBin(t, "", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "\nExit status: 0 done; 1 the work failed", "-h says what the exit codes mean")
	variadic := map[string]bool{"run": true, "eval": true}
	for _, line := range commandLines() {
		t.Run(strings.Join(line, " "), func(t *testing.T) {
			dir := t.TempDir()
			code, help, stderr := outpostBin(t, dir, append(slices.Clone(line), "-h")...)
			require.Zero(t, code, stderr)
			bools, valued := helpFlags(help)
			require.NotEmpty(t, append(bools, valued...), "-h lists the flags:\n%s", help)

			bad := [][]string{{"--no-such-flag"}}
			if len(bools) > 0 { // not a boolean
				bad = append(bad, []string{"--" + bools[0] + "=maybe"})
			}
			if len(valued) > 0 { // no value
				bad = append(bad, []string{"--" + valued[0]})
			}
			if !variadic[line[0]] { // arguments too many
				bad = append(bad, []string{"a1", "a2", "a3"})
			}
			for _, args := range bad {
				requireRefused(t, dir, append(slices.Clone(line), args...))
			}
		})
	}
}

// No command, an unknown command or subcommand, a flag value a command
// checks itself, a required flag or argument left out, and a pair of flags
// given apart exit 2 as well, with a usage hint; a failure of the work
// itself (no store to read) exits 1.
func TestFlagValuesRefusedExit2(t *testing.T) {
	golden, err := filepath.Abs(referenceGolden)
	require.NoError(t, err)
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"runs"}, {"runs", "lisst"}, {"db", "nope"}, {"firmware", "nope"}, {"uplink", "nope"}, {"bench", "nope"},
		{"runs", "list", "--limit", "0"},
		{"runs", "list", "--status", "sleeping"},
		{"runs", "show"},
		{"runs", "fork", "t1"},
		{"db", "backup"},
		{"db", "prune"},
		{"db", "prune", "--older-than", "-1h"},
		{"db", "check", "--data", "d", "--file", "f"},
		{"run", "--max-tokens", "-1", "hello"},
		{"run", "--model", "gpt", "hello"},
		{"run"},
		{"resume", "r1", "--decision", "maybe"},
		{"resume", "r1", "--decision", "edit", "--value", "{"},
		{"serve", "--workers", "0"},
		{"serve", "--uplink", "http://127.0.0.1:1"},
		{"collector"},
		{"uplink", "flush"},
		{"firmware", "sign", "bundle"},
		{"firmware", "activate", "name", "latest"},
		{"firmware", "install", "--allow-downgrade", "bundle"},
		{"bench", "reference", "--runs", "0"},
		{"bench", "reference", "--saver", "disk"},
		{"eval", "--parallel", "0", "g.jsonl"},
		// Values checked before any work starts (nothing listens, no
		// store or data folder is made, no start-up line is printed).
		{"serve", "--listen", "0.0.0.0:7979"},
		{"serve", "--listen", "7070"},
		{"serve", "--listen", "127.0.0.1:99999"},
		{"serve", "--tls-cert", "cert.pem", "--tls-key", "key.pem"},
		{"serve", "--uplink", "collector.site:8443", "--uplink-secret", "secret"},
		{"serve", "--uplink", "http://127.0.0.1:1", "--uplink-secret", "secret"},
		{"serve", "--appliance-id", "clinic 1", "--listen", "127.0.0.1:0"},
		{"serve", "--ollama", "http://::1:x", "--listen", "127.0.0.1:0"},
		{"serve", "--ollama-stall-timeout", "-1s", "--listen", "127.0.0.1:0"},
		{"serve", "--allow-host", "https://clinic-pc.local", "--listen", "127.0.0.1:0"},
		{"uplink", "status", "--url", "collector.site"},
		{"uplink", "flush", "--uplink", "ftp://collector.site", "--uplink-secret", "secret"},
		{"uplink", "flush", "--url", "http://127.0.0.1:1", "--secret-file", "secret"},
		{"uplink", "flush", "--url", "http://127.0.0.1:1", "--secret-file", "secret", "--timeout", "0s"},
		{"uplink", "flush", "--url", "http://127.0.0.1:1", "--secret-file", "secret", "--appliance-id", "a:b"},
		{"collector", "--secrets", "secrets"},
		{"collector", "--listen", "collector", "--secrets", "secrets"},
		{"run", "--agent", "medication-adherance", "hello"},
		{"run", "--tools", "kb_serch", "hello"},
		{"run", "--thread", "", "hello"},
		{"run", "--ollama", "http://::1:x", "hello"},
		{"run", "--ollama-stall-timeout", "-1s", "hello"},
		{"resume", "r1", "--decision", "approve", "--ollama", "http://::1:x"},
		{"firmware", "sign", "--key", "ID.key", "bundle"},
		{"firmware", "verify", "--keys", "keys", "bundle"},
		{"firmware", "install", "--keys", "keys", "bundle"},
		{"eval", "--timeout", "0s", golden},
		{"bench", "reference", "--threads", "0"},
		{"db", "salvage", "--appliance-id", "a:b", "copy.db"},
	} {
		requireRefused(t, t.TempDir(), args)
	}

	code, _, stderr := outpostBin(t, t.TempDir(), "runs", "show", "--data", t.TempDir(), "run_0000000000000001")
	require.Equal(t, 1, code, "no store is a failure of the work, not of the command line: %s", stderr)
	require.NotRegexp(t, usageHint, stderr)
}

// A file a flag names that is there but will not do (a secret that is not
// one line, a secrets file with a bad line, a certificate and a key that
// are not PEM, a private key file that holds a public key) is refused as
// a bad command line too, before anything is done, as is a collector's
// --postgres DSN that does not parse beside a good secrets file: the
// folder the command runs in stays empty (no collector-data, no token) and
// the files it was given are as they were.
func TestFlagFilesRefusedBeforeWork(t *testing.T) {
	files := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(files, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	secret := write("secret", "two words\n")
	secrets := write("secrets", "clinic-1\n")
	goodSecrets := write("good-secrets", "clinic-1 s3cret\n")
	pem := write("cert.pem", "not a certificate\n")
	cert, key := selfSigned(t, t.TempDir())
	bundle := filepath.Join(files, "bundle")
	code, _, stderr := outpostBin(t, files, "firmware", "export", bundle)
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, files, "firmware", "keygen", "--out", files)
	require.Zero(t, code, stderr)
	pubs, err := filepath.Glob(filepath.Join(files, "*.pub"))
	require.NoError(t, err)
	require.Len(t, pubs, 1)
	before := folderFiles(t, bundle)

	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"serve", "--uplink", "http://127.0.0.1:1", "--uplink-secret", secret}, "--uplink-secret: uplink secret " + secret + ": want the secret alone on one line"},
		{[]string{"uplink", "flush", "--url", "http://127.0.0.1:1", "--secret-file", secret}, "--secret-file: uplink secret " + secret},
		{[]string{"collector", "--secrets", secrets}, "--secrets: secrets " + secrets + " line 1: want \"appliance_id secret\""},
		{[]string{"collector", "--secrets", goodSecrets, "--postgres", "port=notanumber"}, "--postgres: collector postgres: cannot parse `port=notanumber`"},
		{[]string{"serve", "--tls-cert", pem, "--tls-key", pem}, "--tls-cert " + pem + " and --tls-key " + pem + ": tls: "},
		{[]string{"firmware", "sign", "--key", pubs[0], bundle}, "--key: "},
		// With TLS, an address beyond loopback is taken; one written as an
		// IPv4 address that is not one is refused, not looked up as a name.
		{[]string{"serve", "--listen", "999.1.1.1:8443", "--tls-cert", cert, "--tls-key", key}, `--listen "999.1.1.1:8443": want HOST:PORT, such as 127.0.0.1:7070 ("999.1.1.1" is not an IP address)`},
	} {
		dir := t.TempDir()
		requireRefused(t, dir, tc.args)
		_, _, stderr := outpostBin(t, dir, tc.args...)
		require.Contains(t, stderr, tc.says, tc.args)
	}
	require.Equal(t, before, folderFiles(t, bundle), "the bundle was not signed")
}

// A certificate and key that load are taken: serve, checking them before
// it starts, still serves HTTPS with them beyond loopback's rules.
func TestServeTakesATLSPairThatLoads(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	cmd := exec.Command(builtOutpost(t), "serve", "--data", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--tls-cert", cert, "--tls-key", key, "--ollama", "http://127.0.0.1:1")
	out, stderr := startBin(t, cmd)
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	var url string
	for url == "" && sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "console: "); ok {
			url = u
		}
	}
	require.True(t, strings.HasPrefix(url, "https://127.0.0.1:"), "serve printed no https console line; stderr:\n%s", stderr.String())
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(url + "healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// selfSigned writes a certificate for 127.0.0.1 and its key, as PEM, into
// dir.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(priv)
	require.NoError(t, err)
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return cert, key
}

// Every command's -h names what each of its flags takes (FILE, URL, ADDR,
// a choice such as sync|exit), not Go's "string" or "value"; outpost -h
// says where to start, and serve -h what it serves and where its token is.
func TestHelpNamesWhatFlagsTake(t *testing.T) {
	code, help, _ := outpostBin(t, "", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "Start with \"outpost serve\", then open http://127.0.0.1:7070/ and paste the token that\n\"outpost token\" prints.")
	vague := regexp.MustCompile(`(?m)^  -[a-z-]+ (string|value)$`)
	for _, line := range commandLines() {
		code, help, stderr := outpostBin(t, "", append(slices.Clone(line), "-h")...)
		require.Zero(t, code, stderr)
		require.Empty(t, vague.FindAllString(help, -1), "%v -h:\n%s", line, help)
	}
	code, help, _ = outpostBin(t, "", "serve", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "Serve the HTTP API (/api/v1), its event stream and the operator console page")
	require.Contains(t, help, "outpost token prints it")
	require.Contains(t, help, "\n  -uplink-secret FILE\n")
	require.Contains(t, help, "\n  -listen ADDR\n")
	code, help, _ = outpostBin(t, "", "resume", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "edit sends --value in its place:\na text is quoted twice, --value '\"Please call the pharmacy.\"'")
	code, help, _ = outpostBin(t, "", "eval", "-h")
	require.Zero(t, code)
	require.Contains(t, help, "Exit 1 when one departs; exit 2 when the replay cannot be made")
}

// With bundles installed in the data folder, run still refuses an agent no
// active bundle has, or a tool its agent cannot have, before it makes a
// store (exit 2), and runs what the bundles do have.
func TestRunChecksAgentAndToolsAgainstInstalledBundles(t *testing.T) {
	dir := t.TempDir()
	data, ref := filepath.Join(dir, "data"), filepath.Join(dir, "ref")
	code, _, stderr := outpostBin(t, dir, "firmware", "export", ref)
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", ref)
	require.Zero(t, code, stderr)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--agent", "medication-adherance"}, `--agent: unknown agent "medication-adherance" (available: `},
		{[]string{"--agent", "medication-adherence-tools", "--tools", "kb_search,kb_serch"}, `--tools: agent "medication-adherence-tools" cannot have tool kb_serch here`},
	} {
		args := append(append([]string{"run", "--data", data}, tc.args...), "when is my next metformin refill due")
		code, stdout, stderr := outpostBin(t, dir, args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Empty(t, stdout)
		require.Contains(t, stderr, tc.says)
		require.NoFileExists(t, filepath.Join(data, store.FileName), args)
	}
	code, stdout, stderr := outpostBin(t, dir, "run", "--data", data, "--agent", "medication-adherence-tools", "--tools", "kb_search",
		"when is my next metformin refill due")
	require.Zero(t, code, stderr)
	require.Regexp(t, `tool\.called +generate_response +\{"args"`, stdout)
}

// exportedBundle exports the embedded bundle to dir/clinic, for a test to
// change, sign and install into dir/data.
func exportedBundle(t *testing.T, dir string) (data, b string) {
	t.Helper()
	data, b = filepath.Join(dir, "data"), filepath.Join(dir, "clinic")
	code, _, stderr := outpostBin(t, dir, "firmware", "export", b)
	require.Zero(t, code, stderr)
	return data, b
}

// An unknown agent's error lists the agents new runs have: with a bundle
// installed, its agents, not the embedded bundle's, which new runs no
// longer use. The bench workload's agent is not listed (serve's API and the
// firmware listing do not show it), though run still starts it by name.
// firmware list names the same agents, installed or not (with nothing
// installed it named the embedded bundle, medication-adherence, which
// read as one agent where the error named two).
func TestUnknownAgentListsTheInstalledAgents(t *testing.T) {
	sameAgents := func(t *testing.T, dir, data, unknownErr string) {
		t.Helper()
		_, named, ok := strings.Cut(unknownErr, "(available: ")
		require.True(t, ok, unknownErr)
		named, _, _ = strings.Cut(named, ")")
		code, stdout, stderr := outpostBin(t, dir, "firmware", "list", "--data", data)
		require.Zero(t, code, stderr)
		_, listed, ok := strings.Cut(stdout, "agents new runs have: ")
		require.True(t, ok, stdout)
		listed, _, _ = strings.Cut(listed, "\n")
		require.Equal(t, named, listed, "firmware list and the unknown agent's error name other agents")
	}
	dir := t.TempDir()
	data, b := exportedBundle(t, dir)
	// A bundle of one agent: the reference without its tools agent, and
	// without the golden conversations, some of which are the tools agent's.
	mf := filepath.Join(b, "manifest.json")
	raw, err := os.ReadFile(mf)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	m["name"] = "clinic"
	delete(m["agents"].(map[string]any), "medication-adherence-tools")
	delete(m, "golden")
	raw, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(mf, raw, 0o644))
	require.NoError(t, os.Remove(filepath.Join(b, "agents", "medication-adherence-tools.json")))
	require.NoError(t, os.RemoveAll(filepath.Join(b, "golden")))
	devKey, err := filepath.Abs(filepath.Join("..", "..", "testdata", "keys", "dev.key"))
	require.NoError(t, err)
	code, _, stderr := outpostBin(t, dir, "firmware", "sign", "--key", devKey, b)
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", b)
	require.Zero(t, code, stderr)

	code, _, stderr = outpostBin(t, dir, "run", "--data", data, "--agent", "medication-adherence-tools", "hello")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `unknown agent "medication-adherence-tools" (available: medication-adherence)`)
	sameAgents(t, dir, data, stderr)

	// With nothing installed, the embedded bundle's agents.
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	code, _, stderr = outpostBin(t, dir, "run", "--data", empty, "--agent", "nosuch", "hello")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `unknown agent "nosuch" (available: medication-adherence, medication-adherence-tools)`)
	sameAgents(t, dir, empty, stderr)

	code, _, stderr = outpostBin(t, dir, "run", "--data", data, "--thread", "bench", "--agent", "reference", "hello")
	require.Zero(t, code, stderr)
}

// An unknown subcommand says so on stderr's first line, then gives the
// command's usage, as an unknown command does, with exit 2 and nothing on
// stdout.
func TestUnknownSubcommandErrorComesFirst(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		error, next string
	}{
		{[]string{"bogus"}, `outpost: unknown command "bogus"`, "Outpost "},
		{[]string{"db", "bogus"}, `outpost db: unknown db subcommand "bogus"`, "Usage: outpost db <"},
		{[]string{"runs", "bogus"}, `outpost runs: unknown runs subcommand "bogus"`, "Usage: outpost runs <"},
		{[]string{"firmware", "bogus"}, `outpost firmware: unknown firmware command "bogus"`, "Usage: outpost firmware <"},
		{[]string{"uplink", "bogus"}, `outpost uplink: unknown uplink subcommand "bogus"`, "Usage: outpost uplink <"},
		{[]string{"bench", "bogus"}, `outpost bench: unknown workload "bogus"`, "Usage: outpost bench reference"},
		{[]string{"help", "db", "bogus"}, `outpost db: unknown db subcommand "bogus"`, "Usage: outpost db <"},
		// No subcommand, or a flag before it: the flag package stops at
		// the subcommand, so the line is put right rather than guessed at.
		{[]string{"runs"}, `outpost runs: a subcommand is needed: list, show, history, fork, replay`, "Usage: outpost runs <"},
		{[]string{"runs", "--data", "DIR"}, `outpost runs: --data goes after the subcommand: outpost runs list --data DIR`, "Usage: outpost runs <"},
		{[]string{"runs", "--data", "DIR", "show", "r1"}, `outpost runs: --data goes after the subcommand: outpost runs show --data DIR r1`, "Usage: outpost runs <"},
		{[]string{"db"}, `outpost db: a subcommand is needed: check, backup, compact, prune, salvage`, "Usage: outpost db <"},
		{[]string{"db", "--json", "check"}, `outpost db: --json goes after the subcommand: outpost db check --json`, "Usage: outpost db <"},
		{[]string{"firmware"}, `outpost firmware: a subcommand is needed: keygen, sign, verify, install, list, activate, remove, export`, "Usage: outpost firmware <"},
		{[]string{"firmware", "--data=DIR", "list"}, `outpost firmware: --data goes after the subcommand: outpost firmware list --data=DIR`, "Usage: outpost firmware <"},
		{[]string{"uplink"}, `outpost uplink: a subcommand is needed: status, flush`, "Usage: outpost uplink <"},
		{[]string{"uplink", "--data", "DIR"}, `outpost uplink: --data goes after the subcommand: outpost uplink status --data DIR`, "Usage: outpost uplink <"},
		{[]string{"bench"}, `outpost bench: a workload is needed: reference`, "Usage: outpost bench reference"},
		{[]string{"bench", "--saver", "bbolt"}, `outpost bench: --saver goes after the workload: outpost bench reference --saver bbolt`, "Usage: outpost bench reference"},
		// A flag's value that names a subcommand is the flag's: the
		// subcommand is the first argument that is no flag and no value.
		{[]string{"runs", "--thread", "list", "show", "r1"}, `outpost runs: --thread goes after the subcommand: outpost runs show --thread list r1`, "Usage: outpost runs <"},
		{[]string{"runs", "--json", "show", "r1"}, `outpost runs: --json goes after the subcommand: outpost runs show --json r1`, "Usage: outpost runs <"},
		{[]string{"db", "--data", "check", "backup", "FILE"}, `outpost db: --data goes after the subcommand: outpost db backup --data check FILE`, "Usage: outpost db <"},
		{[]string{"firmware", "--data", "list", "export", "DIR"}, `outpost firmware: --data goes after the subcommand: outpost firmware export --data list DIR`, "Usage: outpost firmware <"},
		{[]string{"uplink", "--data", "status", "flush"}, `outpost uplink: --data goes after the subcommand: outpost uplink flush --data status`, "Usage: outpost uplink <"},
		{[]string{"bench", "--saver", "reference"}, `outpost bench: --saver goes after the workload: outpost bench reference --saver reference`, "Usage: outpost bench reference"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := outpost(t, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			lines := strings.Split(stderr, "\n")
			require.GreaterOrEqual(t, len(lines), 3, stderr)
			require.Equal(t, tc.error, lines[0], stderr)
			require.Empty(t, lines[1], stderr)
			require.True(t, strings.HasPrefix(lines[2], tc.next), stderr)
			require.Equal(t, 1, strings.Count(stderr, tc.error), "said once: %s", stderr)
		})
	}
}

// The subcommands a missing one is named with are those the command runs,
// in the order of the usage line that names them (<list|show|...>).
func TestSubcommandNeededNamesEverySubcommand(t *testing.T) {
	for name, cmd := range commands {
		if len(cmd.subs) == 0 {
			continue
		}
		t.Run(name, func(t *testing.T) {
			code, _, stderr := outpost(t, name)
			require.Equal(t, 2, code, stderr)
			first, _, _ := strings.Cut(stderr, "\n")
			_, list, ok := strings.Cut(first, " is needed: ")
			require.True(t, ok, stderr)
			require.Equal(t, cmd.subs, strings.Split(list, ", "), stderr)
			_, help, _ := outpost(t, name, "-h")
			if usage, _, _ := strings.Cut(help, "\n"); strings.Contains(usage, "|") {
				require.Contains(t, usage, "<"+strings.Join(cmd.subs, "|")+">")
			}
		})
	}
}

// Where a flag comes before the subcommand, which arguments are flags'
// values is read from the subcommands' own flag sets, each made for its
// -h: every subcommand makes one, under its own name, and writes nothing
// but to the probe.
func TestEverySubcommandsFlagsAreProbed(t *testing.T) {
	for name, cmd := range commands {
		for _, sub := range cmd.subs {
			t.Run(name+" "+sub, func(t *testing.T) {
				p := &flagProbe{}
				require.ErrorIs(t, cmd.run(context.Background(), []string{sub, "-h"}, p, p), flag.ErrHelp)
				require.NotNil(t, p.fs)
				require.Equal(t, "outpost "+name+" "+sub, p.fs.Name())
			})
		}
	}
}
