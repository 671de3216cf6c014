package branch_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
)

// latencies collects per-operation durations and reports percentiles as
// benchmark metrics (go test -bench prints them next to ns/op).
type latencies []time.Duration

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	pct := func(p float64) float64 {
		i := int(p*float64(len(s)-1) + 0.5)
		return float64(s[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), prefix+"p50-ms")
	b.ReportMetric(pct(0.95), prefix+"p95-ms")
	b.ReportMetric(pct(0.99), prefix+"p99-ms")
}

// benchEnv is a shell sandbox with typical agent state: a cwd, variables,
// a function, a background process and some files.
func benchEnv(b *testing.B, r *rig) (*branch.Env, string) {
	b.Helper()
	img := testImage(b, r)
	env, _, err := r.e.NewEnv(context.Background(), img)
	if err != nil {
		b.Fatal(err)
	}
	start, _ := counterCmd(img)
	run(b, r.e, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && seq 1000 > /work/numbers")
	run(b, r.e, env, start)
	return env, img
}

func BenchmarkCheckpoint(b *testing.B) {
	dir := b.TempDir()
	r := newRig(b, newBtrfs(b, dir), dir, 0)
	env, img := benchEnv(b, r)
	b.Logf("image %s", img)
	ctx := context.Background()
	for _, kind := range []branch.Kind{branch.FS, branch.Proc, branch.Full} {
		b.Run(string(kind), func(b *testing.B) {
			var lat latencies
			var bytes int64
			for i := 0; i < b.N; i++ {
				run(b, r.e, env, fmt.Sprintf("echo %d > /work/turn", i))
				t := time.Now()
				sid, err := r.e.Checkpoint(ctx, env, kind)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
				if kind != branch.FS {
					st, _ := r.e.State(sid)
					u, _ := r.e.Usage()
					_ = st
					bytes = u.Manifest.Artifacts["proc"].Bytes / int64(max(1, u.Manifest.Artifacts["proc"].Count))
				}
			}
			lat.report(b, "")
			if bytes > 0 {
				b.ReportMetric(float64(bytes), "image-bytes")
			}
		})
	}
}

func BenchmarkRestore(b *testing.B) {
	dir := b.TempDir()
	r := newRig(b, newBtrfs(b, dir), dir, 0)
	env, _ := benchEnv(b, r)
	ctx := context.Background()
	sid, err := r.e.Checkpoint(ctx, env, branch.Full)
	if err != nil {
		b.Fatal(err)
	}
	var lat latencies
	for i := 0; i < b.N; i++ {
		lat = append(lat, branchOnce(b, r.e, sid, 1))
	}
	lat.report(b, "")
}

func BenchmarkBranch(b *testing.B) {
	for _, warm := range []int{0, 8} {
		b.Run(fmt.Sprintf("warm=%d", warm), func(b *testing.B) {
			dir := b.TempDir()
			r := newRig(b, newBtrfs(b, dir), dir, warm)
			env, _ := benchEnv(b, r)
			ctx := context.Background()
			sid, err := r.e.Checkpoint(ctx, env, branch.Full)
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 2, 4, 8, 16, 32} {
				if warm > 0 && n > warm {
					continue
				}
				b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
					var lat latencies
					for i := 0; i < b.N; i++ {
						if warm > 0 {
							b.StopTimer()
							waitWarm(b, r.e, warm)
							b.StartTimer()
						}
						lat = append(lat, branchOnce(b, r.e, sid, n))
					}
					lat.report(b, "")
					s := append(latencies(nil), lat...)
					sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
					b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000/float64(n), "per-child-p50-ms")
				})
			}
		})
	}
}

// branchOnce branches state sid into n children, closes them outside the
// timer and returns how long the branch took.
func branchOnce(b *testing.B, e *branch.Engine, sid string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	t := time.Now()
	res, err := e.Branch(ctx, branch.Source{State: sid}, n)
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(t)
	b.StopTimer()
	defer b.StartTimer()
	for j, c := range res.Children {
		if res.Errors[j] != nil {
			b.Fatalf("child %d: %v", j, res.Errors[j])
		}
		e.CloseEnv(ctx, c)
	}
	return took
}

func waitWarm(tb testing.TB, e *branch.Engine, n int) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		u, _ := e.Usage()
		if u.Warm >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("warm copies did not reach %d", n)
}

