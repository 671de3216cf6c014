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
		ev, err := p.Evaluate(ctx, r.Env, r.Task, 0)
		if err != nil || ev.Reward != 0 {
			b.Fatalf("unsolved fizzbuzz: %+v %v", ev, err)
		}
		b.StopTimer()
		p.Close(ctx)
		b.StartTimer()
	}
}

// BenchmarkDataset10k: a generated dataset of 10,000 instances: opening
// it and a lazy pool on it (what a server does before it answers), then
// the first reset of an instance (its setup and post-setup checkpoint)
// and a second reset of it (from the kept state).
func BenchmarkDataset10k(b *testing.B) {
	e, _ := newEngine(b)
	ctx := context.Background()
	dir := writeDataset(b, 10000, nil)
	for i := 0; i < b.N; i++ {
		start := time.Now()
		d, err := envpool.OpenDataset(dir)
		if err != nil {
			b.Fatal(err)
		}
		p, err := envpool.NewPool(ctx, e, nil, envpool.PoolOptions{Logger: quiet(), Lazy: true, Datasets: []*envpool.Dataset{d}})
		if err != nil {
			b.Fatal(err)
		}
		open := time.Since(start)
		idx := 4321 + i
		t0 := time.Now()
		r, err := p.Reset(ctx, envpool.ResetRequest{Dataset: "squares", Index: &idx})
		if err != nil {
			b.Fatal(err)
		}
		first := time.Since(t0)
		t1 := time.Now()
		r2, err := p.Reset(ctx, envpool.ResetRequest{Dataset: "squares", Index: &idx})
		if err != nil {
			b.Fatal(err)
		}
		again := time.Since(t1)
		b.ReportMetric(float64(open.Microseconds())/1000, "open_ms")
		b.ReportMetric(float64(first.Microseconds())/1000, "first_reset_ms")
		b.ReportMetric(float64(again.Microseconds())/1000, "second_reset_ms")
		e.CloseEnv(ctx, r.Env)
		e.CloseEnv(ctx, r2.Env)
		p.Close(ctx)
		d.Close()
	}
}

// BenchmarkEvaluateLeaf: the cost of evaluating a finished leaf of a
// tree, as the expansion of a tree rollout pays it: the trusted grader
// with its pristine copy from the warm reserve (warm), restored on demand
// (cold), against the fork of the leaf that a verifier keeping the
// agent's processes needs (fork), which every evaluation paid before the
// trusted grader.
func BenchmarkEvaluateLeaf(b *testing.B) {
	e, _ := newEngine(b)
	ctx := context.Background()
	for _, mode := range []struct {
		name  string
		warm  int
		keeps bool
	}{{"trusted-warm", 2, false}, {"trusted-cold", -1, false}, {"fork", -1, true}} {
		b.Run(mode.name, func(b *testing.B) {
			task := helloTask
			task.VerifierKeepsProcesses = mode.keeps
			p, err := envpool.NewPool(ctx, e, []envpool.Task{task}, envpool.PoolOptions{Warm: mode.warm, Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(ctx)
			var lat []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if err := p.WaitWarm(ctx); err != nil {
					b.Fatal(err)
				}
				r, err := p.Reset(ctx, envpool.ResetRequest{Task: "hello"})
				if err != nil {
					b.Fatal(err)
				}
				run(b, e, r.Env, `echo "$GREETING" > greeting.txt`)
				if _, err := e.WaitCheckpoint(ctx, r.Env); err != nil {
					b.Fatal(err)
				}
				if err := p.WaitWarm(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t := time.Now()
				ev, err := p.Evaluate(ctx, r.Env, r.Task, 0)
				if err != nil || ev.Reward != 1 {
					b.Fatalf("evaluate: %v %v", ev, err)
				}
				lat = append(lat, time.Since(t))
				if i == 0 {
					b.Logf("%s: %v in all; details %v", mode.name, time.Since(t), ev.Details)
				}
				b.StopTimer()
				e.CloseEnv(ctx, r.Env)
				b.StartTimer()
			}
			b.ReportMetric(p50(lat), "evaluate-p50-ms")
		})
	}
}
