package branch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/internal/memhold"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// lazyMB is what the lazy restore tests' process holds.
const lazyMB = 256

// lazyRig is an engine that restores images of 64 MiB and more lazily,
// with a debian env whose Python process holds lazyMB MiB of patterned
// memory; sid is a past state of it (not its head).
func lazyRig(t *testing.T) (*rig, *branch.Env, string) {
	t.Helper()
	dir := t.TempDir()
	r := newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) { o.LazyBytes = 64 << 20 })
	if os.Getenv("ARBOR_TEST_IMAGE") == "busybox" {
		t.Log("the memory holder is Python: debian image")
	}
	sandboxtest.DebianCache(t)
	if _, err := r.images.Get(context.Background(), "debian"); err != nil {
		if err := r.images.Build(context.Background(), "debian", nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	env, _, err := r.e.NewEnv(ctx, "debian")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.e.CloseEnv(context.Background(), env) })
	res, err := r.e.Exec(ctx, env, memhold.Start(lazyMB)+"; echo past > /f", sandbox.ExecOptions{Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start the memory holder: %v %+v", err, res)
	}
	sid, err := r.e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	run(t, r.e, env, "echo later > /f")
	if _, err := r.e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	return r, env, sid
}

// lazyDaemons lists the criu lazy-pages daemons this process started that
// still run.
func lazyDaemons(t *testing.T) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	me := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "lazy-pages") {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) > 1 && f[1] == me {
			pids = append(pids, pid)
		}
	}
	return pids
}

// volumes counts the engine's sandbox roots.
func volumes(t *testing.T, r *rig) int {
	t.Helper()
	vs, err := r.snap.List(context.Background(), launch.VolumePrefix)
	if err != nil {
		t.Fatal(err)
	}
	return len(vs)
}

// TestLazyBranch: branch(2) of a past state of a sandbox holding 256 MiB,
// restored lazily: each child holds the state's files and, checked over a
// SHA-256 of all of it, the state's memory; both were restored lazily;
// its daemon finishes; the daemons are gone once the children are closed.
func TestLazyBranch(t *testing.T) {
	r, _, sid := lazyRig(t)
	ctx := context.Background()
	want := memhold.Want(lazyMB)
	res, err := r.e.Branch(ctx, branch.Source{State: sid}, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("branch(2) of a %d MiB process: %v", lazyMB, res.Took)
	for i, c := range res.Children {
		if c == nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		m, err := c.Sandbox().Memory()
		if err != nil {
			t.Fatal(err)
		}
		// How much a child holds right after depends on how far its
		// daemon's background copy got meanwhile (a loaded machine: all
		// of it); that the restore was lazy is LazyRestores below, and
		// the memory right after is `arbor bench --branch-only`'s
		// (benchmarks/branchmem_linux.go).
		t.Logf("child %d right after: memory.current %d MiB, anon %d MiB", i, m.Current>>20, m.Anon>>20)
	}
	u, err := r.e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Coord.LazyRestores < 2 {
		t.Errorf("LazyRestores %d after a branch(2) of a %d MiB image, want 2", u.Coord.LazyRestores, lazyMB)
	}
	var wg sync.WaitGroup
	for i, c := range res.Children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := r.e.Exec(ctx, c, "cat /f; "+memhold.Sum, sandbox.ExecOptions{Timeout: 30 * time.Second})
			if err != nil {
				t.Errorf("child %d: %v", i, err)
				return
			}
			if got := string(out.Stdout); got != "past\n"+want {
				t.Errorf("child %d: %q, want the past state's file and memory sum %q", i, got, want)
			}
		}()
	}
	wg.Wait()
	// The daemons copy the rest and exit; the children then hold it all.
	deadline := time.Now().Add(time.Minute)
	for len(lazyDaemons(t)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if d := lazyDaemons(t); len(d) > 0 {
		t.Fatalf("lazy-pages daemons %v still run a minute after the branch", d)
	}
	for i, c := range res.Children {
		m, _ := c.Sandbox().Memory()
		t.Logf("child %d once its daemon is done: memory.current %d MiB, anon %d MiB", i, m.Current>>20, m.Anon>>20)
		if m.Anon < lazyMB<<20 {
			t.Errorf("child %d: anon %d MiB once its daemon is done, want all %d", i, m.Anon>>20, lazyMB)
		}
		if got := run(t, r.e, c, memhold.Sum); got != want {
			t.Errorf("child %d after its daemon: memory sum %q", i, got)
		}
		if err := r.e.CloseEnv(ctx, c); err != nil {
			t.Error(err)
		}
	}
	if u, _ := r.e.Usage(); u.Coord.LazyFailed != 0 {
		t.Errorf("LazyFailed %d", u.Coord.LazyFailed)
	}
}