// BenchmarkIsolation measures what the hardening and user namespace mode
// cost, side by side in one run: sandbox start, the step round trip, checkpoints by kind,
// a restore and branch(8), for sandboxes started unhardened, hardened (the
// default) and hardened in user namespace mode (docs/security.md).
func BenchmarkIsolation(b *testing.B) {
	modes := []struct {
		name   string
		adjust func(*launch.Launcher)
	}{
		{"unhardened", func(l *launch.Launcher) { l.Isolation.Unhardened = true; l.UserNS = sandbox.UserNSConfig{} }},
		{"hardened", func(l *launch.Launcher) { l.UserNS = sandbox.UserNSConfig{} }},
		{"hardened-userns", func(l *launch.Launcher) { l.UserNS = sandbox.UserNSConfig{Enabled: true} }},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			dir := b.TempDir()
			r := newRigLauncher(b, newBtrfs(b, dir), dir, 0, m.adjust)
			t := time.Now()
			env, img := benchEnv(b, r) // the first launch (in user namespace mode it also shifts the image)
			b.Logf("image %s, first launch with set-up %v", img, time.Since(t))
			ctx := context.Background()
			if _, err := r.e.Checkpoint(ctx, env, branch.Full); err != nil {
				b.Fatal(err)
			}
			b.Run("start", func(b *testing.B) {
				var lat latencies
				for i := 0; i < b.N; i++ {
					t := time.Now()
					e, _, err := r.e.NewEnv(ctx, img)
					if err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t))
					b.StopTimer()
					r.e.CloseEnv(ctx, e)
					b.StartTimer()
				}
				lat.report(b, "")
			})
			b.Run("step", func(b *testing.B) {
				var lat latencies
				for i := 0; i < b.N; i++ {
					t := time.Now()
					run(b, r.e, env, "true")
					lat = append(lat, time.Since(t))
				}
				lat.report(b, "")
			})
			for _, kind := range []branch.Kind{branch.FS, branch.Proc, branch.Full} {
				b.Run("checkpoint-"+string(kind), func(b *testing.B) {
					var lat latencies
					for i := 0; i < b.N; i++ {
						run(b, r.e, env, fmt.Sprintf("echo %d > /work/turn", i))
						t := time.Now()
						if _, err := r.e.Checkpoint(ctx, env, kind); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t))
					}
					lat.report(b, "")
				})
			}
			sid, err := r.e.Checkpoint(ctx, env, branch.Full)
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 8} {
				name := "restore"
				if n > 1 {
					name = fmt.Sprintf("branch%d", n)
				}
				b.Run(name, func(b *testing.B) {
					var lat latencies
					for i := 0; i < b.N; i++ {
						lat = append(lat, branchOnce(b, r.e, sid, n))
					}
					lat.report(b, "")
				})
			}
		})
	}
}

// BenchmarkClassify is the cost of classifying a turn (Engine.Classify:
// the eBPF inspector's EndTurn, with the shell state query and the
// descriptor table) on the sandbox of benchEnv, for a read-only turn and a
// file edit.
func BenchmarkClassify(b *testing.B) {
	r := branchtest.ForTest(b, branchtest.Options{Inspector: true})
	ctx := context.Background()
	env, _, err := r.Engine.NewEnv(ctx, "busybox")
	if err != nil {
		b.Fatal(err)
	}
	run(b, r.Engine, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && seq 1000 > /work/numbers && exec 3>>/work/log")
	if _, err := r.Engine.Checkpoint(ctx, env, branch.Full); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, cmd string }{
		{"read-only", "cat /work/numbers >/dev/null"},
		{"file-edit", "echo x >> /work/numbers"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var lat latencies
			for i := 0; i < b.N; i++ {
				run(b, r.Engine, env, tc.cmd)
				turn, err := r.Engine.Classify(ctx, env, tc.cmd)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, turn.Took)
				if _, _, err := r.Engine.CheckpointAsync(env, turn.Kind); err != nil {
					b.Fatal(err)
				}
				if _, err := r.Engine.WaitCheckpoint(ctx, env); err != nil {
					b.Fatal(err)
				}
			}
			lat.report(b, "")
		})
	}
}

// BenchmarkGC: garbage collection throughput, states deleted per second
// from an env's close until GC is done (bounded passes of the default
// batch, snapshots and process images deleted with their records), for a
// closed lineage of 50 states (fs checkpoints, one in five full) per
// iteration; the lineage is made with the timer stopped.
func BenchmarkGC(b *testing.B) {
	const n = 50
	dir := b.TempDir()
	r := newRig(b, newBtrfs(b, dir), dir, 0)
	ctx := context.Background()
	var took time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		env, _, err := r.e.NewEnv(ctx, "busybox")
		if err != nil {
			b.Fatal(err)
		}
		for j := range n - 1 {
			run(b, r.e, env, fmt.Sprintf("echo %d > /f", j))
			kind := branch.FS
			if j%5 == 4 {
				kind = branch.Full
			}
			if _, err := r.e.Checkpoint(ctx, env, kind); err != nil {
				b.Fatal(err)
			}
		}
		// Timed from the close: the background GC, nudged by it, and
		// GC share the work.
		b.StartTimer()
		t := time.Now()
		if err := r.e.CloseEnv(ctx, env); err != nil {
			b.Fatal(err)
		}
		if err := r.e.GC(ctx); err != nil {
			b.Fatal(err)
		}
		took += time.Since(t)
	}
	u, err := r.e.Usage()
	if err != nil {
		b.Fatal(err)
	}
	if u.Manifest.States != 0 {
		b.Fatalf("%d states left after GC", u.Manifest.States)
	}
	b.Logf("%d states deleted in %v (%d passes, longest %v)", u.GC.States, took, u.GC.Passes, u.GC.MaxPass)
	b.ReportMetric(float64(u.GC.States)/took.Seconds(), "states/s")
}
