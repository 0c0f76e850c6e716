package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/uplink"
)

func init() {
	register("uplink", "show or flush the outcome uplink to the collector", runUplink, uplinkSubs...)
}

const uplinkUsage = `Usage: outpost uplink <status|flush> [flags]

  status   the ledger's last seq, the acknowledged cursor and the backlog
  flush    send the backlog to the collector now and wait (--url and --secret-file), retrying
           until --timeout (1m) while the collector is down, and saying so every few seconds

Flags: --data DIR, --url URL, --appliance-id ID, --secret-file FILE, --timeout D, --json.
--uplink and --uplink-secret, as serve names them, are --url and --secret-file.
While serve runs, it owns the store: status reads the ledger through its
control socket and says whether serve sends the uplink, and to where; flush
is refused (serve --uplink sends it; GET /api/v1/uplink shows it).
`

// uplinkSubs are the uplink subcommands, which runUplink tells apart.
var uplinkSubs = []string{"status", "flush"}

func runUplink(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, fs, err := subcommand("uplink", uplinkUsage, uplinkSubs, args, stdout, stderr)
	if sub == "" {
		return err
	}
	if !slices.Contains(uplinkSubs, sub) {
		return unknownSub(uplinkUsage, "unknown uplink subcommand %q", sub)
	}
	// Each subcommand lists only its own flags.
	data := dataFlag(fs.FlagSet)
	asJSON := fs.Bool("json", false, "print JSON")
	url, appliance, secretFile, timeout := new(string), new(string), new(string), new(time.Duration)
	// serve's names of the uplink flags (--uplink, --uplink-secret) are
	// taken too, so that serve's flags can be copied here.
	if sub == "status" {
		fs.synopsis = "uplink status [--data DIR] [--url URL] [--json]"
		fs.About = `Print the outcome ledger's last seq, how far the collector has acknowledged it, and the
backlog. This command holds no uplink of its own: it reports one as configured when given
--url (serve's --uplink); without it, it says that none is and what serve takes to send
the ledger (--uplink URL --appliance-id ID --uplink-secret FILE). While serve runs, it
reads the ledger through serve's control socket and says whether serve sends the uplink,
and to which collector ("owner" in --json); GET /api/v1/uplink shows serve's own.`
		fs.StringVar(url, "url", "", "the collector's base `URL`, to report as configured")
		fs.alias("uplink", "url")
		// What serve is given, to copy as it is; status sends nothing.
		fs.StringVar(appliance, "appliance-id", "", "`ID`, taken as serve takes it, and not used: status reports the store's id")
		fs.StringVar(secretFile, "secret-file", "", "`FILE`, taken as flush takes it, and not used: status sends nothing")
		fs.alias("uplink-secret", "secret-file")
	} else {
		fs.synopsis = "uplink flush --url URL --secret-file FILE [flags]"
		fs.StringVar(url, "url", "", "the collector's base `URL`")
		fs.alias("uplink", "url")
		fs.StringVar(appliance, "appliance-id", "", "this appliance's `ID` upstream (default: the store's)")
		fs.StringVar(secretFile, "secret-file", "", "`FILE` holding this appliance's uplink secret")
		fs.alias("uplink-secret", "secret-file")
		fs.DurationVar(timeout, "timeout", time.Minute, "give up after this long")
	}
	if err := fs.parse(args[1:], false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	if *url != "" {
		if err := checkCollectorURL(givenAs(fs, "url"), *url); err != nil {
			return err
		}
	}
	switch sub {
	case "status":
		return uplinkStatus(ctx, *data, *url, *asJSON, stdout)
	case "flush":
		if *url == "" || *secretFile == "" {
			return badUsage("flush needs --url (or --uplink) and --secret-file (or --uplink-secret) (usage: outpost %s)", fs.synopsis)
		}
		if *timeout <= 0 {
			return badUsage("--timeout must be more than 0, not %s: it is how long flush waits for the collector", *timeout)
		}
		if err := checkApplianceIDFlag(*appliance); err != nil {
			return err
		}
		secret, err := loadSecretFlag(givenAs(fs, "secret-file"), *secretFile)
		if err != nil {
			return err
		}
		return uplinkFlush(ctx, *data, uplink.Config{URL: *url, ApplianceID: *appliance, Secret: secret}, *timeout, *asJSON, stdout, stderr)
	}
	return unknownSub(uplinkUsage, "unknown uplink subcommand %q", sub)
}

// uplinkStatusView is what uplink status prints under --json: the
// uplink's status, and, while a process owns the store, what that process
// says of itself and of the uplink it sends (absent when it does not say,
// as an owner from before it did not).
type uplinkStatusView struct {
	uplink.Status
	Owner *store.ControlOwner `json:"owner,omitempty"`
}

func uplinkStatus(ctx context.Context, dir, url string, asJSON bool, stdout io.Writer) error {
	var st uplinkStatusView
	served := false
	// Status only reads: the store is opened read-only, so that it is not
	// changed (not even by the transaction a writer's open commits) and a
	// read-only data folder can be asked too.
	err := withStoreReadOnly(dir,
		func(db *store.DB) error {
			u, err := uplink.New(db, uplink.Config{URL: url})
			if err != nil {
				return err
			}
			st.Status = u.Status()
			return nil
		},
		func(c *store.Control) error {
			ls, err := c.Ledger(ctx)
			if err != nil {
				return err
			}
			served = true
			st.Status = uplink.Status{ApplianceID: ls.ApplianceID, AckedSeq: ls.AckedSeq, LastSeq: ls.LastSeq, Backlog: ls.Backlog(), URL: url}
			st.Owner = dialOwner(ctx, dir)
			return nil
		})
	if err != nil {
		return err
	}
	// This command holds no secret, so it cannot tell a configured uplink
	// by one: --url is how it is told there is one.
	st.Configured = url != ""
	if asJSON {
		return printJSON(stdout, st)
	}
	printUplinkStatus(stdout, st.Status)
	switch {
	case served:
		fmt.Fprintln(stdout, ownerUplink(st.Owner))
	case !st.Configured:
		// What --json says with configured: false, for a person, with
		// what configures one.
		fmt.Fprintf(stdout, "no uplink configured: the outcomes stay in the ledger until one is; "+
			"to send them to a collector, start serve with --uplink URL --appliance-id ID --uplink-secret FILE "+
			"(--url URL here reports one as configured)\n")
	}
	return nil
}

// ownerUplink says what the process that owns the store does with the
// uplink, as it says on its control socket (o nil: it does not say).
func ownerUplink(o *store.ControlOwner) string {
	switch {
	case o == nil:
		return "a running outpost owns this store and does not say whether it sends an uplink: GET /api/v1/uplink shows serve's"
	case o.SendsUplink:
		return fmt.Sprintf("%s owns this store and sends its uplink to %s: GET /api/v1/uplink shows its last error and last success",
			o.Command, o.UplinkURL)
	}
	return fmt.Sprintf("%s is running without an uplink: the outcomes stay in the ledger until serve is started with "+
		"--uplink URL --appliance-id ID --uplink-secret FILE", o.Command)
}

// dialOwner returns what the process that owns the store in dir says of
// itself, or nil when it does not say.
func dialOwner(ctx context.Context, dir string) *store.ControlOwner {
	c, err := store.DialControl(dir)
	if err != nil {
		return nil
	}
	o, err := c.Owner(ctx)
	if err != nil || o.Command == "" {
		return nil
	}
	return &o
}

func printUplinkStatus(w io.Writer, st uplink.Status) {
	fmt.Fprintf(w, "appliance %s: %d outcomes, %d acknowledged upstream, backlog %d\n", st.ApplianceID, st.LastSeq, st.AckedSeq, st.Backlog)
	if st.LastSuccessAt != nil {
		fmt.Fprintf(w, "last success %s\n", st.LastSuccessAt.Format(time.RFC3339))
	}
	parked := ""
	if st.Parked != nil {
		p := st.Parked
		parked = (&uplink.StatusError{StatusCode: p.StatusCode, Code: p.Code, Message: p.Message}).Error()
		fmt.Fprintf(w, "PARKED outcomes %d-%d: %s\n", p.FirstSeq, p.LastSeq, parked)
	}
	// The last error is most often the parking itself, said just above.
	if st.LastError != "" && (parked == "" || !strings.Contains(st.LastError, parked)) {
		fmt.Fprintf(w, "last error: %s\n", st.LastError)
	}
}

func uplinkFlush(ctx context.Context, dir string, cfg uplink.Config, timeout time.Duration, asJSON bool, stdout, stderr io.Writer) error {
	if err := storeExists(dir); err != nil {
		return err
	}
	db, err := openStore(dir)
	if errors.Is(err, store.ErrInUse) {
		// What the owner does with the uplink: a serve without one
		// sends nothing, and stopping it is how to flush from here.
		o := dialOwner(ctx, dir)
		why := ownerUplink(o)
		if o != nil && !o.SendsUplink {
			why += "; or stop it and flush from here"
		}
		return fmt.Errorf("%w\n(%s)", err, why)
	}
	if err != nil {
		return err
	}
	defer db.Close()
	ref, _ := firmware.Reference()
	// The redaction policy of an outcome is its bundle's: installed
	// bundles that cannot be read are said, not passed over, since an
	// outcome leaves once.
	in, err := openInstalled(dir, nil)
	if err != nil {
		return explain(err)
	}
	cfg.RedactorFor = bundleRedactors(ref, in, stderr)
	ls, err := db.Ledger(ctx)
	if err != nil {
		return err
	}
	cfg.Events = newFlushProgress(stderr, ls.LastSeq, 3*time.Second)
	u, err := uplink.New(db, cfg)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := reportRetries(u, timeout, stderr, 5*time.Second)
	ferr := u.Flush(fctx)
	stop()
	st := u.Status()
	if errors.Is(ferr, context.DeadlineExceeded) && ctx.Err() == nil {
		why := "it did not answer"
		if st.LastError != "" {
			why = "last error: " + st.LastError
		}
		ferr = fmt.Errorf("the collector did not acknowledge the backlog within --timeout %s: %d outcome(s) still wait (%s); "+
			"the next flush sends them, as serve --uplink does", timeout, st.Backlog, why)
	}
	if asJSON {
		if err := printJSON(stdout, st); err != nil {
			return err
		}
	} else {
		printUplinkStatus(stdout, st)
	}
	return ferr
}

// flushProgress says how far a long flush has got: it hears of each batch
// the collector acknowledges, and prints a line every interval.
type flushProgress struct {
	w           io.Writer
	total       uint64
	every       time.Duration
	start, last time.Time
}

func newFlushProgress(w io.Writer, total uint64, every time.Duration) *flushProgress {
	now := time.Now()
	return &flushProgress{w: w, total: total, every: every, start: now, last: now}
}

func (p *flushProgress) Publish(events ...engine.Event) {
	for _, ev := range events {
		var sent struct {
			AckedSeq uint64 `json:"acked_seq"`
		}
		if ev.Type != engine.EventUplinkSent || json.Unmarshal(ev.Data, &sent) != nil || time.Since(p.last) < p.every {
			continue
		}
		p.last = time.Now()
		fmt.Fprintf(p.w, "uplink: %d of %d outcomes acknowledged in %s…\n", sent.AckedSeq, p.total, time.Since(p.start).Round(time.Second))
	}
}

// reportRetries says on w, every interval, that a flush is retrying and
// why, while the collector refuses it, or that it waits for the collector,
// while one holds the batch without an answer and none is acknowledged,
// so that a flush to a collector that is down does not sit silent until
// --timeout. The returned function stops it.
func reportRetries(u *uplink.Uplink, timeout time.Duration, w io.Writer, every time.Duration) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		t := time.NewTicker(every)
		defer t.Stop()
		acked := u.Status().AckedSeq
		for {
			select {
			case <-done:
				return
			case <-t.C:
				st := u.Status()
				took := time.Since(start).Round(time.Second)
				switch {
				case st.LastError != "":
					fmt.Fprintf(w, "uplink: %d of %d outcomes acknowledged; retrying (%s of --timeout %s): %s…\n",
						st.AckedSeq, st.LastSeq, took, timeout, st.LastError)
				case st.AckedSeq == acked:
					fmt.Fprintf(w, "uplink: %d of %d outcomes acknowledged; waiting for the collector to answer (%s of --timeout %s)…\n",
						st.AckedSeq, st.LastSeq, took, timeout)
				}
				acked = st.AckedSeq
			}
		}
	}()
	return func() { close(done); <-finished }
}

