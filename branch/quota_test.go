package branch_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr/zfs/zfstest"
	"github.com/arbor-env/arbor/sandbox"
)

// fillDisk runs dd until the root is full in env and checks that it
// stopped at the quota: "Disk quota exceeded", a little under quota bytes
// written, and a disk limit event.
func fillDisk(t *testing.T, e *branch.Engine, env *branch.Env, quota int64) {
	t.Helper()
	res, err := e.Exec(context.Background(), env, "dd if=/dev/zero of=/big bs=1M; echo exit=$?; wc -c < /big", sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("dd in %s: %v", env.ID, err)
	}
	out := string(res.Stdout) + string(res.Stderr)
	if !strings.Contains(out, "Disk quota exceeded") || !strings.Contains(out, "exit=1") {
		t.Fatalf("dd in %s: want it stopped by the quota, got %q", env.ID, out)
	}
	f := strings.Fields(string(res.Stdout))
	n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err != nil || n > quota || n < quota-4<<20 {
		t.Fatalf("dd in %s wrote %s bytes (%v), want a little under the %d byte quota", env.ID, f[len(f)-1], err, quota)
	}
	var ev *sandbox.LimitEvent
	for i := range res.Limits {
		if res.Limits[i].Resource == "disk" {
			ev = &res.Limits[i]
		}
	}
	if ev == nil || ev.Limit != quota {
		t.Fatalf("dd in %s: limit events %v, want a disk event with limit %d", env.ID, res.Limits, quota)
	}
}

// The quota holds in every restored child: a branched child, a rolled-back
// environment and a child of a full child each stop at it, while their
// siblings, their parent and the engine go on.
func TestDiskQuotaHoldsInRestoredChildren(t *testing.T) {
	const quota = 48 << 20
	e := branchtest.ForTest(t, branchtest.Options{Limits: sandbox.Limits{DiskBytes: quota}}).Engine
	diskQuotaInChildren(t, e, quota)
}

// TestDiskQuotaHoldsInRestoredChildrenZFS is the same on the zfs backend
// (zfs-fuse here), where the quota is the quota property.
func TestDiskQuotaHoldsInRestoredChildrenZFS(t *testing.T) {
	requireCR(t)
	const quota = 48 << 20
	r := newRigLimits(t, zfstest.NewRoot(t), t.TempDir(), 0, sandbox.Limits{DiskBytes: quota})
	diskQuotaInChildren(t, r.e, quota)
}

func diskQuotaInChildren(t *testing.T, e *branch.Engine, quota int64) {
	ctx := context.Background()
	parent, first, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	// The parent writes some of its quota; its children inherit the file
	// but get a quota of their own (it counts what each writes).
	run(t, e, parent, "dd if=/dev/zero of=/inherited bs=1M count=16 2>/dev/null")
	br, err := e.Branch(ctx, branch.Source{Env: parent}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range br.Children {
		if br.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, br.Errors[i])
		}
	}
	child, sibling := br.Children[0], br.Children[1]
	if got := run(t, e, child, "wc -c < /inherited"); strings.TrimSpace(got) != strconv.Itoa(16<<20) {
		t.Fatalf("child lost the parent's file: %q", got)
	}
	fillDisk(t, e, child, quota)
	run(t, e, sibling, "dd if=/dev/zero of=/mine bs=1M count=32 2>/dev/null")
	run(t, e, parent, "echo still writable > /note")

	// A child of the full child starts with a whole quota and stops at it.
	grand, err := e.Branch(ctx, branch.Source{Env: child}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if grand.Errors[0] != nil {
		t.Fatal(grand.Errors[0])
	}
	run(t, e, grand.Children[0], "rm /big")
	fillDisk(t, e, grand.Children[0], quota)

	// Rolled back to the first state, the child's new root is capped too.
	if err := e.Rollback(ctx, child, first); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, e, child, quota)
	for _, env := range []*branch.Env{grand.Children[0], child, sibling, parent} {
		if err := e.CloseEnv(ctx, env); err != nil {
			t.Fatalf("close %s: %v", env.ID, err)
		}
	}
}
