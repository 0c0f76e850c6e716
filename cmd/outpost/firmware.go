package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

func init() {
	register("firmware", "make keys, sign, verify, install, list, activate, remove and export firmware bundles", runFirmware, subNames(firmwareCommands)...)
}

const firmwareUsage = `Usage: outpost firmware <command> [flags]

Commands:
  keygen  [--out DIR]                        make an ed25519 key pair (KEYID.key, mode 0600, and KEYID.pub)
  sign    --key FILE DIR                     record every file's sha256 in DIR/manifest.json and sign it
  verify  [--data DIR] [--keys PATH] [--trust-dev-key] BUNDLE
                                             check a bundle (a folder or a .tar) without installing it: its
                                             signature and files, its graphs, and that its names meet (tools,
                                             lanes, and the agents, nodes, tools and statuses its golden
                                             conversations expect)
  install [--data DIR] [--keys PATH] [--trust-dev-key] [--activate]
          [--allow-downgrade --by NAME --reason TEXT] BUNDLE
                                             verify and install a bundle; the first version of a name becomes active;
                                             the same bundle again repairs an installed copy that changed on disk
  list    [--data DIR] [--json]              installed bundles, which version is active, whether each
                                             still verifies on disk (exit 1 if one does not), and which
                                             need a newer appliance than this binary (needs_appliance), and
                                             the embedded bundles kept for the runs pinned to them (kept)
  activate [--data DIR] [--allow-downgrade --by NAME --reason TEXT] NAME VERSION
                                             make an installed version the one new runs use
                                             (going back below the active one is a recorded downgrade)
  remove  [--data DIR] --by NAME --reason TEXT NAME VERSION
                                             remove an installed version that is not active and that no
                                             run refers to, finished or not (recorded; stop serve first)
  export  DIR                                write the embedded reference bundle out, as a starting point

Trusted keys are the *.pub files in DATA/keys plus --keys (a .pub file or a folder of them); install
copies the key that verified a bundle into DATA/keys, so that the appliance can check it again on
every start. --trust-dev-key trusts the development key of the reference bundle: it is public, so
never use it on a production appliance.

Every command takes --json; "outpost firmware COMMAND -h" lists its flags.
`

// firmwareCommands are the firmware subcommands.
var firmwareCommands = []sub[func(fs *cmdFlags, args []string, stdout io.Writer) error]{
	{"keygen", firmwareKeygen},
	{"sign", firmwareSign},
	{"verify", firmwareVerify},
	{"install", firmwareInstall},
	{"list", firmwareList},
	{"activate", firmwareActivate},
	{"remove", firmwareRemove},
	{"export", firmwareExport},
}

func runFirmware(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, fs, err := subcommand("firmware", firmwareUsage, subNames(firmwareCommands), args, stdout, stderr)
	if sub == "" {
		return err
	}
	if run, ok := findSub(firmwareCommands, sub); ok {
		return run(fs, args[1:], stdout)
	}
	return unknownSub(firmwareUsage, "unknown firmware command %q", sub)
}

// explain adds what to do to the firmware library's errors.
func explain(err error) error {
	var hint string
	switch {
	case err == nil:
		return nil
	case errors.Is(err, firmware.ErrUnknownKey):
		hint = "the bundle is signed by a key this appliance does not trust: pass its .pub with --keys, or put it in DATA/keys; " +
			"a bundle signed by the public development key needs --trust-dev-key on each command (never in production)"
	case errors.Is(err, firmware.ErrBundleSignature):
		hint = "the signature does not match manifest.json: the bundle was changed after it was signed, or damaged; do not install it"
	case errors.Is(err, firmware.ErrHashMismatch):
		hint = "a file differs from the sha256 the signed manifest gives: the bundle was changed after it was signed, or damaged; " +
			"do not install it: get a fresh copy (its author, having changed it on purpose, signs it again: outpost firmware sign)"
	case errors.Is(err, firmware.ErrMissingFile):
		hint = "the signed manifest lists a file the bundle lacks: get a complete copy"
	case errors.Is(err, firmware.ErrUnlistedFile):
		hint = "the bundle holds a file the signed manifest does not list: remove it, or re-sign"
	case errors.Is(err, firmware.ErrDowngrade):
		hint = "to install or activate an older version on purpose, add --allow-downgrade --by NAME --reason TEXT (it is recorded)"
	case errors.Is(err, firmware.ErrUnknownNodeKind):
		// The error lists the known kinds already.
		hint = "fix the node's kind at the line and column given, then sign the bundle again"
	case errors.Is(err, firmware.ErrMalformed) && strings.Contains(err.Error(), "read bundle tar"):
		hint = "the tar is damaged, cut short or not a tar (a .tar.gz must be unpacked first): get a fresh copy"
	case errors.Is(err, firmware.ErrMalformed):
		hint = "fix the file at the line and column given, then sign the bundle again"
	case errors.Is(err, firmware.ErrMinVersion):
		hint = "upgrade the outpost binary on this appliance first, then install the bundle (outpost version prints this one)"
	case errors.Is(err, firmware.ErrNotInstalled):
		hint = "see what is installed with outpost firmware list"
	case errors.Is(err, os.ErrNotExist):
		return pathNotFound(err)
	}
	if hint == "" {
		return err
	}
	return fmt.Errorf("%w\n(%s)", err, hint)
}

