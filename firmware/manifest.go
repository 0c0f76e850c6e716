package firmware

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Names of the two files every bundle has at its root.
const (
	ManifestFile  = "manifest.json"
	SignatureFile = "manifest.sig"
)

// ManifestFormat is the manifest encoding this package reads and writes.
const ManifestFormat = 1

// Manifest describes a bundle: what it is, who signed it, what it holds, and
// the sha256 of every file in it. It is the only file the signature covers;
// the hashes extend the signature to the rest.
type Manifest struct {
	Format              int       `json:"format"`
	Name                string    `json:"name"`
	Version             int64     `json:"version"`
	Created             time.Time `json:"created"`
	KeyID               string    `json:"key_id"`
	MinApplianceVersion string    `json:"min_appliance_version,omitempty"`
	Description         string    `json:"description,omitempty"`

	// Agents maps an agent's name to its graph file.
	Agents map[string]string `json:"agents"`
	// Tools, Rules, Lanes and Redaction name the tool registry, guardrail
	// rules, model lanes and redaction policy files. Each is optional.
	Tools     string `json:"tools,omitempty"`
	Rules     string `json:"rules,omitempty"`
	Lanes     string `json:"lanes,omitempty"`
	Redaction string `json:"redaction,omitempty"`
	// Knowledge lists the knowledge-base documents; a document's id is its
	// file name without the extension ("kb/kb-03.md" is "kb-03").
	Knowledge []string `json:"knowledge,omitempty"`
	// Prompts maps a prompt's name to its file.
	Prompts map[string]string `json:"prompts,omitempty"`
	// Golden lists golden-conversation files (JSON lines).
	Golden []string `json:"golden,omitempty"`

	// Files maps every file of the bundle, besides the manifest and its
	// signature, to its sha256 in lowercase hex.
	Files map[string]string `json:"files"`
}

// String returns the manifest's name and version ("patterns v3").
func (m *Manifest) String() string { return fmt.Sprintf("%s v%d", m.Name, m.Version) }

