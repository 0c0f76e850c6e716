package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/internal/pgtest"
	"github.com/outpost-edge/outpost/store"
)

// The binaries the command-line tests run, each built once per test binary
// into binDir, which TestMain removes: the binary as make build builds it,
// and (tagged) one built with the tag outpost_reference_override, whose
// embedded bundle $OUTPOST_TEST_REFERENCE can replace.
var (
	binDir          string
	binDirOnce      sync.Once
	binDirError     error
	plain, tagged   builtBinary
	referenceTagged = "outpost_reference_override"
)

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// outpostBin runs the built binary with args, as a person would from a
// shell, in the folder dir ("" for the test's own), and returns its exit
// code and what it printed.
func outpostBin(t *testing.T, dir string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return outpostBinEnv(t, builtOutpost(t), nil, dir, args...)
}

// outpostBinEnv is outpostBin for the binary bin, with env added to the
// environment.
func outpostBinEnv(t *testing.T, bin string, env []string, dir string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// A command that should have refused its command line but goes on to
	// serve or wait ends the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "OUTPOST_DATA="), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errb.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errb.String()
}

// builtOutpost is the path of the binary, built at the first call.
func builtOutpost(t *testing.T) string { return plain.build(t, "") }

// builtOutpostTagged is the path of the binary built with
// referenceTagged, built at the first call.
func builtOutpostTagged(t *testing.T) string { return tagged.build(t, referenceTagged) }

func (b *builtBinary) build(t *testing.T, tags string) string {
	t.Helper()
	binDirOnce.Do(func() { binDir, binDirError = os.MkdirTemp("", "outpost-bin-") })
	require.NoError(t, binDirError)
	b.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		b.path = filepath.Join(binDir, "outpost"+tags)
		cmd := exec.Command(gobin, "build", "-tags", tags, "-o", b.path, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = errors.New(string(out))
		}
	})
	require.NoError(t, b.err)
	return b.path
}

// A flag of run's own written after the input ("outpost run hi --data
// DIR") is refused with exit 2, and nothing is run or made: not in DIR,
// not in the default folder. The message gives the command line with the
// flags first, and the one that sends the word as text, and both work.
func TestRunRefusesItsFlagsAfterTheInput(t *testing.T) {
	cwd, data := t.TempDir(), filepath.Join(t.TempDir(), "data")
	code, stdout, stderr := outpostBin(t, cwd, "run", "--thread", "t1", "hi", "there", "--data", data)
	require.Equal(t, 2, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "outpost run: --data after the input would be read as input, so nothing was run: run takes its flags before the input:\n"+
		"  outpost run --thread t1 --data "+data+" hi there\n"+
		"(to send --data as text, put -- before the input: outpost run --thread t1 -- hi there --data "+data+")")
	entries, err := os.ReadDir(cwd)
	require.NoError(t, err)
	require.Empty(t, entries, "a refused run made something in the current folder")
	require.NoDirExists(t, data)

	for _, w := range []string{"--json", "-json", "--agent=reference", "--max-tokens"} {
		code, _, stderr = outpostBin(t, cwd, "run", "--data", data, "hi", w, "5")
		require.Equal(t, 2, code, w)
		require.Contains(t, stderr, w+" after the input would be read as input")
	}
	// A flag with no value after it: the line with the flags first
	// would take the input for its value.
	code, _, stderr = outpostBin(t, cwd, "run", "--data", data, "hi", "there", "--thread")
	require.Equal(t, 2, code)
	require.NotContains(t, stderr, "--thread hi")
	require.Contains(t, stderr, "outpost run: --thread after the input would be read as input, so nothing was run, and it has no value: "+
		"run takes its flags, each with its value, before the input (outpost run --thread THREAD ... INPUT)")
	require.NoDirExists(t, data)
	code, _, stderr = outpostBin(t, cwd, "run", "hi", "--help")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--help after the input would be read as input, so nothing was run: outpost run -h lists run's flags")

	// The suggested command lines.
	code, _, stderr = outpostBin(t, cwd, "run", "--thread", "t1", "--data", data, "hi", "there")
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, cwd, "run", "--thread", "t1", "--", "hi", "there", "--data", data)
	require.Zero(t, code, stderr)
	// Words that are not run's flags are input, as before.
	code, _, stderr = outpostBin(t, cwd, "run", "--thread", "t1", "take", "-3", "units", "--verbose")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpostBin(t, cwd, "runs", "list", "--thread", "t1", "--json")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, `"input": "hi there --data `+data+`"`)
	require.Contains(t, stdout, `"input": "take -3 units --verbose"`)

	_, help, _ := outpostBin(t, cwd, "run", "-h")
	require.Contains(t, help, "A word after the input that is one of run's own flags (outpost run hello --json)\nis refused, with exit 2 and nothing run")
}

