package criu_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/internal/memhold"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// lazyMB is the memory the lazy restore tests' process holds.
const lazyMB = 256

// memHoldSource starts a debian sandbox whose Python process holds lazyMB
// MiB of patterned memory and dumps it; it returns the images and the
// isolation record.
func memHoldSource(t *testing.T, c *criu.Checkpointer, snap *btrfs.Snapshotter, id string) (string, sandbox.IsolationRecord) {
	t.Helper()
	ctx := context.Background()
	sb := startSource(t, snap, id, sandboxtest.DebianRoot(t, ""))
	if r, err := sb.Exec(ctx, memhold.Start(lazyMB), sandbox.ExecOptions{Timeout: time.Minute}); err != nil || r.ExitCode != 0 || len(r.Stdout) == 0 {
		t.Fatalf("start the memory holder: %v %+v", err, r)
	}
	if got := memSum(t, sb); got != memhold.Want(lazyMB) {
		t.Fatalf("the source's memory sum is %q, want %q", got, memhold.Want(lazyMB))
	}
	imgs := t.TempDir()
	st, rec := dump(t, c, snap, sb, "snap", imgs, false)
	if st.Bytes < lazyMB<<20 {
		t.Fatalf("images of %d bytes: the holder's %d MiB are not in them", st.Bytes, lazyMB)
	}
	return imgs, rec
}

func memSum(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()
	r, err := sb.Exec(context.Background(), memhold.Sum, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("memory sum: %v", err)
	}
	return strings.TrimSpace(string(r.Stdout))
}

func memCurrent(t *testing.T, sb *sandbox.Sandbox) int64 {
	t.Helper()
	m, err := sb.Memory()
	if err != nil {
		t.Fatal(err)
	}
	return m.Current
}

// restoreLazily clones snapshot "snap" as name and restores imgs into it
// lazily; the child and its daemon are destroyed at the end of the test.
func restoreLazily(t *testing.T, c *criu.Checkpointer, snap *btrfs.Snapshotter, imgs, name string, rec sandbox.IsolationRecord) (*sandbox.Sandbox, *criu.LazyPages, error) {
	ctx := context.Background()
	if err := snap.Clone(ctx, "snap", name); err != nil {
		t.Fatal(err)
	}
	lp, err := c.StartLazyPages(ctx, imgs)
	if err != nil {
		return nil, nil, err
	}
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "crlazy-" + name, Root: snap.Path(name)}, rec, func(join func(int) error) (int, error) {
		return c.RestoreLazily(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path(name), Join: join}, lp)
	})
	if err != nil {
		if cerr := lp.Close(); cerr != nil {
			t.Errorf("close lazy-pages daemon: %v", cerr)
		}
		if err := syscall.Kill(lp.PID(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("the daemon (pid %d) of the failed restore is still there: %v", lp.PID(), err)
		}
		return nil, nil, err
	}
	t.Cleanup(func() {
		child.Destroy(context.Background())
		if err := lp.Close(); err != nil {
			t.Errorf("close lazy-pages daemon: %v", err)
		}
	})
	return child, lp, nil
}

// TestLazyRestore: two children restored lazily, in parallel, from the
// images of a process holding 256 MiB of patterned memory run before
// their memory is copied (memory.current right after the restore is far
// below 256 MiB), each answers the right checksum over all of it, and
// each daemon copies the rest and exits cleanly, the children then
// holding it all.
func TestLazyRestore(t *testing.T) {
	c, snap := setup(t)
	imgs, rec := memHoldSource(t, c, snap, "crlazysrc")
	want := memhold.Want(lazyMB)
	type child struct {
		sb    *sandbox.Sandbox
		lp    *criu.LazyPages
		err   error
		took  time.Duration
		early int64
	}
	kids := make([]child, 2)
	var wg sync.WaitGroup
	for i := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			k := &kids[i]
			k.sb, k.lp, k.err = restoreLazily(t, c, snap, imgs, fmt.Sprintf("lazy%d", i), rec)
			k.took = time.Since(start)
			if k.err == nil {
				k.early = memCurrent(t, k.sb)
			}
		}()
	}
	wg.Wait()
	for i, k := range kids {
		if k.err != nil {
			t.Fatalf("lazy restore %d: %v", i, k.err)
		}
		t.Logf("child %d: restored in %v, memory.current %d MiB right after", i, k.took, k.early>>20)
		if k.early >= lazyMB<<20 {
			t.Errorf("child %d holds %d MiB right after a lazy restore: its %d MiB were copied eagerly", i, k.early>>20, lazyMB)
		}
	}
	for i, k := range kids {
		if got := memSum(t, k.sb); got != want {
			t.Errorf("child %d: memory sum %q, want %q", i, got, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := k.lp.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("child %d: lazy-pages daemon: %v", i, err)
		}
		if m := memCurrent(t, k.sb); m < lazyMB<<20 {
			t.Errorf("child %d holds %d MiB once its daemon is done, want all %d", i, m>>20, lazyMB)
		}
		if err := syscall.Kill(k.lp.PID(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("child %d: the finished daemon (pid %d) is still there: %v", i, k.lp.PID(), err)
		}
		if got := memSum(t, k.sb); got != want {
			t.Errorf("child %d after its daemon: memory sum %q, want %q", i, got, want)
		}
	}
	// The eager restore of the same images, for the log.
	if err := snap.Clone(context.Background(), "snap", "eager"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eager, err := sandbox.Restore(context.Background(), sandbox.Config{ID: "crlazy-eager", Root: snap.Path("eager")}, rec, func(join func(int) error) (int, error) {
		return c.Restore(context.Background(), criu.RestoreRequest{Dir: imgs, Root: snap.Path("eager"), Join: join})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eager.Destroy(context.Background())
	t.Logf("eager restore: %v, memory.current %d MiB", time.Since(start), memCurrent(t, eager)>>20)
}

// TestLazyDaemonKilled: a lazy restore whose daemon is killed while CRIU
// restores (at the post-restore notification, after it received the
// tree's userfaultfds) fails with ErrLazyPages; nothing of the tree is
// left (its cgroup is gone), the daemon is reaped, and the same images
// restore lazily afterwards.
func TestLazyDaemonKilled(t *testing.T) {
	c, snap := setup(t)
	imgs, rec := memHoldSource(t, c, snap, "crlazykill")
	var killed *criu.LazyPages
	c.LazyFaultHook = func(stage string, d *criu.LazyPages) {
		if stage == "post-restore" && killed == nil {
			killed = d
			syscall.Kill(d.PID(), syscall.SIGKILL)
			<-d.Done() // reaped: its end of the socket is closed
		}
	}
	_, _, err := restoreLazily(t, c, snap, imgs, "killed", rec)
	if killed == nil {
		t.Fatalf("no post-restore notification (restore: %v)", err)
	}
	if !errors.Is(err, criu.ErrLazyPages) {
		t.Fatalf("restore with its daemon killed: %v, want ErrLazyPages", err)
	}
	t.Logf("restore: %v", err)
	if _, err := os.Stat("/sys/fs/cgroup/arbor/crlazy-killed"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed restore's cgroup is left: %v", err)
	}
	c.LazyFaultHook = nil
	child, lp, err := restoreLazily(t, c, snap, imgs, "after", rec)
	if err != nil {
		t.Fatal(err)
	}
	if got := memSum(t, child); got != memhold.Want(lazyMB) {
		t.Errorf("restored after the failed one: memory sum %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lp.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
