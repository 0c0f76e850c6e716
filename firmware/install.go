package firmware

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// indexFile is the installer's record of what is installed and active, in
// DATA/firmware/. It is small, rewritten whole, atomically.
const indexFile = "index.json"

// indexFormat is the index encoding this package reads and writes.
const indexFormat = 1

// Installed describes one installed bundle version.
type Installed struct {
	Name        string    `json:"name"`
	Version     int64     `json:"version"`
	Digest      string    `json:"digest"`
	KeyID       string    `json:"key_id"`
	Created     time.Time `json:"created"`
	InstalledAt time.Time `json:"installed_at"`
	InstalledBy string    `json:"installed_by,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	// Downgrade is set when the version was installed below the highest
	// one ever installed for its name, with AllowDowngrade.
	Downgrade bool `json:"downgrade,omitempty"`
	Active    bool `json:"active"`
	// Repaired is set on what Install returns when it rewrote an installed
	// copy that no longer verified on disk; it is never stored.
	Repaired bool `json:"repaired,omitempty"`
}

// Ref returns the reference runs pinned to this version record.
func (i Installed) Ref() engine.BundleRef {
	return engine.BundleRef{Name: i.Name, Version: i.Version, Digest: i.Digest}
}

// LogEntry is one change to what is installed or active: the audit trail of
// installs, activations, downgrades and removals.
type LogEntry struct {
	At      time.Time `json:"at"`
	Action  string    `json:"action"` // install, activate, downgrade, remove, repair
	Name    string    `json:"name"`
	Version int64     `json:"version"`
	Digest  string    `json:"digest,omitempty"`
	By      string    `json:"by,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

type index struct {
	Format    int              `json:"format"`
	Installed []Installed      `json:"installed"`
	Active    map[string]int64 `json:"active"`
	// Highest is the highest version ever installed per name. It does not
	// go down when a version is removed: rollback protection must survive
	// a removal.
	Highest map[string]int64 `json:"highest"`
	Log     []LogEntry       `json:"log"`
}

// InstallerOptions configures an Installer.
type InstallerOptions struct {
	// ApplianceVersion is checked against a bundle's min_appliance_version.
	// Empty or not a release version ("dev") skips the check.
	ApplianceVersion string
	// Now is the clock (time.Now by default).
	Now func() time.Time
	// Runtime is what opened bundles' model and tool_loop nodes run with;
	// nil means the bundles' scripted rules, with calls kept in memory.
	Runtime *Runtime
}

// InstallOptions qualify one install.
type InstallOptions struct {
	// AllowDowngrade installs a version lower than the highest installed
	// for its name. The downgrade is recorded, with By and Reason.
	AllowDowngrade bool
	// Activate makes the version active once installed. The first version
	// installed under a name is always activated.
	Activate bool
	By       string
	Reason   string
}

// Installer keeps verified bundles under DATA/firmware/NAME/VERSION/ and
// records in DATA/firmware/index.json which are installed and which one is
// active per name. Every bundle is verified again, against the installer's
// keyring, each time it is opened. One process at a time may use a data
// directory's installer.
type Installer struct {
	dir  string
	keys *Keyring
	opts InstallerOptions

	mu    sync.Mutex
	idx   index
	cache map[string]openedVersion // by name@version, and .embedded@digest for kept copies

	// keepMu serializes KeepReference; kept is what it has kept.
	keepMu sync.Mutex
	kept   map[engine.BundleRef]bool
}

// openedVersion is a version Open loaded and, where it was loaded with no
// Runtime, the contents it verified, from which the version is loaded again
// for the Runtime SetRuntime sets without being read and verified again.
type openedVersion struct {
	b *Bundle
	v *verified
}

// NewInstaller opens (creating if needed) the firmware directory under
// dataDir.
func NewInstaller(dataDir string, keys *Keyring, opts InstallerOptions) (*Installer, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Join(dataDir, "firmware")
	if err := fsync.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("firmware installer: %w", err)
	}
	in := &Installer{dir: dir, keys: keys, opts: opts, cache: map[string]openedVersion{}, kept: map[engine.BundleRef]bool{},
		idx: index{Format: indexFormat, Active: map[string]int64{}, Highest: map[string]int64{}}}
	data, err := os.ReadFile(filepath.Join(dir, indexFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// No index and no bundle: nothing is installed. Bundle folders
		// with no index mean the index was lost: the appliance must not
		// fall back to the embedded reference bundle as if nothing were
		// installed.
		if entries, err := os.ReadDir(dir); err == nil {
			for _, e := range entries {
				// The copies of embedded bundles kept for the runs
				// pinned to them (keptDir) are not installed
				// bundles: the index does not list them.
				if e.IsDir() && e.Name() != keptDir {
					return nil, fmt.Errorf("firmware installer: %s is missing but %s holds installed bundles (%s/...): "+
						"restore it from a backup of the data folder, or move the bundle folders aside and install again",
						indexFile, dir, e.Name())
				}
			}
		}
	case err != nil:
		return nil, fmt.Errorf("firmware installer: %w", err)
	default:
		if _, err := decodeStrict(filepath.Join(dir, indexFile), data, &in.idx); err != nil {
			return nil, fmt.Errorf("firmware installer: %w", err)
		}
		if in.idx.Format != indexFormat {
			return nil, fmt.Errorf("firmware installer: %s: format %d, want %d", indexFile, in.idx.Format, indexFormat)
		}
		if in.idx.Active == nil {
			in.idx.Active = map[string]int64{}
		}
		if in.idx.Highest == nil {
			in.idx.Highest = map[string]int64{}
		}
	}
	return in, nil
}

// Dir returns the firmware directory.
func (in *Installer) Dir() string { return in.dir }

// Keys returns the installer's keyring.
func (in *Installer) Keys() *Keyring { return in.keys }

func (in *Installer) versionDir(name string, version int64) string {
	return filepath.Join(in.dir, name, strconv.FormatInt(version, 10))
}

func (in *Installer) find(name string, version int64) int {
	for i, x := range in.idx.Installed {
		if x.Name == name && x.Version == version {
			return i
		}
	}
	return -1
}

// saveLocked writes the index atomically; on failure the in-memory index
// is restored from old, so memory never claims what the disk does not.
func (in *Installer) saveLocked(old index) error {
	raw, err := json.MarshalIndent(&in.idx, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(in.dir, indexFile), append(raw, '\n'), 0o644)
	}
	if err != nil {
		in.idx = old
		return fmt.Errorf("save firmware index: %w", err)
	}
	return nil
}

