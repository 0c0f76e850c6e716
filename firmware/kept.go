package firmware

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/internal/fsync"
)

// keptDir is the folder, in the firmware folder, where an appliance keeps
// a copy of each embedded bundle that a run was pinned to:
// DATA/firmware/.embedded/NAME/VERSION-SHA256/. The embedded bundle
// changes with the binary (a re-signed one keeps its version and changes
// its digest), and a run waiting for a person must go on with the bundle
// it started on after the binary is replaced. No bundle name begins with
// a dot, so no installed bundle has this folder.
const keptDir = ".embedded"

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// keptHooks are test hooks in the listing and removal of kept copies, in
// the spirit of the store's failpoints. They are nil in production; tests
// set them before the call and clear them after.
var keptHooks struct {
	// listed runs in Kept once the copies on disk are listed, before
	// any is checked.
	listed func(refs []engine.BundleRef)
	// removing runs in RemoveKept once it has found that no run refers
	// to ref, before it renames the copy aside.
	removing func(ref engine.BundleRef)
}

// keptPath is where the copy pinned by ref is kept, or "" for a reference
// that no kept copy can have (it names no path under keptDir).
func (in *Installer) keptPath(ref engine.BundleRef) string {
	if !bundleNameRE.MatchString(ref.Name) || ref.Version < 0 || !digestRE.MatchString(ref.Digest) {
		return ""
	}
	return filepath.Join(in.dir, keptDir, ref.Name, strconv.FormatInt(ref.Version, 10)+"-"+strings.TrimPrefix(ref.Digest, "sha256:"))
}

// KeepReference keeps a copy of the embedded reference bundle's signed
// files in the firmware folder, for the runs pinned to it: they go on with
// it under a later binary whose embedded bundle differs (Resolver finds the
// copy). A copy already there that verifies is left as it is, one that
// does not is written again, and a process checks it once.
func (in *Installer) KeepReference() error {
	v, err := referenceVerified()
	if err != nil {
		return fmt.Errorf("keep the embedded bundle: reference bundle: %w", err)
	}
	ref := engine.BundleRef{Name: v.manifest.Name, Version: v.manifest.Version, Digest: v.digest}
	in.keepMu.Lock()
	defer in.keepMu.Unlock()
	if in.kept[ref] {
		return nil
	}
	if _, err := in.verifyKept(ref); err != nil {
		// An index, though it lists nothing, before the copy: an older
		// binary takes bundle folders beside no index for installed
		// bundles whose index was lost, and refuses the folder.
		if err := in.ensureIndex(); err != nil {
			return fmt.Errorf("keep the embedded bundle %s v%d (%s): %w", ref.Name, ref.Version, ref.Digest, err)
		}
		if err := writeTree(in.keptPath(ref), v.files); err != nil {
			return fmt.Errorf("keep the embedded bundle %s v%d (%s) in %s for the runs pinned to it: %w",
				ref.Name, ref.Version, ref.Digest, filepath.Join(in.dir, keptDir), err)
		}
	}
	in.kept[ref] = true
	return nil
}

// ensureIndex writes the index where there is none yet.
func (in *Installer) ensureIndex() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, err := os.Stat(filepath.Join(in.dir, indexFile)); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return in.saveLocked(in.idx)
}

// Kept describes one kept copy of an embedded bundle (KeepReference):
// the reference of the runs pinned to it, and whether it verifies.
type Kept struct {
	engine.BundleRef
	// Problem says why the copy no longer verifies; empty when it does.
	Problem string `json:"problem,omitempty"`
}

// Kept lists the kept copies of embedded bundles, by name, version and
// digest, each checked on disk as a run pinned to it would check it. It
// waits for a copy being kept or removed in this process, so that it does
// not take one half written or half removed for a damaged one. A copy
// another process removes meanwhile (db prune, which holds the store but
// not this installer) is renamed aside whole before it is deleted
// (RemoveKept): one listed that is gone when it is checked was removed, not
// damaged, and is left out. What the folder holds that is no kept copy is
// left out too (StrayKept names it).
func (in *Installer) Kept() ([]Kept, error) {
	in.keepMu.Lock()
	defer in.keepMu.Unlock()
	refs, _, err := in.keptRefs()
	if err != nil {
		return nil, err
	}
	if hook := keptHooks.listed; hook != nil {
		hook(refs)
	}
	var list []Kept
	for _, ref := range refs {
		k := Kept{BundleRef: ref}
		if _, err := in.verifyKept(ref); err != nil {
			if _, serr := os.Lstat(in.keptPath(ref)); errors.Is(serr, fs.ErrNotExist) {
				continue
			}
			k.Problem = err.Error()
		}
		list = append(list, k)
	}
	return list, nil
}

