package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/outpost-edge/outpost/console"
)

func init() {
	register("token", "print the console's bearer token", runToken)
}

func runToken(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("token", "token [--data DIR] [--json]", stdout, stderr)
	data := dataFlag(fs.FlagSet)
	asJSON := fs.Bool("json", false, "print JSON: {token}")
	if err := fs.parse(args, false); err != nil {
		return err
	}
	tok, err := console.ReadToken(*data)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no console token in %s yet: \"outpost serve --data %s\" makes one when it first starts", *data, *data)
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
