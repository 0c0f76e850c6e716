package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
)

func init() {
	register("db", "check, back up, compact, prune or salvage the store", runDB, subNames(dbSubs)...)
}

const dbUsage = `Usage: outpost db <check|backup|compact|prune|salvage> [flags]

  check              verify bbolt's pages, every record's checksum, that every referenced blob exists
                     and that the outcome ledger's hash chain is whole; count the file's space: pages
                     in use, free pages, room to grow into; warn of runs waiting for a person whose
                     pinned bundle is on disk nowhere (stranded) (read-only: the store is not changed)
  check --file FILE  the same for a store file outside a data folder, such as a backup
  backup FILE        write a consistent copy of the store to FILE, then check the copy (works while
                     serve runs); a copy that does not check clean is removed
  compact            rewrite the store without free pages, in the current page size (stop serve
                     first); interrupted or failing (a full disk), it leaves the store as it was
  prune --older-than D
                     drop the intermediate checkpoints of finished threads idle for D (720h, 30d,
                     1d12h; 0s takes every idle thread), then collect the blobs nothing names (a
                     blob is kept for at least 24h, whatever D); remove the copies of embedded
                     bundles kept in DATA/firmware/.embedded that no run refers to
  salvage FILE       copy every record that can still be read from a damaged store (one that
                     will not open, or that check finds pages of) into a new store FILE, and
                     say what was lost (stop serve first; the store itself is not changed);
                     --appliance-id ID gives the copy the appliance ID where nothing left names it

Every subcommand takes --data DIR and --json; "outpost db SUBCOMMAND -h" lists its flags.
Under --json, results go to stdout as JSON and errors to stderr as text, with a non-zero exit.
`

// dbSub is one db subcommand: its positional argument (none, or "FILE"),
// what its usage line adds, and what its -h says above the flags.
type dbSub struct {
	arg, synopsis, about string
}

var dbSubs = []sub[dbSub]{
	{"check", dbSub{about: `Verify the store: bbolt's pages, every record's checksum and decoding, that every referenced
blob exists, and that the outcome ledger's hash chain is whole; count the file's space.
The store is opened read-only and is not changed. While serve runs, the check goes
through serve's control socket. Files beside the store that a compaction which stopped
midway left (outpost.db.compact, outpost.db.compact-upgrade, outpost.db.probe-*) are named as
leftovers; they do not make the check fail, and the next compact removes them. Runs waiting for a person whose
pinned bundle is on disk nowhere (neither installed, nor kept, nor embedded in this binary)
are named too (stranded in --json), as serve, run and resume warn of them at a start; they
do not make the check fail.
To check a store file outside a data folder, such as a backup: outpost db check --file FILE.`}},
	{"backup", dbSub{arg: "FILE", about: `Write a consistent copy of the store to FILE, a new file (an existing one is never
overwritten), then check the copy. Works while serve runs. A copy that does not check clean
is removed, and the message says whether the fault is in the store itself.`}},
	{"compact", dbSub{about: `Rewrite the store without free pages, in the current page size. Stop serve first.
The store is read, not written, until the copy takes its place: interrupted, or failing (a disk
that fills, a folder that is not writable), it leaves the store byte for byte as it was. The copy
is written beside the store (outpost.db.compact) and renamed into its place. Leftovers of a
compaction that stopped midway are removed first, and named on stderr. A store of an older
format comes out in the current one, upgraded as serve's first open would upgrade it and
checked before it takes the store's place (outpost.db.compact-upgrade holds the copy upgraded).`}},
	{"prune", dbSub{synopsis: "--older-than D", about: `Drop the intermediate checkpoints of finished threads idle for --older-than, then collect
the blobs nothing names (a blob is kept for at least 24h, whatever --older-than).
Then remove the copies of embedded bundles kept in DATA/firmware/.embedded that no run, of
any status, refers to (kept_removed in --json; null when the store's owner, an older
serve, did not look at them); the next run that pins such a bundle keeps it again.
While serve (or run) owns the store, the prune goes through it, and the copy of its own
embedded bundle stays: it may pin a new run to it at any moment. A failure after the
store's prune has committed (removing a kept copy) is said after the prune's report.`}},
	{"salvage", dbSub{arg: "FILE", about: `Copy every record that can still be read from a damaged store into a new store FILE,
and say what was lost. Stop serve first; the store itself is not changed.
The copy keeps the appliance ID its outcomes go upstream as. Where the store's record of it
is lost, it is taken from the outcomes copied, else from --appliance-id, else from an older
copy of the store's meta records; where nothing names it, the copy gets a new one, and the
report says so.`}},
}

