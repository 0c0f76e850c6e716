package engine

import (
	"context"
	"fmt"
)

// History lists a thread's checkpoints, newest first (at most limit; 0 for
// all). Forks appear in the same list: follow ParentID to see a branch.
func (g *Graph) History(ctx context.Context, store Checkpointer, thread string, limit int) ([]*Checkpoint, error) {
	return store.History(ctx, thread, "", "", limit)
}

// HistoryPage lists a namespace's checkpoints below before, newest first,
// as Checkpointer.History does, for a reader paging through a thread: a
// before that names no checkpoint of the namespace fails with
// ErrCheckpointNotFound, where History would list below it as any string
// and restart or empty the listing quietly.
func HistoryPage(ctx context.Context, store Checkpointer, thread, ns, before string, limit int) ([]*Checkpoint, error) {
	if before != "" {
		if _, err := store.Checkpoint(ctx, thread, ns, before); err != nil {
			return nil, fmt.Errorf("list checkpoints below %s: %w", before, err)
		}
	}
	return store.History(ctx, thread, ns, before, limit)
}

// StateAt returns the state of a thread at a checkpoint ("" for the newest).
func (g *Graph) StateAt(ctx context.Context, cfg RunConfig, checkpointID string) (*Snapshot, error) {
	e, err := g.newExecution(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, checkpointID); err != nil {
		return nil, err
	}
	return e.result().State, nil
}

// Fork starts a new branch of a thread at an earlier checkpoint: it commits a
// new checkpoint whose parent is that one, with the same state and the same
// next tasks. It becomes the thread's newest checkpoint, so the next Invoke or
// Resume runs on from it; the old branch is left untouched.
func (g *Graph) Fork(ctx context.Context, cfg RunConfig, checkpointID string) (*Checkpoint, error) {
	if checkpointID == "" {
		return nil, fmt.Errorf("fork: a checkpoint id is required")
	}
	e, err := g.newExecution(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, checkpointID); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	// No run made the fork (the execution's run record is never stored),
	// so it names none: the next run on the thread starts from it.
	c := &Checkpoint{Thread: cfg.Thread, NS: cfg.ns, ID: newID(), ParentID: checkpointID,
		Step: e.step, Source: SourceFork, Next: e.next, Created: cfg.now().UTC()}
	if err := cfg.Store.Commit(ctx, &Commit{Checkpoint: c, Sync: true}); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	return c, nil
}

// UpdateState writes to a thread's newest checkpoint as if node asNode had
// returned writes: the writes go through the reducers, and the next tasks
// are routed from asNode (Start routes to the entry nodes). It returns the
// new checkpoint.
func (g *Graph) UpdateState(ctx context.Context, cfg RunConfig, asNode string, writes ...Write) (*Checkpoint, error) {
	if asNode != Start && g.nodes[asNode] == nil {
		return nil, fmt.Errorf("update state: unknown node %q", asNode)
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("update state: a store is required")
	}
	e, err := g.newExecution(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.load(ctx, ""); err != nil {
		return nil, err
	}
	if err := e.checkWrites(asNode, writes); err != nil {
		return nil, fmt.Errorf("update state: %w", err)
	}
	e.cfg.Durability = DurabilitySync
	e.apply(writes)
	e.step++
	next, err := e.route([]string{asNode}, nil)
	if err != nil {
		return nil, fmt.Errorf("update state: %w", err)
	}
	e.next = next
	c, err := e.newCheckpoint(SourceUpdate, []string{asNode})
	if err != nil {
		return nil, err
	}
	if err := e.store.Commit(ctx, &Commit{Checkpoint: c, Blobs: e.blobBuf, Sync: true}); err != nil {
		return nil, fmt.Errorf("update state: %w", err)
	}
	return c, nil
}