// run -h shows what leaving --tools out does, not a made-up default
// ("-"); left out, the run calls its agent's tools; "" narrows them to
// none; "-" is no longer a hidden word for "no narrowing".
func TestRunToolsFlag(t *testing.T) {
	code, help, _ := outpostBin(t, "", "run", "-h")
	require.Zero(t, code)
	i := strings.Index(help, "  -tools")
	require.GreaterOrEqual(t, i, 0, help)
	tools, _, _ := strings.Cut(help[i:], "\n  -")
	require.NotContains(t, tools, "(default")
	require.Contains(t, tools, `narrow the run's tools to these NAMES (comma-separated; "" for none); without it, the run may call every tool its agent may`)

	data := t.TempDir()
	const q = "when is my next metformin refill due"
	code, stdout, stderr := outpostBin(t, "", "run", "--data", data, "--agent", "medication-adherence-tools", q)
	require.Zero(t, code, stderr)
	require.Regexp(t, `tool\.called +generate_response +\{"args"`, stdout)
	code, stdout, stderr = outpostBin(t, "", "run", "--data", data, "--agent", "medication-adherence-tools", "--tools", "", q)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, `"reason":"tool \"kb_search\" is not allowed by this request"`)
	require.NotContains(t, stdout, "tool.called")
	code, _, stderr = outpostBin(t, "", "run", "--data", data, "--agent", "medication-adherence-tools", "--tools", "-", q)
	require.Equal(t, 2, code, "a tool the agent cannot have is a bad command line")
	require.Contains(t, stderr, "cannot have tool - here")
}

// The reference tools agent answers a refused call in words of its own,
// not by pasting the refusal where the tool's result would go ("Here is
// the clinic's clock: refused: ..."): the clock and the medication guide
// refused by the request, and a follow-up the operator declined.
func TestReferenceToolsAgentAnswersARefusedCallPlainly(t *testing.T) {
	data := t.TempDir()
	output := func(stdout string) string {
		t.Helper()
		_, out, ok := strings.Cut(stdout, "\noutput: ")
		require.True(t, ok, stdout)
		return strings.TrimSpace(out)
	}
	code, stdout, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "clock", "--agent", "medication-adherence-tools",
		"--tools", "kb_search", "what time is it today for my metformin")
	require.Zero(t, code, stderr)
	require.Equal(t, `I cannot read the clinic's clock just now (refused: tool "current_time" is not available). `+
		"Take your doses at the times on your label.", output(stdout))
	code, stdout, stderr = outpostBin(t, "", "run", "--data", data, "--thread", "guide", "--agent", "medication-adherence-tools",
		"--tools", "current_time", "what is the dose of metformin")
	require.Zero(t, code, stderr)
	require.Equal(t, `I cannot look metformin up in the medication guide just now (refused: tool "kb_search" is not available). `+
		"Please ask the clinic's pharmacist, or read the leaflet that came with your medicine.", output(stdout))

	code, stdout, stderr = outpostBin(t, "", "run", "--data", data, "--thread", "call", "--agent", "medication-adherence-tools",
		"--json", "please schedule a reminder call")
	require.Zero(t, code, stderr)
	var run struct{ ID, Status string }
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &run), stdout)
	require.Equal(t, "interrupted", run.Status)
	code, stdout, stderr = outpostBin(t, "", "resume", "--data", data, "--decision", "reject", "--by", "nurse", "--reason", "no desk today", run.ID)
	require.Zero(t, code, stderr)
	require.Equal(t, `I could not schedule the follow-up call (refused: the call to "schedule_followup" was not run (declined by the operator)). `+
		"Please call the clinic to arrange it.", output(stdout))
}

