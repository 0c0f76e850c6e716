// Package wiring connects packages that may not import each other: it
// adapts the bbolt store to the interfaces the agent package consumes.
// CallLog is the entry point.
package wiring