// StrayKept names what the folder of kept copies holds that is no kept
// copy (a file, a temporary or backup file an editor left, a README), by
// its path. Kept and RemoveKept pass over it and leave it as it is; a
// caller warns of it.
func (in *Installer) StrayKept() ([]string, error) {
	in.keepMu.Lock()
	defer in.keepMu.Unlock()
	_, stray, err := in.keptRefs()
	return stray, err
}

// keptRefs lists the references of the kept copies on disk, by name,
// version and digest, reading their folders' names alone, and the paths
// of what is there that is no copy (stray): a copy is a folder
// NAME/VERSION-HEX, named as keptPath names it, and anything else (a file
// where a bundle's folder belongs, a README, an editor's backup) stands
// for no run's bundle, so it is passed over rather than fail every
// listing and removal of the copies.
func (in *Installer) keptRefs() (list []engine.BundleRef, stray []string, err error) {
	root := filepath.Join(in.dir, keptDir)
	names, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kept bundles: %w", err)
	}
	for _, n := range names {
		if !n.IsDir() || !bundleNameRE.MatchString(n.Name()) {
			stray = append(stray, filepath.Join(root, n.Name()))
			continue
		}
		copies, err := os.ReadDir(filepath.Join(root, n.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("kept bundles: %w", err)
		}
		for _, c := range copies {
			if strings.HasPrefix(c.Name(), ".install-") || strings.HasPrefix(c.Name(), removingPrefix) {
				continue // not a copy: a write cut short, or a removal
			}
			ver, hex, _ := strings.Cut(c.Name(), "-")
			version, err := strconv.ParseInt(ver, 10, 64)
			ref := engine.BundleRef{Name: n.Name(), Version: version, Digest: "sha256:" + hex}
			if path := in.keptPath(ref); err != nil || !c.IsDir() || path == "" || filepath.Base(path) != c.Name() {
				stray = append(stray, filepath.Join(root, n.Name(), c.Name()))
				continue
			}
			list = append(list, ref)
		}
	}
	sort.Slice(list, func(a, b int) bool {
		x, y := list[a], list[b]
		return x.Name < y.Name || x.Name == y.Name && (x.Version < y.Version || x.Version == y.Version && x.Digest < y.Digest)
	})
	return list, stray, nil
}

// RemoveKept removes the kept copies of embedded bundles that no run
// refers to (inUse false for their reference), and returns those it
// removed. It leaves the copies keep names whatever inUse says: the copy
// of the bundle embedded in a process that may pin a new run to it at any
// moment, since a run's copy is kept before its record is first stored
// (KeepReference), where no walk of the records can see it.
//
// inUse must know every run that refers to a copy: call RemoveKept while
// the data folder's store is held against every other process that pins
// runs (its lock, or from the process that owns it). In this process a
// run comes to refer to a kept copy only through KeepReference (a new run
// pinned to the embedded bundle, or a run pinned to it that is resumed or
// forked from), which takes keepMu, as RemoveKept does from its decision
// to the deletion: a pin in between waits, finds the copy gone (kept is
// cleared with it) and writes it again before its run goes on. A copy of
// any other bundle (an earlier binary's) gains no run: resuming or forking
// from a run pinned to it pins nothing new (a fork makes no run, and the
// next run on its thread pins the bundle new runs use), and that run's
// record already keeps the copy. A copy is renamed
// aside (.remove-*, which is no copy's name) before it is deleted, so that
// a removal cut short leaves no half copy that a listing would take for a
// damaged one; the next RemoveKept deletes what one left. A copy removed
// is kept again by the next run that pins its bundle under a binary that
// embeds it.
func (in *Installer) RemoveKept(inUse func(engine.BundleRef) bool, keep ...engine.BundleRef) ([]engine.BundleRef, error) {
	in.keepMu.Lock()
	defer in.keepMu.Unlock()
	if err := in.removeAside(); err != nil {
		return nil, err
	}
	refs, _, err := in.keptRefs()
	if err != nil {
		return nil, err
	}
	var removed []engine.BundleRef
	for _, ref := range refs {
		dir := in.keptPath(ref)
		if dir == "" || slices.Contains(keep, ref) || inUse(ref) {
			continue
		}
		if hook := keptHooks.removing; hook != nil {
			hook(ref)
		}
		aside := filepath.Join(filepath.Dir(dir), removingPrefix+filepath.Base(dir))
		if err := os.Rename(dir, aside); err != nil {
			return removed, fmt.Errorf("remove the kept copy of %s v%d (%s): %w", ref.Name, ref.Version, ref.Digest, err)
		}
		// From here the copy is gone for any reader: this process must
		// write it again before a run pins it (KeepReference).
		delete(in.kept, ref)
		in.mu.Lock()
		delete(in.cache, ".embedded@"+ref.Digest)
		in.mu.Unlock()
		removed = append(removed, ref)
		if err := errors.Join(fsync.Dir(filepath.Dir(dir)), os.RemoveAll(aside)); err != nil {
			return removed, fmt.Errorf("remove the kept copy of %s v%d (%s): %w", ref.Name, ref.Version, ref.Digest, err)
		}
	}
	return removed, nil
}