func runDB(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := subFirst("db", dbUsage, "subcommand", subNames(dbSubs), args); err != nil {
		return err
	}
	if isHelp(args[0]) {
		return groupHelp(dbUsage, stdout)
	}
	name := args[0]
	sub, ok := findSub(dbSubs, name)
	if !ok {
		return unknownSub(dbUsage, "unknown db subcommand %q", name)
	}
	synopsis := strings.Join(strings.Fields("db "+name+" "+sub.synopsis+" [flags] "+sub.arg), " ")
	fs := newCmdFlags("db "+name, synopsis, stdout, stderr)
	fs.About = sub.about
	data := dataFlag(fs.FlagSet)
	fs.Lookup("data").Usage = "the data folder `DIR` (or set $OUTPOST_DATA)"
	asJSON := fs.Bool("json", false, "print JSON")
	var file, applianceID string
	var olderThan age
	switch name {
	case "check":
		fs.StringVar(&file, "file", "", "check the store file `FILE`, such as a backup, instead of the data folder's (read-only)")
	case "salvage":
		fs.StringVar(&applianceID, "appliance-id", "", "the appliance `ID` to give the copy when the store's own is lost and no outcome copied names it")
	case "prune":
		fs.Var(&olderThan, "older-than", "prune the finished threads whose newest checkpoint is older than `D`: 720h, 30d, 1d12h, 90m; 0s takes every one")
	}
	if err := fs.parse(args[1:], false); err != nil {
		return err
	}
	synopsis = "outpost " + synopsis
	var dst string
	switch {
	case sub.arg != "" && fs.NArg() == 0:
		return badUsage("%s needs the file to write: usage: %s", name, synopsis)
	case name == "check" && fs.NArg() > 0:
		file := "FILE"
		if fi, err := os.Stat(fs.Arg(0)); err == nil && fi.Mode().IsRegular() {
			file = fs.Arg(0)
		}
		return badUsage("unexpected argument %q: usage: %s; to check a store file, such as a backup: outpost db check --file %s",
			fs.Arg(0), synopsis, file)
	case sub.arg != "" && fs.NArg() > 1:
		return badUsage("unexpected argument %q: usage: %s", fs.Arg(1), synopsis)
	case sub.arg == "" && fs.NArg() > 0:
		return badUsage("unexpected argument %q: usage: %s", fs.Arg(0), synopsis)
	case sub.arg != "":
		dst = fs.Arg(0)
	}
	switch name {
	case "check":
		if file != "" && flagGiven(fs.FlagSet, "data") {
			return usageError("give --data DIR or --file FILE, not both")
		}
		return dbCheck(ctx, *data, file, *asJSON, stdout, stderr)
	case "backup":
		return dbBackup(ctx, *data, dst, *asJSON, stdout, stderr)
	case "compact":
		return dbCompact(ctx, *data, *asJSON, stdout, stderr)
	case "prune":
		switch {
		case !olderThan.set:
			return badUsage("prune needs --older-than, how long a finished thread has been idle: 720h, 30d, 1d12h (0s takes every idle thread)")
		case olderThan.d < 0:
			return badUsage("--older-than %s is negative: give how long a finished thread has been idle, 0s or more, such as 720h or 30d", olderThan.text)
		}
		return dbPrune(ctx, *data, olderThan.d, *asJSON, stdout, stderr)
	}
	if err := checkApplianceIDFlag(applianceID); err != nil {
		return err
	}
	return dbSalvage(ctx, *data, dst, store.SalvageOptions{ApplianceID: applianceID}, *asJSON, stdout, stderr)
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// age is a flag.Value for a duration that also takes days, as operators
// write them: "30d", "1d12h", "1.5d", besides what time.ParseDuration
// reads ("720h", "90m", "0s").
type age struct {
	d    time.Duration
	text string
	set  bool
}

func (a *age) String() string { return a.text }

func (a *age) Set(s string) error {
	if len(s) > 1 && s[0] == '-' && (s[1] == '-' || unicode.IsLetter(rune(s[1]))) {
		// The flag package takes the next word as the value, whatever it
		// is: "--older-than --data D" would read "--data" here.
		return fmt.Errorf("%s is a flag, not a duration: the duration goes right after the flag, as in --older-than 720h", s)
	}
	d, err := parseAge(s)
	if errors.Is(err, errAgeTooLong) {
		return fmt.Errorf("too long: at most %dd (about %d years), such as 720h or 30d", maxAgeDays, maxAgeDays/365)
	}
	if err != nil {
		return errors.New("want a duration such as 720h, 30d, 1d12h or 90m (units d, h, m, s)")
	}
	a.d, a.text, a.set = d, s, true
	return nil
}

// maxAgeDays is the most days an age holds, a little under what a
// time.Duration does.
const maxAgeDays = math.MaxInt64/int64(24*time.Hour) - 1

// errAgeTooLong is parseAge's error for a well-formed duration longer than
// a time.Duration holds.
var errAgeTooLong = errors.New("duration too long")

// parseAge reads a time.ParseDuration duration that may begin with a
// number of days ("30d", "1d12h").
func parseAge(s string) (time.Duration, error) {
	i := strings.IndexByte(s, 'd')
	if i < 0 {
		d, err := time.ParseDuration(s)
		if err != nil && overflows(s) {
			return 0, fmt.Errorf("%w: %q", errAgeTooLong, s)
		}
		return d, err
	}
	num, rest := s[:i], s[i+1:]
	sign := time.Duration(1)
	if strings.HasPrefix(num, "-") {
		sign, num = -1, num[1:]
	} else {
		num = strings.TrimPrefix(num, "+")
	}
	if num == "" || strings.Trim(num, "0123456789.") != "" || strings.Count(num, ".") > 1 || strings.ContainsAny(rest, "+-d") {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	days, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	if days > float64(maxAgeDays) {
		return 0, fmt.Errorf("%w: %q", errAgeTooLong, s)
	}
	d := time.Duration(days * float64(24*time.Hour))
	if rest != "" {
		r, err := time.ParseDuration(rest)
		switch {
		case err != nil && overflows(rest), err == nil && r > math.MaxInt64-d:
			return 0, fmt.Errorf("%w: %q", errAgeTooLong, s)
		case err != nil:
			return 0, fmt.Errorf("bad duration %q", s)
		}
		d += r
	}
	return sign * d, nil
}

// overflows reports whether time.ParseDuration refuses s for its size
// alone: s reads as a duration once every run of digits is made "1".
func overflows(s string) bool {
	var b strings.Builder
	for i, c := range s {
		isDigit := c >= '0' && c <= '9'
		if isDigit && i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
			continue
		}
		if isDigit {
			c = '1'
		}
		b.WriteRune(c)
	}
	_, err := time.ParseDuration(b.String())
	return err == nil
}

// storeFile is the store file of the data folder dir, which must exist.
// One that holds nothing of a store (empty, all zeros) is refused by the
// store when it is opened.
func storeFile(dir string) (string, error) {
	if err := storeExists(dir); err != nil {
		return "", err
	}
	return filepath.Join(dir, store.FileName), nil
}

// withStore opens the store for writing, or reaches the process that owns
// it through its control socket.
func withStore(dir string, local func(*store.DB) error, remote func(*store.Control) error) error {
	return openOrDial(dir, store.Options{}, local, remote)
}

// withStoreReadOnly is withStore for work that only reads: opening the
// store read-only commits nothing and upgrades no older format in place
// (an older version the binary can read is read as it is).
func withStoreReadOnly(dir string, local func(*store.DB) error, remote func(*store.Control) error) error {
	return openOrDial(dir, store.Options{ReadOnly: true}, local, remote)
}

// openOrDial opens the store in dir with opts, or reaches the process that
// owns it through its control socket. A read-only open still waits for a
// writer's lock, so a store that serve holds is reached through serve.
func openOrDial(dir string, opts store.Options, local func(*store.DB) error, remote func(*store.Control) error) error {
	if _, err := storeFile(dir); err != nil {
		return err
	}
	// A process that owns the store answers on its socket at once, where
	// opening would first wait out the lock's timeout. A socket that a
	// killed owner left behind answers nothing: then the file is opened.
	if remote != nil {
		if c, err := store.DialControl(dir); err == nil {
			if err := remote(c); !unanswered(err) {
				return err
			}
		}
	}
	db, err := store.OpenDir(dir, opts)
	if errors.Is(err, store.ErrInUse) && remote != nil {
		c, cerr := store.DialControl(dir)
		if cerr != nil {
			return fmt.Errorf("%w, and its owner serves no control socket (%v)", err, cerr)
		}
		return remote(c)
	}
	if err != nil {
		return explainOpen(dir, err)
	}
	defer db.Close()
	return local(db)
}

// unanswered says a control socket had no one behind it.
func unanswered(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// newFileAt checks that dst can be made as a new file: it does not exist,
// is not a folder, and its folder exists. The store's writers check again;
// this says what is wrong in the operator's terms, before any work.
func newFileAt(dst string) error {
	if fi, err := os.Stat(dst); err == nil {
		if fi.IsDir() {
			return fmt.Errorf("%s is a folder: give a file name, such as %s", dst, filepath.Join(dst, "outpost-"+time.Now().Format("2006-01-02")+".db"))
		}
		return fmt.Errorf("%s already exists: it is never overwritten; give a new file name", dst)
	}
	parent := filepath.Dir(dst)
	fi, err := os.Stat(parent)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("folder %s does not exist", parent)
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s is not a folder", parent)
	}
	return nil
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

func dbCheck(ctx context.Context, dir, file string, asJSON bool, stdout, stderr io.Writer) error {
	var rep *store.CheckReport
	ctx = withProgress(ctx, "check", "read", stderr)
	var err error
	if file != "" {
		rep, err = checkFile(ctx, file)
	} else {
		err = withStoreReadOnly(dir,
			func(db *store.DB) (err error) {
				if rep, err = db.Check(ctx); err != nil {
					return err
				}
				return checkStranded(ctx, dir, newLocalRuns(dir, db), rep, stderr)
			},
			func(c *store.Control) (err error) {
				if rep, err = c.Check(ctx); err != nil {
					return err
				}
				return checkStranded(ctx, dir, c, rep, stderr)
			})
	}
	if err != nil {
		return err
	}
	if rep.Problems == nil {
		rep.Problems = []store.Problem{}
	}
	if asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "checked %d records: %s\n", sum(rep.Records), countsText(rep.Records))
		if sp := rep.Space; sp != nil {
			fmt.Fprintf(stdout, "store file %.2f MB in pages of %d KB: %.2f MB in use, %.2f MB of free pages (db compact gives them back), %.2f MB room to grow into\n",
				float64(sp.FileBytes)/1e6, sp.PageSize/1024, float64(sp.UsedBytes)/1e6, float64(sp.FreeBytes)/1e6,
				float64(max(sp.FileBytes-sp.UsedBytes-sp.FreeBytes, 0))/1e6)
		}
		if chainVerified(rep) {
			fmt.Fprintf(stdout, "outcome ledger: the hash chain of its %d record(s) is whole\n", rep.Records["outcomes"])
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(stdout, "PROBLEM %s\n", p)
		}
		for _, name := range rep.Leftovers {
			fmt.Fprintf(stdout, "leftover %s: left by a compaction that stopped midway, of no use; the next outpost db compact removes it, or remove it\n",
				filepath.Join(dir, name))
		}
		for _, sr := range rep.Stranded {
			if sr.Held {
				fmt.Fprintf(stdout, "WARNING run %s was left unfinished and is held, waiting for its pinned bundle: %s\n", sr.Run, sr.Reason)
				continue
			}
			fmt.Fprintf(stdout, "WARNING run %s waits for a person but cannot go on: %s\n", sr.Run, sr.Reason)
		}
		if rep.OK() {
			fmt.Fprintln(stdout, "store is sound")
		}
	}
	switch {
	case rep.OK():
		return nil
	case file != "":
		// A copy with problems is no backup to restore; what it still
		// holds can be copied out.
		return fmt.Errorf("%d problem(s) found: %s\n%s", len(rep.Problems), store.Options{Copy: true}.DamageAdvice(), salvageFileHint)
	}
	return fmt.Errorf("%d problem(s) found", len(rep.Problems))
}

