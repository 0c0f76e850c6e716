package bench

import (
	"context"
	"testing"
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
