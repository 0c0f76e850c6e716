package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/outpost-edge/outpost/store"
)

func init() {
	register("db", "check, back up, compact, prune or salvage the store", runDB)
}

const dbUsage = `Usage: outpost db <check|backup|compact|prune|salvage> [flags]

  check              verify bbolt's pages, every record's checksum, and that every referenced blob exists;
                     count the file's space: pages in use, free pages, room to grow into
  backup FILE        write a consistent copy of the store to FILE (works while serve runs)
  compact            rewrite the store without free pages, in the current page size (stop serve
                     first); interrupted, it leaves the store as it was
  prune --older-than D
                     drop the intermediate checkpoints of finished threads idle for D, then collect
                     the blobs nothing names (a blob is kept for at least 24h, whatever D)
  salvage FILE       copy every record that can still be read from a damaged store (one that
                     will not open, or that check finds pages of) into a new store FILE, and
                     say what was lost (stop serve first; the store itself is not changed)

Every subcommand takes --data DIR and --json.
`

func runDB(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, fs, err := subcommand("db", dbUsage, args, stderr)
	if sub == "" {
		return err
	}
	args = args[1:]
	data := dataFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	olderThan := fs.Duration("older-than", 0, "prune: only threads whose newest checkpoint is older than this (e.g. 720h)")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch sub {
	case "check":
		return dbCheck(ctx, *data, *asJSON, stdout, stderr)
	case "backup":
		if fs.NArg() != 1 {
			return fmt.Errorf("backup needs the destination file: outpost db backup FILE")
		}
		return dbBackup(ctx, *data, fs.Arg(0), *asJSON, stdout, stderr)
	case "compact":
		return dbCompact(ctx, *data, *asJSON, stdout, stderr)
	case "prune":
		if *olderThan <= 0 {
			return fmt.Errorf("prune needs --older-than, a positive duration such as 720h")
		}
		return dbPrune(ctx, *data, *olderThan, *asJSON, stdout, stderr)
	case "salvage":
		if fs.NArg() != 1 {
			return fmt.Errorf("salvage needs the file to write: outpost db salvage FILE")
		}
		return dbSalvage(ctx, *data, fs.Arg(0), *asJSON, stdout, stderr)
	}
	fmt.Fprint(stderr, dbUsage)
	return fmt.Errorf("unknown db subcommand %q", sub)
}

// withStore opens the store, or reaches the process that owns it through
// its control socket.
func withStore(dir string, local func(*store.DB) error, remote func(*store.Control) error) error {
	if _, err := os.Stat(filepath.Join(dir, store.FileName)); err != nil {
		return fmt.Errorf("no store in %s: %w", dir, err)
	}
	db, err := store.OpenDir(dir, store.Options{})
	if errors.Is(err, store.ErrInUse) && remote != nil {
		c, cerr := store.DialControl(dir)
		if cerr != nil {
			return fmt.Errorf("%w, and its owner serves no control socket (%v)", err, cerr)
		}
		return remote(c)
	}
	if err != nil {
		_, err = openStore(dir)
		return err
	}
	defer db.Close()
	return local(db)
}

// withProgress makes a long check, prune or compaction say how far it has
// got, on stderr, every few seconds; a short one prints nothing more. done
// says what happens to the records: "read", "copied".
func withProgress(ctx context.Context, what, done string, stderr io.Writer) context.Context {
	start, last := time.Now(), time.Now()
	return store.WithProgress(ctx, func(n int) {
		if time.Since(last) >= 3*time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "%s: %d records %s in %s…\n", what, n, done, time.Since(start).Round(time.Second))
		}
	})
}

func dbCheck(ctx context.Context, dir string, asJSON bool, stdout, stderr io.Writer) error {
	var rep *store.CheckReport
	ctx = withProgress(ctx, "check", "read", stderr)
	err := withStore(dir,
		func(db *store.DB) (err error) { rep, err = db.Check(ctx); return err },
		func(c *store.Control) (err error) { rep, err = c.Check(ctx); return err })
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "checked %d records: checkpoints %d, pending writes %d, blobs %d (%d indexed), runs %d, tool calls %d, outcomes %d\n",
			sum(rep.Records), rep.Records["checkpoints"], rep.Records["writes"], rep.Records["bloblog"], rep.Records["blobindex"],
			rep.Records["runs"], rep.Records["toolcalls"], rep.Records["outcomes"])
		if sp := rep.Space; sp != nil {
			fmt.Fprintf(stdout, "store file %.2f MB in pages of %d KB: %.2f MB in use, %.2f MB of free pages (db compact gives them back), %.2f MB room to grow into\n",
				float64(sp.FileBytes)/1e6, sp.PageSize/1024, float64(sp.UsedBytes)/1e6, float64(sp.FreeBytes)/1e6,
				float64(max(sp.FileBytes-sp.UsedBytes-sp.FreeBytes, 0))/1e6)
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(stdout, "PROBLEM %s\n", p)
		}
		if rep.OK() {
			fmt.Fprintln(stdout, "store is sound")
		}
	}
	if !rep.OK() {
		return fmt.Errorf("%d problem(s) found", len(rep.Problems))
	}
	return nil
}

