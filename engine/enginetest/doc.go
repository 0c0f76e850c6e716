// Package enginetest holds tests that every implementation of the engine's
// storage interfaces must pass. RunStoreSuite runs the shared conformance
// suite against a fresh engine.Store; the memory store and the bbolt store
// (package store) both run it, so the engine behaves the same on either.
// HoldAgent is an agent that holds its runs in flight, for tests of what
// other parts show of them.
package enginetest
