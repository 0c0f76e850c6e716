// Package gctune keeps the garbage collector's headroom in proportion for
// an appliance: generous while the live heap is small, where collections
// are cheap to skip and a few megabytes more cost nothing, and bounded as
// the heap grows with long conversations, where GOGC=400 alone would let
// the process hold five times what it uses.
//
// Entry points: Percent gives the GOGC for a live heap; Start applies it
// now and after every collection until Stop.
package gctune
