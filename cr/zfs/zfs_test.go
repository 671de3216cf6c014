package zfs_test

import (
	"errors"
	"testing"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/crtest"
	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/cr/zfs/zfstest"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

func TestConformance(t *testing.T) {
	crtest.Run(t, func(tb testing.TB) cr.Snapshotter { return zfstest.NewRoot(tb) })
}

func BenchmarkBackend(b *testing.B) {
	crtest.Bench(b, func(tb testing.TB) cr.Snapshotter { return zfstest.NewRoot(tb) })
}

func TestOpenUnavailable(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := zfs.Open(t.Context(), zfs.Options{Dataset: "tank/arbor"})
	if !errors.Is(err, cr.ErrUnavailable) {
		t.Fatalf("want ErrUnavailable without zfs in PATH, got %v", err)
	}
}

// TestNotAheadCloner: the engine does not clone a branch's roots ahead on
// zfs (cr.AheadCloner: zfs-fuse deadlocked on a clone beside two quota
// changes).
func TestNotAheadCloner(t *testing.T) {
	var s cr.Snapshotter = &zfs.Snapshotter{}
	if _, ok := s.(cr.AheadCloner); ok {
		t.Fatal("the zfs backend is a cr.AheadCloner")
	}
}