// db check --file on a damaged backup gives advice that fits a backup:
// not "restore the last backup" (it is the backup), nor, for an empty one,
// "remove the file and start again" (that is a new appliance's store).
// On the store file of a folder that serve owns, it names the check that
// goes through serve, and that check works.
func TestDBCheckFileAdvisesABackup(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	bak := filepath.Join(t.TempDir(), "backup.db")
	code, _, stderr = outpostBin(t, "", "db", "backup", "--data", data, bak)
	require.Zero(t, code, stderr)
	whole, err := os.ReadFile(bak)
	require.NoError(t, err)

	for name, b := range map[string][]byte{"cut.db": whole[:len(whole)/2], "empty.db": nil} {
		path := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		code, stdout, stderr := outpostBin(t, "", "db", "check", "--file", path)
		require.Equal(t, 1, code, name)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "store file is damaged", name)
		require.Contains(t, stderr, "nothing was changed: this copy cannot be restored: check an older backup, "+
			"or, while the store itself is sound, take a new one (outpost db backup FILE)", name)
		require.NotContains(t, stderr, "restore the last backup", name)
		require.NotContains(t, stderr, "new appliance", name)
	}

	s := startServe(t, builtOutpost(t), data)
	code, _, stderr = outpostBin(t, "", "db", "check", "--file", filepath.Join(data, "outpost.db"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is in use by another outpost process\n(another outpost process, such as serve, owns this file: "+
		"outpost db check --data "+data+" checks it through that process)")
	code, stdout, stderr := outpostBin(t, "", "db", "check", "--data", data)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
	s.stop(t)
}

// runs fork from a checkpoint that is not there says so in a line, and
// names the command that lists the thread's checkpoints.
func TestRunsForkUnknownCheckpoint(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr := outpostBin(t, "", "runs", "fork", "t1", "--data", data, "--checkpoint", "0000000000000001")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, `outpost runs: thread "t1" has no checkpoint "0000000000000001" (outpost runs history t1 --data `+data+" lists them)\n", stderr)
}

// uplink flush to a collector that is down says every few seconds that it
// is retrying and why, and, when --timeout runs out, how many outcomes
// still wait, where it sat silent until then and ended with "flush:
// context deadline exceeded".
func TestUplinkFlushToACollectorThatIsDown(t *testing.T) {
	data, secret := oneOutcomeToSend(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now

	code, stdout, stderr := outpostBin(t, "", "uplink", "flush", "--data", data, "--url", down, "--secret-file", secret, "--timeout", "7s")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stdout, "backlog 1")
	require.Regexp(t, `uplink: 0 of 1 outcomes acknowledged; retrying \(5s of --timeout 7s\): send outcomes 1-1: .*connection refused…\n`, stderr)
	require.Regexp(t, `outpost uplink: the collector did not acknowledge the backlog within --timeout 7s: 1 outcome\(s\) still wait `+
		`\(last error: send outcomes 1-1: .*connection refused\); the next flush sends them, as serve --uplink does\n$`, stderr)
}

// uplink flush to a collector that takes the connection and never answers
// says so too, every few seconds and at the end, where it sat silent until
// --timeout ran out and then named an empty "last error".
func TestUplinkFlushToACollectorThatDoesNotAnswer(t *testing.T) {
	data, secret := oneOutcomeToSend(t)
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer hung.Close()
	defer close(release)

	code, _, stderr := outpostBin(t, "", "uplink", "flush", "--data", data, "--url", hung.URL, "--secret-file", secret, "--timeout", "7s")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "uplink: 0 of 1 outcomes acknowledged; waiting for the collector to answer (5s of --timeout 7s)…\n")
	require.NotContains(t, stderr, "last error: )")
	require.Regexp(t, `outpost uplink: the collector did not acknowledge the backlog within --timeout 7s: 1 outcome\(s\) still wait `+
		`\(it did not answer\); the next flush sends them, as serve --uplink does\n$`, stderr)
}

