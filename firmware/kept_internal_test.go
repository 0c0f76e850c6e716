package firmware

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A listing of the kept copies (firmware list, which takes no lock) while
// another process removes one (db prune with serve stopped: another
// installer, whose lock the listing does not share) does not take the
// copy it saw go for a damaged one: a copy is renamed aside whole before
// it is deleted, so one gone by the time it is checked was removed.
func TestKeptPassesOverACopyRemovedWhileItLists(t *testing.T) {
	data := t.TempDir()
	lister, err := NewInstaller(data, nil, InstallerOptions{})
	require.NoError(t, err)
	pruner, err := NewInstaller(data, nil, InstallerOptions{})
	require.NoError(t, err)
	require.NoError(t, pruner.KeepReference())
	own, err := ReferenceRef()
	require.NoError(t, err)

	keptHooks.listed = func(refs []engine.BundleRef) {
		keptHooks.listed = nil
		require.Equal(t, []engine.BundleRef{own}, refs)
		removed, err := pruner.RemoveKept(func(engine.BundleRef) bool { return false })
		require.NoError(t, err)
		require.Equal(t, []engine.BundleRef{own}, removed)
	}
	t.Cleanup(func() { keptHooks.listed = nil })
	list, err := lister.Kept()
	require.NoError(t, err)
	require.Empty(t, list, "a copy removed while it was listed is listed as damaged")
}

// A run pinned to the embedded bundle once RemoveKept has found that no run
// refers to its copy, and before the copy goes (a new run started, or a
// fork from a run pinned to it, as serve's HTTP API or runs fork does it),
// is never left without the copy: the pin waits for the removal, finds the
// copy gone and writes it again, and the run opens its bundle from it.
func TestAPinDuringRemoveKeptKeepsTheCopyAgain(t *testing.T) {
	ref, err := Reference()
	require.NoError(t, err)
	own := ref.Ref()
	for _, path := range []string{"new run", "fork"} {
		t.Run(path, func(t *testing.T) {
			data := t.TempDir()
			in, err := NewInstaller(data, nil, InstallerOptions{})
			require.NoError(t, err)
			resolve := EmbeddedResolver(in, ref)
			ag, err := resolve(ReferenceAgent, engine.BundleRef{})
			require.NoError(t, err)
			require.NoError(t, ag.Pin(&engine.Run{Meta: map[string]string{}}))

			pinned := make(chan error, 1)
			keptHooks.removing = func(r engine.BundleRef) {
				keptHooks.removing = nil
				require.Equal(t, own, r)
				go func() {
					if path == "fork" {
						// A fork resolves the graph of the thread's last
						// run, pinned to own.
						_, err := resolve(ReferenceAgent, own)
						pinned <- err
						return
					}
					pinned <- ag.Pin(&engine.Run{Meta: map[string]string{}})
				}()
				// Time for the pin to reach the copy before it goes, were
				// it not held off until the removal is done.
				time.Sleep(50 * time.Millisecond)
			}
			t.Cleanup(func() { keptHooks.removing = nil })
			removed, err := in.RemoveKept(func(engine.BundleRef) bool { return false })
			require.NoError(t, err)
			require.Equal(t, []engine.BundleRef{own}, removed)
			require.NoError(t, <-pinned)

			// The run pinned meanwhile goes on from the copy under a later
			// binary, whose installer finds it on disk and whole.
			later, err := NewInstaller(data, nil, InstallerOptions{})
			require.NoError(t, err)
			b, err := later.OpenPinned(own)
			require.NoError(t, err, "the copy a run was pinned to during the removal is gone")
			require.Equal(t, own, b.Ref())
		})
	}
}
