package engine

import (
	"context"
	"fmt"
)

// RunValue returns the value kept under key for the run that the calling
// node serves, made by make on first use. Every task of the run sees the
// same value: the tasks of one superstep, which run concurrently, the
// supersteps after them, and the nodes of its subgraphs. It is how nodes
// share a running count, such as the tokens their model calls spent,
// without waiting for the end of a superstep.
//
// The value lives as long as the Invoke or Resume call that runs the run:
// a run resumed after a pause or recovered after a restart starts without
// it, so make must rebuild it from what is durable (the run's state or a
// record kept outside it); RunInfo.Resumed says whether there is anything
// to rebuild. make runs once per key, under a lock that other
// callers for the run wait on; its error is returned and nothing is kept.
//
// Runs that never call it pay nothing for it.
func RunValue(ctx context.Context, key any, make func() (any, error)) (any, error) {
	sp := scratchFrom(ctx)
	if sp == nil || sp.exec == nil {
		return nil, fmt.Errorf("engine.RunValue called outside a running node")
	}
	e := sp.exec.root()
	e.runValuesMu.Lock()
	defer e.runValuesMu.Unlock()
	if v, ok := e.runValues[key]; ok {
		return v, nil
	}
	v, err := make()
	if err != nil {
		return nil, err
	}
	if e.runValues == nil {
		e.runValues = map[any]any{}
	}
	e.runValues[key] = v
	return v, nil
}

// root is the execution of the run's root graph: e itself, or the one
// whose task runs e as a subgraph (at any depth).
func (e *execution) root() *execution {
	for e.cfg.parent != nil {
		e = e.cfg.parent
	}
	return e
}