func (ix index) clone() index {
	c := ix
	c.Installed = append([]Installed(nil), ix.Installed...)
	c.Log = append([]LogEntry(nil), ix.Log...)
	c.Active = make(map[string]int64, len(ix.Active))
	for k, v := range ix.Active {
		c.Active[k] = v
	}
	c.Highest = make(map[string]int64, len(ix.Highest))
	for k, v := range ix.Highest {
		c.Highest[k] = v
	}
	return c
}

// Install verifies the bundle at path (a directory or a .tar), checks that
// it loads, and copies it into the firmware directory. It refuses a version
// lower than the highest installed for the name (ErrDowngrade) unless
// AllowDowngrade is set. Installing the same version with the same digest
// again changes nothing; with a different digest it is refused.
func (in *Installer) Install(path string, o InstallOptions) (*Installed, error) {
	files, err := readBundle(path)
	if err != nil {
		return nil, fmt.Errorf("install: %w", err)
	}
	v, err := verifyContents(files, in.keys)
	if err != nil {
		return nil, fmt.Errorf("install %s: %w", path, err)
	}
	m := v.manifest
	if err := m.CheckApplianceVersion(in.opts.ApplianceVersion); err != nil {
		return nil, fmt.Errorf("install %s: %w", path, err)
	}
	b, err := load(v, nil)
	if err == nil {
		err = b.checkNames(v)
	}
	if err != nil {
		return nil, fmt.Errorf("install %s: %w", path, err)
	}

	in.mu.Lock()
	defer in.mu.Unlock()
	if i := in.find(m.Name, m.Version); i >= 0 {
		cur := in.idx.Installed[i]
		if cur.Digest != v.digest {
			return nil, fmt.Errorf("install %s: %w: %s is installed as %s, this is %s", path, ErrVersionInstalled, m, cur.Digest, v.digest)
		}
		// The same bundle again repairs an installed copy that no longer
		// verifies on disk (a file changed or lost since): the only way
		// back for the runs pinned to it.
		if _, err := in.verifyInstalled(cur); err != nil {
			if err := in.writeVersion(m.Name, m.Version, v.files); err != nil {
				return nil, fmt.Errorf("install %s: repair %s: %w", path, m, err)
			}
			old := in.idx.clone()
			in.idx.Log = append(in.idx.Log, LogEntry{At: in.opts.Now().UTC(), Action: "repair", Name: m.Name, Version: m.Version,
				Digest: v.digest, By: o.By, Reason: o.Reason})
			if err := in.saveLocked(old); err != nil {
				return nil, fmt.Errorf("install %s: %w", path, err)
			}
			delete(in.cache, m.Name+"@"+strconv.FormatInt(m.Version, 10))
			cur.Repaired = true
		}
		if o.Activate && !cur.Active {
			if err := in.activateLocked(m.Name, m.Version, o.By, o.Reason); err != nil {
				return nil, err
			}
			cur.Active = true
		}
		return &cur, nil
	}
	highest := in.idx.Highest[m.Name]
	downgrade := m.Version < highest
	if downgrade && !o.AllowDowngrade {
		return nil, fmt.Errorf("install %s: %w: %s is below v%d (allow the downgrade explicitly to install it)", path, ErrDowngrade, m, highest)
	}
	if err := in.writeVersion(m.Name, m.Version, v.files); err != nil {
		return nil, fmt.Errorf("install %s: %w", path, err)
	}
	now := in.opts.Now().UTC()
	rec := Installed{Name: m.Name, Version: m.Version, Digest: v.digest, KeyID: m.KeyID, Created: m.Created,
		InstalledAt: now, InstalledBy: o.By, Reason: o.Reason, Downgrade: downgrade}
	old := in.idx.clone()
	in.idx.Installed = append(in.idx.Installed, rec)
	sort.Slice(in.idx.Installed, func(a, b int) bool {
		x, y := in.idx.Installed[a], in.idx.Installed[b]
		return x.Name < y.Name || x.Name == y.Name && x.Version < y.Version
	})
	if m.Version > highest {
		in.idx.Highest[m.Name] = m.Version
	}
	action := "install"
	if downgrade {
		action = "downgrade"
	}
	in.idx.Log = append(in.idx.Log, LogEntry{At: now, Action: action, Name: m.Name, Version: m.Version,
		Digest: v.digest, By: o.By, Reason: o.Reason})
	_, hasActive := in.idx.Active[m.Name]
	if o.Activate || !hasActive {
		in.setActive(m.Name, m.Version, now, o.By, o.Reason)
	}
	if err := in.saveLocked(old); err != nil {
		return nil, fmt.Errorf("install %s: %w", path, err)
	}
	rec = in.idx.Installed[in.find(m.Name, m.Version)]
	return &rec, nil
}