// removingPrefix begins the name a kept copy is renamed to while it is
// removed.
const removingPrefix = ".remove-"

// removeAside deletes what a RemoveKept cut short left.
func (in *Installer) removeAside() error {
	names, err := filepath.Glob(filepath.Join(in.dir, keptDir, "*", removingPrefix+"*"))
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(n); err != nil {
			return fmt.Errorf("kept bundles: %w", err)
		}
	}
	return nil
}

// ReferenceRef is the reference a run pinned to the embedded reference
// bundle records, read without compiling the bundle.
func ReferenceRef() (engine.BundleRef, error) {
	v, err := referenceVerified()
	if err != nil {
		return engine.BundleRef{}, fmt.Errorf("reference bundle: %w", err)
	}
	return engine.BundleRef{Name: v.manifest.Name, Version: v.manifest.Version, Digest: v.digest}, nil
}

// verifyKept reads the copy kept for ref and verifies it as an installed
// bundle is verified: its signature (by the development key the embedded
// bundles are signed with, or a key the appliance trusts), every file's
// sha256, and that it is the bundle ref names. A copy that is not there is
// an error wrapping fs.ErrNotExist.
func (in *Installer) verifyKept(ref engine.BundleRef) (*verified, error) {
	dir := in.keptPath(ref)
	if dir == "" {
		return nil, fmt.Errorf("%s v%d (%s): %w", ref.Name, ref.Version, ref.Digest, fs.ErrNotExist)
	}
	files, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	keys, err := DevKeyring()
	if err != nil {
		return nil, err
	}
	if in.keys != nil {
		for _, id := range in.keys.IDs() {
			if pub, ok := in.keys.Key(id); ok {
				keys.Add(pub)
			}
		}
	}
	v, err := verifyContents(files, keys)
	if err != nil {
		return nil, fmt.Errorf("kept copy %s: %w", dir, err)
	}
	if v.digest != ref.Digest || v.manifest.Name != ref.Name || v.manifest.Version != ref.Version {
		return nil, fmt.Errorf("%w: kept copy %s is %s v%d (%s)", ErrPinnedMismatch, dir, v.manifest.Name, v.manifest.Version, v.digest)
	}
	return v, nil
}

// OpenPinned opens the bundle ref names by name, version and digest: the
// installed version of that digest, or else the kept copy of the embedded
// bundle it is (KeepReference). It writes nothing. A bundle on disk
// nowhere is ErrPinnedMissing, one installed with another digest
// ErrPinnedMismatch, and so is one whose folder changed since it was
// installed, naming each file that differs.
func (in *Installer) OpenPinned(ref engine.BundleRef) (*Bundle, error) { return in.openPinned(ref) }