// pathNotFound says once, in plain words, that a path names nothing: the
// system's "stat PATH: no such file or directory" followed by a hint
// repeating it read as two faults. The error still wraps the original.
func pathNotFound(err error) error {
	var pe *os.PathError
	if !errors.As(err, &pe) {
		return err
	}
	return rephrased{msg: strings.Replace(err.Error(), pe.Error(), pe.Path+": no such file or folder", 1), err: err}
}

// rephrased is err said in other words.
type rephrased struct {
	msg string
	err error
}

func (e rephrased) Error() string { return e.msg }
func (e rephrased) Unwrap() error { return e.err }

func keyFlags(fs *flag.FlagSet) (keys *string, dev *bool) {
	keys = fs.String("keys", "", "trust the public key file at `PATH`, or the *.pub files of the folder there")
	dev = fs.Bool("trust-dev-key", false, "trust the development key of the reference bundle (never in production)")
	return keys, dev
}

func keyring(dataDir, keys string, dev bool) (*firmware.Keyring, error) {
	ring, err := trustedKeys(dataDir, keys)
	if err != nil {
		return nil, err
	}
	d, err := firmware.DevKeyring()
	if err != nil {
		return nil, err
	}
	if dev {
		for _, id := range d.IDs() {
			pub, _ := d.Key(id)
			ring.Add(pub)
		}
	} else {
		// The development key is public: it is trusted for the one command
		// that says --trust-dev-key, never from DATA/keys (where an earlier
		// install with the flag kept it), or anyone could hand the
		// appliance a bundle that it would take as trusted.
		var kept []ed25519.PublicKey
		for _, id := range ring.IDs() {
			if _, isDev := d.Key(id); !isDev {
				pub, _ := ring.Key(id)
				kept = append(kept, pub)
			}
		}
		ring = firmware.NewKeyring(kept...)
	}
	if len(ring.IDs()) == 0 {
		return nil, fmt.Errorf("no trusted keys: pass --keys PATH (a .pub file or folder), put keys in %s, or --trust-dev-key for the reference bundle", keysDir(dataDir))
	}
	return ring, nil
}

func firmwareKeygen(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware keygen [--out DIR] [--json]"
	fs.About = `Make an ed25519 key pair in the folder --out: KEYID.key (mode 0600), to sign bundles with,
and KEYID.pub, for the appliances to trust.`
	out := fs.String("out", ".", "`DIR`, the folder for the key pair")
	asJSON := fs.Bool("json", false, "print JSON: {key_id, private, public}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	id, err := firmware.Keygen(*out)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, map[string]string{"key_id": id, "private": filepath.Join(*out, id+".key"), "public": filepath.Join(*out, id+".pub")})
	}
	fmt.Fprintf(stdout, "key %s\n  private: %s (keep it secret; sign with it)\n  public:  %s (trust it on appliances)\n",
		id, filepath.Join(*out, id+".key"), filepath.Join(*out, id+".pub"))
	return nil
}