// TestLazyBranchDaemonKilled: a branch whose lazy-pages daemon is killed
// while CRIU restores (at post-restore, once it holds the tree's
// userfaultfds; at post-resume, the tree running) gets a clean error for
// that child wrapping state.ErrRestore and criu.ErrLazyPages, and no child: no
// env, no sandbox volume left, no daemon; a branch after it works.
func TestLazyBranchDaemonKilled(t *testing.T) {
	r, _, sid := lazyRig(t)
	ctx := context.Background()
	for _, stage := range []string{"post-restore", "post-resume"} {
		t.Run(stage, func(t *testing.T) {
			envs, volsBefore := len(r.e.Envs()), volumes(t, r)
			var killed bool
			r.opts.CRIU.LazyFaultHook = func(s string, d *criu.LazyPages) {
				if s == stage && !killed {
					killed = true
					syscall.Kill(d.PID(), syscall.SIGKILL)
					<-d.Done()
				}
			}
			defer func() { r.opts.CRIU.LazyFaultHook = nil }()
			res, err := r.e.Branch(ctx, branch.Source{State: sid}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !killed {
				t.Fatalf("no %s notification (child: %v)", stage, res.Errors[0])
			}
			if res.Children[0] != nil || !errors.Is(res.Errors[0], state.ErrRestore) || !errors.Is(res.Errors[0], criu.ErrLazyPages) {
				t.Fatalf("branch with its daemon killed at %s: child %v, err %v; want no child, state.ErrRestore and ErrLazyPages", stage, res.Children[0], res.Errors[0])
			}
			t.Logf("reported: %v", res.Errors[0])
			if n := len(r.e.Envs()); n != envs {
				t.Errorf("%d envs after the failed branch, want %d", n, envs)
			}
			if d := lazyDaemons(t); len(d) > 0 {
				t.Errorf("lazy-pages daemons %v left", d)
			}
			if vols := volumes(t, r); vols != volsBefore {
				t.Errorf("sandbox volumes %d after the failed branch, %d before", vols, volsBefore)
			}
		})
	}
	res, err := r.e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Children[0] == nil {
		t.Fatalf("branch after the failed ones: %v %v", err, res.Errors)
	}
	if got := run(t, r.e, res.Children[0], memhold.Sum); got != memhold.Want(lazyMB) {
		t.Errorf("memory sum %q after the failed branches", got)
	}
}

// failed is a sandbox.Failing that has failed, standing in for a
// lazy-pages daemon that died after its child was handed out.
type failed struct{}

func (failed) Close() error { return nil }
func (failed) Err() error   { return criu.ErrLazyPages }

// TestLazyFailureAfterHandout: once what a child's memory depends on has
// failed (its daemon died after the branch returned), its next command
// has no result: the env is revived at its state (RevivedError) and holds
// the state's memory again.
func TestLazyFailureAfterHandout(t *testing.T) {
	r, _, sid := lazyRig(t)
	ctx := context.Background()
	res, err := r.e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Children[0] == nil {
		t.Fatalf("branch: %v %v", err, res.Errors)
	}
	c := res.Children[0]
	old := c.Sandbox()
	old.Hold(failed{})
	_, err = r.e.Exec(ctx, c, "echo unreachable", sandbox.ExecOptions{Timeout: 30 * time.Second})
	var rev *branch.RevivedError
	if !errors.As(err, &rev) {
		t.Fatalf("exec after the daemon failed: %v, want a RevivedError", err)
	}
	select {
	case <-old.Exited():
	case <-time.After(10 * time.Second):
		t.Error("the sandbox whose daemon failed still runs")
	}
	if got := run(t, r.e, c, "cat /f; "+memhold.Sum); got != "past\n"+memhold.Want(lazyMB) {
		t.Errorf("revived child: %q", got)
	}
}

// TestLazyChildCheckpoint: a lazily restored child checkpointed at once
// (its daemon may still be copying: the dump reads the missing pages
// through it) gives a state whose own branch, lazy again, holds the same
// memory; and a rollback of the child to the past state brings it back.
func TestLazyChildCheckpoint(t *testing.T) {
	r, _, sid := lazyRig(t)
	ctx := context.Background()
	want := memhold.Want(lazyMB)
	res, err := r.e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Children[0] == nil {
		t.Fatalf("branch: %v %v", err, res.Errors)
	}
	c := res.Children[0]
	run(t, r.e, c, "echo child > /f")
	s2, err := r.e.Checkpoint(ctx, c, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := r.e.Branch(ctx, branch.Source{State: s2}, 1)
	if err != nil || res2.Children[0] == nil {
		t.Fatalf("branch of the child's state: %v %v", err, res2.Errors)
	}
	if got := run(t, r.e, res2.Children[0], "cat /f; "+memhold.Sum); got != "child\n"+want {
		t.Errorf("branch of the lazily restored child's state: %q", got)
	}
	if err := r.e.Rollback(ctx, c, sid); err != nil {
		t.Fatal(err)
	}
	if got := run(t, r.e, c, "cat /f; "+memhold.Sum); got != "past\n"+want {
		t.Errorf("child rolled back to the past state: %q", got)
	}
	if u, _ := r.e.Usage(); u.Coord.LazyRestores < 3 || u.Coord.LazyFailed != 0 {
		t.Errorf("LazyRestores %d, LazyFailed %d: want 3 lazy restores, none failed", u.Coord.LazyRestores, u.Coord.LazyFailed)
	}
}