// checkStranded adds to rep the runs of the data folder dir that wait for
// a person and cannot go on, their pinned bundle being on disk nowhere, as
// the starts of serve, run and resume warn of them, and the runs left
// unfinished that wait for their pinned bundle (engine.Run.Held): those
// serve holds, through its socket, or those the next start would hold,
// read from the store itself. It writes nothing.
//
// A firmware folder that cannot be read (a malformed key file in
// DATA/keys) does not fail the check of the store: it is said on stderr,
// and the runs are left unchecked.
func checkStranded(ctx context.Context, dir string, rs runReader, rep *store.CheckReport, stderr io.Writer) error {
	resolve, err := pinnedResolver(dir)
	if err != nil {
		fmt.Fprintf(stderr, "WARNING: the runs waiting for a person were not checked for their pinned bundles: %v\n", err)
		return nil
	}
	if rep.Stranded, err = strandedRuns(ctx, rs, resolve, false); err != nil {
		return err
	}
	// Through the socket, a listing by live status: a run stored queued
	// is listed under one of the two.
	for _, st := range []engine.RunStatus{engine.StatusQueued, engine.StatusRunning} {
		runs, err := rs.Runs(ctx, engine.RunFilter{Status: st, Summary: true, Damaged: func(string, error) {}}) // named by the check
		if err != nil {
			return err
		}
		for _, r := range runs {
			// Through the socket the owner's listing says it; read from
			// the store itself, the next start's resolver (viewRun's,
			// without the step count it reads checkpoints for).
			h := r.Held
			if l, local := rs.(localRuns); local && l.held != nil {
				h = l.held(r)
			}
			if h != nil {
				rep.Stranded = append(rep.Stranded, store.StrandedRun{Run: r.ID, Bundle: r.Bundle, Reason: h.Reason, Held: true})
			}
		}
	}
	return nil
}

