package branch_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/state"
)

// TestDiskPressure: with the pool reported over its high mark (a fake
// statfs: how full it is follows how many of the test's states exist),
// the GC evicts closed lineages' states within their retention, the
// env closed first first, down to the low mark; never an open env's
// lineage or a pinned state. While nothing more can go, resets and
// branches are refused with state.ErrNoSpace and steps and checkpoints go on;
// once the pool is under the mark again, they are admitted.
func TestDiskPressure(t *testing.T) {
	r := retainRig(t, time.Hour, func(o *branch.Options) {
		o.GCBatch = 1
		o.GCInterval = 50 * time.Millisecond
		o.PressureWait = 200 * time.Millisecond
	})
	ctx := context.Background()
	e := r.e
	a, as := numbered(t, e, 2)
	b, bs := numbered(t, e, 2)
	c, cs := numbered(t, e, 2)
	if err := e.CloseEnv(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := e.CloseEnv(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := e.Pin(cs[1]); err != nil { // keeps cs[0] and cs[1]
		t.Fatal(err)
	}
	all := append(append(append([]string{}, as...), bs...), cs...)
	// The pool is at 95% while more than limit of the test's states exist.
	var limit atomic.Int64
	limit.Store(int64(len(all)))
	const total = 1 << 30
	branch.SetStatfs(e, func(name, _ string) (int64, int64, int64, error) {
		used := int64(total / 2)
		if name == branch.DiskPool {
			n := 0
			for _, sid := range all {
				if _, err := e.State(sid); err == nil {
					n++
				}
			}
			if int64(n) > limit.Load() {
				used = total / 100 * 95
			}
		}
		return used, total, total - used, nil
	})
	waitPasses(t, e, 2)
	exists(t, e, "under the high mark", all...)

	limit.Store(int64(len(all) - len(bs)))
	branchtest.WaitFor(t, "b's states evicted", func() bool { return gone(e, bs...) })
	waitPasses(t, e, 3)
	exists(t, e, "back under the low mark: the env closed later", cs...)

	limit.Store(0) // over for good: only cs[2] can still go
	branchtest.WaitFor(t, "cs[2] evicted", func() bool { return gone(e, cs[2]) })
	waitPasses(t, e, 3)
	exists(t, e, "open lineage and pinned states under pressure", append(as, cs[:2]...)...)
	if _, err := e.Branch(ctx, branch.Source{State: cs[1]}, 1); !errors.Is(err, state.ErrNoSpace) {
		t.Errorf("branch over the high mark: %v, want state.ErrNoSpace", err)
	}
	if _, _, err := e.NewEnv(ctx, "busybox"); !errors.Is(err, state.ErrNoSpace) {
		t.Errorf("new env over the high mark: %v, want state.ErrNoSpace", err)
	}
	run(t, e, a, "echo 3 > /f")
	if _, err := e.Checkpoint(ctx, a, state.Full); err != nil {
		t.Errorf("checkpoint over the high mark: %v", err)
	}
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Pressure.Refused != 2 || u.Pressure.Evicted != int64(len(bs)+1) || !u.Disk[0].Over || u.Disk[0].Name != branch.DiskPool {
		t.Errorf("usage under pressure: %+v %+v, want 2 refusals, %d evicted, the pool over", u.Pressure, u.Disk, len(bs)+1)
	}

	limit.Store(int64(len(all)))
	branchCheck(t, e, cs[1], "1")
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatalf("new env once under the mark: %v", err)
	}
	e.CloseEnv(ctx, env)
	exists(t, e, "the open lineage at the end", as...)
}

// TestStatfsHangs: a watched file system whose statfs does not answer
// (a hung FUSE daemon) does not hang the engine: Usage and Admit return
// with its last numbers while the call is stuck, however many ask only
// one call is in flight, and once it answers the next measure reads the
// new numbers.
func TestStatfsHangs(t *testing.T) {
	r := retainRig(t, time.Hour, nil)
	e := r.e
	const total = 1 << 30
	var calls atomic.Int64 // calls that hung
	release := make(chan struct{})
	var hang atomic.Bool
	branch.SetStatfsMax(e, 100*time.Millisecond)
	branch.SetStatfs(e, func(name, _ string) (int64, int64, int64, error) {
		if name == branch.DiskPool {
			if hang.Load() {
				calls.Add(1)
				<-release
				return total / 10 * 3, total, total / 10 * 7, nil
			}
		}
		return total / 10, total, total / 10 * 9, nil
	})
	pool := func() branch.DiskUsage {
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
		t.Fatalf("usage has no %s: %+v", branch.DiskPool, u.Disk)
		return branch.DiskUsage{}
	}
	if d := pool(); d.Used != total/10 {
		t.Fatalf("pool used %d before the hang, want %d", d.Used, total/10)
	}
	hang.Store(true)
	done := make(chan error, 1)
	go func() {
		for range 3 {
			if d := pool(); d.Used != total/10 {
				done <- fmt.Errorf("pool used %d while statfs hangs, want the last reading %d", d.Used, total/10)
				return
			}
		}
		done <- e.Admit(context.Background())
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("while statfs hangs: %v", err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("Usage and Admit still waiting on a hung statfs after a minute")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d statfs calls of the pool in flight at once, want 1", n)
	}
	close(release) // the stuck call answers, and so does every call after it
	branchtest.WaitFor(t, "the pool's new numbers", func() bool { return pool().Used == total/10*3 })
}

// TestStateBytes: a file snapshot's size is what the turn wrote that it
// holds (the root's simple-quota charge since the previous snapshot), a
// state of kind full adds its process image, and the lineage counts each
// artifact once.
func TestStateBytes(t *testing.T) {
	r := retainRig(t, 0, nil)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "dd if=/dev/urandom of=/x bs=1M count=3 2>/dev/null")
	s1, err := e.Checkpoint(ctx, env, state.FS)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo small > /y")
	s2, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	line, err := e.Lineage(s2)
	if err != nil {
		t.Fatal(err)
	}
	own, total := e.StateBytes(line)
	if len(line) != 3 || line[1].ID != s1 {
		t.Fatalf("lineage %v", line)
	}
	st2, _ := e.State(s2)
	img, err := branch.ArtifactBytes(e, st2.Proc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("own bytes %v, lineage %d, image %d", own, total, img)
	if own[1] < 3<<20 || own[1] > 4<<20 {
		t.Errorf("fs state after writing 3 MiB: %d bytes, want about 3 MiB", own[1])
	}
	// The image is a delta of s1's (docs/engine.md, "Delta images"):
	// smaller than a whole dump, but never empty.
	if fs := own[2] - img; img <= 0 || fs < 0 || fs > 1<<20 {
		t.Errorf("full state after a small write: %d bytes with a %d byte image, want the image and under 1 MiB of files", own[2], img)
	}
	if sum := own[0] + own[1] + own[2]; total != sum {
		t.Errorf("lineage %d bytes, want the sum of its states' own %d (no artifact shared here)", total, sum)
	}
}