func dbBackup(ctx context.Context, dir, dst string, asJSON bool, stdout, stderr io.Writer) error {
	start, last := time.Now(), time.Now()
	ctx = store.WithCopyProgress(ctx, func(copied, total int64) {
		if time.Since(last) >= 3*time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "backup: %.1f of %.1f MB copied in %s…\n", float64(copied)/1e6, float64(total)/1e6, time.Since(start).Round(time.Second))
		}
	})
	err := withStore(dir,
		func(db *store.DB) error { return db.BackupFile(ctx, dst) },
		func(c *store.Control) error { return c.BackupFile(ctx, dst) })
	if err != nil {
		return err
	}
	// A backup that does not open is no backup.
	b, err := store.Open(dst, store.Options{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("backup written to %s but it does not open: %w", dst, err)
	}
	rep, err := b.Check(ctx)
	size, _ := b.Size()
	b.Close()
	if err != nil {
		return fmt.Errorf("check backup %s: %w", dst, err)
	}
	if !rep.OK() {
		return fmt.Errorf("backup %s has %d problem(s); first: %s", dst, len(rep.Problems), rep.Problems[0])
	}
	if asJSON {
		return printJSON(stdout, map[string]any{"file": dst, "bytes": size, "seconds": time.Since(start).Seconds(), "checked": true})
	}
	fmt.Fprintf(stdout, "backed up %s to %s (%.2f MB, checked) in %s\n", dir, dst, float64(size)/1e6, time.Since(start).Round(time.Millisecond))
	return nil
}

func dbCompact(ctx context.Context, dir string, asJSON bool, stdout, stderr io.Writer) error {
	ctx = withProgress(ctx, "compact", "copied", stderr)
	before, after, err := store.CompactFile(ctx, filepath.Join(dir, store.FileName), store.Options{})
	if errors.Is(err, store.ErrInUse) {
		return fmt.Errorf("%w: compact needs the store to itself; stop serve first", err)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, map[string]int64{"bytes_before": before, "bytes_after": after})
	}
	fmt.Fprintf(stdout, "compacted %s: %.2f MB -> %.2f MB\n", dir, float64(before)/1e6, float64(after)/1e6)
	return nil
}

func dbPrune(ctx context.Context, dir string, olderThan time.Duration, asJSON bool, stdout, stderr io.Writer) error {
	var rep *store.PruneReport
	ctx = withProgress(ctx, "prune", "read", stderr)
	err := withStore(dir,
		func(db *store.DB) (err error) { rep, err = db.Prune(ctx, olderThan, time.Now()); return err },
		func(c *store.Control) (err error) { rep, err = c.Prune(ctx, olderThan); return err })
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, rep)
	}
	fmt.Fprintf(stdout, "pruned %d thread(s): %d checkpoints, %d pending writes, %d blobs (%.2f MB) removed; %d checkpoints rewritten as snapshots\n",
		rep.Threads, rep.CheckpointsRemoved, rep.WritesRemoved, rep.BlobsRemoved, float64(rep.BlobBytesRemoved)/1e6, rep.Rewritten)
	for _, p := range rep.Skipped {
		fmt.Fprintf(stdout, "skipped %s\n", p)
	}
	fmt.Fprintln(stdout, "run \"outpost db compact\" to give the freed pages back to the file system")
	return nil
}

func dbSalvage(ctx context.Context, dir, dst string, asJSON bool, stdout, stderr io.Writer) error {
	src := filepath.Join(dir, store.FileName)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("no store in %s: %w", dir, err)
	}
	rep, err := store.Salvage(withProgress(ctx, "salvage", "copied", stderr), src, dst)
	if errors.Is(err, store.ErrInUse) {
		return fmt.Errorf("%w: salvage reads the store file itself; stop serve first", err)
	}
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "salvaged %s into %s: %d records copied (checkpoints %d, pending writes %d, blobs %d, runs %d, tool calls %d, outcomes %d)\n",
			src, dst, sum(rep.Records), rep.Records["checkpoints"]+rep.Records["recent"], rep.Records["writes"], rep.Records["bloblog"],
			rep.Records["runs"], rep.Records["toolcalls"], rep.Records["outcomes"])
		for _, p := range rep.Lost {
			fmt.Fprintf(stdout, "LOST %s\n", p)
		}
		for _, p := range rep.Check.Problems {
			fmt.Fprintf(stdout, "PROBLEM in the copy: %s\n", p)
		}
		if rep.OK() {
			fmt.Fprintln(stdout, "nothing was lost, and the copy checks clean")
		}
		fmt.Fprintf(stdout, "to use the copy: stop serve, move %s aside, move %s to %s, start serve\n", src, dst, src)
	}
	if !rep.OK() {
		return fmt.Errorf("the copy is not whole: %d part(s) lost, %d problem(s) in the copy", len(rep.Lost), len(rep.Check.Problems))
	}
	return nil
}

func sum(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