func firmwareSign(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware sign --key FILE DIR"
	fs.About = `Record the sha256 of every file of the bundle folder DIR in DIR/manifest.json, set its
key_id, and sign it. A bundle written by firmware export, signed with a key other than the
development key, gets a description that no longer says the development key signs it; sign
says so.`
	key := fs.String("key", "", "private key `FILE` (from firmware keygen)")
	asJSON := fs.Bool("json", false, "print JSON: {signed, key_id, description?} (description: the one the manifest was given, when sign changed it)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if *key == "" || fs.NArg() != 1 {
		return badUsage("sign needs --key FILE and one bundle folder (usage: outpost %s)", fs.synopsis)
	}
	if _, _, err := firmware.LoadPrivateKey(*key); err != nil {
		return badUsage("--key: %v", err)
	}
	done, err := firmware.SignBundle(fs.Arg(0), *key)
	if errors.Is(err, firmware.ErrMissingFile) {
		// explain's hint is for a bundle one was given; this one is being
		// made.
		return fmt.Errorf("%w\n(add the file to the folder, or take it out of %s, then sign again)", err, firmware.ManifestFile)
	}
	if err != nil {
		return explain(err)
	}
	if *asJSON {
		out := map[string]string{"signed": fs.Arg(0), "key_id": done.KeyID}
		if done.Description != "" {
			out["description"] = done.Description
		}
		return printJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "signed %s with %s\n", fs.Arg(0), done.KeyID)
	if done.Description != "" {
		// The signature covers the manifest, so a changed line in it is
		// the user's to know of.
		fmt.Fprintf(stdout, "changed the description in %s, which said the development key signs the bundle, to: %q\n",
			filepath.Join(fs.Arg(0), firmware.ManifestFile), done.Description)
	}
	return nil
}

func firmwareVerify(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware verify [flags] BUNDLE"
	fs.About = `Check a bundle (a folder or a .tar) without installing it: its signature and files, its
graphs, and that its names meet (tools, lanes, and the agents, nodes, tools and statuses its
golden conversations expect). Prints each agent's allowlist, and warns on stderr of an agent
that runs a tool loop and names no tools. Exit 0 means this appliance can install it.`
	data := dataFlag(fs.FlagSet)
	keys, dev := keyFlags(fs.FlagSet)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return badUsage("verify needs one bundle (a folder or a .tar) (usage: outpost %s)", fs.synopsis)
	}
	if err := checkKeysFlag(*keys); err != nil {
		return err
	}
	if err := bundleExists(fs.Arg(0)); err != nil {
		return err
	}
	ring, err := keyring(*data, *keys, *dev)
	if err != nil {
		return err
	}
	// Load, not only Verify: a bundle whose graphs do not compile is as
	// unusable as one with a bad signature.
	b, err := firmware.Load(fs.Arg(0), ring)
	if err != nil {
		return explain(err)
	}
	// As install would: ok means this appliance can install it.
	if err := b.Manifest.CheckApplianceVersion(version); err != nil {
		return explain(err)
	}
	warnVersionNotChecked(b.Manifest, fs.stderr)
	warnBundle(b, fs.stderr)
	if *asJSON {
		return printJSON(stdout, map[string]any{"ok": true, "name": b.Manifest.Name, "version": b.Manifest.Version,
			"digest": b.Digest, "key_id": b.Manifest.KeyID, "agents": b.AgentNames(), "allowlists": allowlists(b)})
	}
	fmt.Fprintf(stdout, "ok: %s (%s), signed by %s, agents: %v\n", b.Manifest, b.Digest, b.Manifest.KeyID, b.AgentNames())
	for _, a := range b.AgentNames() {
		fmt.Fprintf(stdout, "  %s: %s\n", a, describeAllowlist(b.Allowlist(a)))
	}
	return nil
}

// describeAllowlist says what an agent's allowlist lets it call.
func describeAllowlist(tools []string) string {
	switch {
	case tools == nil:
		return "tools: every tool of the registry (it names none)"
	case len(tools) == 0:
		return "tools: none"
	}
	return "tools: " + strings.Join(tools, ", ")
}

// warnBundle says on w what the bundle may mean otherwise than it says
// (firmware.Bundle.Warnings): it still verifies and installs.
func warnBundle(b *firmware.Bundle, w io.Writer) {
	for _, msg := range b.Warnings() {
		fmt.Fprintf(w, "warning: %s\n", msg)
	}
}

// bundleExists names a bundle path that names nothing before the keys are
// looked for, so that a mistyped path is the first thing said, not a
// missing key.
func bundleExists(path string) error {
	if _, err := os.Stat(path); err != nil {
		return explain(fmt.Errorf("read bundle: %w", err))
	}
	return nil
}

