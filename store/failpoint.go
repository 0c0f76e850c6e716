package store

import "github.com/outpost-edge/outpost/engine"

// failpoint holds test hooks at the store's durability boundaries, in the
// spirit of bbolt's gofail points. Every hook is nil in production; tests
// set them before starting writers and clear them when the writers are done.
var failpoint struct {
	// beforeCommitTx runs before a group commit opens its transaction, with
	// the number of requests in the batch. An error fails the whole batch
	// and nothing is written.
	beforeCommitTx func(batch int) error
	// midGroupCommit runs inside the transaction after request i of the
	// batch was applied. An error rolls the transaction back before bbolt
	// writes anything, and fails every request in it; the store writes on.
	midGroupCommit func(i int) error
	// applyRequest runs before request i is applied. An error is charged
	// to that request alone: the others are retried in a fresh
	// transaction.
	applyRequest func(i int) error
	// commitWrite runs once bbolt's commit returned without error; an error
	// stands for one from the commit itself (a page write or an fsync
	// failing), after which the store takes no more writes.
	commitWrite func() error
	// afterCommitTx runs once a batch's transaction is durable, before its
	// committers are woken.
	afterCommitTx func(batch int)
	// storeMade runs once Open has made a new store file under its
	// temporary name and fsynced it, before it renames it into place; an
	// error stops the creation there.
	storeMade func(tmp string) error
	// compactCopied runs once CompactFile has written the compacted copy,
	// before it renames it into place and lets go of the store.
	compactCopied func()
}

// probe holds test hooks that count what a read touches, for tests of its
// cost that do not measure time. Every hook is nil in production; tests
// set them before the reads and clear them after.
var probe struct {
	// runRead runs for each run record that a listing (Runs) reads, and
	// for each that CallsLostThrough reads, with its key.
	runRead func(key []byte)
	// blobLoaded runs for each blob read whole (blobs.load).
	blobLoaded func(ref engine.BlobRef)
}