// writeVersion copies a verified bundle's files into NAME/VERSION/ through
// a temporary directory, syncing every file, so that a crash leaves either
// no version directory or a complete one.
func (in *Installer) writeVersion(name string, version int64, files contents) error {
	return writeTree(in.versionDir(name, version), files)
}

// writeTree writes files into the folder final as writeVersion says.
func writeTree(final string, files contents) error {
	parent := filepath.Dir(final)
	if err := fsync.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, ".install-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, p := range sortedKeys(files) {
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := writeSynced(dst, files[p]); err != nil {
			return err
		}
	}
	dirs := map[string]bool{tmp: true}
	for p := range files {
		for d := filepath.Dir(filepath.Join(tmp, filepath.FromSlash(p))); len(d) > len(tmp); d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if err := fsync.Dir(d); err != nil {
			return err
		}
	}
	// A directory already there is left over from a crash or a removal
	// (it has no index entry), or a damaged copy being repaired: it is
	// moved aside, and removed only once the new copy is in its place.
	aside := ""
	if _, err := os.Lstat(final); err == nil {
		aside = tmp + ".old"
		if err := os.Rename(final, aside); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		if aside != "" {
			err = errors.Join(err, os.Rename(aside, final))
		}
		return err
	}
	if err := fsync.Dir(parent); err != nil {
		return err
	}
	if aside != "" {
		return os.RemoveAll(aside)
	}
	return nil
}

func writeSynced(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
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
	return f.Close()
}

func (in *Installer) setActive(name string, version int64, at time.Time, by, reason string) {
	in.idx.Active[name] = version
	for i := range in.idx.Installed {
		if in.idx.Installed[i].Name == name {
			in.idx.Installed[i].Active = in.idx.Installed[i].Version == version
		}
	}
	in.idx.Log = append(in.idx.Log, LogEntry{At: at, Action: "activate", Name: name, Version: version, By: by, Reason: reason})
}

