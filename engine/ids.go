package engine

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

var idGen struct {
	sync.Mutex
	last int64
}

// newID returns a time-ordered, fixed-width, strictly increasing id.
func newID() string {
	idGen.Lock()
	defer idGen.Unlock()
	now := time.Now().UnixNano()
	if now <= idGen.last {
		now = idGen.last + 1
	}
	idGen.last = now
	return hex16(uint64(now))
}

// hex16 renders n as 16 lowercase hex digits.
func hex16(n uint64) string {
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = hexDigits[n&0xf]
		n >>= 4
	}
	return string(b[:])
}

// observeID keeps ids increasing past one read from a store, even if the
// clock went back since it was written.
func observeID(id string) {
	n, err := strconv.ParseUint(id, 16, 64)
	if err != nil || len(id) != 16 {
		return
	}
	idGen.Lock()
	if int64(n) > idGen.last {
		idGen.last = int64(n)
	}
	idGen.Unlock()
}

// ObserveID keeps the ids this process makes past id (a checkpoint id, or
// a run id with its "run_" prefix), one read from a store. A store calls it
// when it opens with the newest ids it holds, so that ids keep increasing
// when the clock was set back while the appliance was off (a board without
// a clock battery, a site with no network to set the time from). Other
// strings are ignored.
func ObserveID(id string) { observeID(strings.TrimPrefix(id, "run_")) }

// NewRunID returns a new sortable run id.
func NewRunID() string { return "run_" + newID() }

// IsRunID reports whether id has the form NewRunID gives: "run_" and 16
// lowercase hex digits. A list cursor of another form is a caller's bug,
// to refuse before it restarts or empties a listing quietly (run ids sort
// by time, and a listing reads on from any string).
func IsRunID(id string) bool {
	hex, ok := strings.CutPrefix(id, "run_")
	return ok && IsCheckpointID(hex)
}

// IsCheckpointID reports whether id has the form of a checkpoint id: 16
// lowercase hex digits. Like a run id, a history cursor of another form is
// refused before anything is read.
func IsCheckpointID(id string) bool {
	return len(id) == 16 && !strings.ContainsFunc(id, func(c rune) bool {
		return (c < '0' || c > '9') && (c < 'a' || c > 'f')
	})
}

func taskID(ckpt, node string, i int) string {
	h := xxhash.New()
	_, _ = h.WriteString(ckpt)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(node)
	_, _ = h.Write([]byte{0, byte(i), byte(i >> 8), byte(i >> 16)})
	return hex16(h.Sum64())
}
