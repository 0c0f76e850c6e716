package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/outpost-edge/outpost/bench"
	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// defaultDataDir is ./outpost-data, or $OUTPOST_DATA when set.
func defaultDataDir() string {
	if d := os.Getenv("OUTPOST_DATA"); d != "" {
		return d
	}
	return "./outpost-data"
}

func dataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", defaultDataDir(), "data folder (or set $OUTPOST_DATA)")
}

// openStore opens the store in dir, explaining the common failures.
func openStore(dir string) (*store.DB, error) {
	db, err := store.OpenDir(dir, store.Options{})
	switch {
	case errors.Is(err, store.ErrInUse):
		return nil, fmt.Errorf("%w\n(another outpost process, such as serve, owns it; stop it or use its HTTP API)", err)
	case errors.Is(err, store.ErrFormat):
		return nil, fmt.Errorf("%w\n(this data folder was written by an incompatible outpost version, or is not an outpost store)", err)
	}
	return db, err
}

// resolver returns the agents this binary can run.
func resolver() (engine.Resolver, error) {
	ref, err := bench.ReferenceAgent()
	if err != nil {
		return nil, err
	}
	return func(name string, _ engine.BundleRef) (*engine.Agent, error) {
		if name == ref.Name {
			return ref, nil
		}
		return nil, fmt.Errorf("%w %q (available: %s)", engine.ErrUnknownAgent, name, ref.Name)
	}, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
