package store

import (
	"bytes"

	"github.com/outpost-edge/outpost/engine"
)

// Blob references live in typed fields (a checkpoint's channel values, a
// pending write's writes, a tool call's arguments and result) and also as
// text inside values that a node chose to store: a message that points at a
// model response, a run's output. The garbage collector must never free a
// blob that anything still names, so it also scans bytes for the textual
// form "xxh64:<16 hex>:<length>". A false match only keeps a blob alive.

var refMarker = []byte("xxh64:")

// scanRefs calls fn for every textual blob reference in b.
func scanRefs(b []byte, fn func(engine.BlobRef)) {
	for {
		i := bytes.Index(b, refMarker)
		if i < 0 {
			return
		}
		b = b[i+len(refMarker):]
		if ref, n, ok := parseRefTail(b); ok {
			fn(ref)
			b = b[n:]
		}
	}
}

// parseRefTail parses "<16 hex>:<decimal length>" at the start of b.
func parseRefTail(b []byte) (engine.BlobRef, int, bool) {
	if len(b) < 18 || b[16] != ':' {
		return engine.BlobRef{}, 0, false
	}
	var h uint64
	for _, c := range b[:16] {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return engine.BlobRef{}, 0, false
		}
		h = h<<4 | uint64(v)
	}
	var n uint64
	i := 17
	for ; i < len(b) && i < 17+10 && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + uint64(b[i]-'0')
	}
	if i == 17 || n > 1<<32-1 {
		return engine.BlobRef{}, 0, false
	}
	return engine.BlobRef{Hash: h, Len: uint32(n)}, i, true
}

// valueRefs reports the blob references of channel values, typed and
// textual.
func valueRefs(cvs []engine.ChannelValue, fn func(engine.BlobRef)) {
	for _, cv := range cvs {
		eachValueRef(cv.Value, fn)
	}
}

func eachValueRef(v engine.Value, fn func(engine.BlobRef)) {
	if !v.Blob.IsZero() {
		fn(v.Blob)
	}
	scanRefs(v.Inline, fn)
}

func checkpointRefs(c *engine.Checkpoint, fn func(engine.BlobRef)) {
	valueRefs(c.Channels, fn)
	for _, t := range c.Next {
		scanRefs(t.Input, fn)
	}
}

func writeRefs(w *engine.PendingWrite, fn func(engine.BlobRef)) {
	valueRefs(w.Writes, fn)
	scanRefs(w.Data, fn)
}

func toolCallRefs(tc *ToolCall, fn func(engine.BlobRef)) {
	eachValueRef(tc.Args, fn)
	eachValueRef(tc.Result, fn)
}

func runRefs(r *engine.Run, fn func(engine.BlobRef)) {
	scanRefs(r.Input, fn)
	scanRefs(r.Output, fn)
	scanRefs([]byte(r.Error), fn)
	for _, in := range r.Interrupts {
		scanRefs(in.Payload, fn)
	}
	for _, dr := range r.Decisions {
		scanRefs(dr.Value, fn)
	}
	for _, v := range r.Meta {
		scanRefs([]byte(v), fn)
	}
}
