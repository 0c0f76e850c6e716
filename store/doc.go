// Package store keeps an Outpost appliance's durable state in one bbolt
// file: runs, checkpoints, pending writes (which carry interrupts and
// resume values), content-addressed blobs, tool-call records, and the
// outcome ledger with its uplink cursor.
//
// Entry points:
//
//   - Open (or OpenDir) returns a *DB, which implements engine.Store; pass
//     it to the engine as its checkpointer, blob store and run store.
//   - DB.Commit makes one superstep durable in one fsynced transaction.
//     Concurrent commits share transactions (group commit, see Stats).
//   - DB.PutToolIntent, DB.PutToolResult and DB.ToolCall record side
//     effects so that recovery never silently repeats one.
//   - The outcome ledger (ledger.go): a commit that ends a run, or pauses
//     it at an interrupt, appends the run's Outcome in the same
//     transaction, hash-chained to the one before. DB.Outcomes reads it in
//     seq order, DB.Ledger reports its head and the uplink cursor, and
//     DB.AckOutcomes advances that cursor. Nothing edits or deletes an
//     outcome; Check verifies the chain and names the first broken link.
//   - DB.Check, DB.Backup, DB.Compact (and CompactFile) and DB.Prune are
//     the operations behind "outpost db"; Salvage copies what can still be
//     read out of a store too damaged to open (salvage.go).
//   - ListLive lists runs as the run manager that works the store has
//     them (live statuses, runs not stored yet): GET /api/v1/runs, and
//     "outpost runs list" through the control socket (ServeControl).
//
// Only one process may open a store for writing: a second Open fails
// within Options.Timeout with ErrInUse. A file of another format or
// version fails with ErrFormat, and one whose pages are not whole (cut
// short, a page overwritten) or that holds nothing of a store (empty, all
// zeros) with ErrDamaged, before bbolt trusts it (fileguard.go). A new
// store file is made whole under a temporary name and renamed into place,
// so that Outpost never leaves an empty one behind. When writing or
// fsyncing a transaction fails, the store takes no more writes
// (ErrWriteFailed, DB.WriteErr) and reads go on: what that transaction
// left on disk is unknown until the file is opened again.
//
// Checkpoints are keyed by ID first, so that the commits of many threads
// sharing one transaction write a few pages at the right edge of the tree;
// each namespace's newest checkpoint and branch heads are recorded beside
// them, and History merges the parent chains that start there (leaves.go).
// The newest few checkpoints wait in a small bucket stored inside the root
// page, so that a lone thread's step commit writes fewer pages (recent.go).
// Blobs are appended to a log, so a group commit's new blobs also land
// together, and found through an index written in batches; the newest,
// unindexed blobs are kept in memory and read back at open (bloblog.go).
// An outcome is prepared outside the transaction that appends it, which
// only chains it (ledger.go). The runs that are queued, running or
// interrupted are indexed by the commits that write their records, so that
// the review list and recovery at start read those runs alone, not the
// months of finished ones (unfinished.go); a listing with
// engine.RunFilter.Summary shows an input or output over SummaryBytes by
// the preview its record keeps, and reads no blob of it (run.go).
//
// A commit writes every page from a changed record up to its bucket's
// root, and its fsync costs about as much again per page: new stores get
// 8 KB pages for shallower trees (DefaultPageSize), and the committer keeps
// the file's end ahead of the pages in use zeroed and synced, so that
// commits do not write into holes the file system must first allocate
// (runway.go).
//
// Every record is a version byte, a payload and a CRC32C. Checkpoints and
// pending writes, and runs since record version 2, use a hand-written binary
// layout; tool calls use JSON inside the same envelope (so did runs at
// version 1, which are still read). A record that fails to decode is reported
// as a *CorruptError naming its bucket and key; decoding never panics.
//
// Examples are the best way to understand it: example_test.go opens,
// commits and reads; prune_test.go shows retention; the conformance suite
// in engine/enginetest runs against this store and the engine's memory
// store alike.
package store
