package firmware_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// A run pinned to the embedded bundle resolves from the copy kept of it
// when the embedded bundle is not that one any more (EmbeddedResolver with
// another bundle as the embedded one stands for a later binary). A kept
// copy that changed on disk is refused as an installed one is, and kept
// again whole; a pin that names no copy is refused as missing, also one
// whose digest would name a path out of the folder.
func TestKeptEmbeddedBundleServesItsRuns(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	ref, err := firmware.Reference()
	if err != nil {
		t.Fatal(err)
	}
	pinned := ref.Ref()
	resolve := firmware.EmbeddedResolver(in, ref)
	ag, err := resolve(firmware.ReferenceAgent, engine.BundleRef{})
	if err != nil {
		t.Fatal(err)
	}
	copyDir := filepath.Join(data, "firmware", ".embedded", pinned.Name, strconv.FormatInt(pinned.Version, 10)+"-"+strings.TrimPrefix(pinned.Digest, "sha256:"))
	if _, err := os.Stat(copyDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("kept before a run pinned it: %v", err)
	}
	if err := ag.Pin(&engine.Run{Meta: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(copyDir, "manifest.json")); err != nil {
		t.Fatalf("not kept once a run pinned it: %v", err)
	}

	// A later binary: another embedded bundle, a new installer.
	later := firmware.EmbeddedResolver(newInstaller(t, data), loadPatterns(t))
	a, err := later(firmware.ReferenceAgent, pinned)
	if err != nil || a.Bundle != pinned {
		t.Fatalf("pinned run under a later binary: %+v, %v", a, err)
	}
	kept, err := newInstaller(t, data).Kept()
	if err != nil || len(kept) != 1 || kept[0].BundleRef != pinned || kept[0].Problem != "" {
		t.Fatalf("kept %+v, %v", kept, err)
	}

	kb := filepath.Join(copyDir, "kb", "kb-01.md")
	if err := os.WriteFile(kb, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	later = firmware.EmbeddedResolver(newInstaller(t, data), loadPatterns(t))
	if _, err := later(firmware.ReferenceAgent, pinned); !errors.Is(err, firmware.ErrHashMismatch) || !strings.Contains(err.Error(), "kb/kb-01.md") {
		t.Fatalf("changed kept copy: %v", err)
	}
	if kept, _ := newInstaller(t, data).Kept(); len(kept) != 1 || !strings.Contains(kept[0].Problem, "kb/kb-01.md") {
		t.Fatalf("changed kept copy listed as %+v", kept)
	}
	if err := newInstaller(t, data).KeepReference(); err != nil {
		t.Fatal(err)
	}
	if _, err := later(firmware.ReferenceAgent, pinned); err != nil {
		t.Fatalf("kept again: %v", err)
	}

	for _, digest := range []string{"sha256:" + strings.Repeat("0", 64), "sha256:../../../x", ""} {
		gone := pinned
		gone.Digest = digest
		if _, err := later(firmware.ReferenceAgent, gone); !errors.Is(err, firmware.ErrPinnedMissing) || !errors.Is(err, firmware.ErrPinnedMismatch) {
			t.Fatalf("pinned to %q: %v", digest, err)
		}
	}
}

// A data folder whose firmware folder holds only kept copies, with no
// index (nothing was ever installed), opens as one with nothing
// installed: the copies are not taken for installed bundles whose index
// was lost.
func TestKeptCopiesAreNotInstalledBundles(t *testing.T) {
	data := t.TempDir()
	if err := newInstaller(t, data).KeepReference(); err != nil {
		t.Fatal(err)
	}
	// KeepReference writes an index beside the copy (see
	// TestKeptCopyComesWithAnIndex); without it, as a lost index leaves
	// the folder:
	if err := os.Remove(filepath.Join(data, "firmware", "index.json")); err != nil {
		t.Fatal(err)
	}
	in := newInstaller(t, data)
	if l := in.List(); len(l) != 0 {
		t.Fatalf("installed %+v", l)
	}
}

// Without a firmware folder (a command that starts no run passes no
// installer), the embedded bundle serves the runs pinned to it and keeps
// nothing, and a run pinned to another bundle is refused as missing.
func TestEmbeddedResolverWithoutAFirmwareFolder(t *testing.T) {
	ref, err := firmware.Reference()
	if err != nil {
		t.Fatal(err)
	}
	resolve := firmware.EmbeddedResolver(nil, ref)
	a, err := resolve(firmware.ReferenceAgent, ref.Ref())
	if err != nil || a.Bundle != ref.Ref() {
		t.Fatalf("run pinned to the embedded bundle: %+v, %v", a, err)
	}
	if a, err = resolve(firmware.ReferenceAgent, engine.BundleRef{}); err != nil {
		t.Fatalf("new run: %v", err)
	}
	if a.Pin != nil {
		if err := a.Pin(&engine.Run{Meta: map[string]string{}}); err != nil {
			t.Fatalf("pin with nowhere to keep: %v", err)
		}
	}
	other := loadPatterns(t).Ref()
	if _, err := resolve(firmware.ReferenceAgent, other); !errors.Is(err, firmware.ErrPinnedMissing) || !strings.Contains(err.Error(), other.Digest) {
		t.Fatalf("run pinned to a bundle neither embedded nor kept: %v", err)
	}
}

// The first copy kept in a data folder where nothing was installed comes
// with an index that lists nothing: an older binary takes bundle folders
// beside no index for installed bundles whose index was lost, and refuses
// to open the firmware folder, so that a downgrade would stop serve.
func TestKeptCopyComesWithAnIndex(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if err := in.KeepReference(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(data, "firmware", "index.json"))
	if err != nil {
		t.Fatalf("no index beside the kept copy: %v", err)
	}
	var idx struct {
		Format    int               `json:"format"`
		Installed []json.RawMessage `json:"installed"`
	}
	if err := json.Unmarshal(raw, &idx); err != nil || idx.Format == 0 || len(idx.Installed) != 0 {
		t.Fatalf("index %s: %+v, %v", raw, idx, err)
	}
	if list := newInstaller(t, data).List(); len(list) != 0 {
		t.Fatalf("the kept copy is listed as installed: %+v", list)
	}
}

// RemoveKept removes the kept copies no run refers to and leaves those
// that one does, and those it is told to keep. The same installer keeps a
// removed copy again when a run pins its bundle once more: what it knew it
// had kept goes with the copy. What a removal cut short left aside is
// deleted by the next.
func TestRemoveKeptLeavesTheCopiesRunsReferTo(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	ref, err := firmware.Reference()
	if err != nil {
		t.Fatal(err)
	}
	own := ref.Ref()
	if err := in.KeepReference(); err != nil {
		t.Fatal(err)
	}
	// A copy of another digest, as an earlier binary kept it.
	root := filepath.Join(data, "firmware", ".embedded", own.Name)
	v := strconv.FormatInt(own.Version, 10) + "-"
	ownDir := filepath.Join(root, v+strings.TrimPrefix(own.Digest, "sha256:"))
	other := engine.BundleRef{Name: own.Name, Version: own.Version, Digest: "sha256:" + strings.Repeat("ab", 32)}
	otherDir := filepath.Join(root, v+strings.Repeat("ab", 32))
	if err := os.CopyFS(otherDir, os.DirFS(ownDir)); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(root, ".remove-1-"+strings.Repeat("cd", 32))
	if err := os.MkdirAll(leftover, 0o755); err != nil {
		t.Fatal(err)
	}

	used := map[engine.BundleRef]bool{other: true}
	removed, err := in.RemoveKept(func(r engine.BundleRef) bool { return used[r] }, own)
	if err != nil || len(removed) != 0 {
		t.Fatalf("removed %v, %v: every copy is referred to or kept", removed, err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover of a removal cut short: %v", err)
	}

	removed, err = in.RemoveKept(func(engine.BundleRef) bool { return false })
	if err != nil || len(removed) != 2 || removed[0] != other && removed[1] != other {
		t.Fatalf("removed %v, %v; want both copies", removed, err)
	}
	if kept, err := in.Kept(); err != nil || len(kept) != 0 {
		t.Fatalf("listed after removal: %+v, %v", kept, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil || len(entries) != 0 {
		t.Fatalf("left in %s: %v, %v", root, entries, err)
	}

	ag, err := firmware.EmbeddedResolver(in, ref)(firmware.ReferenceAgent, engine.BundleRef{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.Pin(&engine.Run{Meta: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if kept, err := in.Kept(); err != nil || len(kept) != 1 || kept[0].BundleRef != own || kept[0].Problem != "" {
		t.Fatalf("not kept again when a run pinned the bundle: %+v, %v", kept, err)
	}
}

// What the folder of kept copies holds that is no kept copy (a file where
// a bundle's folder of copies belongs, a README, an editor's backup, a
// file or folder under a name that is not VERSION-HEX as a copy's is) is
// no run's bundle: listing and removing the copies pass over it, and
// StrayKept names it, for a warning, without failing either; it stays.
func TestStrayFilesBesideKeptCopiesAreLeftAlone(t *testing.T) {
	data := t.TempDir()
	in := newInstaller(t, data)
	if err := in.KeepReference(); err != nil {
		t.Fatal(err)
	}
	own, err := firmware.ReferenceRef()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(data, "firmware", ".embedded")
	hex := strings.TrimPrefix(own.Digest, "sha256:")
	v := strconv.FormatInt(own.Version, 10)
	stray := []string{
		filepath.Join(root, "README"),
		filepath.Join(root, own.Name, "README~"),
		filepath.Join(root, own.Name, v+"-"+hex+".bak"),
		filepath.Join(root, own.Name, v+"-"+strings.Repeat("ab", 32)), // a file by a copy's name
	}
	for _, p := range stray {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(root, "Not A Name"), filepath.Join(root, own.Name, "0"+v+"-"+hex)} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		stray = append(stray, p)
	}

	kept, err := in.Kept()
	if err != nil || len(kept) != 1 || kept[0].BundleRef != own || kept[0].Problem != "" {
		t.Fatalf("kept %+v, %v; want the one copy, whole", kept, err)
	}
	got, err := in.StrayKept()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(stray)
	if !slices.Equal(got, stray) {
		t.Fatalf("stray %q, want %q", got, stray)
	}
	removed, err := in.RemoveKept(func(engine.BundleRef) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != own {
		t.Fatalf("removed %v, %v; want the one copy", removed, err)
	}
	for _, p := range stray {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("a stray file went with the copies: %v", err)
		}
	}
}

// An installed version whose folder was deleted by hand, while the index
// still lists it, is ErrPinnedMissing to a run pinned to it, naming the
// folder and the way back; installing the same bundle again puts it back.
func TestPinnedInstalledFolderDeleted(t *testing.T) {
	in, rec, folder := damagedInstall(t, os.RemoveAll)
	_, err := in.OpenPinned(rec.Ref())
	if !errors.Is(err, firmware.ErrPinnedMissing) || !errors.Is(err, firmware.ErrPinnedMismatch) {
		t.Fatalf("want ErrPinnedMissing, got %v", err)
	}
	if !errors.Is(err, engine.ErrBundleUnavailable) {
		t.Errorf("the same bundle installed again puts it back, so recovery should leave its runs for it: %v is not engine.ErrBundleUnavailable", err)
	}
	for _, want := range []string{"its folder " + folder + " is gone", "outpost firmware install"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	reinstallRepairs(t, in, rec)
}

// An installed version with one file changed, lost or added by hand in
// its folder is ErrPinnedMismatch to a run pinned to it, naming the file
// and what is wrong with it, the folder, and the way back; installing the
// same bundle again puts the folder back as installed.
func TestPinnedInstalledFileChanged(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(folder string) error
		says   string
	}{
		{"a file lost", func(folder string) error { return os.Remove(filepath.Join(folder, "agents", "parallel.json")) },
			"agents/parallel.json is missing"},
		{"a file changed", func(folder string) error {
			return os.WriteFile(filepath.Join(folder, "prompts", "answer.txt"), []byte("changed\n"), 0o644)
		}, "prompts/answer.txt differs from its sha256 in the pinned manifest"},
		{"the manifest changed", func(folder string) error {
			p := filepath.Join(folder, firmware.ManifestFile)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, append(b, '\n'), 0o644)
		}, "manifest.json differs from the pinned digest"},
		{"the signature lost", func(folder string) error { return os.Remove(filepath.Join(folder, firmware.SignatureFile)) },
			"manifest.sig is missing"},
		{"a file added", func(folder string) error {
			return os.WriteFile(filepath.Join(folder, "notes.txt"), []byte("mine\n"), 0o644)
		}, "notes.txt is not in the bundle"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in, rec, folder := damagedInstall(t, c.damage)
			_, err := in.OpenPinned(rec.Ref())
			if !errors.Is(err, firmware.ErrPinnedMismatch) || errors.Is(err, firmware.ErrPinnedMissing) {
				t.Fatalf("want ErrPinnedMismatch, got %v", err)
			}
			if !errors.Is(err, engine.ErrBundleUnavailable) {
				t.Errorf("the same bundle installed again puts it back, so recovery should leave its runs for it: %v is not engine.ErrBundleUnavailable", err)
			}
			for _, want := range []string{
				"the run is pinned to " + rec.Name + " v1 (" + rec.Digest + ")",
				"its folder " + folder + " no longer holds it as installed: " + c.says,
				"install the same bundle file again, the same version and digest, with outpost firmware install " +
					"(it puts the folder back as installed): the run goes on at its resume, or, left running, at the next start",
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
			reinstallRepairs(t, in, rec)
		})
	}
}

// damagedInstall installs the patterns bundle in a new folder, damages its
// installed version's folder, and returns an installer opened afresh, as
// a later process opens it, with nothing cached.
func damagedInstall(t *testing.T, damage func(folder string) error) (*firmware.Installer, *firmware.Installed, string) {
	t.Helper()
	dir := t.TempDir()
	in, err := firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := in.Install(patternsDir, firmware.InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	folder := filepath.Join(in.Dir(), rec.Name, strconv.FormatInt(rec.Version, 10))
	if err := damage(folder); err != nil {
		t.Fatal(err)
	}
	if in, err = firmware.NewInstaller(dir, testKeyring(t), firmware.InstallerOptions{}); err != nil {
		t.Fatal(err)
	}
	return in, rec, folder
}

// reinstallRepairs installs the patterns bundle again and checks that the
// version rec pins opens once more.
func reinstallRepairs(t *testing.T, in *firmware.Installer, rec *firmware.Installed) {
	t.Helper()
	if _, err := in.Install(patternsDir, firmware.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := in.OpenPinned(rec.Ref()); err != nil {
		t.Fatalf("after the same bundle again: %v", err)
	}
}
