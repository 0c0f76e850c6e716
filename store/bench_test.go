package store

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/engine"
)

// BenchmarkCommit measures fsynced superstep commits: one committer (the
// latency of one durable step) and 64 (what group commit buys). The
// fsyncs/op metric shows how many commits shared each fsync, pages/op how
// many pages bbolt wrote per commit.
//
// Checkpoint IDs are made as the engine makes them, time-ordered across
// threads, and each step's parent is the thread's previous step: the store's
// layout depends on both.
func BenchmarkCommit(b *testing.B) {
	for _, committers := range []int{1, 64} {
		b.Run(fmt.Sprintf("sync/committers=%d", committers), func(b *testing.B) {
			d, err := Open(filepath.Join(b.TempDir(), FileName), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			var next, ids atomic.Int64
			ids.Store(time.Now().UnixNano())
			// RunParallel starts GOMAXPROCS*parallelism goroutines.
			b.SetParallelism(max(1, committers/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			commitLoop := func(pb interface{ Next() bool }) {
				thread := fmt.Sprintf("t%d", next.Add(1))
				parent := ""
				for i := 1; pb.Next(); i++ {
					c := stepCommit(thread, i)
					id := fmt.Sprintf("%016x", ids.Add(1))
					c.Checkpoint.ID, c.Checkpoint.ParentID, parent = id, parent, id
					c.Writes[0].CheckpointID = id
					c.Run.Checkpoint = id
					c.Checkpoint.Channels = append(c.Checkpoint.Channels,
						engine.ChannelValue{Channel: "messages", Delta: true, Value: engine.Value{Inline: []byte(`["a short message of a turn"]`)}})
					if err := d.Commit(bg, c); err != nil {
						b.Error(err)
						return
					}
				}
			}
			if committers == 1 {
				commitLoop(&serialPB{n: b.N})
			} else {
				b.RunParallel(func(pb *testing.PB) { commitLoop(pb) })
			}
			b.StopTimer()
			st := d.Stats()
			b.ReportMetric(float64(st.Syncs)/float64(b.N), "fsyncs/op")
			pages, _, _ := d.PageStats()
			b.ReportMetric(float64(pages)/float64(b.N), "pages/op")
		})
	}
}

type serialPB struct{ n int }

func (p *serialPB) Next() bool { p.n--; return p.n >= 0 }