// checkFile checks the store file at path, read-only.
func checkFile(ctx context.Context, path string) (*store.CheckReport, error) {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, fmt.Errorf("no store file %s: %w", path, err)
	case fi.IsDir():
		return nil, fmt.Errorf("%s is a folder: --file names a store file; for a data folder use --data %s", path, path)
	}
	db, err := store.Open(path, store.Options{ReadOnly: true, Copy: true})
	if err != nil {
		return nil, explainOpenFile(path, err)
	}
	defer db.Close()
	return db.Check(ctx)
}

// salvageFileHint says how to salvage a store file of any name: db
// salvage reads DIR/outpost.db alone.
const salvageFileHint = "(with no sound copy, copy out what can still be read: copy the file into an empty folder as " + store.FileName +
	", then run outpost db salvage --data FOLDER NEWFILE)"

// explainOpenFile is explainOpen for a store file checked with --file,
// such as a backup: it speaks of the file, not of a data folder (the
// store's own advice speaks of a copy: store.Options.Copy). db
// salvage reads DIR/outpost.db alone, so the hint to salvage a file of
// another name says to put it there.
func explainOpenFile(path string, err error) error {
	switch {
	case errors.Is(err, store.ErrInUse):
		return fmt.Errorf("%w\n(another outpost process, such as serve, owns this file: outpost db check --data %s checks it through that process)",
			err, shellQuote(filepath.Dir(path)))
	case errors.Is(err, store.ErrBucketsMissing), errors.Is(err, store.ErrOlderFormat):
		return err // its own message says what to do
	case errors.Is(err, store.ErrFormat):
		return fmt.Errorf("%w\n(this file was written by an incompatible outpost version, or is not an outpost store)", err)
	case filepath.Base(path) != store.FileName && errors.Is(err, store.ErrDamaged) && !errors.Is(err, store.ErrHollow):
		return fmt.Errorf("%w\n%s", err, salvageFileHint)
	}
	return explainOpen(filepath.Dir(path), err)
}

