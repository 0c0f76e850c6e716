package bench

import (
	"context"
	"testing"

	"github.com/outpost-edge/outpost/engine"
)

func benchmarkScenario(b *testing.B, threads, turns int) {
	for b.Loop() {
		res, err := Run(context.Background(), Options{Saver: "memory", Threads: threads, Turns: turns})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.TurnsPerS, "turns/s")
	}
}

// BenchmarkReferenceS1 is one thread of 200 turns, in memory.
func BenchmarkReferenceS1(b *testing.B) { benchmarkScenario(b, 1, 200) }

// BenchmarkReferenceS2 is 64 threads of 20 turns, in memory.
func BenchmarkReferenceS2(b *testing.B) { benchmarkScenario(b, 64, 20) }

func benchmarkBolt(b *testing.B, threads, turns int, d engine.Durability) {
	for b.Loop() {
		res, err := RunBolt(context.Background(), Options{Threads: threads, Turns: turns, Durability: d}, b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.TurnsPerS, "turns/s")
		b.ReportMetric(float64(res.DBBytes)/1e6, "db_MB")
	}
}

// BenchmarkReferenceS2BoltSync is 64 threads of 20 turns, every step fsynced.
func BenchmarkReferenceS2BoltSync(b *testing.B) { benchmarkBolt(b, 64, 20, engine.DurabilitySync) }

// BenchmarkReferenceS2BoltExit is 64 threads of 20 turns, committed at run end.
func BenchmarkReferenceS2BoltExit(b *testing.B) { benchmarkBolt(b, 64, 20, engine.DurabilityExit) }

// BenchmarkReferenceS1BoltSync is one thread of 200 turns, every step fsynced.
func BenchmarkReferenceS1BoltSync(b *testing.B) { benchmarkBolt(b, 1, 200, engine.DurabilitySync) }
