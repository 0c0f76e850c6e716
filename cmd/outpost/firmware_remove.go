package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

const firmwareRemoveAbout = `Remove an installed version of a bundle, its folder and its entry in the firmware index.
--by NAME and --reason TEXT are required: the firmware log records the removal with who
removed the version and why, as it records a downgrade. Refused, with nothing changed: the active version of
its name (activate another first), a version that any run in the store is pinned to, whatever
its status (a finished run is still replayed and forked from its bundle), and a version that
is not installed. Stop serve first: serve reads the installed bundles when it starts, and
only it knows the runs it has not stored yet; remove holds the data folder, so that no run
starts while it looks, and reads the store without changing it.`

func firmwareRemove(fs *cmdFlags, args []string, stdout io.Writer) error {
	fs.synopsis = "firmware remove [flags] NAME VERSION"
	fs.About = firmwareRemoveAbout
	data := dataFlag(fs.FlagSet)
	by := fs.String("by", "", "who removes, by `NAME` (required, recorded)")
	reason := fs.String("reason", "", "why, in a `TEXT` (required, recorded)")
	asJSON := fs.Bool("json", false, "print JSON: {name, version, digest, removed, by, reason}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	// A removal is as deliberate as a downgrade, and no more undone: the
	// log says who and why.
	if *by == "" || *reason == "" {
		return badUsage("firmware remove needs --by NAME and --reason TEXT, which are recorded")
	}
	v, err := versionArg(fs, "remove")
	if err != nil {
		return err
	}
	// Held whether or not the folder has a store yet, so that no serve or
	// run starts, and pins the version, while remove looks.
	in, release, err := heldInstaller(fs, *data, "remove", lockDataFolder, "remove the version")
	if err != nil {
		return err
	}
	defer release()
	name := fs.Arg(0)
	var rec *firmware.Installed
	for _, i := range in.List() {
		if i.Name == name && i.Version == v {
			rec = &i
		}
	}
	if rec == nil {
		return notInstalled("remove", in.List(), name, v, *data, dataHint(fs.FlagSet))
	}
	if rec.Active {
		return fmt.Errorf("remove %s v%d: %w: it is the active version of %s, which new runs use\n"+
			"(make another version active first: outpost firmware activate%s %s VERSION; the only version of a name cannot be removed)",
			name, v, firmware.ErrInUse, name, dataHint(fs.FlagSet), shellQuote(name))
	}
	pins, err := storePins(context.Background(), *data)
	if err != nil {
		return err
	}
	if len(pins.Damaged) > 0 {
		return fmt.Errorf("remove %s v%d: refused, nothing changed: %d run record(s) cannot be read (first %s), so which bundles "+
			"those runs are pinned to is not known\n(outpost db check%s names them)", name, v, len(pins.Damaged), pins.Damaged[0], dataHint(fs.FlagSet))
	}
	if p := pins.ByBundle[rec.Ref()]; p != nil {
		return fmt.Errorf("remove %s v%d: %w: %s\n(a run, finished or not, goes on, is replayed and is forked with the bundle it is pinned to; "+
			"the version stays on disk while any run refers to it)", name, v, firmware.ErrInUse, pinnedRuns(p))
	}
	// Checked again under the installer's own lock, against the same
	// runs: none can start while the folder is held.
	if err := in.Remove(name, v, func(ref engine.BundleRef) bool { return pins.ByBundle[ref] != nil },
		firmware.RemoveOptions{By: *by, Reason: *reason}); err != nil {
		return explain(err)
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"name": name, "version": v, "digest": rec.Digest, "removed": true,
			"by": *by, "reason": *reason})
	}
	fmt.Fprintf(stdout, "removed %s v%d (%s): no run refers to it\n", name, v, rec.Digest)
	return nil
}

// pinnedRuns says which runs p counts: how many, and the first few.
func pinnedRuns(p *store.Pins) string {
	more := ""
	if p.Runs > len(p.First) {
		more = fmt.Sprintf(", and %d more", p.Runs-len(p.First))
	}
	return fmt.Sprintf("%d run(s) are pinned to it: %s%s (outpost runs show ID)", p.Runs, strings.Join(p.First, ", "), more)
}

// storePins reads the bundles the runs of the data folder dir are pinned
// to, from its store opened read-only under the folder's lock, which the
// caller holds; a folder with no store has no runs.
func storePins(ctx context.Context, dir string) (*store.BundlePins, error) {
	if storeExists(dir) != nil {
		return &store.BundlePins{}, nil
	}
	db, err := store.OpenHeld(dir, store.Options{})
	if err != nil {
		return nil, explainOpen(dir, err)
	}
	pins, err := db.PinnedBundles(ctx)
	return pins, errors.Join(err, db.Close())
}
