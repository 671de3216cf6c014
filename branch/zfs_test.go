package branch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/zfs/zfstest"
	"github.com/arbor-env/arbor/inspector"
)

func TestMain(m *testing.M) {
	if os.Getenv("ARBOR_CRASH_HELPER") != "" {
		os.Exit(m.Run()) // the crash helper needs no zfs pool of its own
	}
	zfstest.Main(m)
}

// TestBranchAndRollbackZFS runs the branch/rollback test on the zfs backend
// (zfs-fuse here, through the test shim: see docs/zfs.md).
func TestBranchAndRollbackZFS(t *testing.T) {
	requireCR(t)
	snap := zfstest.NewRoot(t)
	r := newRig(t, snap, t.TempDir(), 0)
	branchAndRollback(t, r)
}

// TestTreeDiffStalledFileSystemZFS: the comparison behind verification
// and classification, on a file system that stops answering (zfs-fuse
// stopped with SIGSTOP, as when it hangs: docs/zfs.md), gives up with
// inspector.ErrStalled at its context's deadline instead of blocking the
// turn, and answers again once the daemon runs.
func TestTreeDiffStalledFileSystemZFS(t *testing.T) {
	snap := zfstest.NewRoot(t)
	ctx := context.Background()
	for _, v := range []string{"live", "snap"} {
		if err := snap.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { snap.Destroy(context.Background(), v) })
		if err := os.MkdirAll(filepath.Join(snap.Path(v), "work"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(snap.Path(v), "work", "a.txt"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pid := zfstest.Daemon(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume := func() { syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	// Should the bound not hold, the daemon runs again after a while and
	// the comparisons below return without ErrStalled: a failure, not a
	// test that hangs.
	guard := time.AfterFunc(time.Minute, resume)
	defer guard.Stop()

	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := inspector.TreeDiff(sctx, snap.Path("live"), snap.Path("snap")); !errors.Is(err, inspector.ErrStalled) {
		t.Errorf("TreeDiff on a stopped zfs-fuse: %v, want ErrStalled", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := inspector.PathChanged(pctx, snap.Path("live"), snap.Path("snap"), "/work/a.txt"); !errors.Is(err, inspector.ErrStalled) {
		t.Errorf("PathChanged on a stopped zfs-fuse: %v, want ErrStalled", err)
	}
	resume()
	diff, err := inspector.TreeDiff(ctx, snap.Path("live"), snap.Path("snap"))
	if err != nil {
		t.Fatalf("TreeDiff after zfs-fuse resumed: %v", err)
	}
	if want := []string{"/work/a.txt"}; !slices.Equal(diff, want) {
		t.Errorf("TreeDiff after zfs-fuse resumed: %v, want %v", diff, want)
	}
}
