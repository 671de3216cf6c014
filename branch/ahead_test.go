package branch_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// countingSnap counts Clones by destination, and those whose ctx
// carries an aheadKey: Branch's own ctx, which only the clones it makes
// ahead of its children's restores run under (a restore's own clone runs
// under its queue job's ctx). With aheadKey true those fail.
type countingSnap struct {
	*btrfs.Snapshotter
	mu            sync.Mutex
	clones        map[string]int
	ahead, failed int
}

type aheadKey struct{}

func (c *countingSnap) Clone(ctx context.Context, src, dst string) error {
	mark, _ := ctx.Value(aheadKey{}).(*bool)
	c.mu.Lock()
	c.clones[dst]++
	if mark != nil {
		c.ahead++
		if *mark {
			c.failed++
		}
	}
	c.mu.Unlock()
	if mark != nil && *mark {
		return errors.New("clone failed (injected)")
	}
	return c.Snapshotter.Clone(ctx, src, dst)
}

func (c *countingSnap) counts() (clones map[string]int, ahead, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.clones), c.ahead, c.failed
}

func (c *countingSnap) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clones, c.ahead, c.failed = map[string]int{}, 0, 0
}

// TestBranchRootsClonedAhead: the roots of a branch's cold children are
// cloned ahead of their restores, outside the queue (docs/engine.md,
// "Roots cloned ahead"): with the queue held, all n are made before any
// restore starts, each restore then uses its own, and the children are
// exact; when the clones made ahead fail, every restore clones its own
// root and the branch still answers all its children; nothing is left
// behind.
func TestBranchRootsClonedAhead(t *testing.T) {
	dir := t.TempDir()
	c := &countingSnap{Snapshotter: newBtrfs(t, dir).(*btrfs.Snapshotter), clones: map[string]int{}}
	r := newRig(t, c, dir, 0)
	e := r.e
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo past > /f; X=past")
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo later > /f; X=later")
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	warmUpRestores(t, e, sid)
	waitIdle(t, e)
	before := holdings(t, e, c)
	const n = 6
	for _, tt := range []struct {
		name   string
		fail   bool
		clones int // per child root
	}{
		{"made ahead", false, 1},
		{"ahead failed", true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			release := branchtest.HoldQueue(t, e, "busybox")
			defer release()
			c.reset()
			fail := tt.fail
			type answer struct {
				res *branch.BranchResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := e.Branch(context.WithValue(ctx, aheadKey{}, &fail), branch.Source{State: sid}, n)
				done <- answer{res, err}
			}()
			branchtest.WaitFor(t, "every root cloned ahead", func() bool {
				_, ahead, _ := c.counts()
				return ahead == n
			})
			release()
			a := <-done
			if a.err != nil {
				t.Fatal(a.err)
			}
			for i, ch := range a.res.Children {
				if a.res.Errors[i] != nil {
					t.Fatalf("child %d: %v", i, a.res.Errors[i])
				}
				if got := run(t, e, ch, "cat /f; echo $X"); got != "past\npast\n" {
					t.Errorf("child %d: %q, want the past state", i, got)
				}
			}
			clones, ahead, failed := c.counts()
			for i, ch := range a.res.Children {
				vol := launch.VolumePrefix + ch.ID + "-0"
				if clones[vol] != tt.clones {
					t.Errorf("child %d's root %s cloned %d times, want %d", i, vol, clones[vol], tt.clones)
				}
			}
			if len(clones) != n || ahead != n {
				t.Errorf("%d roots cloned, %d ahead; want %d and %d: %v", len(clones), ahead, n, n, clones)
			}
			if want := map[bool]int{true: n}[tt.fail]; failed != want {
				t.Errorf("%d failed clones, want %d", failed, want)
			}
			for _, ch := range a.res.Children {
				if err := e.CloseEnv(ctx, ch); err != nil {
					t.Fatal(err)
				}
			}
			waitIdle(t, e)
			if after := holdings(t, e, c); after != before {
				t.Errorf("after the children closed the engine holds %+v, before %+v", after, before)
			}
		})
	}
}