// uplink flush to a URL where a web server, not the collector, answers 404
// with an empty body says what answered and what to check, where it said
// "PARKED outcomes 1-1: the collector answered 404 : " and "collector
// answered 404: ", naming nothing.
func TestUplinkFlushToAURLThatIsNoCollector(t *testing.T) {
	data, secret := oneOutcomeToSend(t)
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	empty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer empty.Close()

	for _, tc := range []struct{ url, says string }{
		{other.URL, "collector answered 404: 404 page not found (nothing at this URL takes outcomes: check that it is the collector's base URL"},
		{empty.URL, "collector answered 404: Not Found, with an empty answer (nothing at this URL takes outcomes: check that it is the collector's base URL"},
	} {
		code, stdout, stderr := outpostBin(t, "", "uplink", "flush", "--data", data, "--url", tc.url, "--secret-file", secret, "--timeout", "5s")
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stdout, "PARKED outcomes 1-1: "+tc.says)
		require.Contains(t, stderr, "outpost uplink: batch parked: the collector refused it: send outcomes 1-1: "+tc.says)
		// The status says it once: its last error is the parked batch's.
		require.Equal(t, 1, strings.Count(stdout, tc.says), stdout)
	}
}

// db check --file of a backup that an older binary made, which lacks a
// bucket a later one added, says that a store restored from it gets the
// bucket, and not that the file was written by an incompatible version
// or is no store, which it said as well.
func TestDBCheckFileOfABackupLackingANewBucket(t *testing.T) {
	data := t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "hi")
	require.Zero(t, code, stderr)
	bak := filepath.Join(t.TempDir(), "old.db")
	code, _, stderr = outpostBin(t, "", "db", "backup", "--data", data, bak)
	require.Zero(t, code, stderr)
	bdb, err := bbolt.Open(bak, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket([]byte("toolcalls")) }))
	require.NoError(t, bdb.Close())

	code, _, stderr = outpostBin(t, "", "db", "check", "--file", bak)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "bucket toolcalls is missing; a store restored from this copy gets it when it is first opened for writing (by serve or run)")
	require.NotContains(t, stderr, "incompatible")

	// Restored, the store is told the same on a read-only open.
	restored := t.TempDir()
	raw, err := os.ReadFile(bak)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(restored, "outpost.db"), raw, 0o600))
	code, _, stderr = outpostBin(t, "", "db", "check", "--data", restored)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "bucket toolcalls is missing; opening the store for writing once adds it")
	require.NotContains(t, stderr, "incompatible")
}

// oneOutcomeToSend makes a data folder whose ledger holds one outcome, and
// an uplink secret file.
func oneOutcomeToSend(t *testing.T) (data, secret string) {
	t.Helper()
	data = t.TempDir()
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	secret = filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2-but-longer\n"), 0o600))
	return data, secret
}

// uplink status only reads: the store file is byte for byte as it was
// after it, as text and as JSON (it opened the store for writing, which
// commits a transaction, and failed in a read-only data folder).
func TestUplinkStatusChangesNothing(t *testing.T) {
	data, _ := oneOutcomeToSend(t)
	path := filepath.Join(data, store.FileName)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	code, stdout, stderr := outpostBin(t, "", "uplink", "status", "--data", data)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, ": 1 outcomes, 0 acknowledged upstream, backlog 1")
	code, stdout, stderr = outpostBin(t, "", "uplink", "status", "--data", data, "--json")
	require.Equal(t, 0, code, stderr)
	var st struct{ Backlog int }
	require.NoError(t, json.Unmarshal([]byte(stdout), &st), stdout)
	require.Equal(t, 1, st.Backlog)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(before, after), "uplink status changed the store file")
}