func firmwareInstall(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware install [flags] BUNDLE"
	fs.About = `Verify a bundle (a folder or a .tar) and install it into DATA/firmware; the first version of
a name becomes active. The same bundle again repairs an installed copy that changed on disk.
Stop serve first: it reads the installed bundles when it starts.`
	data := dataFlag(fs.FlagSet)
	keys, dev := keyFlags(fs.FlagSet)
	activate := fs.Bool("activate", false, "make this version active (the first version of a name always is)")
	downgrade := fs.Bool("allow-downgrade", false, "install a version lower than one installed before (recorded, with --by and --reason)")
	by := fs.String("by", "", "who installs, by `NAME` (recorded)")
	reason := fs.String("reason", "", "why, in a `TEXT` (recorded)")
	asJSON := fs.Bool("json", false, "print the installed version as JSON")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return badUsage("install needs one bundle (a folder or a .tar) (usage: outpost %s)", fs.synopsis)
	}
	if *downgrade && (*by == "" || *reason == "") {
		return badUsage("--allow-downgrade needs --by NAME and --reason TEXT, which are recorded")
	}
	if err := checkKeysFlag(*keys); err != nil {
		return err
	}
	if err := bundleExists(fs.Arg(0)); err != nil {
		return err
	}
	ring, err := keyring(*data, *keys, *dev)
	if err != nil {
		return err
	}
	// Compile it first: an installer only checks signatures and hashes.
	b, err := firmware.Load(fs.Arg(0), ring)
	if err != nil {
		return explain(err)
	}
	warnVersionNotChecked(b.Manifest, fs.stderr)
	warnBundle(b, fs.stderr)
	release, err := holdDataFolder(*data, "install")
	if err != nil {
		return err
	}
	defer release()
	in, err := firmware.NewInstaller(*data, ring, firmware.InstallerOptions{ApplianceVersion: version})
	if err != nil {
		return err
	}
	rec, err := in.Install(fs.Arg(0), firmware.InstallOptions{AllowDowngrade: *downgrade, Activate: *activate, By: *by, Reason: *reason})
	if err != nil {
		return explain(err)
	}
	if err := trustKey(*data, ring, b.Manifest.KeyID); err != nil {
		return fmt.Errorf("installed, but the signing key could not be kept in %s: %w", keysDir(*data), err)
	}
	if *asJSON {
		return printJSON(stdout, rec)
	}
	state := "installed"
	if rec.Active {
		state += " and active"
	}
	if rec.Downgrade {
		state += " (a downgrade, recorded)"
	}
	if rec.Repaired {
		state = "repaired (its installed copy had changed on disk; rewritten and recorded)"
	}
	fmt.Fprintf(stdout, "%s v%d %s: %s, signed by %s\n", rec.Name, rec.Version, state, rec.Digest, rec.KeyID)
	if !rec.Active {
		// A version installed beside the active one serves no run until
		// it is activated.
		for _, r := range in.List() {
			if r.Name != rec.Name || !r.Active {
				continue
			}
			back := ""
			if rec.Version < r.Version {
				back = " --allow-downgrade --by NAME --reason TEXT"
			}
			fmt.Fprintf(stdout, "new runs still use v%d, the active version; to make v%d active: outpost firmware activate%s%s %s %d\n",
				r.Version, rec.Version, dataHint(fs.FlagSet), back, shellQuote(rec.Name), rec.Version)
		}
	}
	return nil
}

// trustKey writes the public key id into DATA/keys, so that the installed
// bundle verifies on every later open.
func trustKey(dataDir string, ring *firmware.Keyring, id string) error {
	pub, ok := ring.Key(id)
	if !ok {
		return fmt.Errorf("key %s is not in the keyring", id)
	}
	return firmware.WritePublicKey(keysDir(dataDir), pub)
}

