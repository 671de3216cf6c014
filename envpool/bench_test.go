package envpool_test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

func p50(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// BenchmarkReset compares reset from the warm pool, reset restored on
// demand (empty pool) and a fresh env from the image (whose initial
// checkpoint the first step then waits for, counted in fresh+gate).
func BenchmarkReset(b *testing.B) {
	e, _ := newEngine(b)
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		warm int
		req  envpool.ResetRequest
	}{
		{"warm", 2, envpool.ResetRequest{Task: "hello"}},
		{"on-demand", -1, envpool.ResetRequest{Task: "hello"}},
		{"fresh", -1, envpool.ResetRequest{Image: "busybox"}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			p, err := envpool.NewPool(ctx, e, []envpool.Task{helloTask}, envpool.PoolOptions{Warm: mode.warm, Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(ctx)
			var lat, ready []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if err := p.WaitWarm(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t := time.Now()
				r, err := p.Reset(ctx, mode.req)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
				if _, err := e.Checkpoint(ctx, r.Env, "none"); err != nil { // waits for a pending checkpoint
					b.Fatal(err)
				}
				ready = append(ready, time.Since(t))
				b.StopTimer()
				e.CloseEnv(ctx, r.Env)
				b.StartTimer()
			}
			b.ReportMetric(float64(p.Stats().Tasks[0].Prepared.Microseconds())/1000, "prepare-ms")
			b.ReportMetric(p50(lat), "reset-p50-ms")
			b.ReportMetric(p50(ready), "reset+gate-p50-ms")
		})
	}
}

// BenchmarkPrepareDebianTask measures preparing the shipped python task
// (debian image, three setup commands, full checkpoint).
func BenchmarkPrepareDebianTask(b *testing.B) {
	sandboxtest.DebianCache(b)
	e, images := newEngine(b)
	ctx := context.Background()
	if err := images.Build(ctx, "debian", nil); err != nil {
		b.Fatal(err)
	}
	task, err := envpool.LoadTask(filepath.Join("..", "tasks", "python-fizzbuzz.json"))
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		p, err := envpool.NewPool(ctx, e, []envpool.Task{task}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(p.Stats().Tasks[0].Prepared.Microseconds())/1000, "prepare-ms")
		p.WaitWarm(ctx)
		r, err := p.Reset(ctx, envpool.ResetRequest{Task: task.Name})
		if err != nil {
			b.Fatal(err)
		}
		ev, err := p.Evaluate(ctx, r.Env, r.Task)
		if err != nil || ev.Reward != 0 {
			b.Fatalf("unsolved fizzbuzz: %+v %v", ev, err)
		}
		b.StopTimer()
		p.Close(ctx)
		b.StartTimer()
	}
}
