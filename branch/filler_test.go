package branch_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// smallPool is an engine on a 1 GiB btrfs pool whose sandboxes may write
// quota bytes each (-1: no quota), with no retention.
func smallPool(t *testing.T, quota int64, adjust func(*branch.Options)) *rig {
	t.Helper()
	dir := t.TempDir()
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: dir, PoolSize: 1 << 30, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snap.Unmount(context.Background()) })
	return newRigOptions(t, snap, dir, func(o *branch.Options) {
		o.Launcher.Limits = sandbox.Limits{DiskBytes: quota}
		o.GCInterval = 100 * time.Millisecond
		o.PressureWait = 500 * time.Millisecond
		if adjust != nil {
			adjust(o)
		}
	})
}

// pool is the engine's pool as last measured.
func pool(t *testing.T, e *branch.Engine) branch.DiskUsage {
	t.Helper()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range u.Disk {
		if d.Name == branch.DiskPool {
			return d
		}
	}
	t.Fatal("no pool in Usage().Disk")
	return branch.DiskUsage{}
}

// execOK runs cmd in env and returns its result, failing the test on an
// engine error (not on the command's exit code).
func execOK(t *testing.T, e *branch.Engine, env *branch.Env, cmd string) *sandbox.Result {
	t.Helper()
	res, err := e.Exec(context.Background(), env, cmd, sandbox.ExecOptions{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return res
}

// keepStepping has env write a small file, checkpoint, and checks the
// state branches with it: the other envs' work while a filler runs.
func keepStepping(t *testing.T, e *branch.Engine, env *branch.Env, what string) {
	t.Helper()
	ctx := context.Background()
	if res := execOK(t, e, env, "echo "+what+" > /f"); res.ExitCode != 0 {
		t.Errorf("%s: write: exit %d: %s", what, res.ExitCode, res.Stderr)
	}
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Errorf("%s: checkpoint: %v", what, err)
	}
}

const filler = "dd if=/dev/zero of=/big bs=1M 2>&1; sync"

// TestFillerStoppedByQuota: with a per-sandbox quota (here 256 MiB on a
// 1 GiB pool; the server's default is 2 GiB on 16), an env that writes
// until it fails is stopped by its quota (EDQUOT), the pool stays under
// its high mark, and the other envs keep stepping, checkpointing and
// branching, as do resets. Once the filler removes its file and closes
// (no retention), the pool's room comes back without a restart.
func TestFillerStoppedByQuota(t *testing.T) {
	r := smallPool(t, 256<<20, nil)
	ctx := context.Background()
	e := r.e
	other, _ := numbered(t, e, 1)
	fill, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	before := pool(t, e)
	res := execOK(t, e, fill, filler)
	if !strings.Contains(string(res.Stdout)+string(res.Stderr), "Disk quota exceeded") {
		t.Fatalf("filler: exit %d, %q; want it stopped by its quota", res.ExitCode, string(res.Stdout)+string(res.Stderr))
	}
	// The filler's turn is checkpointed like any other: the state holds /big.
	if _, err := e.Checkpoint(ctx, fill, state.Full); err != nil {
		t.Errorf("checkpoint of the full sandbox: %v", err)
	}
	full := pool(t, e)
	t.Logf("pool before %d/%d, after the filler %d/%d (%.0f%%)", before.Used, before.Total, full.Used, full.Total, 100*full.Fraction())
	if full.Used-before.Used < 200<<20 || full.Fraction() >= 0.9 {
		t.Errorf("pool after the filler: %+v, want about 256 MiB more and under the high mark", full)
	}
	t.Log("filler stopped")
	for _, what := range []string{"a", "b", "c"} {
		keepStepping(t, e, other, what)
	}
	t.Log("other env stepped")
	branchCheck(t, e, other.Head(), "c")
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatalf("reset next to a filler stopped by its quota: %v", err)
	}
	e.CloseEnv(ctx, env)
	// rm alone frees nothing while the filler's checkpoint holds /big;
	// closing it (no retention) lets GC take its states.
	execOK(t, e, fill, "rm /big; sync")
	if err := e.CloseEnv(ctx, fill); err != nil {
		t.Fatal(err)
	}
	t.Log("filler closed")
	branchtest.WaitFor(t, "the filler's room back", func() bool { syncPool(t, r.snap); return pool(t, e).Used < full.Used-200<<20 })
}