// A newcomer's round with bundles of their own, on the built binary: a
// higher version installed beside the active one says that new runs still
// use the active one, and gives the activate command, which works; a lower
// one gives it with the downgrade flags. A tampered bundle is not to be
// installed (the advice was "re-sign it", which on an appliance would
// bless the tampering). eval --bundle of a bundle signed by one's own key
// says how to trust it, and tells a tampered one as firmware verify does.
func TestFirmwareNewcomerRound(t *testing.T) {
	dir := t.TempDir()
	data, keys, v1, v2 := filepath.Join(dir, "data"), filepath.Join(dir, "keys"), filepath.Join(dir, "v1"), filepath.Join(dir, "v2")
	ok := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := outpostBin(t, dir, args...)
		require.Zero(t, code, "%v: %s", args, stderr)
		return stdout
	}
	ok("firmware", "keygen", "--out", keys)
	key, err := filepath.Glob(filepath.Join(keys, "*.key"))
	require.NoError(t, err)
	require.Len(t, key, 1)
	// v1 is the embedded version, v2 the one above it.
	ev := embeddedVersion(t)
	lo, hi := strconv.FormatInt(ev, 10), strconv.FormatInt(ev+1, 10)
	for i, b := range []string{v1, v2} {
		ok("firmware", "export", b)
		setBundleVersion(t, b, ev+int64(i))
		ok("firmware", "sign", "--key", key[0], b)
	}
	require.Contains(t, ok("firmware", "install", "--data", data, "--keys", keys, v2), "medication-adherence v"+hi+" installed and active")
	out := ok("firmware", "install", "--data", data, "--allow-downgrade", "--by", "ada", "--reason", "test", v1)
	require.Contains(t, out, "new runs still use v"+hi+", the active version; to make v"+lo+" active: "+
		"outpost firmware activate --data "+data+" --allow-downgrade --by NAME --reason TEXT medication-adherence "+lo+"\n")
	// A downgrade that is not active is marked in the ACTIVE column as
	// the header names it, not one space to the right.
	list := strings.Split(ok("firmware", "list", "--data", data), "\n")
	i := slices.IndexFunc(list, func(l string) bool { return strings.Contains(l, "(downgrade)") })
	require.Regexp(t, `^medication-adherence +`+lo+` +\(downgrade\) `, list[i])
	require.Equal(t, strings.Index(list[0], "ACTIVE"), strings.Index(list[i], "(downgrade)"), "%q\n%q", list[0], list[i])
	ok("firmware", "activate", "--data", data, "--allow-downgrade", "--by", "ada", "--reason", "test", "medication-adherence", lo)
	out = ok("firmware", "install", "--data", data, v2)
	require.Contains(t, out, "new runs still use v"+lo+", the active version; to make v"+hi+" active: outpost firmware activate --data "+data+" medication-adherence "+hi+"\n")
	ok("firmware", "activate", "--data", data, "medication-adherence", hi)
	require.Regexp(t, `medication-adherence +`+hi+` +active`, ok("firmware", "list", "--data", data))

	golden, err := filepath.Abs(referenceGolden)
	require.NoError(t, err)
	code, _, stderr := outpostBin(t, dir, "eval", "--bundle", v2, golden)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "bundle signed by an unknown key")
	require.Contains(t, stderr, "(eval trusts the development key alone unless --keys names the signer's .pub file, or a folder of them)")
	ok("eval", "--bundle", v2, "--keys", keys, golden)

	kb := filepath.Join(v2, "kb", "kb-01.md")
	require.NoError(t, os.WriteFile(kb, []byte("tampered"), 0o644))
	for _, args := range [][]string{{"firmware", "verify", "--keys", keys, v2}, {"firmware", "install", "--data", data, v2}, {"eval", "--bundle", v2, "--keys", keys, golden}} {
		code, _, stderr := outpostBin(t, dir, args...)
		require.NotZero(t, code, args)
		require.Contains(t, stderr, "does not match its sha256", args)
		require.Contains(t, stderr, "the bundle was changed after it was signed, or damaged; do not install it: get a fresh copy", args)
		require.NotContains(t, stderr, "re-sign it", args)
	}
}

// eval's exit 2 says the replay could not be made, so that CI can tell a
// broken harness from a regression (exit 1): a flag it does not take is
// such a case, and exited 1. eval no longer lists --max-recoveries, which
// it took and ignored (its runs live in memory, and nothing recovers them).
func TestEvalFlagErrorsAreHarnessErrors(t *testing.T) {
	golden, err := filepath.Abs(referenceGolden)
	require.NoError(t, err)
	code, help, _ := outpostBin(t, "", "eval", "-h")
	require.Zero(t, code)
	require.NotContains(t, help, "max-recoveries")
	require.Contains(t, help, "-max-tokens")
	for _, flag := range []string{"--paralel", "--max-recoveries"} {
		code, stdout, stderr := outpostBin(t, "", "eval", flag, "3", golden)
		require.Equal(t, 2, code, "%s: %s", flag, stderr)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "outpost eval: flag provided but not defined: "+strings.TrimPrefix(flag, "-"))
	}
}

