package main

import (
	"context"
	"fmt"
	"io"

	"github.com/outpost-edge/outpost/bench"
)

func benchBolt(ctx context.Context, opts bench.Options, dir string, stderr io.Writer) (*bench.Result, error) {
	return nil, fmt.Errorf("--saver bbolt is not wired yet")
}