// TestFillerWithoutQuota: a sandbox with no quota (removed from its
// root) fills the 1 GiB pool. Eviction finds nothing to free, so fair
// shares stop it (docs/engine.md, "Fair shares"): its command answers
// ErrOverShare, and so does every later call on it, never a revived env.
// Once its root is gone the pool is back under its marks without a
// restart: resets work again, and the other env, which a full pool may
// have refused writes, steps, checkpoints and branches exactly.
func TestFillerWithoutQuota(t *testing.T) {
	r := smallPool(t, 256<<20, nil)
	ctx := context.Background()
	e := r.e
	other, _ := numbered(t, e, 1)
	fill, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitCheckpoint(ctx, fill); err != nil {
		t.Fatal(err)
	}
	vol := rootOf(t, r.snap, fill)
	if err := r.snap.(cr.Quotaer).SetQuota(ctx, vol, 0); err != nil {
		t.Fatal(err)
	}
	res, err := e.Exec(ctx, fill, filler, sandbox.ExecOptions{Timeout: 2 * time.Minute})
	switch {
	case errors.Is(err, branch.ErrOverShare):
		t.Logf("filler stopped during its command: %v", err)
	case err != nil:
		t.Fatalf("filler without a quota: %v, want its output or ErrOverShare", err)
	default:
		t.Logf("filler's command ended first: exit %d, %q", res.ExitCode, string(res.Stdout)+string(res.Stderr))
	}
	branchtest.WaitFor(t, "the filler stopped", func() bool {
		_, err := e.Exec(ctx, fill, "true", sandbox.ExecOptions{})
		return errors.Is(err, branch.ErrOverShare)
	})
	if _, err := e.Checkpoint(ctx, fill, state.Full); !errors.Is(err, branch.ErrOverShare) {
		t.Errorf("checkpoint of the stopped filler: %v, want ErrOverShare", err)
	}
	branchtest.WaitFor(t, "the pool under its low mark", func() bool {
		syncPool(t, r.snap)
		d := pool(t, e)
		return !d.Over && d.Fraction() < 0.8
	})
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatalf("reset once the filler is gone: %v", err)
	}
	e.CloseEnv(ctx, env)
	keepStepping(t, e, other, "after")
	branchCheck(t, e, other.Head(), "after")
	if u, err := e.Usage(); err != nil || u.Pressure.Stopped != 1 {
		t.Errorf("Usage().Pressure.Stopped = %d (%v), want 1", u.Pressure.Stopped, err)
	}
	if err := e.CloseEnv(ctx, fill); err != nil {
		t.Errorf("close of the stopped filler: %v", err)
	}
	if err := e.CheckManifest(); err != nil {
		t.Error(err)
	}
}

// syncPool commits the pool's transaction and wakes its cleaner: what GC
// deleted outside pressure is freed after btrfs's next periodic commit
// (30 s by default), which this brings forward.
func syncPool(t *testing.T, snap cr.Snapshotter) {
	if err := snap.(*btrfs.Snapshotter).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// rootOf is the volume of env's root.
func rootOf(t *testing.T, snap cr.Snapshotter, env *branch.Env) string {
	t.Helper()
	vols, err := snap.List(context.Background(), launch.VolumePrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if strings.HasPrefix(filepath.Base(v.Name), env.ID) {
			return v.Name
		}
	}
	t.Fatalf("no root volume for env %s in %v", env.ID, vols)
	return ""
}

// TestFillersOverTheirShare: three envs each write up to their quota
// (400 MiB on a 1 GiB pool: together more than the pool holds). The
// pool fills, eviction finds nothing to free, and the GC stops the env
// holding the most of it (over its share: 90% of the pool over the open
// envs); its calls then answer ErrOverShare, never a revived env. The
// well-behaved env is never stopped: once the pool is back under its high
// mark it steps, checkpoints and branches exactly, and resets are
// admitted again (docs/engine.md, "Fair shares").
func TestFillersOverTheirShare(t *testing.T) {
	r := smallPool(t, 400<<20, nil)
	ctx := context.Background()
	e := r.e
	other, _ := numbered(t, e, 1)
	fillers := make([]*branch.Env, 3)
	for i := range fillers {
		env, _, err := e.NewEnv(ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		fillers[i] = env
	}
	errs := make([]error, len(fillers))
	done := make(chan int)
	for i, env := range fillers {
		go func() {
			_, errs[i] = e.Exec(ctx, env, filler, sandbox.ExecOptions{Timeout: 2 * time.Minute})
			done <- i
		}()
	}
	for range fillers {
		<-done
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, branch.ErrOverShare) {
			t.Errorf("filler %d: %v, want its output or ErrOverShare", i, err)
		}
	}
	branchtest.WaitFor(t, "a filler stopped and the pool under its high mark", func() bool {
		syncPool(t, r.snap)
		u, err := e.Usage()
		if err != nil {
			t.Fatal(err)
		}
		return u.Pressure.Stopped > 0 && pool(t, e).Fraction() < 0.9
	})
	stopped := 0
	for i, env := range fillers {
		_, err := e.Exec(ctx, env, "true", sandbox.ExecOptions{})
		switch {
		case errors.Is(err, branch.ErrOverShare):
			stopped++
			t.Logf("filler %d stopped: %v", i, err)
		case err != nil:
			t.Errorf("filler %d after the pool filled: %v, want it running or ErrOverShare", i, err)
		}
	}
	if stopped == 0 || stopped == len(fillers) {
		t.Errorf("%d of %d fillers stopped: want the ones over their share until the pool was under its mark, not all", stopped, len(fillers))
	}
	keepStepping(t, e, other, "after")
	branchCheck(t, e, other.Head(), "after")
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatalf("reset once the pool is back under its mark: %v", err)
	}
	e.CloseEnv(ctx, env)
	for _, env := range fillers {
		e.CloseEnv(ctx, env)
	}
	if err := e.CheckManifest(); err != nil {
		t.Error(err)
	}
}

