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
	"github.com/arbor-env/arbor/state"
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
	for _, kind := range []state.Kind{state.FS, state.Proc, state.Full} {
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
				if kind != state.FS {
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
	sid, err := r.e.Checkpoint(ctx, env, state.Full)
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
			sid, err := r.e.Checkpoint(ctx, env, state.Full)
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

// BenchmarkBranchPrepared branches n children from a past state (not
// the env's head) cold, and from the same state after Prepare(n, wait):
// the children are then thawed prepared copies (docs/engine.md,
// "Prepared copies"). The prepare itself is outside the timer: it is the
// background work a trainer's hint buys ahead of the branch.
func BenchmarkBranchPrepared(b *testing.B) {
	dir := b.TempDir()
	r := newRigOptions(b, newBtrfs(b, dir), dir, func(o *branch.Options) { o.Inspector = newInspector(b) })
	env, _ := benchEnv(b, r)
	ctx := context.Background()
	past, err := r.e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		b.Fatal(err)
	}
	run(b, r.e, env, "echo later > /work/turn")
	if _, err := r.e.Checkpoint(ctx, env, state.Full); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"cold", "prepared"} {
		for _, n := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/n=%d", mode, n), func(b *testing.B) {
				var lat latencies
				u0, _ := r.e.Usage()
				for i := 0; i < b.N; i++ {
					var taken int64
					if mode == "prepared" {
						b.StopTimer()
						res, err := r.e.Prepare(ctx, []string{past}, n, true)
						if err != nil {
							b.Fatal(err)
						}
						if res.Ready[past] != n {
							b.Fatalf("prepare(%d, wait): %+v", n, res)
						}
						u, _ := r.e.Usage()
						taken = u.Prepare.Taken
						b.StartTimer()
					}
					lat = append(lat, branchOnce(b, r.e, past, n))
					if mode == "prepared" {
						if u, _ := r.e.Usage(); u.Prepare.Taken-taken != int64(n) {
							b.Fatalf("branch(%d) took %d prepared copies, want %d", n, u.Prepare.Taken-taken, n)
						}
					}
				}
				lat.report(b, "")
				s := append(latencies(nil), lat...)
				sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
				b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000/float64(n), "per-child-p50-ms")
				// Where a cold child's restore goes, each restore's own
				// time (two run at once on two cores).
				if u1, _ := r.e.Usage(); mode == "cold" && u1.Coord.Restores > u0.Coord.Restores {
					k := float64(u1.Coord.Restores - u0.Coord.Restores)
					for _, ph := range []string{branch.PhaseClone, branch.PhaseCRIU, branch.PhaseAdopt} {
						d := u1.Coord.RestorePhases[ph] - u0.Coord.RestorePhases[ph]
						b.ReportMetric(float64(d.Microseconds())/1000/k, ph+"-ms/child")
					}
				}
			})
		}
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
			if _, err := r.e.Checkpoint(ctx, env, state.Full); err != nil {
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
			for _, kind := range []state.Kind{state.FS, state.Proc, state.Full} {
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
			sid, err := r.e.Checkpoint(ctx, env, state.Full)
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
// descriptor table) on the sandbox of benchEnv, for a read-only turn, a
// file edit and a pipeline while a background process holds a socket (the
// pipe's stream calls make the Inspector read every process's
// descriptors, docs/inspector.md "Syscall classes").
func BenchmarkClassify(b *testing.B) {
	r := branchtest.ForTest(b, branchtest.Options{Inspector: true})
	ctx := context.Background()
	env, _, err := r.Engine.NewEnv(ctx, "busybox")
	if err != nil {
		b.Fatal(err)
	}
	run(b, r.Engine, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && seq 1000 > /work/numbers && exec 3>>/work/log && (nc -l -p 9999 >/dev/null 2>&1 &)")
	if _, err := r.Engine.Checkpoint(ctx, env, state.Full); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, cmd string }{
		{"read-only", "cat /work/numbers >/dev/null"},
		{"file-edit", "echo x >> /work/numbers"},
		{"pipeline", "seq 1000 | wc -l >/dev/null"},
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
			kind := state.FS
			if j%5 == 4 {
				kind = state.Full
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

// BenchmarkGCLatency: what a busy background GC costs a turn and a
// branch, side by side. One open busybox env takes turns (a small command
// and the fs checkpoint a turn would take after it, timed together: the
// step) and, after each, a branch(1) from a past full state of its own
// (timed: the branch; the child is closed outside the timer), in three
// conditions:
//
//   - idle: no other states; the GC only runs the empty passes the
//     children's close nudges.
//   - retained: a backlog of closed lineages (several envs, fs
//     checkpoints, one in twenty full) kept by a retention of an hour; the
//     GC's passes find nothing to delete. The control for gc: the same
//     manifest and pool, no deletion.
//   - gc: the engine's clock passes that retention (branch.AdvanceClock)
//     and the background GC deletes the backlog; only the samples that
//     start after its first deletion and end before it has deleted the
//     whole backlog count, so each ran with the GC deleting (another
//     backlog when one gave too few).
//
// Backlogs are made with the timer stopped. It reports p50/p95/p99 of
// each (idle-step-p50-ms, gc-branch-p99-ms, ...), the samples in the gc
// windows, the states the GC deleted inside them and its rate there,
// and for comparison its rate on a backlog of the same size with nothing
// else running (gc-alone-states/s). One run per invocation: use
// -benchtime 1x (one to two minutes).
func BenchmarkGCLatency(b *testing.B) {
	const (
		samples  = 30  // per condition, at least
		rounds   = 4   // gc condition: backlogs deleted, at most
		lineages = 4   // closed lineages per backlog, made in parallel
		states   = 400 // states per lineage
	)
	dir := b.TempDir()
	r := newRigOptions(b, newBtrfs(b, dir), dir, func(o *branch.Options) { o.Retain = time.Hour })
	e := r.e
	ctx := context.Background()
	usage := func() branch.Usage {
		u, err := e.Usage()
		if err != nil {
			b.Fatal(err)
		}
		return u
	}
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		b.Fatal(err)
	}
	start, _ := counterCmd("busybox")
	run(b, e, env, "mkdir -p /work && cd /work && export K=v && seq 1000 > /work/numbers")
	run(b, e, env, start)
	past, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		b.Fatal(err)
	}
	turn := 0
	sample := func() (step, br time.Duration) {
		turn++
		t := time.Now()
		run(b, e, env, fmt.Sprintf("echo %d > /work/turn", turn))
		if _, err := e.Checkpoint(ctx, env, state.FS); err != nil {
			b.Fatal(err)
		}
		step = time.Since(t)
		return step, branchOnce(b, e, past, 1)
	}
	// still takes the samples of a condition in which the GC must delete
	// nothing.
	still := func(name string) (steps, branches latencies) {
		u0 := usage()
		for range samples {
			s, br := sample()
			steps, branches = append(steps, s), append(branches, br)
		}
		u1 := usage()
		if u1.GC.States != u0.GC.States {
			b.Fatalf("%s: GC deleted %d states", name, u1.GC.States-u0.GC.States)
		}
		b.Logf("%s: %d samples, %d states in the manifest, %d GC passes (none deleted anything; the last held the GC lock %v)",
			name, samples, u1.Manifest.States, u1.GC.Passes-u0.GC.Passes, u1.GC.LastPass)
		return steps, branches
	}
	// backlog makes the closed lineages, retained for the hour, and
	// returns how many states they hold.
	backlog := func() int64 {
		b.StopTimer()
		defer b.StartTimer()
		before := usage().Manifest.States
		errs := make(chan error, lineages)
		for range lineages {
			go func() {
				errs <- func() error {
					env, _, err := e.NewEnv(ctx, "busybox")
					if err != nil {
						return err
					}
					defer e.CloseEnv(ctx, env)
					for j := range states - 1 {
						if _, err := e.Exec(ctx, env, fmt.Sprintf("echo %d > /f", j), execOpts()); err != nil {
							return err
						}
						kind := state.FS
						if j%20 == 19 {
							kind = state.Full
						}
						if _, err := e.Checkpoint(ctx, env, kind); err != nil {
							return err
						}
					}
					return nil
				}()
			}()
		}
		for range lineages {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		return int64(usage().Manifest.States - before)
	}

	idleStep, idleBranch := still("idle")
	n := backlog()
	retStep, retBranch := still("retained")

	var gcStep, gcBranch latencies
	var deleted, passes int64
	var window time.Duration
	made := 0
	for ; made < rounds && len(gcStep) < samples; made++ {
		if made > 0 {
			n = backlog()
		}
		u := usage()
		target := u.GC.States + n
		branch.AdvanceClock(e, time.Hour+time.Second)
		var first branch.Usage
		branchtest.WaitFor(b, "the GC's first deletion", func() bool {
			first = usage()
			return first.GC.States > u.GC.States
		})
		t0, last := time.Now(), first
		var took time.Duration
		for {
			s, br := sample()
			now := usage()
			if now.GC.States >= target {
				break // the GC finished during this sample
			}
			gcStep, gcBranch = append(gcStep, s), append(gcBranch, br)
			last, took = now, time.Since(t0)
		}
		deleted += last.GC.States - first.GC.States
		passes += last.GC.Passes - first.GC.Passes
		window += took
		b.Logf("gc round %d: backlog of %d states; %d samples so far; the GC deleted %d states in %d passes in this window (%v, longest pass so far %v)",
			made, n, len(gcStep), last.GC.States-first.GC.States, last.GC.Passes-first.GC.Passes, took.Round(time.Millisecond), last.GC.MaxPass)
		branchtest.WaitFor(b, "the backlog deleted", func() bool { return usage().GC.States >= target })
	}
	if len(gcStep) == 0 {
		b.Fatal("no sample fell inside a GC window: make the backlog bigger")
	}
	b.Logf("gc: %d samples in %d windows, in which the GC deleted %d states in %d passes (%v)",
		len(gcStep), made, deleted, passes, window.Round(time.Millisecond))

	// For comparison, the GC alone on a backlog of the same size.
	n = backlog()
	b.StopTimer()
	u := usage()
	branch.AdvanceClock(e, time.Hour+time.Second)
	t0 := time.Now()
	branchtest.WaitFor(b, "the backlog deleted", func() bool { return usage().GC.States >= u.GC.States+n })
	alone := time.Since(t0)
	a := usage()
	b.Logf("alone: the GC deleted %d states in %d passes in %v (longest pass so far %v)",
		n, a.GC.Passes-u.GC.Passes, alone.Round(time.Millisecond), a.GC.MaxPass)
	b.StartTimer()

	idleStep.report(b, "idle-step-")
	retStep.report(b, "retained-step-")
	gcStep.report(b, "gc-step-")
	idleBranch.report(b, "idle-branch-")
	retBranch.report(b, "retained-branch-")
	gcBranch.report(b, "gc-branch-")
	b.ReportMetric(float64(len(gcStep)), "gc-samples")
	b.ReportMetric(float64(deleted), "gc-deleted-states")
	if window > 0 {
		b.ReportMetric(float64(deleted)/window.Seconds(), "gc-window-states/s")
	}
	b.ReportMetric(float64(n)/alone.Seconds(), "gc-alone-states/s")
}
