package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/internal/wiring"
	"github.com/outpost-edge/outpost/models"
	"github.com/outpost-edge/outpost/models/ollama"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/uplink"
)

func init() {
	register("serve", "serve the HTTP API, the event stream and the operator console", runServe)
}

// hostList collects repeated --allow-host flags.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }
func (h *hostList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		// The console matches the Host a browser sends: a URL or a path
		// would never match, and the name would be refused at every visit.
		if strings.ContainsAny(p, "/@ \t") {
			return errors.New("want a host name, such as clinic-pc.local (or clinic-pc.local:7070), not a URL")
		}
		if p != "" {
			*h = append(*h, p)
		}
	}
	return nil
}

// consoleUplink reports the uplink for GET /api/v1/uplink; with none
// configured it still reports the ledger's backlog.
func consoleUplink(db *store.DB, up *uplink.Uplink) func(context.Context) (*console.UplinkStatus, error) {
	return func(ctx context.Context) (*console.UplinkStatus, error) {
		if up == nil {
			ls, err := db.Ledger(ctx)
			if err != nil {
				return nil, err
			}
			return &console.UplinkStatus{AckedSeq: ls.AckedSeq, LastSeq: ls.LastSeq, Backlog: ls.Backlog(),
				Note: "no uplink configured: outcomes stay on the appliance"}, nil
		}
		st := up.Status()
		return &console.UplinkStatus{Configured: st.Configured, AckedSeq: st.AckedSeq, LastSeq: st.LastSeq,
			Backlog: st.Backlog, LastError: st.LastError, LastSuccessAt: st.LastSuccessAt, ResendingFrom: st.ResendingFrom}, nil
	}
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("serve", "serve [--data DIR] [--listen ADDR] [--model scripted|ollama:NAME] [--ollama URL] [--ollama-keep-alive D] [--ollama-stall-timeout D] [--tls-cert FILE --tls-key FILE] [--allow-host NAME] [--workers N] [--max-run-time DURATION] [--max-tokens N] [--max-recoveries N] [--max-alone-time DURATION] [--max-suspect-wait DURATION] [--appliance-tools NAMES] [--uplink URL --uplink-secret FILE] [--appliance-id ID]", stdout, stderr)
	fs.About = `Serve the HTTP API (/api/v1), its event stream and the operator console page, on
--listen (http://127.0.0.1:7070/ unless told). The page and the API take a bearer token,
made at the first start: outpost token prints it. While serve runs it owns the data
folder; Ctrl-C stops it, and unfinished runs resume at the next start.`
	data := dataFlag(fs.FlagSet)
	listen := fs.String("listen", "127.0.0.1:7070", "the `ADDR` to serve on, HOST:PORT; beyond loopback it needs --tls-cert and --tls-key")
	mc := modelFlags(fs.FlagSet)
	cert := fs.String("tls-cert", "", "TLS certificate `FILE` (PEM)")
	key := fs.String("tls-key", "", "TLS private key `FILE` (PEM)")
	var hosts hostList
	fs.Var(&hosts, "allow-host", "a Host `NAME` the console answers to besides the loopback ones (repeatable)")
	workers := fs.Int("workers", 8, "runs executing at once")
	upURL := fs.String("uplink", "", "the collector `URL` to send the outcome ledger to (e.g. https://collector.site:8443)")
	applianceID := fs.String("appliance-id", "", "this appliance's `ID` upstream (default: the store's)")
	upSecret := fs.String("uplink-secret", "", "`FILE` holding the HMAC secret shared with the collector")
	bc := budgetFlags(fs.FlagSet, true)
	tools := applianceToolsFlag(fs.FlagSet)
	if err := fs.parse(args, false); err != nil {
		return err
	}
	// A folder given as an argument ("outpost serve /srv/outpost") would
	// leave the default one served.
	if _, err := fs.args(); err != nil {
		return err
	}
	budget, err := bc.budget()
	if err != nil {
		return err
	}
	if *workers < 1 {
		return badUsage("--workers must be at least 1, not %d", *workers)
	}
	if (*upURL == "") != (*upSecret == "") {
		return badUsage("--uplink and --uplink-secret go together")
	}
	if (*cert == "") != (*key == "") {
		return badUsage("--tls-cert and --tls-key go together")
	}
	if err := mc.check(); err != nil {
		return err
	}
	if err := checkListenAddr("listen", *listen, "127.0.0.1:7070"); err != nil {
		return err
	}
	if err := console.CheckListen(*listen, *cert != ""); err != nil {
		return badUsage("--listen: %v", err)
	}
	if *cert != "" {
		if err := checkTLSPair(*cert, *key); err != nil {
			return err
		}
	}
	var secret []byte
	if *upURL != "" {
		if err := checkCollectorURL("uplink", *upURL); err != nil {
			return err
		}
		if secret, err = loadSecretFlag("uplink-secret", *upSecret); err != nil {
			return err
		}
	}
	if err := checkApplianceIDFlag(*applianceID); err != nil {
		return err
	}
	// The runtime is bound to the store once it is open; the bundles the
	// check loads for it are the ones served.
	rt := &firmware.Runtime{Budget: budget, Tools: tools.restriction()}
	lb, err := checkApplianceTools(*data, loadedBundles{rt: rt})
	if err != nil {
		return err
	}
	// The address is taken first: one that is in use stops serve before
	// it makes a data folder or a store, or says anything else.
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("%w (another program serves there: stop it, or choose another address with --listen)", err)
	}
	serving := false
	defer func() {
		if !serving {
			l.Close()
		}
	}()

	// Start-up lines and the model switch's line may be written at once.
	stdout = &lockedWriter{w: stdout}
	p, model, err := mc.provider(ctx, stderr, true)
	if err != nil {
		return err
	}
	// An Ollama asked for that did not answer is probed in the
	// background; new model calls move to it once it serves the model.
	var sw *wiring.OllamaSwitch
	if name, ok := strings.CutPrefix(mc.model, "ollama:"); ok && p == nil {
		sw = wiring.NewOllamaSwitch(mc.client(), name, wiring.SwitchOptions{
			Logf: func(f string, a ...any) { fmt.Fprintf(stdout, f+"\n", a...) }})
	}
	bus := engine.NewBus()
	db, err := openStore(*data)
	if err != nil {
		return err
	}
	defer db.Close()
	// Event numbers go on rising across restarts: this start's numbers
	// begin above every earlier start's.
	epoch, err := db.NextStreamEpoch()
	if err != nil {
		return err
	}
	bus.StartAfter(epoch << 32)
	if err := bindRuntime(rt, db, *data, p, model); err != nil {
		return err
	}
	if sw != nil {
		rt.Models = sw.Models
	}
	// The bundle is announced below, once; the resolver's own notice
	// would repeat it at the first run.
	// One installer and one load of the embedded bundle for both, so that
	// each bundle is verified and compiled once.
	in, ref := lb.in, lb.ref
	if in == nil {
		if in, err = openInstaller(*data, rt); err != nil {
			return err
		}
	}
	if ref == nil {
		if ref, err = firmware.ReferenceWithRuntime(rt); err != nil {
			return err
		}
	}
	resolve, err := applianceResolver(*data, loadedBundles{rt: rt, in: in, ref: ref}, nil, false, keepPinning)
	if err != nil {
		return err
	}
	bundles, err := bundleInfo(in, ref)
	if err != nil {
		return err
	}
	var agents []string
	for _, b := range bundles {
		if b.Active {
			fmt.Fprintf(stdout, "bundle: %s v%d (%s)\n", b.Name, b.Version, b.Digest)
			if b.Notice != "" {
				fmt.Fprintf(stdout, "  %s\n", b.Notice)
			}
			agents = append(agents, b.Agents...)
		}
	}
	modelHealth := modelCheck(ctx, mc, p, model, sw, stdout)
	fmt.Fprintln(stdout, bc.describe())
	fmt.Fprintln(stdout, describeApplianceTools(rt.Tools))

	tok, created, err := console.LoadOrCreateToken(*data)
	if err != nil {
		return err
	}
	metrics := console.NewMetrics()
	var up *uplink.Uplink
	if *upURL != "" {
		up, err = uplink.New(db, uplink.Config{URL: *upURL, ApplianceID: *applianceID, Secret: secret,
			RedactorFor: bundleRedactors(ref, in, stderr), Events: bus})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "uplink: sending outcomes to %s as %s\n", *upURL, db.ApplianceID())
	} else {
		fmt.Fprintf(stdout, "uplink: none configured (--uplink URL --uplink-secret FILE); outcomes stay on the appliance\n")
	}
	m := engine.NewManager(console.InstrumentStore(db, metrics), resolve, engine.ManagerOptions{Workers: *workers, Events: bus,
		EventValues: console.EventValues(),
		MaxDuration: budget.WallTime, MaxTokens: budget.Tokens, MaxRecoveries: bc.maxRecoveries(), MaxAlone: bc.maxAlone(),
		MaxSuspectWait: bc.maxSuspectWait()})
	srv := console.New(console.Config{Manager: m, Bus: bus, Resolve: resolve, Agents: agents, Token: tok,
		AllowHosts: hosts, Bundles: func() []console.BundleInfo { return bundles }, Kept: in.Kept, Metrics: metrics,
		Health: []console.HealthCheck{{Name: "model", Check: modelHealth}}, StoreSize: db.Size, StoreWrites: db.WriteErr, CountRuns: db.CountRuns,
		Records: db,
		Uplink:  consoleUplink(db, up),
		Logf:    func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }})

	ctl, stopCtl := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		opts := keptReclaimer(*data, db, m, in, ref.Ref())
		opts.Owner = store.ControlOwner{Command: "serve", SendsUplink: up != nil, UplinkURL: *upURL}
		if err := store.ServeControl(ctl, db, *data, m, opts); err != nil {
			fmt.Fprintf(stderr, "control socket: %v\n", err)
		}
	}()
	bgCtx, stopBg := context.WithCancel(context.Background())
	if up != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			// A batch cut short by the stop is sent again at the next
			// start: the collector answers a repeated batch the same way.
			_ = up.Run(bgCtx)
		}()
	}
	if sw != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			_ = sw.Run(bgCtx)
		}()
	}
	shutdown := func() {
		srv.Close()
		m.Close() // running steps finish or stop at a checkpoint; runs stay recoverable
		stopBg()
		stopCtl()
		bus.Close()
		bg.Wait()
	}
	n, err := recoverRuns(ctx, m, resolve, engine.BundleRef{}, stderr)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		// Stopped while runs were being resumed: a stop like any other.
		// What the pass had not handed to a worker, and what stopped at
		// a checkpoint, resumes at the next start.
		fmt.Fprintf(stdout, "\nshutting down while resuming runs left running by an earlier process: they resume at the next start\n")
		shutdown()
		fmt.Fprintf(stdout, "stopped; the store is closed\n")
		return nil
	}
	if err != nil {
		shutdown()
		return err
	}
	if n > 0 {
		fmt.Fprintf(stdout, "resumed %d run(s) left running by an earlier process\n", n)
	}

	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	serving = true // hs closes l from here on
	go func() {
		if *cert != "" {
			served <- hs.ServeTLS(l, *cert, *key)
		} else {
			served <- hs.Serve(l)
		}
	}()
	scheme := "http"
	if *cert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "console: %s://%s/\n", scheme, l.Addr())
	if created {
		fmt.Fprintf(stdout, "  a bearer token was made for this appliance (%s/%s, mode 0600)\n", *data, console.TokenFile)
	}
	fmt.Fprintf(stdout, "  paste the token into the page: outpost token --data %s\n", *data)
	fmt.Fprintf(stdout, "  Ctrl-C stops serving; unfinished runs resume at the next start\n")

	select {
	case <-ctx.Done():
		fmt.Fprintf(stdout, "\nshutting down: waiting for running steps to reach a checkpoint\n")
	case err = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Close() // drops stream clients, whose connections Shutdown does not track
	serr := hs.Shutdown(sctx)
	shutdown()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if serr != nil {
		return fmt.Errorf("shutdown: %w", serr)
	}
	fmt.Fprintf(stdout, "stopped; the store is closed\n")
	return nil
}

