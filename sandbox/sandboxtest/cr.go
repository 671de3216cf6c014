package sandboxtest

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"testing"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
)

// CRIU returns a checkpointer on the private CRIU 4.x make deps installs
// (or criu on PATH), skipping the test, as a documented "cannot run here",
// when there is none or the test is not root.
func CRIU(tb testing.TB, log *slog.Logger) *criu.Checkpointer {
	tb.Helper()
	RequireRoot(tb)
	c, err := criu.New("", log)
	if errors.Is(err, cr.ErrUnavailable) {
		tb.Skipf("criu 4.x not installed: run make deps (%v)", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Btrfs opens a btrfs pool of size bytes in dir (a loop-mounted file when
// dir is not on btrfs), unmounted when the test ends; it skips without
// btrfs-progs.
func Btrfs(tb testing.TB, dir string, size int64, log *slog.Logger) *btrfs.Snapshotter {
	tb.Helper()
	RequireRoot(tb)
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		tb.Skip("btrfs-progs not installed: run make deps")
	}
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: dir, PoolSize: size, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { snap.Unmount(context.Background()) })
	return snap
}