// chainVerified reports whether check walked the outcome ledger and found
// its hash chain whole: no problem of the file (which stops the walk
// before the records) and none in the outcomes bucket.
func chainVerified(rep *store.CheckReport) bool {
	for _, p := range rep.Problems {
		if p.Bucket == "" || p.Bucket == "outcomes" {
			return false
		}
	}
	return true
}

// recordKinds names the record counts of a check or a salvage, by bucket,
// in the order they are printed; the first ones are printed even at 0.
var recordKinds = []struct{ bucket, name string }{
	{"checkpoints", "checkpoints"}, {"recent", "recent checkpoints"}, {"heads", "thread heads"}, {"branches", "branches"},
	{"writes", "pending writes"}, {"bloblog", "blobs"}, {"blobindex", "blob index entries"}, {"runs", "runs"},
	{"outcomeruns", "outcome index entries"}, {"unfinished", "unfinished run index entries"}, {"toolcalls", "tool calls"}, {"outcomes", "outcomes"},
	{"uplink", "uplink cursor"}, {"meta", "meta records"},
}

// alwaysCounted are the record kinds printed even at 0; check counts the
// recent bucket's checkpoints as checkpoints, so it shows only in a
// salvage's count, where the copy's buckets are counted as they are.
var alwaysCounted = map[string]bool{"checkpoints": true, "heads": true, "branches": true, "writes": true, "bloblog": true,
	"blobindex": true, "runs": true, "outcomeruns": true, "toolcalls": true, "outcomes": true}

// countsText lists the counts so that they add up to sum(counts): every
// bucket counted is named, those this binary has no name for by bucket.
func countsText(counts map[string]int) string {
	var parts []string
	seen := map[string]bool{}
	for _, k := range recordKinds {
		seen[k.bucket] = true
		if n := counts[k.bucket]; n > 0 || alwaysCounted[k.bucket] {
			parts = append(parts, fmt.Sprintf("%s %d", k.name, n))
		}
	}
	var others []string
	for b := range counts {
		if !seen[b] {
			others = append(others, b)
		}
	}
	sort.Strings(others)
	for _, b := range others {
		parts = append(parts, fmt.Sprintf("%s %d", b, counts[b]))
	}
	return strings.Join(parts, ", ")
}

func dbBackup(ctx context.Context, dir, dst string, asJSON bool, stdout, stderr io.Writer) error {
	if err := newFileAt(dst); err != nil {
		return err
	}
	start, last := time.Now(), time.Now()
	ctx = store.WithCopyProgress(ctx, func(copied, total int64) {
		if time.Since(last) >= 3*time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "backup: %.1f of %.1f MB copied in %s…\n", float64(copied)/1e6, float64(total)/1e6, time.Since(start).Round(time.Second))
		}
	})
	var size int64
	err := withStoreReadOnly(dir,
		func(db *store.DB) (err error) {
			if err := db.BackupFile(ctx, dst); err != nil {
				return err
			}
			size, err = verifyBackup(ctx, dir, dst, func() (*store.CheckReport, error) { return db.Check(ctx) })
			return err
		},
		func(c *store.Control) (err error) {
			if err := c.BackupFile(ctx, dst); err != nil {
				return err
			}
			size, err = verifyBackup(ctx, dir, dst, func() (*store.CheckReport, error) { return c.Check(ctx) })
			return err
		})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, map[string]any{"file": dst, "bytes": size, "seconds": time.Since(start).Seconds(), "checked": true})
	}
	fmt.Fprintf(stdout, "backed up %s to %s (%.2f MB, checked) in %s\n", dir, dst, float64(size)/1e6, time.Since(start).Round(time.Millisecond))
	return nil
}