// bundleRedactors returns each outcome's redaction policy: its bundle's,
// by name, version and digest, from the embedded reference bundle ref or
// the installer in (an installed bundle, or the kept copy of an earlier
// embedded bundle, opened read-only), either of which may be nil, as
// loaded by the caller, so that serve compiles no bundle again for its
// uplink. An outcome whose bundle is unknown, or has no policy, leaves
// with its identity fields only (uplink.Config's fail-closed default); a
// bundle on disk nowhere, or that cannot be read, is said on w once.
func bundleRedactors(ref *firmware.Bundle, in *firmware.Installer, w io.Writer) func(engine.BundleRef) uplink.Redactor {
	var mu sync.Mutex
	cache := map[engine.BundleRef]uplink.Redactor{}
	return func(r engine.BundleRef) uplink.Redactor {
		mu.Lock()
		defer mu.Unlock()
		if red, ok := cache[r]; ok {
			return red
		}
		b := ref
		if ref == nil || ref.Ref() != r {
			b = nil
			why := "this binary does not embed it and this data folder has no firmware folder"
			if in != nil {
				ib, err := in.OpenPinned(r)
				switch {
				case err == nil:
					b = ib
				case errors.Is(err, firmware.ErrPinnedMissing):
					why = "this binary does not embed it, and the firmware folder holds no copy of it"
				default:
					why = err.Error()
				}
			}
			if b == nil && r.Name != "" {
				fmt.Fprintf(w, "uplink: the outcomes of bundle %s v%d (%s) leave with appliance_id, seq and outcome_id alone in clear, "+
					"since its redaction policy cannot be read: %s\n", r.Name, r.Version, r.Digest, why)
			}
		}
		var red uplink.Redactor
		if b != nil && b.Redactor != nil {
			red = b.Redactor // never a typed nil
		}
		cache[r] = red
		return red
	}
}
