package store

import (
	"sync"

	"go.etcd.io/bbolt"
)

// txState is what the store keeps for one open write transaction of the
// commit queue: the ledger head it appends to and its changes to the blob
// store. The committer registers it when the transaction begins and
// forgets it when the Update callback returns, so it never outlives its
// transaction, committed or rolled back.
type txState struct {
	head  *ledgerHead
	blobs *blobs
	// batch is the number of requests the transaction applies.
	batch int
}

var txStates = struct {
	mu sync.Mutex
	m  map[*bbolt.Tx]*txState
}{m: map[*bbolt.Tx]*txState{}}

func beginTxState(tx *bbolt.Tx, tail *blobTail, batch int) *txState {
	st := &txState{blobs: openBlobs(tx, tail, newBlobChanges()), batch: batch}
	txStates.mu.Lock()
	txStates.m[tx] = st
	txStates.mu.Unlock()
	return st
}

func endTxState(tx *bbolt.Tx) {
	txStates.mu.Lock()
	delete(txStates.m, tx)
	txStates.mu.Unlock()
}

// stateOf returns a commit-queue transaction's state. Only the requests of
// the queue write, so every write transaction they see has one.
func stateOf(tx *bbolt.Tx) *txState {
	txStates.mu.Lock()
	defer txStates.mu.Unlock()
	return txStates.m[tx]
}

// writeBlobs is the blob store as a commit-queue transaction sees it.
func writeBlobs(tx *bbolt.Tx) *blobs { return stateOf(tx).blobs }