// verifyBackup checks the copy just written to dst and returns its size. A
// copy that does not open or check clean is removed, so that a file left
// under a backup's name is always a sound one; checkStore, the store's own
// check, then tells whether the fault is in the store (the copy is taken
// page for page, so it holds the store's faults) or in the copy.
func verifyBackup(ctx context.Context, dir, dst string, checkStore func() (*store.CheckReport, error)) (int64, error) {
	var fault string
	b, err := store.Open(dst, store.Options{ReadOnly: true, Copy: true})
	if err == nil {
		rep, cerr := b.Check(ctx)
		size, _ := b.Size()
		err = errors.Join(cerr, b.Close())
		switch {
		case err == nil && rep.OK():
			return size, nil
		case err == nil:
			fault = fmt.Sprintf("%d problem(s); first: %s", len(rep.Problems), rep.Problems[0])
		default:
			fault = fmt.Sprintf("could not be checked: %v", err)
		}
	} else {
		fault = fmt.Sprintf("does not open: %v", err)
	}
	removed := fmt.Sprintf("%s was removed", dst)
	if rerr := os.Remove(dst); rerr != nil {
		removed = fmt.Sprintf("%s could not be removed (%v): do not keep it as a backup", dst, rerr)
	}
	live, err := checkStore()
	switch {
	case err != nil:
		return 0, fmt.Errorf("the backup %s; %s. Checking the store in %s, to tell whether the fault is there, failed too: %w", fault, removed, dir, err)
	case !live.OK():
		return 0, fmt.Errorf("the store in %s is damaged: it has %d problem(s); first: %s. The backup copied the damage (%s); %s. "+
			"Run outpost db check --data %s for the list, and outpost db salvage --data %s FILE to copy out what can still be read",
			dir, len(live.Problems), live.Problems[0], fault, removed, dir, dir)
	}
	return 0, fmt.Errorf("the backup %s, but the store in %s checks clean: the copy was damaged as it was written "+
		"(look at the disk that holds it); %s; try again", fault, dir, removed)
}

func dbCompact(ctx context.Context, dir string, asJSON bool, stdout, stderr io.Writer) error {
	path, err := storeFile(dir)
	if err != nil {
		return err
	}
	ctx = withProgress(ctx, "compact", "copied", stderr)
	c, err := store.CompactFile(ctx, path, store.Options{})
	for _, name := range c.Removed {
		fmt.Fprintf(stderr, "removed %s, left by a compaction that stopped midway\n", filepath.Join(dir, name))
	}
	if errors.Is(err, store.ErrInUse) {
		return fmt.Errorf("%w: compact needs the store to itself; stop serve first", err)
	}
	if err != nil {
		return explainOpen(dir, err)
	}
	if asJSON {
		out := map[string]any{"bytes_before": c.Before, "bytes_after": c.After}
		if len(c.Removed) > 0 {
			out["leftovers_removed"] = c.Removed
		}
		if c.UpgradedFrom != 0 {
			out["upgraded_from"] = c.UpgradedFrom
		}
		return printJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "compacted %s: %.2f MB -> %.2f MB\n", dir, float64(c.Before)/1e6, float64(c.After)/1e6)
	if c.UpgradedFrom != 0 {
		fmt.Fprintf(stdout, "%s\n", upgradedText(c.UpgradedFrom, "the compacted copy was checked before it took the store's place"))
	}
	return nil
}

// upgradedText says that a db command upgraded the store from the older
// format version from to the current one, as serve or run would have at
// their first open; how adds how it was made safe.
func upgradedText(from int, how string) string {
	return fmt.Sprintf("upgraded the store from format version %d to %d, as serve or run do at their first open (%s); "+
		"an older outpost binary no longer opens it", from, store.FormatVersion, how)
}

