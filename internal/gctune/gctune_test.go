package gctune

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 400},
		{1 * mib, 400},
		{16 * mib, 400},
		{17 * mib, 376},
		{32 * mib, 200},
		{48 * mib, 133},
		{64 * mib, 100},
		{1 << 30, 100},
	} {
		assert.Equal(t, tc.want, Percent(tc.live), "live %d MiB", tc.live/mib)
	}
}

// gogc reads the GOGC the runtime works to.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// waitFor collects until GOGC is want: the tuner runs after a collection,
// on the finalizer goroutine.
func waitFor(t *testing.T, tu *Tuner, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for gogc() != want || tu.Percent() != want {
		if time.Now().After(deadline) {
			require.Failf(t, "GOGC did not follow the live heap", "GOGC %d, tuner %d, want %d", gogc(), tu.Percent(), want)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// The tuner follows the live heap up and down, collection after
// collection, and leaves GOGC alone once stopped.
func TestTunerFollowsTheLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	tu := Start()
	defer tu.Stop()
	waitFor(t, tu, Percent(liveNow()))
	assert.Greater(t, gogc(), 300, "a test binary's heap is small")

	held := make([][]byte, 48)
	for i := range held {
		held[i] = make([]byte, 1<<20)
	}
	runtime.GC()
	want := Percent(liveNow())
	assert.Less(t, want, 150, "48 MiB held")
	waitFor(t, tu, want)

	runtime.KeepAlive(held)
	held = nil
	runtime.GC()
	waitFor(t, tu, Percent(liveNow()))
	assert.Greater(t, gogc(), 300, "the held heap is gone")

	tu.Stop()
	debug.SetGCPercent(250)
	runtime.GC()
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, 250, gogc(), "a stopped tuner sets nothing")
}

func liveNow() uint64 {
	s := []metrics.Sample{{Name: liveHeap}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