// bundleInfo lists the bundles new runs use: the installed ones of in, or
// the embedded reference bundle ref, as loaded, when none is installed.
func bundleInfo(in *firmware.Installer, ref *firmware.Bundle) ([]console.BundleInfo, error) {
	if len(in.List()) == 0 {
		r := ref.Ref()
		return []console.BundleInfo{{Name: r.Name, Version: r.Version, Digest: r.Digest, Agents: ref.AgentNames(),
			Allowlists: allowlists(ref), Active: true, Source: "embedded", Notice: firmware.ReferenceNotice}}, nil
	}
	var out []console.BundleInfo
	for _, rec := range in.List() {
		bi := console.BundleInfo{Name: rec.Name, Version: rec.Version, Digest: rec.Digest, Active: rec.Active, Source: "installed"}
		if rec.Active {
			b, err := in.Open(rec.Name, rec.Version)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("active bundle %s v%d: its folder %s is gone (the firmware index still lists it): "+
					"install the same bundle file again with outpost firmware install, which puts it back, or activate another version with outpost firmware activate",
					rec.Name, rec.Version, filepath.Join(in.Dir(), rec.Name, strconv.FormatInt(rec.Version, 10)))
			}
			if err != nil {
				return nil, err
			}
			bi.Agents, bi.Allowlists = b.AgentNames(), allowlists(b)
		}
		out = append(out, bi)
	}
	return out, nil
}

