package main

import (
	"context"
	"io"

	"github.com/outpost-edge/outpost/bench"
)

func benchBolt(ctx context.Context, opts bench.Options, dir string, _ io.Writer) (*bench.Result, error) {
	return bench.RunBolt(ctx, opts, dir)
}
