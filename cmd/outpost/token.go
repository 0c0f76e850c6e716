package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/outpost-edge/outpost/console"
	"github.com/outpost-edge/outpost/uplink"
)

func init() {
	register("token", "print the console's bearer token", runToken)
}

func runToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("token", "token [--data DIR] [--json]\n       outpost token --collector [--data DIR] [--json]", stdout, stderr)
	collector := fs.Bool("collector", false, "print the collector's token, for its GET /v1/appliances (--data is the collector's, default "+defaultCollectorData+")")
	data := new(string)
	*data = defaultDataDir()
	// An empty --data is refused as it is read, before a --collector that
	// comes after it: the error then names both defaults.
	fs.Var(dataValue{data, func() string {
		if *collector {
			return defaultCollectorData
		}
		return defaultDataDir() + " (" + defaultCollectorData + " with --collector)"
	}}, "data", "data folder `DIR` (or set $OUTPOST_DATA)")
	asJSON := fs.Bool("json", false, "print JSON: {token}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	if _, err := fs.args(); err != nil {
		return err
	}
	if *collector {
		dataSet := false
		fs.Visit(func(f *flag.Flag) { dataSet = dataSet || f.Name == "data" })
		if !dataSet {
			*data = defaultCollectorData
		}
	}
	if fi, err := os.Stat(*data); err == nil && !fi.IsDir() {
		owner := "serve"
		if *collector {
			owner = "collector"
		}
		return fmt.Errorf("%s is a file: --data names the data folder, the one given to outpost %s", *data, owner)
	}
	whose := servesFolder
	if *collector {
		whose = "given to outpost collector, with --data DIR (" + defaultCollectorData + " unless told)"
	}
	if err := dataFolderExists(*data, whose); err != nil {
		return err
	}
	var tok string
	var err error
	if *collector {
		tok, err = console.ReadTokenFile(*data, uplink.TokenFile)
	} else {
		tok, err = console.ReadToken(*data)
	}
	switch {
	case errors.Is(err, os.ErrNotExist) && *collector:
		return fmt.Errorf("no collector token in %s yet: \"outpost collector --data %s\" makes one when it first starts", *data, shellQuote(*data))
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no console token in %s yet: \"outpost serve --data %s\" makes one when it first starts", *data, shellQuote(*data))
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, map[string]string{"token": tok})
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