func dbPrune(ctx context.Context, dir string, olderThan time.Duration, asJSON bool, stdout, stderr io.Writer) error {
	var rep *store.PruneReport
	ctx = withProgress(ctx, "prune", "read", stderr)
	err := withStore(dir,
		func(db *store.DB) error {
			if v := db.UpgradedFrom(); v != 0 {
				// Said before the prune's report, which is stdout's
				// under --json: the upgrade has committed whatever follows.
				fmt.Fprintf(stderr, "%s\n", upgradedText(v, "in one transaction, before the prune"))
			}
			r, err := db.Prune(ctx, olderThan, time.Now())
			if err != nil {
				return err
			}
			rep = r
			// This process holds the store: no other pins a run meanwhile,
			// and the copy of its own embedded bundle goes too when no run
			// refers to it (the next run that pins it keeps it again).
			return reclaimKept(ctx, dir, nil, db, nil, rep)
		},
		// The owner reclaims the kept copies itself (keptReclaimer). A
		// failure after the store's prune comes with its report.
		func(c *store.Control) (err error) {
			rep, err = c.Prune(ctx, olderThan)
			return err
		})
	if rep == nil {
		return err
	}
	// The store's prune has committed: what it removed is said whatever
	// failed after it, then the failure.
	if err != nil {
		err = fmt.Errorf("the store was pruned (reported above), then: %w", err)
	}
	if asJSON {
		return errors.Join(printJSON(stdout, rep), err)
	}
	fmt.Fprintf(stdout, "pruned %d thread(s): %d checkpoints, %d pending writes, %d blobs (%.2f MB) removed; %d checkpoints rewritten as snapshots\n",
		rep.Threads, rep.CheckpointsRemoved, rep.WritesRemoved, rep.BlobsRemoved, float64(rep.BlobBytesRemoved)/1e6, rep.Rewritten)
	if rep.CallsRemoved > 0 {
		fmt.Fprintf(stdout, "removed %d call record(s) of runs a crash lost before they were stored\n", rep.CallsRemoved)
	}
	switch {
	case rep.KeptRemoved == nil:
		// An owner from before the kept copies were reclaimed prunes the
		// store alone.
		fmt.Fprintf(stdout, "the kept copies of embedded bundles in %s were not looked at: the store's owner (serve, or run) did not report them "+
			"(an older binary?); to remove those no run refers to, run outpost db prune --data %s with it stopped, or upgrade it\n",
			filepath.Join(dir, "firmware", ".embedded"), shellQuote(dir))
	case *rep.KeptRemoved > 0:
		fmt.Fprintf(stdout, "removed %d kept copy(ies) of embedded bundles that no run refers to (from %s)\n",
			*rep.KeptRemoved, filepath.Join(dir, "firmware", ".embedded"))
	}
	for _, p := range rep.Skipped {
		fmt.Fprintf(stdout, "skipped %s\n", p)
	}
	if rep.CheckpointsRemoved+rep.WritesRemoved+rep.BlobsRemoved+rep.CallsRemoved > 0 {
		fmt.Fprintln(stdout, "run \"outpost db compact\" to give the freed pages back to the file system")
	}
	return err
}

// reclaimKept removes the copies of embedded bundles kept in the firmware
// folder of the data folder dir that no run refers to: none of db's run
// records, of any status, nor of live's runs not stored yet (nil: none),
// and counts them in rep; keep names copies that stay whatever. in is the
// folder's installer, or nil to open it here. The caller holds the store
// against every other process that pins runs (it owns it). A run record
// that cannot be read may refer to any copy: then none is removed, and
// rep says why.
func reclaimKept(ctx context.Context, dir string, in *firmware.Installer, db *store.DB, live store.LiveRuns, rep *store.PruneReport, keep ...engine.BundleRef) error {
	// Looked at, whatever comes of it: nil is an owner that did not look.
	rep.KeptRemoved = new(int)
	if in == nil {
		if _, err := os.Stat(filepath.Join(dir, "firmware", ".embedded")); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		// The copies are neither verified nor opened: no key is needed.
		// A firmware folder that cannot be read (a damaged index) leaves
		// the copies, and the store's prune stands.
		var err error
		if in, err = firmware.NewInstaller(dir, nil, firmware.InstallerOptions{ApplianceVersion: version}); err != nil {
			rep.Skipped = append(rep.Skipped, store.Problem{Message: fmt.Sprintf("no kept copy of an embedded bundle was removed: %v", err)})
			return nil
		}
	}
	// The runs not stored yet are read first: one stored meanwhile is
	// then found by the walk of the records after.
	unstored := map[engine.BundleRef]bool{}
	if live != nil {
		for _, r := range live.Unstored(engine.RunFilter{}) {
			unstored[r.Bundle] = true
		}
	}
	pins, err := db.PinnedBundles(ctx)
	if err != nil {
		return err
	}
	if len(pins.Damaged) > 0 {
		rep.Skipped = append(rep.Skipped, store.Problem{Bucket: "runs", Key: pins.Damaged[0], Message: fmt.Sprintf(
			"cannot be read (%d run record(s) in all), so which bundle it is pinned to is not known: "+
				"no kept copy of an embedded bundle was removed (outpost db check names the records)", len(pins.Damaged))})
		return nil
	}
	removed, err := in.RemoveKept(func(ref engine.BundleRef) bool { return pins.ByBundle[ref] != nil || unstored[ref] }, keep...)
	*rep.KeptRemoved = len(removed)
	if err != nil {
		return err
	}
	stray, err := in.StrayKept()
	for _, p := range stray {
		rep.Skipped = append(rep.Skipped, store.Problem{Message: strayKeptText(p)})
	}
	return err
}

