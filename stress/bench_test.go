package stress

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// latencies collects request latencies per method.
type latencies struct {
	mu sync.Mutex
	m  map[string][]time.Duration
}

func (l *latencies) add(method string, d time.Duration) {
	l.mu.Lock()
	l.m[method] = append(l.m[method], d)
	l.mu.Unlock()
}

// timed runs fn and records its latency under method; an error fails b.
func (l *latencies) timed(b *testing.B, method string, fn func() error) {
	start := time.Now()
	if err := fn(); err != nil {
		b.Errorf("%s: %v", method, err)
		return
	}
	l.add(method, time.Since(start))
}

func (l *latencies) report(b *testing.B) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for n := range l.m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := l.m[n]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		b.ReportMetric(float64(percentile(d, 50).Microseconds())/1000, n+"-p50-ms")
		b.ReportMetric(float64(percentile(d, 99).Microseconds())/1000, n+"-p99-ms")
	}
}

// BenchmarkLatency measures p50/p99 latency per method with 16 and 32
// connections busy at once against a real arbor serve. Each connection
// has an env of the hello task and runs, b.N times: a step that changes
// state, a read-only step, a step_batch of two items, branch (n=1) and
// close of the child, rollback, evaluate and states.
func BenchmarkLatency(b *testing.B) {
	requireHost(b)
	s := startServer(b, "--max-envs", "512")
	for _, conns := range []int{16, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			lat := &latencies{m: map[string][]time.Duration{}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			clients := make([]*arbor.Client, conns)
			envs := make([]*arbor.ResetResult, conns)
			for i := range clients {
				c, err := arbor.Dial(ctx, s.addr, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				clients[i] = c
			}
			var wg sync.WaitGroup
			for i, c := range clients { // all resets at once: reset under load
				wg.Add(1)
				go func() {
					defer wg.Done()
					lat.timed(b, "reset", func() (err error) {
						envs[i], err = c.Reset(ctx, arbor.ResetParams{Task: "hello"})
						return err
					})
				}()
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			b.ResetTimer()
			for i, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					benchConn(b, ctx, c, envs[i], lat)
				}()
			}
			wg.Wait()
			b.StopTimer()
			for i, c := range clients {
				c.CloseEnv(ctx, envs[i].EnvID)
			}
			lat.report(b)
		})
	}
}

func benchConn(b *testing.B, ctx context.Context, c *arbor.Client, r *arbor.ResetResult, lat *latencies) {
	env := r.EnvID
	for n := 0; n < b.N && !b.Failed(); n++ {
		lat.timed(b, "step", func() error {
			_, err := c.Step(ctx, env, arbor.Bash(fmt.Sprintf("echo %d > /work/v && export V=%d", n, n), 0))
			return err
		})
		lat.timed(b, "step_readonly", func() error {
			_, err := c.Step(ctx, env, arbor.Bash("cat /work/v; echo $V", 0))
			return err
		})
		lat.timed(b, "step_batch", func() error {
			_, err := c.StepBatch(ctx, []arbor.BatchItem{{EnvID: env, Action: arbor.Bash("echo $V", 0)}, {EnvID: env, Action: arbor.Bash("ls", 0)}}, nil)
			return err
		})
		var br *arbor.BranchResult
		lat.timed(b, "branch", func() (err error) {
			br, err = c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 1})
			return err
		})
		if br != nil && len(br.EnvIDs) == 1 {
			lat.timed(b, "close", func() error { return c.CloseEnv(ctx, br.EnvIDs[0]) })
		}
		lat.timed(b, "rollback", func() error {
			_, err := c.Rollback(ctx, env, r.Info.StateID)
			return err
		})
		lat.timed(b, "evaluate", func() error {
			_, err := c.Evaluate(ctx, env)
			return err
		})
		lat.timed(b, "states", func() error {
			_, err := c.States(ctx, env)
			return err
		})
	}
}

// BenchmarkSlowReaderRSS measures the server's resident memory while 16
// slow readers each hold 8 answers of 1 MiB unread (128 MiB of output in
// all): rss-base-MiB before, rss-peak-MiB the most seen while the
// answers were held (sampled for 10 s), rss-held-MiB the difference.
// Without a per-connection budget for unread answers the server holds
// them all.
func BenchmarkSlowReaderRSS(b *testing.B) {
	requireHost(b)
	const readers, k = 16, 8
	s := startServer(b, "--max-envs", "512")
	g := newCgroups(s)
	var base, peak int64
	for n := 0; n < b.N; n++ {
		raws := make([]*raw, readers)
		envs := make([]string, readers)
		for i := range raws {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			c, err := dialRaw(ctx, s.addr, 5*time.Minute)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			defer c.ws.Close()
			raws[i] = c
			var res arbor.ResetResult
			if err := c.call(1, protocol.MethodReset, arbor.ResetParams{Image: "busybox"}, &res); err != nil {
				b.Fatal(err)
			}
			envs[i] = res.EnvID
			mk := protocol.StepParams{EnvID: res.EnvID, Action: arbor.Bash(fmt.Sprintf("mkdir -p /work && head -c %d /dev/zero > /work/big", bigBytes), 0)}
			if err := c.call(2, protocol.MethodStep, mk, nil); err != nil {
				b.Fatal(err)
			}
		}
		sn, err := s.snapshot(g)
		if err != nil {
			b.Fatal(err)
		}
		base, peak = sn.rss, sn.rss
		b.ResetTimer()
		read := func(env string) protocol.StepParams {
			return protocol.StepParams{EnvID: env, Action: arbor.Action{Tool: state.ToolReadFile, Path: "/work/big", MaxOutput: 2 * bigBytes}}
		}
		for i, c := range raws {
			for j := 0; j < k; j++ {
				if err := c.send(uint32(100+j), protocol.MethodStep, read(envs[i])); err != nil {
					b.Fatal(err)
				}
			}
		}
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if sn, err := s.snapshot(g); err == nil && sn.rss > peak {
				peak = sn.rss
			}
		}
		for i, c := range raws {
			for got := 0; got < k; {
				f, err := c.read()
				if err != nil {
					b.Fatal(err)
				}
				if f.Type == protocol.Response {
					if f.Error != nil {
						b.Fatalf("held read_file: %v", f.Error)
					}
					got++
				}
			}
			if err := c.call(3, protocol.MethodClose, protocol.EnvParams{EnvID: envs[i]}, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
	}
	b.ReportMetric(float64(base>>20), "rss-base-MiB")
	b.ReportMetric(float64(peak>>20), "rss-peak-MiB")
	b.ReportMetric(float64((peak-base)>>20), "rss-held-MiB")
}