var (
	bundleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	sha256HexRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	agentNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// DecodeManifest reads a manifest strictly and checks it: a safe name, a
// positive version, a key id, and every referenced file listed in Files
// under a path that stays inside the bundle.
func DecodeManifest(data []byte) (*Manifest, error) {
	var m Manifest
	pos, err := decodeStrict(ManifestFile, data, &m)
	if err != nil {
		return nil, err
	}
	bad := func(field, format string, args ...any) error {
		return malformed(ManifestFile, data, pos.At(field), "", "%s: %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case m.Format != ManifestFormat:
		return nil, bad("format", "got %d, want %d", m.Format, ManifestFormat)
	case !bundleNameRE.MatchString(m.Name):
		return nil, bad("name", "%q is not a bundle name (lowercase letters, digits, '.', '_', '-')", m.Name)
	case m.Version <= 0:
		return nil, bad("version", "must be a positive integer, got %d", m.Version)
	case m.Created.IsZero():
		return nil, bad("created", "missing (RFC 3339 time)")
	case m.KeyID == "":
		return nil, bad("key_id", "missing")
	case len(m.Agents) == 0:
		return nil, bad("agents", "no agents")
	case m.Files == nil:
		return nil, bad("files", "missing")
	}
	if m.MinApplianceVersion != "" {
		if _, err := parseVersion(m.MinApplianceVersion); err != nil {
			return nil, bad("min_appliance_version", "%v", err)
		}
	}
	for p, sum := range m.Files {
		if err := checkPath(p); err != nil {
			return nil, fmt.Errorf("%s: files: %w", ManifestFile, err)
		}
		if p == ManifestFile || p == SignatureFile {
			return nil, bad("files", "%q may not be listed", p)
		}
		if !sha256HexRE.MatchString(sum) {
			return nil, bad("files."+p, "%q is not a lowercase hex sha256", sum)
		}
	}
	for _, r := range m.references() {
		if err := checkPath(r.path); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", ManifestFile, r.field, err)
		}
		if _, ok := m.Files[r.path]; !ok {
			return nil, fmt.Errorf("%s: %s: %w: %q is referenced but has no sha256 in files", ManifestFile, r.field, ErrMissingFile, r.path)
		}
	}
	for name := range m.Agents {
		if !agentNameRE.MatchString(name) {
			return nil, bad("agents", "%q is not an agent name", name)
		}
	}
	return &m, nil
}

type reference struct{ field, path string }

// references lists every file the manifest names outside Files, in a
// stable order.
func (m *Manifest) references() []reference {
	var out []reference
	for _, k := range sortedKeys(m.Agents) {
		out = append(out, reference{"agents." + k, m.Agents[k]})
	}
	for _, r := range []reference{{"tools", m.Tools}, {"rules", m.Rules}, {"lanes", m.Lanes}, {"redaction", m.Redaction}} {
		if r.path != "" {
			out = append(out, r)
		}
	}
	for i, p := range m.Knowledge {
		out = append(out, reference{fmt.Sprintf("knowledge.%d", i), p})
	}
	for _, k := range sortedKeys(m.Prompts) {
		out = append(out, reference{"prompts." + k, m.Prompts[k]})
	}
	for i, p := range m.Golden {
		out = append(out, reference{fmt.Sprintf("golden.%d", i), p})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkPath refuses a bundle path that is not a clean, relative,
// slash-separated path inside the bundle.
func checkPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty path", ErrPathEscape)
	case strings.ContainsAny(p, "\\\x00") || strings.Contains(p, ":"):
		return fmt.Errorf("%w: %q holds a backslash, colon or NUL", ErrPathEscape, p)
	case path.IsAbs(p):
		return fmt.Errorf("%w: %q is absolute", ErrPathEscape, p)
	case p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.."):
		return fmt.Errorf("%w: %q climbs out with \"..\"", ErrPathEscape, p)
	case path.Clean(p) != p || p == ".":
		return fmt.Errorf("%w: %q is not a clean path", ErrPathEscape, p)
	}
	return nil
}

// parseVersion reads "1", "1.2" or "1.2.3" (an optional leading "v", and
// anything after a '-' or '+' ignored) into three numbers.
func parseVersion(s string) ([3]int, error) {
	var v [3]int
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	if i := strings.IndexAny(t, "-+"); i >= 0 {
		t = t[:i]
	}
	parts := strings.Split(t, ".")
	if len(parts) > 3 || t == "" {
		return v, fmt.Errorf("%q is not a version (MAJOR.MINOR.PATCH)", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("%q is not a version (MAJOR.MINOR.PATCH)", s)
		}
		v[i] = n
	}
	return v, nil
}

// ChecksApplianceVersion reports whether an appliance whose version is v
// holds bundles to their min_appliance_version: v reads as a version
// (MAJOR[.MINOR[.PATCH]], an optional leading "v", anything after a '-' or
// '+' left out, as git describe writes "v1.2.0-3-gabc1234"). A
// development build ("dev", a bare commit hash) does not, and
// CheckApplianceVersion passes every bundle on it.
func ChecksApplianceVersion(v string) bool {
	_, err := parseVersion(v)
	return err == nil
}

// CheckApplianceVersion returns an error wrapping ErrMinVersion when the
// appliance's version is older than the manifest requires. An appliance
// version that is not a release ("dev", a commit hash) passes: development
// builds run every bundle.
func (m *Manifest) CheckApplianceVersion(appliance string) error {
	if m.MinApplianceVersion == "" {
		return nil
	}
	have, err := parseVersion(appliance)
	if err != nil {
		return nil
	}
	want, err := parseVersion(m.MinApplianceVersion)
	if err != nil {
		return fmt.Errorf("%w: %s: min_appliance_version %q: %v", ErrMinVersion, m, m.MinApplianceVersion, err)
	}
	for i := range have {
		if have[i] != want[i] {
			if have[i] < want[i] {
				return fmt.Errorf("%w: %s needs appliance %s or later, this is %s", ErrMinVersion, m, m.MinApplianceVersion, appliance)
			}
			return nil
		}
	}
	return nil
}
