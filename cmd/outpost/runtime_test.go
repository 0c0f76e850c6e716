package main

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// tuneRuntime changes process-wide settings: the test restores them.
func TestTuneRuntime(t *testing.T) {
	procs, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		debug.SetGCPercent(gc)
	})
	for _, tc := range []struct {
		name, gogc, gomaxprocs string
		moreProcs, wantGC      int
		tuned                  bool
	}{
		{"defaults", "", "", 1, 400, true},
		{"the environment wins", "150", "3", 0, 150, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			t.Setenv("GOMAXPROCS", tc.gomaxprocs)
			runtime.GOMAXPROCS(procs)
			debug.SetGCPercent(150) // as the runtime would have read GOGC=150
			tuner := tuneRuntime()
			if tuner != nil {
				tuner.Stop()
			}
			assert.Equal(t, tc.tuned, tuner != nil, "the collector's tuner runs")
			assert.Equal(t, procs+tc.moreProcs, runtime.GOMAXPROCS(0))
			assert.Equal(t, tc.wantGC, debug.SetGCPercent(100))
		})
	}
}