func firmwareList(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware list [flags]"
	fs.About = `List the installed bundles, which version of each name is active, whether each still
verifies on disk (exit 1 if one does not), and which need a newer appliance than this binary;
then the copies of embedded bundles kept for the runs pinned to them. Reads the folder alone,
and makes nothing in it.`
	data := dataFlag(fs.FlagSet)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	// A listing makes nothing: a mistyped --data is named, not given an
	// empty firmware folder.
	if err := dataFolderExists(*data, servesFolder); err != nil {
		return err
	}
	var installed []firmware.Installed
	log, kept := []firmware.LogEntry{}, []firmware.Kept{}
	in, err := openInstalled(*data, nil)
	if err != nil {
		return err
	}
	if in != nil {
		installed = in.List()
		if l := in.Log(); l != nil {
			log = l
		}
		k, err := in.Kept()
		if err != nil {
			return err
		}
		if err := warnStrayKept(in, fs.stderr); err != nil {
			return err
		}
		kept = append(kept, k...)
	}
	// Each version is checked on disk as serve checks it before a run
	// uses it, so that a bundle changed or damaged since its install is
	// seen here, not when a run is refused.
	// A version that needs a newer appliance than this binary is marked
	// too: it cannot be activated, and the runs pinned to it do not go on.
	type listed struct {
		firmware.Installed
		Verified bool   `json:"verified"`
		Problem  string `json:"problem,omitempty"`
		// NeedsAppliance is the bundle's min_appliance_version, set only
		// when this binary is older.
		NeedsAppliance string `json:"needs_appliance,omitempty"`
	}
	list := []listed{}
	var damaged, needy []string
	for _, i := range installed {
		l := listed{Installed: i, Verified: true}
		m, err := in.VerifiedManifest(i.Name, i.Version)
		if err != nil {
			l.Verified, l.Problem = false, err.Error()
			damaged = append(damaged, fmt.Sprintf("%s v%d", i.Name, i.Version))
		} else if err := m.CheckApplianceVersion(version); err != nil {
			l.NeedsAppliance = m.MinApplianceVersion
			needy = append(needy, fmt.Sprintf("%s v%d needs appliance %s", i.Name, i.Version, m.MinApplianceVersion))
		}
		list = append(list, l)
	}
	var failed error
	if len(damaged) > 0 {
		failed = fmt.Errorf("%s: changed or damaged on disk since install, so no run can use it: "+
			"install the same bundle again (outpost firmware install) to repair the copy", strings.Join(damaged, ", "))
	}
	var damagedKept []string
	for _, k := range kept {
		if k.Problem != "" {
			damagedKept = append(damagedKept, fmt.Sprintf("%s v%d (%s)", k.Name, k.Version, k.Digest))
		}
	}
	if len(damagedKept) > 0 {
		failed = errors.Join(failed, fmt.Errorf("kept embedded bundle %s: changed or damaged on disk, so the runs pinned to it cannot go on: "+
			"the binary that embeds it writes it again when such a run goes on under it; or install that bundle (outpost firmware export DIR "+
			"with that binary, then outpost firmware install --trust-dev-key DIR)", strings.Join(damagedKept, ", ")))
	}
	if *asJSON {
		return errors.Join(printJSON(stdout, map[string]any{"installed": list, "kept": kept, "log": log}), failed)
	}
	// The agents new runs have, as an unknown agent's error names them:
	// the bundle's name alone is easily taken for its one agent.
	ref, err := firmware.Reference()
	if err != nil {
		return errors.Join(err, failed)
	}
	agentsLine := "agents new runs have: " + strings.Join(newRunAgents(in, ref), ", ")
	if len(list) == 0 {
		fmt.Fprintf(stdout, "no bundles installed: new runs use the embedded reference bundle %s\n%s\n", firmware.ReferenceName, agentsLine)
		return errors.Join(printKept(stdout, kept), failed)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tACTIVE\tKEY\tINSTALLED\tDIGEST\tON DISK")
	for _, i := range list {
		var marks []string
		if i.Active {
			marks = append(marks, "active")
		}
		if i.Downgrade {
			marks = append(marks, "(downgrade)")
		}
		if i.NeedsAppliance != "" {
			marks = append(marks, "(needs appliance "+i.NeedsAppliance+")")
		}
		active := strings.Join(marks, " ")
		state := "verified"
		if !i.Verified {
			state = "DAMAGED: " + i.Problem
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", i.Name, i.Version, active, i.KeyID, i.InstalledAt.Local().Format("2006-01-02 15:04"), i.Digest, state)
	}
	if err := tw.Flush(); err != nil {
		return errors.Join(err, failed)
	}
	fmt.Fprintln(stdout, agentsLine)
	for _, n := range needy {
		fmt.Fprintf(stdout, "%s or later, this is %s: it cannot be activated, no new run starts on it, "+
			"and the runs pinned to it do not go on until the outpost binary is upgraded to that version\n", n, version)
	}
	return errors.Join(printKept(stdout, kept), failed)
}

// warnStrayKept says on stderr what the folder of kept copies of in holds
// that is no kept copy, which the listing and db prune pass over.
func warnStrayKept(in *firmware.Installer, stderr io.Writer) error {
	stray, err := in.StrayKept()
	for _, p := range stray {
		fmt.Fprintf(stderr, "warning: %s\n", strayKeptText(p))
	}
	return err
}

// strayKeptText says what is done with p, in the folder of kept copies but
// no kept copy. p is named by its absolute path: a prune through serve
// reports the path serve sees, which, from a relative --data, is relative
// to serve's folder, not to the one db prune is run in.
func strayKeptText(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return fmt.Sprintf("%s is not a kept copy of an embedded bundle (a folder NAME/VERSION-SHA256): passed over, left as it is", p)
}

// printKept lists the copies kept of the embedded bundles that runs were
// pinned to: no new run starts on one, but the runs pinned to it go on with
// it under any binary.
func printKept(stdout io.Writer, kept []firmware.Kept) error {
	if len(kept) == 0 {
		return nil
	}
	fmt.Fprintln(stdout, "\nkept for the runs pinned to them (embedded bundles of this or an earlier outpost binary):")
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tDIGEST\tON DISK")
	for _, k := range kept {
		state := "verified"
		if k.Problem != "" {
			state = "DAMAGED: " + k.Problem
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", k.Name, k.Version, k.Digest, state)
	}
	return tw.Flush()
}

func firmwareActivate(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware activate [flags] NAME VERSION"
	fs.About = `Make an installed version the one new runs of its agents use; runs already started stay on
their version. Going back below the active one is a downgrade, recorded with --by and
--reason. Stop serve first: it reads the installed bundles when it starts.`
	data := dataFlag(fs.FlagSet)
	downgrade := fs.Bool("allow-downgrade", false, "activate a version lower than the active one (recorded, with --by and --reason)")
	by := fs.String("by", "", "who activates, by `NAME` (recorded)")
	reason := fs.String("reason", "", "why, in a `TEXT` (recorded)")
	asJSON := fs.Bool("json", false, "print JSON: {name, version, active}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if *downgrade && (*by == "" || *reason == "") {
		return badUsage("--allow-downgrade needs --by NAME and --reason TEXT, which are recorded")
	}
	v, err := versionArg(fs, "activate")
	if err != nil {
		return err
	}
	in, release, err := heldInstaller(fs, *data, "activate", holdDataFolder, "activate")
	if err != nil {
		return err
	}
	defer release()
	if _, err := in.Open(fs.Arg(0), v); errors.Is(err, firmware.ErrNotInstalled) {
		return notInstalled("activate", in.List(), fs.Arg(0), v, *data, dataHint(fs.FlagSet))
	} else if err != nil {
		return explain(err)
	}
	if err := in.Activate(fs.Arg(0), v, firmware.ActivateOptions{AllowDowngrade: *downgrade, By: *by, Reason: *reason}); err != nil {
		return explain(err)
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"name": fs.Arg(0), "version": v, "active": true})
	}
	fmt.Fprintf(stdout, "%s v%d is active: new runs use it; runs already started stay on their version\n", fs.Arg(0), v)
	return nil
}

// versionArg checks the NAME VERSION arguments of the command verb
// (activate, remove) and returns the version.
func versionArg(fs *cmdFlags, verb string) (int64, error) {
	if fs.NArg() != 2 {
		return 0, badUsage("%s needs a bundle name and a version (usage: outpost %s)", verb, fs.synopsis)
	}
	v, err := strconv.ParseInt(fs.Arg(1), 10, 64)
	if err != nil || v <= 0 {
		return 0, badUsage("version %q is not a positive integer", fs.Arg(1))
	}
	return v, nil
}

// heldInstaller takes the data folder of a command that changes an
// installed version, NAME VERSION (verb: activate, remove), with hold
// (saying what it does), and opens its installer. It installs nothing:
// a folder where nothing is installed is refused without making a
// firmware folder.
func heldInstaller(fs *cmdFlags, data, verb string, hold func(dir, what string) (func(), error), what string) (*firmware.Installer, func(), error) {
	if err := dataFolderExists(data, servesFolder); err != nil {
		return nil, nil, err
	}
	release, err := hold(data, what)
	if err != nil {
		return nil, nil, err
	}
	in, err := openInstalled(data, nil)
	if err == nil && in == nil {
		v, _ := strconv.ParseInt(fs.Arg(1), 10, 64)
		err = notInstalled(verb, nil, fs.Arg(0), v, data, dataHint(fs.FlagSet))
	}
	if err != nil {
		release()
		return nil, nil, err
	}
	return in, release, nil
}

// notInstalled is activate's and remove's error (verb) for a version that
// is not installed: it names the versions of that bundle that are (or the
// bundles, where it has none), and how to install one.
func notInstalled(verb string, list []firmware.Installed, name string, version int64, data, dataHint string) error {
	var same []string
	names := map[string]bool{}
	for _, b := range list {
		names[b.Name] = true
		if b.Name == name {
			same = append(same, "v"+strconv.FormatInt(b.Version, 10))
		}
	}
	var have string
	switch {
	case len(same) > 0:
		have = fmt.Sprintf("installed versions of %s: %s", name, strings.Join(same, ", "))
	case len(names) > 0:
		have = fmt.Sprintf("no version of %s is installed; installed bundles: %s", name, strings.Join(slices.Sorted(maps.Keys(names)), ", "))
	default:
		have = "nothing is installed in " + data
	}
	if verb != "activate" {
		return fmt.Errorf("%s %s v%d: %w: %s\n(outpost firmware list%s lists what is installed)", verb, name, version, firmware.ErrNotInstalled, have, dataHint)
	}
	return fmt.Errorf("activate %s v%d: %w: %s\n(install it from its bundle folder or .tar with: outpost firmware install%s --activate PATH)",
		name, version, firmware.ErrNotInstalled, have, dataHint)
}

func firmwareExport(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware export [--json] DIR"
	fs.About = `Write the reference bundle embedded in this binary into DIR (new or empty), signed with the
public development key, as a starting point for a bundle of one's own.`
	asJSON := fs.Bool("json", false, "print JSON: {wrote, name}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return badUsage("export needs a folder (usage: outpost %s)", fs.synopsis)
	}
	if err := firmware.Export(fs.Arg(0)); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, map[string]string{"wrote": fs.Arg(0), "name": firmware.ReferenceName})
	}
	fmt.Fprintf(stdout, "wrote the reference bundle (%s, signed with the public development key) to %s\n"+
		"edit it, then sign it with your own key: outpost firmware keygen --out KEYS && outpost firmware sign --key KEYS/ID.key %s\n",
		firmware.ReferenceName, fs.Arg(0), fs.Arg(0))
	return nil
}