// allowlists maps each agent of b to its allowlist (nil: none).
func allowlists(b *firmware.Bundle) map[string][]string {
	out := map[string][]string{}
	for _, a := range b.AgentNames() {
		out[a] = b.Allowlist(a)
	}
	return out
}

// modelCheck says which model serves and returns its health check: an
// Ollama that answers and has the model is ok; the scripted model standing
// in for an unreachable Ollama is degraded until sw moves new model calls
// to Ollama.
// healthTTL is how long /healthz answers from its last look at Ollama's
// models: anyone may call /healthz, and a monitor that polls it often
// should not become a stream of requests to the model server.
const healthTTL = 5 * time.Second

// cachedHasModel is client.HasModel(name), asked at most once per
// healthTTL; concurrent callers wait for the one asking. An answer cut
// short by its caller's context is not kept.
func cachedHasModel(client *ollama.Client, name string) func(context.Context) (bool, error) {
	var (
		mu  sync.Mutex
		at  time.Time
		has bool
		err error
	)
	return func(ctx context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if !at.IsZero() && time.Since(at) < healthTTL {
			return has, err
		}
		has, err = client.HasModel(ctx, name)
		if ctx.Err() != nil {
			at = time.Time{}
		} else {
			at = time.Now()
		}
		return has, err
	}
}