// ActivateOptions qualify one activation.
type ActivateOptions struct {
	// AllowDowngrade activates a version lower than the active one: a
	// rollback, recorded with By and Reason, as a downgrading install is.
	AllowDowngrade bool
	By, Reason     string
}

// Activate makes an installed version the one new runs of its agents use.
// Runs already started stay on the version they are pinned to. A version
// lower than the active one is refused (ErrDowngrade) unless o allows the
// downgrade: going back is a person's decision, recorded like a
// downgrading install.
func (in *Installer) Activate(name string, version int64, o ...ActivateOptions) error {
	var opt ActivateOptions
	if len(o) > 0 {
		opt = o[0]
	}
	// A version this appliance may not run is not made active: one that
	// needs a newer appliance (this binary was rolled back after the
	// install) or whose files no longer verify.
	if b, err := in.Open(name, version); err == nil {
		if err := b.Manifest.CheckApplianceVersion(in.opts.ApplianceVersion); err != nil {
			return fmt.Errorf("activate %s v%d: %w", name, version, err)
		}
	} else if !errors.Is(err, ErrNotInstalled) {
		return fmt.Errorf("activate %s v%d: %w", name, version, err)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if active, ok := in.idx.Active[name]; ok && version < active && !opt.AllowDowngrade && in.find(name, version) >= 0 {
		return fmt.Errorf("activate %s v%d: %w: v%d is active (allow the downgrade explicitly to go back)", name, version, ErrDowngrade, active)
	}
	return in.activateLocked(name, version, opt.By, opt.Reason)
}

func (in *Installer) activateLocked(name string, version int64, by, reason string) error {
	if in.find(name, version) < 0 {
		return fmt.Errorf("activate: %w: %s v%d", ErrNotInstalled, name, version)
	}
	old := in.idx.clone()
	in.setActive(name, version, in.opts.Now().UTC(), by, reason)
	return in.saveLocked(old)
}

// Active returns the active version of a bundle name.
func (in *Installer) Active(name string) (*Installed, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	v, ok := in.idx.Active[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoActive, name)
	}
	rec := in.idx.Installed[in.find(name, v)]
	return &rec, nil
}

// List returns every installed version, by name then version.
func (in *Installer) List() []Installed {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Installed(nil), in.idx.Installed...)
}

// Log returns the audit trail of installs, activations, downgrades and
// removals, oldest first.
func (in *Installer) Log() []LogEntry {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]LogEntry(nil), in.idx.Log...)
}

// Open loads an installed version, verifying its signature and hashes
// again and checking its digest against the one recorded at install.
// Loaded bundles are cached: a version is read and verified at its first
// Open, and loaded again only for another Runtime (SetRuntime).
func (in *Installer) Open(name string, version int64) (*Bundle, error) {
	in.mu.Lock()
	i := in.find(name, version)
	if i < 0 {
		in.mu.Unlock()
		return nil, fmt.Errorf("open: %w: %s v%d", ErrNotInstalled, name, version)
	}
	rec := in.idx.Installed[i]
	in.mu.Unlock()
	b, err := in.openCached(name+"@"+strconv.FormatInt(version, 10), rec.Digest, func() (*verified, error) { return in.verifyInstalled(rec) })
	if err != nil {
		return nil, fmt.Errorf("open %s v%d: %w", name, version, err)
	}
	return b, nil
}

// openCached is Open's cache: the bundle cached under key if it has digest
// and the installer's runtime, else loaded from verify's contents (or the
// contents cached with it) and cached.
func (in *Installer) openCached(key, digest string, verify func() (*verified, error)) (*Bundle, error) {
	in.mu.Lock()
	rt := in.opts.Runtime
	c, cached := in.cache[key]
	in.mu.Unlock()
	cached = cached && c.b.Digest == digest
	if cached && c.b.runtime == rt {
		return c.b, nil
	}

	v := c.v
	if !cached || v == nil {
		var err error
		if v, err = verify(); err != nil {
			return nil, err
		}
	}
	b, err := load(v, rt)
	if err != nil {
		return nil, err
	}
	// The contents are kept only for a bundle loaded before the runtime
	// was set, which is loaded again once it is (SetRuntime); a bundle
	// loaded with its runtime does not hold its files' bytes.
	if rt != nil {
		v = nil
	}
	in.mu.Lock()
	in.cache[key] = openedVersion{b: b, v: v}
	in.mu.Unlock()
	return b, nil
}