// keptReclaimer is the control socket's AfterPrune of the process that
// owns the store of dir, db, and runs its runs (live) on the embedded
// bundle own and the bundles of in (nil: opened at each prune): a prune
// through the socket reclaims the kept copies no run refers to, but the
// copy of own, which this process may pin a new run to at any moment.
func keptReclaimer(dir string, db *store.DB, live store.LiveRuns, in *firmware.Installer, own engine.BundleRef) store.ControlOptions {
	return store.ControlOptions{AfterPrune: func(ctx context.Context, rep *store.PruneReport) error {
		return reclaimKept(ctx, dir, in, db, live, rep, own)
	}}
}

func dbSalvage(ctx context.Context, dir, dst string, opts store.SalvageOptions, asJSON bool, stdout, stderr io.Writer) error {
	src, err := storeFile(dir)
	if err != nil {
		return err
	}
	if err := newFileAt(dst); err != nil {
		return err
	}
	rep, err := store.SalvageWith(withProgress(ctx, "salvage", "copied", stderr), src, dst, opts)
	if errors.Is(err, store.ErrInUse) {
		return fmt.Errorf("%w: salvage reads the store file itself; stop serve first", err)
	}
	if err != nil {
		return err
	}
	if rep.Lost == nil {
		rep.Lost = []store.Problem{}
	}
	if rep.Check != nil && rep.Check.Problems == nil {
		rep.Check.Problems = []store.Problem{}
	}
	if asJSON {
		if err := printJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "salvaged %s into %s: %d records copied (%s)\n", src, dst, sum(rep.Records), countsText(rep.Records))
		if len(rep.Unlinked) > 0 {
			fmt.Fprintf(stdout, "of them, %d found on pages that nothing led to any more (%s): "+
				"where a record's newest version was lost, an older one may be back\n", sum(rep.Unlinked), countsText(rep.Unlinked))
		}
		if rep.HeadsRebuilt > 0 {
			fmt.Fprintf(stdout, "the heads of %d thread namespace(s) were lost with the page that held them: "+
				"each is recorded anew as its newest checkpoint copied\n", rep.HeadsRebuilt)
		}
		if rep.OutcomesAppended > 0 {
			fmt.Fprintf(stdout, "%d run(s) that came back unfinished are copied as failed, each with its outcome appended to the "+
				"copy's ledger, so that the collector learns that it ended\n", rep.OutcomesAppended)
		}
		if rep.BranchesRebuilt > 0 {
			fmt.Fprintf(stdout, "the older leaves of %d thread namespace(s) were lost with the page that held them: "+
				"each namespace's leaves are recorded anew from the checkpoints copied\n", rep.BranchesRebuilt)
		}
		if rep.WritesLeftOut > 0 {
			fmt.Fprintf(stdout, "%d pending write(s) of checkpoints the copy does not hold were left out, each named below: "+
				"nothing could apply them\n", rep.WritesLeftOut)
		}
		for _, p := range rep.Lost {
			fmt.Fprintf(stdout, "LOST %s\n", p)
		}
		if rep.Check != nil {
			for _, p := range rep.Check.Problems {
				fmt.Fprintf(stdout, "PROBLEM in the copy: %s\n", p)
			}
		}
		if line := applianceLine(rep); line != "" {
			fmt.Fprintln(stdout, line)
		}
		if rep.OK() {
			fmt.Fprintln(stdout, "nothing was lost, and the copy checks clean")
		}
		fmt.Fprintf(stdout, "to use the copy: stop serve, move %s aside, move %s to %s, start serve\n", src, dst, src)
	}
	if !rep.OK() {
		problems := 0
		if rep.Check != nil {
			problems = len(rep.Check.Problems)
		}
		return fmt.Errorf("the copy is not whole: %d part(s) lost, %d problem(s) in the copy", len(rep.Lost), problems)
	}
	return nil
}

// applianceLine says where a salvaged copy's appliance ID came from when
// it is not the store's own record of it.
func applianceLine(rep *store.SalvageReport) string {
	switch rep.ApplianceFrom {
	case store.ApplianceFromOutcomes:
		return fmt.Sprintf("the appliance ID was lost; the copy keeps %s, the ID its outcomes carry", rep.ApplianceID)
	case store.ApplianceFromOption:
		return fmt.Sprintf("the appliance ID was lost; the copy takes %s, as --appliance-id gives", rep.ApplianceID)
	case store.ApplianceFromOldCopy:
		return fmt.Sprintf("the appliance ID was lost; the copy takes %s, which an older copy of the store's meta records names "+
			"(if this appliance sends its outcomes as another ID, salvage again with --appliance-id ID)", rep.ApplianceID)
	case store.ApplianceFromNew:
		return fmt.Sprintf("the copy's new appliance ID is %s", rep.ApplianceID)
	}
	return ""
}

func sum(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