func modelCheck(ctx context.Context, mc *modelChoice, p models.Provider, model string, sw *wiring.OllamaSwitch, stdout io.Writer) func(context.Context) console.Health {
	client := mc.client()
	if oc, ok := p.(*ollama.Client); ok {
		client = oc
	}
	asked, wantOllama := strings.CutPrefix(mc.model, "ollama:")
	switch {
	case p != nil:
		fmt.Fprintf(stdout, "model: %s on Ollama at %s\n", model, client.URL())
	case wantOllama:
		fmt.Fprintf(stdout, "model: no Ollama reachable at %s: using the scripted model until it answers with %s; new model calls move to it then\n", client.URL(), asked)
	default:
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if client.Ping(pctx) == nil {
			fmt.Fprintf(stdout, "model: scripted (an Ollama answers at %s: start with --model ollama:NAME to use it)\n", client.URL())
		} else {
			fmt.Fprintf(stdout, "model: scripted (the bundle's deterministic rules; no Ollama reachable at %s)\n", client.URL())
		}
	}
	hasModel := cachedHasModel(client, asked)
	ollamaHealth := func(ctx context.Context, info map[string]any, detail string) console.Health {
		info["model"] = asked
		has, err := hasModel(ctx)
		switch {
		case err != nil:
			return console.Health{State: console.StateDown, Detail: fmt.Sprintf("Ollama at %s does not answer: %v", client.URL(), err), Info: info}
		case !has:
			return console.Health{State: console.StateDegraded, Detail: fmt.Sprintf("Ollama answers but has no model %s (ollama pull %s)", asked, asked), Info: info}
		}
		return console.Health{State: console.StateOK, Detail: detail, Info: info}
	}
	return func(ctx context.Context) console.Health {
		info := map[string]any{"url": client.URL()}
		switch {
		case p != nil:
			return ollamaHealth(ctx, info, "ollama:"+model)
		case wantOllama && sw != nil && sw.Status().Live:
			st := sw.Status()
			info["switched_at"] = st.SwitchedAt.UTC().Format(time.RFC3339)
			return ollamaHealth(ctx, info, fmt.Sprintf("ollama:%s (since %s; the scripted model served until Ollama answered)",
				asked, st.SwitchedAt.UTC().Format(time.RFC3339)))
		case wantOllama:
			info["model"] = firmware.ScriptedModel
			info["asked"] = asked
			detail := fmt.Sprintf("no Ollama reachable at %s at start: using the scripted model until it answers with %s", client.URL(), asked)
			if sw != nil {
				st := sw.Status()
				if st.LastError != "" {
					detail += "; last check: " + st.LastError
					info["last_error"] = st.LastError
				}
				if !st.LastProbe.IsZero() {
					info["last_check"] = st.LastProbe.UTC().Format(time.RFC3339)
				}
				if !st.NextProbe.IsZero() {
					info["next_check"] = st.NextProbe.UTC().Format(time.RFC3339)
				}
			}
			return console.Health{State: console.StateDegraded, Detail: detail, Info: info}
		}
		info["model"] = firmware.ScriptedModel
		return console.Health{State: console.StateOK, Detail: "scripted model (--model scripted, the default: the bundle's deterministic rules)", Info: info}
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
