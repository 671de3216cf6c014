package branch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// gatedSnap holds every Clone while armed, so that a test can stop a
// restore at a known point (after its image is pinned, before its root
// exists).
type gatedSnap struct {
	*btrfs.Snapshotter // the whole of it: quotas too
	mu                 sync.Mutex
	gate               chan struct{} // non-nil: Clone waits until it is closed
	entered            chan string   // gets the destination of each held Clone
}

func (g *gatedSnap) Clone(ctx context.Context, src, dst string) error {
	g.mu.Lock()
	gate, entered := g.gate, g.entered
	g.mu.Unlock()
	if gate != nil {
		entered <- dst
		<-gate
	}
	return g.Snapshotter.Clone(ctx, src, dst)
}

// arm makes the next Clones wait; the returned func lets them go.
func (g *gatedSnap) arm() (entered <-chan string, open func()) {
	gate, ch := make(chan struct{}), make(chan string, 16)
	g.mu.Lock()
	g.gate, g.entered = gate, ch
	g.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			g.mu.Lock()
			g.gate, g.entered = nil, nil
			g.mu.Unlock()
			close(gate)
		})
	}
}

// held is what an engine holds that a leaked child would add to. Child
// processes stand for sandboxes (every sandbox's init, started or
// restored, is a child of the engine's process); the cgroup tree is
// shared with whatever else runs on the host, so it cannot be counted.
type held struct {
	envs, volumes, children int
}

func holdings(t *testing.T, e *branch.Engine, snap cr.Snapshotter) held {
	t.Helper()
	vols, err := snap.List(context.Background(), launch.VolumePrefix)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vols {
		if strings.HasPrefix(v.Name, launch.VolumePrefix) {
			n++
		}
	}
	// Each thread lists the children it forked; threads come and go.
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("list child processes: %v", err)
	}
	kids := 0
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		kids += len(strings.Fields(string(b)))
	}
	return held{envs: len(e.Envs()), volumes: n, children: kids}
}

// warmUpRestores branches sid once and closes the child, so that what a
// first restore starts for good (CRIU kept started for the next one) is
// in the baseline of a test that counts what the engine holds.
func warmUpRestores(t *testing.T, e *branch.Engine, sid string) {
	t.Helper()
	ctx := context.Background()
	warmup, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || warmup.Errors[0] != nil {
		t.Fatalf("branch: %v %v", err, warmup.Errors)
	}
	if err := e.CloseEnv(ctx, warmup.Children[0]); err != nil {
		t.Fatal(err)
	}
}

// waitIdle waits until the engine's queue has nothing queued or running.
func waitIdle(t *testing.T, e *branch.Engine) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		u, err := e.Usage()
		if err != nil {
			t.Fatal(err)
		}
		q := u.Queue
		if q.Running == 0 && q.Low.Queued == 0 && q.High.Queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue still busy: %+v", q)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCancelledBranch: a Branch whose ctx ends while its children are
// queued, or while one is being restored, returns at once with the ctx's
// error for them, and leaves nothing behind: no env registered that
// nobody holds, no sandbox root, no sandbox process, no goroutine.
func TestCancelledBranch(t *testing.T) {
	dir := t.TempDir()
	g := &gatedSnap{Snapshotter: newBtrfs(t, dir).(*btrfs.Snapshotter)}
	r := newRig(t, g, dir, 0)
	e := r.e
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo b > /b")
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	warmUpRestores(t, e, sid)

	for _, tt := range []struct {
		name string
		// hold makes the branch's jobs stop at a point: wait returns
		// once they are all there, goOn lets them on.
		hold func(t *testing.T, n int) (wait, goOn func())
	}{
		{"queued", func(t *testing.T, n int) (func(), func()) {
			release := branchtest.HoldQueue(t, e, "busybox")
			return func() {
				branchtest.WaitFor(t, "branch jobs queued", func() bool {
					u, err := e.Usage()
					return err == nil && u.Queue.High.Queued == n
				})
			}, release
		}},
		// Both jobs running, their roots' clones held: each made by
		// the job itself or by the goroutine cloning roots ahead (a
		// job whose root that goroutine makes waits for it).
		{"restoring", func(t *testing.T, n int) (func(), func()) {
			entered, open := g.arm()
			t.Cleanup(open)
			return func() {
				for range n {
					<-entered
				}
			}, open
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			waitIdle(t, e)
			before := holdings(t, e, g)
			ignore := goleak.IgnoreCurrent()
			u, err := e.Usage()
			if err != nil {
				t.Fatal(err)
			}
			n := min(2, u.Queue.Workers) // "restoring" holds one job per worker
			wait, goOn := tt.hold(t, n)
			bctx, cancel := context.WithCancel(ctx)
			defer cancel()
			type answer struct {
				res *branch.BranchResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := e.Branch(bctx, branch.Source{State: sid}, n)
				done <- answer{res, err}
			}()
			wait()
			cancel()
			a := <-done
			if a.err != nil {
				t.Fatal(a.err)
			}
			for i := range n {
				if a.res.Children[i] != nil || !errors.Is(a.res.Errors[i], context.Canceled) {
					t.Errorf("child %d: %v, %v; want none, context.Canceled", i, a.res.Children[i], a.res.Errors[i])
				}
			}
			goOn()
			waitIdle(t, e)
			// Roots cloned ahead for jobs that never ran are destroyed
			// in the background once the branch returned.
			deadline := time.Now().Add(30 * time.Second)
			for after := holdings(t, e, g); after != before; after = holdings(t, e, g) {
				if time.Now().After(deadline) {
					t.Fatalf("after a cancelled branch the engine holds %+v, before %+v", after, before)
				}
				time.Sleep(10 * time.Millisecond)
			}
			// A spare CRIU the checkpointer started ahead for the next
			// restore (replacing the one a child used) has a goroutine
			// waiting for it to exit: the checkpointer owns it, and Close
			// ends it.
			goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/arbor-env/arbor/cr/criu.startSwrk.func1"))
		})
	}
}
