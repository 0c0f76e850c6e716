package firmware

import (
	"fmt"
	"sort"
	"strings"

	"github.com/outpost-edge/outpost/engine"
)

// Resolver resolves agents for an engine.Manager from an installer. A new
// run (zero pinned ref) gets the agent from the active version of the
// bundle that has it; a resumed or recovered run gets it from exactly the
// version it is pinned to, whose digest must still match, whatever is
// active now: the installed version, or the copy kept of the embedded
// bundle it was pinned to (KeepReference), else ErrPinnedMissing. An
// installed version whose folder was deleted or changed by hand is also
// engine.ErrBundleUnavailable, since installing the same bundle again puts
// it back: the manager's recovery leaves a run left running on it as it
// is, for a later start, rather than failing it. Neither gets an agent of a bundle that needs a newer
// appliance than this one (ErrMinVersion: the binary was rolled back after
// the install): a new run does not start on it, a run left running is not
// resumed (the manager's recovery fails it, with the reason), and a run
// waiting for a person goes on waiting until the binary is upgraded again.
func Resolver(in *Installer) engine.Resolver {
	return func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		if pinned.Name != "" {
			b, err := in.openPinned(pinned)
			if err != nil {
				return nil, err
			}
			// The bundle's graphs may need what only the newer binary
			// has; running them on this one is what its minimum forbids.
			if err := b.Manifest.CheckApplianceVersion(in.opts.ApplianceVersion); err != nil {
				return nil, fmt.Errorf("%w; a run pinned to it does not go on under this binary (one left running ends failed, "+
					"one waiting for a person waits): to go on with it, upgrade the outpost binary to %s or later again",
					err, b.Manifest.MinApplianceVersion)
			}
			return agentOf(b, name)
		}
		in.mu.Lock()
		names := make([]string, 0, len(in.idx.Active))
		for n := range in.idx.Active {
			names = append(names, n)
		}
		active := make(map[string]int64, len(in.idx.Active))
		for k, v := range in.idx.Active {
			active[k] = v
		}
		in.mu.Unlock()
		sort.Strings(names)
		var found []*Bundle
		for _, n := range names {
			b, err := in.Open(n, active[n])
			if err != nil {
				return nil, err
			}
			if _, ok := b.agents[name]; ok {
				found = append(found, b)
			}
		}
		switch len(found) {
		case 0:
			return nil, unknownAgentError{fmt.Errorf("%w: no active bundle has agent %q (active: %s)", ErrUnknownAgent, name, strings.Join(names, ", "))}
		case 1:
			// A new run does not start on a bundle that needs a newer
			// appliance than this one (a binary rolled back after the
			// install).
			if err := found[0].Manifest.CheckApplianceVersion(in.opts.ApplianceVersion); err != nil {
				return nil, err
			}
			return agentOf(found[0], name)
		}
		var which []string
		for _, b := range found {
			which = append(which, b.Manifest.String())
		}
		return nil, fmt.Errorf("agent %q is in several active bundles: %s", name, strings.Join(which, ", "))
	}
}

// BundleResolver resolves agents from one loaded bundle, such as the
// embedded reference bundle. A run pinned to another bundle fails.
func BundleResolver(b *Bundle) engine.Resolver {
	return func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		if pinned.Name != "" && pinned != b.Ref() {
			return nil, fmt.Errorf("%w: the run is pinned to %s v%d (%s), this is %s (%s)", ErrPinnedMismatch, pinned.Name, pinned.Version, pinned.Digest, b.Manifest, b.Digest)
		}
		return agentOf(b, name)
	}
}

func agentOf(b *Bundle, name string) (*engine.Agent, error) {
	a, err := b.Agent(name)
	if err != nil {
		return nil, unknownAgentError{err}
	}
	return a, nil
}

// unknownAgentError is an error of ours wrapping ErrUnknownAgent that is
// also engine's ErrUnknownAgent. Both sentinels read "unknown agent", so it
// is said once.
type unknownAgentError struct{ err error }

func (e unknownAgentError) Error() string   { return e.err.Error() }
func (e unknownAgentError) Unwrap() []error { return []error{engine.ErrUnknownAgent, e.err} }

// EmbeddedResolver resolves agents from the embedded reference bundle b
// (ReferenceWithRuntime) for the appliance whose firmware folder in keeps:
// a run that pins b keeps a copy of it there first (KeepReference), and so
// does a run pinned to it that is resumed, so that it goes on with b under
// a later binary whose embedded bundle differs. A run pinned to another
// bundle gets it as PinnedResolver gives it. A nil in (a data folder with
// no firmware folder, opened by a command that starts no run) keeps
// nothing.
func EmbeddedResolver(in *Installer, b *Bundle) engine.Resolver {
	resolve := PinnedResolver(in, b)
	if in == nil {
		return resolve
	}
	return func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		a, err := resolve(name, pinned)
		if err != nil || (pinned.Name != "" && pinned != b.Ref()) {
			return a, err
		}
		if pinned.Name != "" {
			if err := in.KeepReference(); err != nil {
				return nil, err
			}
			return a, nil
		}
		keeping := *a
		keeping.Pin = func(run *engine.Run) error {
			if err := in.KeepReference(); err != nil {
				return err
			}
			if a.Pin != nil {
				return a.Pin(run)
			}
			return nil
		}
		return &keeping, nil
	}
}

// PinnedResolver resolves agents as EmbeddedResolver does, and keeps
// nothing, so that it writes nothing: a new run, or one pinned to b, gets
// b's agent; a run pinned to another bundle gets it from in as Resolver
// gives it (an installed version, or a kept copy). A nil in has nothing
// installed or kept: a run pinned to another bundle gets ErrPinnedMissing.
func PinnedResolver(in *Installer, b *Bundle) engine.Resolver {
	embedded := BundleResolver(b)
	var installed engine.Resolver
	if in != nil {
		installed = Resolver(in)
	}
	return func(name string, pinned engine.BundleRef) (*engine.Agent, error) {
		switch {
		case pinned.Name == "" || pinned == b.Ref():
			return embedded(name, pinned)
		case installed == nil:
			return nil, fmt.Errorf("%w: the run is pinned to %s v%d (%s), which this binary does not embed, and this data folder has no firmware folder, so nothing is installed or kept there",
				ErrPinnedMissing, pinned.Name, pinned.Version, pinned.Digest)
		}
		return installed(name, pinned)
	}
}
