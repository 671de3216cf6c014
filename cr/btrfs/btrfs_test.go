package btrfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/crtest"
)

// requireHost skips unless the test can make and mount a btrfs pool.
func requireHost(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skipf("btrfs backend needs root (loop mount, subvolume ioctls)")
	}
	for _, tool := range []string{"mkfs.btrfs", "btrfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("btrfs-progs not installed (%s missing): run make deps", tool)
		}
	}
}

// newPool opens a fresh loop-mounted pool in a temporary state dir and
// unmounts it (freeing the loop device) when tb ends.
func newPool(tb testing.TB) *Snapshotter {
	tb.Helper()
	requireHost(tb)
	s, err := Open(context.Background(), Options{StateDir: tb.TempDir(), PoolSize: 1 << 30})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Unmount(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	crtest.Run(t, func(tb testing.TB) cr.Snapshotter { return newPool(tb) })
}

func BenchmarkBackend(b *testing.B) {
	crtest.Bench(b, func(tb testing.TB) cr.Snapshotter { return newPool(tb) })
}

func TestOpenIsIdempotent(t *testing.T) {
	requireHost(t)
	ctx := t.Context()
	dir := t.TempDir()
	s1, err := Open(ctx, Options{StateDir: dir, PoolSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Unmount(ctx)
	if err := s1.CreateVolume(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	// Reopen while mounted: the mount is found and reused.
	s2, err := Open(ctx, Options{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if vols, _ := s2.List(ctx, ""); len(vols) != 1 {
		t.Fatalf("reopen while mounted: %+v", vols)
	}
	// Reopen after an unmount: the pool file is mounted again, not remade.
	if err := s1.Unmount(ctx); err != nil {
		t.Fatal(err)
	}
	s3, err := Open(ctx, Options{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Unmount(ctx)
	if vols, _ := s3.List(ctx, ""); len(vols) != 1 || vols[0].Name != "kept" {
		t.Fatalf("reopen after unmount: %+v", vols)
	}
}

func TestNestedSubvolumeRefused(t *testing.T) {
	s := newPool(t)
	ctx := t.Context()
	if err := s.CreateVolume(ctx, "outer"); err != nil {
		t.Fatal(err)
	}
	// As a sandboxed root process could: a subvolume inside a volume.
	if err := createSubvol(s.Path("outer"), "inner"); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx, "outer"); !errors.Is(err, cr.ErrNotEmpty) {
		t.Fatalf("want ErrNotEmpty, got %v", err)
	}
	if err := destroySubvol(s.Path("outer"), "inner"); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx, "outer"); err != nil {
		t.Fatal(err)
	}
}