// token --data naming a file says that --data names a folder, where it
// said "console token file: stat FILE/console.token: not a directory".
func TestTokenDataIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "outpost.db")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for _, tc := range []struct{ flag, owner string }{{"", "serve"}, {"--collector", "collector"}} {
		args := []string{"token", "--data", file}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		code, stdout, stderr := outpostBin(t, "", args...)
		require.Equal(t, 1, code)
		require.Empty(t, stdout)
		require.Equal(t, "outpost token: "+file+" is a file: --data names the data folder, the one given to outpost "+tc.owner+"\n", stderr)
	}
}

// eval of golden files that hold no conversation names them as a person
// would ("a.jsonl, b.jsonl", not "[a.jsonl b.jsonl]"), with exit 2.
func TestEvalNoConversations(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	require.NoError(t, os.WriteFile(a, nil, 0o644))
	require.NoError(t, os.WriteFile(b, []byte("\n"), 0o644))
	code, stdout, stderr := outpostBin(t, "", "eval", a, b)
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, "outpost eval: no golden conversations in "+a+", "+b+"\n", stderr)
}

// firmware -h names every flag a command's own -h lists among the data
// folder and the keys (verify reads DATA/keys, and its line left --data
// out), and says that every command takes --json, which each one's -h
// shows.
func TestFirmwareUsageNamesTheFlags(t *testing.T) {
	code, usage, _ := outpostBin(t, "", "firmware", "-h")
	require.Zero(t, code)
	require.Contains(t, usage, `Every command takes --json; "outpost firmware COMMAND -h" lists its flags.`)
	for _, sub := range []string{"keygen", "sign", "verify", "install", "list", "activate", "remove", "export"} {
		code, help, _ := outpostBin(t, "", "firmware", sub, "-h")
		require.Zero(t, code, sub)
		require.Contains(t, help, "  -json\n", sub)
		// A description between the usage line and the flags.
		require.Regexp(t, `^Usage: outpost firmware `+sub+` [^\n]*\n\n[A-Z][^\n]+\n(?:[^\n]+\n)*\nFlags:\n`, help, sub)
		i := strings.Index(usage, "\n  "+sub+" ")
		require.GreaterOrEqual(t, i, 0, sub)
		line := strings.SplitN(usage[i+1:], "\n", 2)[0]
		for _, flag := range []string{"data", "keys", "trust-dev-key"} {
			if strings.Contains(help, "  -"+flag+" ") || strings.Contains(help, "  -"+flag+"\n") {
				require.Contains(t, line, "--"+flag, "firmware -h's %s line", sub)
			}
		}
	}
}

// eval's usage line names every flag its -h lists: it left out --timeout
// and the channel flags.
func TestEvalUsageNamesEveryFlag(t *testing.T) {
	code, help, _ := outpostBin(t, "", "eval", "-h")
	require.Zero(t, code)
	usage := strings.SplitN(help, "\n", 2)[0]
	bools, valued := helpFlags(help)
	for _, f := range append(bools, valued...) {
		require.Contains(t, usage, "[--"+f, "eval's usage line names --%s", f)
	}
}

// A golden conversation naming an agent that no bundle has cannot be
// replayed: that is a broken harness (exit 2), named by file and line, and
// no conversation is replayed; it was a failed conversation (exit 1).
func TestEvalUnknownAgentIsAHarnessError(t *testing.T) {
	golden := filepath.Join(t.TempDir(), "g.jsonl")
	require.NoError(t, os.WriteFile(golden, []byte("# one known agent, one unknown\n"+
		`{"name": "known", "agent": "medication-adherence", "turns": [{"input": "I forgot my metformin dose"}]}`+"\n"+
		`{"name": "typo", "agent": "medication-adherense", "turns": [{"input": "hi"}]}`+"\n"), 0o644))
	code, stdout, stderr := outpostBin(t, "", "eval", golden)
	require.Equal(t, 2, code, stderr)
	require.Empty(t, stdout, "nothing was replayed")
	require.Contains(t, stderr, "outpost eval: bad golden conversation: "+golden+`:3: conversation "typo": unknown agent "medication-adherense" (available: `)
}