// TestDiskReservation: with DiskReserve an env is admitted only if the
// pool can take its whole quota beside what every open env may still
// write (docs/engine.md, "Disk reservation"). On a 1 GiB pool with 300 MiB
// quotas two envs fit and a third, and a branch of 2, are refused with
// state.ErrNoSpace naming the reservation; the two fill their quotas and the
// pool stays under its high mark, so their checkpoints and steps go on;
// once one closes, a new env is admitted again.
func TestDiskReservation(t *testing.T) {
	r := smallPool(t, 300<<20, func(o *branch.Options) { o.DiskReserve = true })
	ctx := context.Background()
	e := r.e
	var envs []*branch.Env
	for range 2 {
		env, _, err := e.NewEnv(ctx, "busybox")
		if err != nil {
			t.Fatalf("env %d of 2 with 300 MiB quotas on 1 GiB: %v", len(envs)+1, err)
		}
		envs = append(envs, env)
	}
	if env, _, err := e.NewEnv(ctx, "busybox"); !errors.Is(err, state.ErrNoSpace) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("a third env: %v, want state.ErrNoSpace for the reservation", err)
	} else if env != nil {
		e.CloseEnv(ctx, env)
	}
	if _, err := e.Branch(ctx, branch.Source{Env: envs[0]}, 2); !errors.Is(err, state.ErrNoSpace) {
		t.Fatalf("a branch of 2: %v, want state.ErrNoSpace", err)
	}
	for _, env := range envs {
		res := execOK(t, e, env, filler)
		if !strings.Contains(string(res.Stdout)+string(res.Stderr), "Disk quota exceeded") {
			t.Fatalf("filler: exit %d, %q; want it stopped by its quota", res.ExitCode, string(res.Stdout)+string(res.Stderr))
		}
	}
	if d := pool(t, e); d.Fraction() >= 0.9 {
		t.Errorf("pool with both envs at their quotas: %.0f%% used, want under the high mark", 100*d.Fraction())
	}
	for i, env := range envs {
		execOK(t, e, env, "rm /big")
		keepStepping(t, e, env, "after-"+string(rune('a'+i)))
	}
	if err := e.CloseEnv(ctx, envs[1]); err != nil {
		t.Fatal(err)
	}
	// Its room comes back once btrfs has dropped its root (a commit
	// later; a client retries no_space).
	var env *branch.Env
	branchtest.WaitFor(t, "an env admitted once one closed", func() bool {
		syncPool(t, r.snap)
		var err error
		env, _, err = e.NewEnv(ctx, "busybox")
		if err != nil && !errors.Is(err, state.ErrNoSpace) {
			t.Fatal(err)
		}
		return err == nil
	})
	e.CloseEnv(ctx, env)
	e.CloseEnv(ctx, envs[0])
}