// openPinned opens the bundle a run is pinned to: the installed version
// of that digest, or else the kept copy of the embedded bundle it is.
func (in *Installer) openPinned(p engine.BundleRef) (*Bundle, error) {
	b, err := in.Open(p.Name, p.Version)
	if err == nil && b.Digest == p.Digest {
		return b, nil
	}
	kept, kerr := in.openCached(".embedded@"+p.Digest, p.Digest, func() (*verified, error) { return in.verifyKept(p) })
	switch {
	case kerr == nil:
		return kept, nil
	case !errors.Is(kerr, fs.ErrNotExist):
		return nil, fmt.Errorf("pinned bundle %s v%d: %w", p.Name, p.Version, kerr)
	case err == nil:
		return nil, fmt.Errorf("%w: %s v%d is %s, the run is pinned to %s", ErrPinnedMismatch, p.Name, p.Version, b.Digest, p.Digest)
	case errors.Is(err, fs.ErrNotExist):
		// The index still lists the version, but its folder was deleted
		// by hand: installing the same bundle again rewrites it (Install's
		// repair), and the run goes on as it was.
		return nil, restorable{fmt.Errorf("%w: the run is pinned to %s v%d (%s), which the index of %s lists as installed, but its folder %s is gone: "+
			"install the same bundle file again, the same version and digest, with outpost firmware install (it puts the folder back): the run goes on at its resume, or, left running, at the next start",
			ErrPinnedMissing, p.Name, p.Version, p.Digest, in.dir, in.versionDir(p.Name, p.Version))}
	case !errors.Is(err, ErrNotInstalled):
		if damage := in.damage(p); damage != nil {
			// Changed by hand since the install: the same bundle again
			// rewrites the folder (Install's repair), as for one deleted.
			return nil, restorable{fmt.Errorf("%w: the run is pinned to %s v%d (%s), installed in %s, but its folder %s no longer holds it as installed: %s: "+
				"install the same bundle file again, the same version and digest, with outpost firmware install (it puts the folder back as installed): the run goes on at its resume, or, left running, at the next start",
				ErrPinnedMismatch, p.Name, p.Version, p.Digest, in.dir, in.versionDir(p.Name, p.Version), strings.Join(damage, "; "))}
		}
		return nil, fmt.Errorf("pinned bundle: %w", err)
	}
	return nil, fmt.Errorf("%w: the run is pinned to %s v%d (%s), which is neither installed in %s nor kept there as an embedded bundle: "+
		"install that bundle, the same version and digest, with outpost firmware install (for a bundle embedded in an earlier outpost binary: "+
		"outpost firmware export DIR with that binary, then outpost firmware install --trust-dev-key DIR), or go on with the run under the binary it started under",
		ErrPinnedMissing, p.Name, p.Version, p.Digest, in.dir)
}

// restorable is the error of a pinned bundle that the same bundle
// installed again puts back as it was pinned: it is engine's
// ErrBundleUnavailable too, so that the manager's recovery leaves a run
// left running on it for a later start rather than failing it.
type restorable struct{ error }

func (e restorable) Unwrap() []error { return []error{e.error, engine.ErrBundleUnavailable} }

// damage says what in the folder of p's installed version differs from
// the bundle p pins, file by file: its manifest (whose sha256 is p's
// digest), the signature, each file the manifest lists, and files it does
// not. Nil when the folder cannot be read or nothing in it differs: the
// version fails to open for another reason (a key no longer trusted, say),
// which the same bundle installed again would not mend.
func (in *Installer) damage(p engine.BundleRef) []string {
	files, err := readDir(in.versionDir(p.Name, p.Version))
	if err != nil {
		return nil
	}
	raw, ok := files[ManifestFile]
	if !ok {
		return []string{ManifestFile + " is missing"}
	}
	if got := Digest(raw); got != p.Digest {
		return []string{fmt.Sprintf("%s differs from the pinned digest (it is %s)", ManifestFile, got)}
	}
	m, err := DecodeManifest(raw)
	if err != nil {
		return nil
	}
	var damage []string
	if _, ok := files[SignatureFile]; !ok {
		damage = append(damage, SignatureFile+" is missing")
	} else if _, err := checkSignature(files, in.keys); errors.Is(err, ErrBundleSignature) {
		damage = append(damage, SignatureFile+" does not verify the manifest")
	}
	for _, name := range sortedKeys(m.Files) {
		data, ok := files[name]
		switch {
		case !ok:
			damage = append(damage, name+" is missing")
		case sha256Hex(data) != m.Files[name]:
			damage = append(damage, name+" differs from its sha256 in the pinned manifest")
		}
	}
	for _, name := range sortedKeys(files) {
		if _, ok := m.Files[name]; !ok && name != ManifestFile && name != SignatureFile {
			damage = append(damage, name+" is not in the bundle (its manifest does not list it)")
		}
	}
	return damage
}
