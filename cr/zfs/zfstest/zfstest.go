// Package zfstest gives tests a real ZFS pool: on this kernel that is
// zfs-fuse, driven through the fusecompat shim (see docs/zfs.md). The host
// set-up (zfs-fuse, the shim) is the product's, zfs.PrepareHost.
package zfstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/zfs"
)

// pool is the file-backed test pool, or why there is none: skip when the
// host cannot run zfs (not root, tools missing), err when setting it up
// failed (that fails the test).
var pool struct {
	name    string
	skip    string
	err     error
	counter atomic.Int64
	once    sync.Once
	cleanup func()
}

// Main is TestMain for packages whose tests use a zfs pool: it makes the
// test binary the zfs-fuse shim when run as "zfs" (zfs.MainIfShim), else
// runs the tests and tears down the pool (and the zfs-fuse it started)
// that the first NewRoot set up.
func Main(m *testing.M) {
	zfs.MainIfShim()
	code := m.Run()
	if pool.cleanup != nil {
		pool.cleanup()
	}
	os.Exit(code)
}

// setUp prepares the host (zfs.PrepareHost: zfs-fuse, the shim) and makes
// a pool in a temporary file. It records a skip reason when the host
// cannot run zfs (not root, no zfs tools), and any other failure as
// pool.err.
func setUp() (cleanup func()) {
	cleanup = func() {}
	if os.Geteuid() != 0 {
		pool.skip = "zfs backend needs root"
		return
	}
	if _, err := exec.LookPath("zfs"); err != nil {
		pool.skip = "zfs tools not installed (zfs-fuse on this kernel): run make deps"
		return
	}
	tmp, err := os.MkdirTemp("", "arbor-zfstest-")
	if err != nil {
		pool.err = err
		return
	}
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		os.RemoveAll(tmp)
	}
	ctx := context.Background()
	h, err := zfs.PrepareHost(ctx, tmp, nil)
	if errors.Is(err, zfs.ErrNoZFSFuse) {
		pool.skip = err.Error()
		return
	} else if err != nil {
		pool.err = err
		return
	}
	undo = append(undo, h.Close)
	var b [3]byte
	rand.Read(b[:])
	name := "arbortest" + hex.EncodeToString(b[:])
	if err := zfs.CreatePool(ctx, name, filepath.Join(tmp, "pool.img"), 2<<30, filepath.Join(tmp, "mnt")); err != nil {
		pool.err = err
		return
	}
	undo = append(undo, func() {
		if err := zfs.DestroyPool(ctx, name); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	})
	pool.name = name
	return cleanup
}

// NewRoot opens a fresh root dataset in the test pool, destroyed with
// everything below it when tb ends. It skips when the host cannot run zfs, and fails when
// setting up the pool failed.
func NewRoot(tb testing.TB) *zfs.Snapshotter {
	tb.Helper()
	// The pool (and zfs-fuse) is set up by the first test that wants it,
	// so packages whose zfs tests are skipped pay nothing.
	pool.once.Do(func() { pool.cleanup = setUp() })
	if pool.skip != "" {
		tb.Skip(pool.skip)
	}
	if pool.err != nil {
		tb.Fatalf("set up the zfs test pool: %v", pool.err)
	}
	root := fmt.Sprintf("%s/t%d", pool.name, pool.counter.Add(1))
	s, err := zfs.Open(context.Background(), zfs.Options{Dataset: root})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := destroyTree(root); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// destroyTree unmounts every filesystem below root, deepest first (zfs-fuse
// calls a mounted dataset busy), and destroys them all. Like the product's
// destroy (cr/zfs destroyMounted), it retries while zfs-fuse still calls a
// just-unmounted dataset busy: CI saw that once in this cleanup.
func destroyTree(root string) error {
	out, err := exec.Command("zfs", "list", "-H", "-r", "-o", "name", root).Output()
	if err != nil {
		return fmt.Errorf("list %s: %v", root, err)
	}
	names := strings.Fields(string(out))
	for try := 0; ; try++ {
		for i := len(names) - 1; i >= 0; i-- {
			exec.Command("zfs", "umount", names[i]).Run()
		}
		out, err := exec.Command("zfs", "destroy", "-R", root).CombinedOutput()
		if err == nil {
			return nil
		}
		if try == 50 || !strings.Contains(string(out), "busy") {
			return fmt.Errorf("destroy %s (try %d): %v: %s", root, try+1, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Daemon returns the pid of the zfs-fuse daemon serving the test pool,
// for tests that stop it (SIGSTOP) to see what a hung file system does.
// It fails when there is not exactly one.
func Daemon(tb testing.TB) int {
	tb.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(comm)) == "zfs-fuse" {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		tb.Fatalf("zfs-fuse daemons running: %v, want exactly one", pids)
	}
	return pids[0]
}
