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
	fs := newCmdFlags("token", "token [--data DIR]", stdout, stderr)
	data := dataFlag(fs.FlagSet)
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
	fmt.Fprintln(stdout, tok)
	return nil
}
