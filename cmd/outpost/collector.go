package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/uplink"
)

func init() {
	register("collector", "receive appliances' outcomes (the uplink's upstream end)", runCollector)
}

// defaultCollectorData is the collector's data folder unless --data says.
const defaultCollectorData = "./collector-data"

func runCollector(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("collector", "collector --listen ADDR --data DIR --secrets FILE [--postgres DSN]", stdout, stderr)
	fs.About = "GET /v1/appliances takes a bearer token, made at first start and kept in DIR/" + uplink.TokenFile +
		" (mode 0600); print it with: outpost token --collector --data DIR"
	listen := fs.String("listen", "127.0.0.1:7080", "the `ADDR` to listen on, HOST:PORT")
	data := new(string)
	*data = defaultCollectorData
	fs.Var(dataValue{data, func() string { return defaultCollectorData }}, "data", "data folder `DIR`: the embedded (bbolt) store, and the token of GET /v1/appliances (with --postgres too)")
	secrets := fs.String("secrets", "", "`FILE` of \"appliance_id secret\" lines, one per appliance")
	pg := fs.String("postgres", "", "store into PostgreSQL at this `DSN` instead of bbolt (several collectors may share it, and its token: the first to start stores its own there, and the others take it into their --data)")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	if *secrets == "" {
		return badUsage("--secrets FILE is required: one \"appliance_id secret\" line per appliance")
	}
	if err := checkListenAddr("listen", *listen, "127.0.0.1:7080"); err != nil {
		return err
	}
	keys, err := uplink.LoadSecrets(*secrets)
	if err != nil {
		return badUsage("--secrets: %v", err)
	}
	if *pg != "" {
		if err := uplink.CheckPostgresDSN(*pg); err != nil {
			return badUsage("--postgres: %v", err)
		}
	}
	// The token is made before the store is opened, so that a data folder
	// it cannot be written to stops the collector before it listens.
	tok, created, err := console.LoadOrCreateTokenFile(*data, uplink.TokenFile)
	if err != nil {
		return err
	}
	var st uplink.CollectorStore
	where, shared := *data, false
	if *pg != "" {
		pgs, err := uplink.OpenPostgresStore(ctx, *pg, "")
		if err != nil {
			return err
		}
		defer pgs.Close()
		st, where = pgs, "postgres"
		// The collectors on one database share its token: the first to
		// start stores its own, and the others take it into their folders.
		dbTok, err := pgs.SharedToken(ctx, tok)
		if err != nil {
			return err
		}
		if dbTok != tok {
			if err := console.ReplaceTokenFile(*data, uplink.TokenFile, dbTok); err != nil {
				return err
			}
			tok, created, shared = dbTok, false, true
		}
	} else {
		bs, err := uplink.OpenBoltStore(*data)
		if err != nil {
			return err
		}
		defer bs.Close()
		st = bs
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv := &http.Server{Handler: uplink.NewCollector(st, uplink.CollectorOptions{Secrets: keys, Logger: log, Token: tok}),
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 2 * time.Minute}
	appliances := "appliances"
	if len(keys) == 1 {
		appliances = "appliance"
	}
	fmt.Fprintf(stdout, "collector listening on http://%s (%d %s, store: %s)\n", l.Addr(), len(keys), appliances, where)
	switch {
	case created:
		fmt.Fprintf(stdout, "  a bearer token for GET %s was made (%s, mode 0600)\n", uplink.AppliancesPath, filepath.Join(*data, uplink.TokenFile))
	case shared:
		fmt.Fprintf(stdout, "  the bearer token for GET %s is the one the database's collectors share, now in %s (mode 0600)\n",
			uplink.AppliancesPath, filepath.Join(*data, uplink.TokenFile))
	}
	fmt.Fprintf(stdout, "  GET %s needs it: outpost token --collector --data %s\n", uplink.AppliancesPath, shellQuote(*data))
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