// holdDataFolder takes the data folder's store lock while a firmware
// command changes what the appliance runs. serve reads the installed
// bundles when it starts, so a change made under a running serve would
// claim "new runs use it" and not be true until the next start: it is
// refused instead. A folder with no store yet has nothing serving it.
func holdDataFolder(dir, what string) (release func(), err error) {
	if storeExists(dir) != nil {
		return func() {}, nil
	}
	return lockDataFolder(dir, what)
}

// lockDataFolder takes the store lock of the data folder dir, which must
// exist, whether it holds a store or not, as holdDataFolder says.
func lockDataFolder(dir, what string) (release func(), err error) {
	unlock, err := store.LockDir(dir, 0)
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w\n(serve reads the installed bundles when it starts: stop it, %s, and start it again)", err, what)
	}
	if err != nil {
		return nil, err
	}
	return func() { _ = unlock() }, nil
}

// warnVersionNotChecked says on w that this build passes the bundle of
// manifest m without holding it to its min_appliance_version, when that is
// so: a development build cannot tell which release it is at least.
func warnVersionNotChecked(m *firmware.Manifest, w io.Writer) {
	if m.MinApplianceVersion != "" && !firmware.ChecksApplianceVersion(version) {
		fmt.Fprintf(w, "warning: this build (%s) is not a release, so the bundle's min_appliance_version %s is not checked: "+
			"a release build refuses a bundle that needs a newer one\n", version, m.MinApplianceVersion)
	}
}