// db check --file that finds problems in a copy says what to do about it,
// as a copy refused at open does: it said only "N problem(s) found".
func TestDBCheckFileProblemsAdvise(t *testing.T) {
	dir := storeWithRun(t)
	damageRunRecords(t, dir)
	raw, err := os.ReadFile(filepath.Join(dir, "outpost.db"))
	require.NoError(t, err)
	bak := filepath.Join(t.TempDir(), "monday.db")
	require.NoError(t, os.WriteFile(bak, raw, 0o600))
	code, stdout, stderr := outpostBin(t, "", "db", "check", "--file", bak)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stdout, "PROBLEM ")
	require.Equal(t, "outpost db: 1 problem(s) found: this copy cannot be restored: check an older backup, "+
		"or, while the store itself is sound, take a new one (outpost db backup FILE)\n"+
		"(with no sound copy, copy out what can still be read: copy the file into an empty folder as outpost.db, "+
		"then run outpost db salvage --data FOLDER NEWFILE)\n", stderr)
}

// An author who signs a bundle folder whose manifest names a file the
// folder lacks is told which entry names it, where, and what to do (add
// the file or take it out of the manifest), not to "get a complete copy"
// of a bundle they are making; nothing is signed.
func TestFirmwareSignAFolderLackingAFile(t *testing.T) {
	dir := t.TempDir()
	keys, b := filepath.Join(dir, "keys"), filepath.Join(dir, "b")
	for _, args := range [][]string{{"firmware", "keygen", "--out", keys}, {"firmware", "export", b}} {
		code, _, stderr := outpostBin(t, dir, args...)
		require.Zero(t, code, "%v: %s", args, stderr)
	}
	key, err := filepath.Glob(filepath.Join(keys, "*.key"))
	require.NoError(t, err)
	require.Len(t, key, 1)
	manifest, err := os.ReadFile(filepath.Join(b, "manifest.json"))
	require.NoError(t, err)
	sig, err := os.ReadFile(filepath.Join(b, "manifest.sig"))
	require.NoError(t, err)
	var m struct{ Knowledge []string }
	require.NoError(t, json.Unmarshal(manifest, &m))
	const gone = 4
	require.NoError(t, os.Remove(filepath.Join(b, filepath.FromSlash(m.Knowledge[gone]))))

	code, stdout, stderr := outpostBin(t, dir, "firmware", "sign", "--key", key[0], b)
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	at := bytes.Index(manifest, []byte(`"knowledge": [`)) + len(`"knowledge": `)
	line := bytes.Count(manifest[:at], []byte("\n")) + 1
	col := at - bytes.LastIndexByte(manifest[:at], '\n')
	require.Contains(t, stderr, fmt.Sprintf("manifest.json:%d:%d: ", line, col))
	require.Contains(t, stderr, fmt.Sprintf("knowledge.%d names %q, which is not in the folder", gone, m.Knowledge[gone]))
	require.Contains(t, stderr, "(add the file to the folder, or take it out of manifest.json, then sign again)")
	require.NotContains(t, stderr, "get a complete copy")
	after, err := os.ReadFile(filepath.Join(b, "manifest.json"))
	require.NoError(t, err)
	require.Equal(t, string(manifest), string(after), "the manifest is not changed")
	afterSig, err := os.ReadFile(filepath.Join(b, "manifest.sig"))
	require.NoError(t, err)
	require.Equal(t, string(sig), string(afterSig), "nothing is signed")
}

