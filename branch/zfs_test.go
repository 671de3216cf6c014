package branch_test

import (
	"os"
	"testing"

	"github.com/arbor-env/arbor/cr/zfs/zfstest"
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