// SetRuntime sets what the model and tool-loop nodes of the bundles opened
// from now on run with (InstallerOptions.Runtime). A version opened before
// is loaded again for rt from the contents verified at its first Open, not
// read and verified again: a process that checks a command line's agent
// before it has a store to run it with verifies the bundle once.
func (in *Installer) SetRuntime(rt *Runtime) {
	in.mu.Lock()
	in.opts.Runtime = rt
	in.mu.Unlock()
}

// Verify checks an installed version on disk as Open does (signature,
// every file's sha256, and the digest recorded at install) without loading
// it, so that a listing can tell which versions would no longer open.
func (in *Installer) Verify(name string, version int64) error {
	_, err := in.VerifiedManifest(name, version)
	return err
}

// VerifiedManifest checks an installed version on disk as Verify does and
// returns its manifest, so that a listing can also tell which versions
// this appliance may not run (Manifest.CheckApplianceVersion).
func (in *Installer) VerifiedManifest(name string, version int64) (*Manifest, error) {
	in.mu.Lock()
	i := in.find(name, version)
	if i < 0 {
		in.mu.Unlock()
		return nil, fmt.Errorf("verify: %w: %s v%d", ErrNotInstalled, name, version)
	}
	rec := in.idx.Installed[i]
	in.mu.Unlock()
	v, err := in.verifyInstalled(rec)
	if err != nil {
		return nil, fmt.Errorf("verify %s v%d: %w", name, version, err)
	}
	return v.manifest, nil
}

// verifyInstalled reads rec's folder and verifies it against the trusted
// keys and the digest recorded at install.
func (in *Installer) verifyInstalled(rec Installed) (*verified, error) {
	files, err := readDir(in.versionDir(rec.Name, rec.Version))
	if err != nil {
		return nil, err
	}
	v, err := verifyContents(files, in.keys)
	if err != nil {
		return nil, err
	}
	if v.digest != rec.Digest || v.manifest.Name != rec.Name || v.manifest.Version != rec.Version {
		return nil, fmt.Errorf("%w: installed as %s, on disk %s", ErrPinnedMismatch, rec.Digest, v.digest)
	}
	return v, nil
}

// RemoveOptions qualify one removal: who removes the version and why,
// recorded in the log entry of the removal. Both are required.
type RemoveOptions struct {
	By, Reason string
}

// Remove deletes an installed version. It refuses a removal that does not
// say who removes the version and why (ErrUnexplained: a removal is as
// deliberate as a downgrade and cannot be undone, so the log must say),
// the active version and any version that inUse reports a run still
// refers to (ErrInUse); pass a function that asks the run store.
func (in *Installer) Remove(name string, version int64, inUse func(engine.BundleRef) bool, opt RemoveOptions) error {
	if opt.By == "" || opt.Reason == "" {
		return fmt.Errorf("remove %s v%d: %w: RemoveOptions.By and RemoveOptions.Reason are required (by %q, reason %q)",
			name, version, ErrUnexplained, opt.By, opt.Reason)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	i := in.find(name, version)
	if i < 0 {
		return fmt.Errorf("remove: %w: %s v%d", ErrNotInstalled, name, version)
	}
	rec := in.idx.Installed[i]
	if rec.Active {
		return fmt.Errorf("remove: %w: %s v%d is active", ErrInUse, name, version)
	}
	if inUse != nil && inUse(rec.Ref()) {
		return fmt.Errorf("remove: %w: runs are pinned to %s v%d", ErrInUse, name, version)
	}
	old := in.idx.clone()
	in.idx.Installed = append(in.idx.Installed[:i:i], in.idx.Installed[i+1:]...)
	in.idx.Log = append(in.idx.Log, LogEntry{At: in.opts.Now().UTC(), Action: "remove", Name: name, Version: version, Digest: rec.Digest,
		By: opt.By, Reason: opt.Reason})
	if err := in.saveLocked(old); err != nil {
		return err
	}
	delete(in.cache, name+"@"+strconv.FormatInt(version, 10))
	// The index no longer lists the version; a failure here leaves files
	// that the next install of the version replaces.
	if err := os.RemoveAll(in.versionDir(name, version)); err != nil {
		return fmt.Errorf("remove %s v%d: %w", name, version, err)
	}
	return nil
}