// A node of a kind that does not exist is named with the known kinds once,
// and with what to do, as any other mistake in a graph file is; the kinds
// were listed twice, and the hint said nothing of fixing the file.
func TestFirmwareVerifyUnknownNodeKind(t *testing.T) {
	dir := t.TempDir()
	b := filepath.Join(dir, "b")
	code, _, stderr := outpostBin(t, dir, "firmware", "export", b)
	require.Zero(t, code, stderr)
	graph := filepath.Join(b, "agents", "medication-adherence.json")
	raw, err := os.ReadFile(graph)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"kind": "router"`)
	require.NoError(t, os.WriteFile(graph, []byte(strings.Replace(string(raw), `"kind": "router"`, `"kind": "routr"`, 1)), 0o644))
	devKey, err := filepath.Abs(filepath.Join("..", "..", "testdata", "keys", "dev.key"))
	require.NoError(t, err)
	code, _, stderr = outpostBin(t, dir, "firmware", "sign", "--key", devKey, b)
	require.Zero(t, code, stderr)

	code, _, stderr = outpostBin(t, dir, "firmware", "verify", "--trust-dev-key", b)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, `node "intake": unknown node kind "routr" (known: `)
	require.Equal(t, 1, strings.Count(stderr, "tool_loop"), "the known kinds are listed once:\n%s", stderr)
	require.Contains(t, stderr, "(fix the node's kind at the line and column given, then sign the bundle again)")
}

// firmware list only reads: in a data folder where nothing was ever
// installed it says so, as text and as JSON, and makes nothing there
// (it made an empty firmware folder, and in a read-only data folder it
// failed with "mkdir DIR/firmware: permission denied").
func TestFirmwareListMakesNothing(t *testing.T) {
	data := t.TempDir()
	code, stdout, stderr := outpostBin(t, "", "firmware", "list", "--data", data)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "no bundles installed: new runs use the embedded reference bundle medication-adherence\n"+
		"agents new runs have: medication-adherence, medication-adherence-tools\n", stdout)
	code, stdout, stderr = outpostBin(t, "", "firmware", "list", "--data", data, "--json")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `{"installed": [], "kept": [], "log": []}`, stdout)
	entries, err := os.ReadDir(data)
	require.NoError(t, err)
	require.Empty(t, entries, "firmware list made something in the data folder")
}

// A command that needs the store, run from a folder without one and with
// no --data (the default ./outpost-data, which is not there), says what
// is missing and what to give, and makes nothing; uplink flush, which
// checked for the store on its own, says the same of a folder that holds
// none. They said only "stat outpost-data/outpost.db: no such file or
// directory".
func TestNoStoreSaysWhatToGive(t *testing.T) {
	dir, empty := t.TempDir(), t.TempDir()
	advice := ": give the data folder that serve uses, with --data DIR or $OUTPOST_DATA (./outpost-data unless told); " +
		"only run and serve make a store\n"
	code, stdout, stderr := outpostBin(t, dir, "runs", "list")
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	require.Equal(t, "outpost runs: no store in ./outpost-data: there is no folder ./outpost-data"+advice, stderr)

	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("hunter2-but-longer\n"), 0o600))
	code, stdout, stderr = outpostBin(t, dir, "uplink", "flush", "--data", empty, "--url", "http://127.0.0.1:1", "--secret-file", secret)
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	require.Equal(t, "outpost uplink: no store in "+empty+": the folder holds no "+store.FileName+advice, stderr)
	for _, d := range []string{dir, empty} {
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		require.Empty(t, entries)
	}
}

// A follow-up approved from the command line whose file cannot be written
// (a folder stands at its path): resume prints the tool's error in its
// events, for the operator, but the answer for the patient says plainly
// that nothing was scheduled, without the error or the path.
func TestRunFailedFollowupAnswersPlainly(t *testing.T) {
	data := t.TempDir()
	blocked := filepath.Join(data, "followups.jsonl")
	require.NoError(t, os.Mkdir(blocked, 0o755))
	code, stdout, stderr := outpostBin(t, "", "run", "--data", data, "--agent", "medication-adherence-tools",
		"please schedule a follow-up call about my refills")
	require.Zero(t, code, stderr)
	run := regexp.MustCompile(`outpost resume (run_[0-9a-f]+) `).FindStringSubmatch(stdout)
	require.NotNil(t, run, stdout)
	code, stdout, stderr = outpostBin(t, "", "resume", "--data", data, "--decision", "approve", run[1])
	require.Zero(t, code, stderr)
	require.Regexp(t, `tool\.result +generate_response +\{.*"error":"tool error: open .*followups\.jsonl: is a directory"`, stdout)
	_, output, _ := strings.Cut(stdout, "\noutput: ")
	require.Contains(t, output, "I could not schedule the follow-up call")
	require.Contains(t, output, "The clinic staff will be told.")
	require.NotContains(t, output, "tool error")
	require.NotContains(t, output, "followups.jsonl")
}
