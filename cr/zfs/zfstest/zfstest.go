// Package zfstest gives tests a real ZFS pool: on this kernel that is
// zfs-fuse, driven through the fusecompat shim (see docs/zfs.md).
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
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/cr/zfs/internal/fusecompat"
)

// The test binary doubles as the zfs-fuse compatibility shim: TestMain puts
// a symlink named "zfs" to it first in PATH when the zfs found is one whose
// `zfs list` lacks -p (zfs-fuse), and go-zfs then runs it as "zfs".
const realZFSEnv = "ARBOR_TEST_REAL_ZFS"

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
// test binary the zfs-fuse shim when run as "zfs", else sets up a pool in a
// temporary file (starting zfs-fuse if ZFS does not answer), runs the tests
// and tears everything down.
func Main(m *testing.M) {
	if filepath.Base(os.Args[0]) == "zfs" {
		fusecompat.RunAsZFS(os.Getenv(realZFSEnv))
	}
	code := m.Run()
	if pool.cleanup != nil {
		pool.cleanup()
	}
	os.Exit(code)
}

// setUp starts zfs-fuse if needed and makes a pool in a temporary file. It
// records a skip reason when the host cannot run zfs (not root, no zfs
// tools), and any other failure as pool.err.
func setUp() (cleanup func()) {
	cleanup = func() {}
	if os.Geteuid() != 0 {
		pool.skip = "zfs backend needs root"
		return
	}
	realZFS, err := exec.LookPath("zfs")
	if err != nil {
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
	if stop, err := startDaemon(tmp); errors.Is(err, errNoZFSFuse) {
		pool.skip = err.Error()
		return
	} else if err != nil {
		pool.err = err
		return
	} else if stop != nil {
		undo = append(undo, stop)
	}
	if out, err := exec.Command(realZFS, "list", "-Hp", "-o", "name").CombinedOutput(); err != nil && strings.Contains(string(out), "invalid option") {
		// zfs-fuse: route go-zfs through the shim.
		self, err := os.Executable()
		if err != nil {
			pool.err = err
			return
		}
		bin := filepath.Join(tmp, "bin")
		os.Mkdir(bin, 0o755)
		if err := os.Symlink(self, filepath.Join(bin, "zfs")); err != nil {
			pool.err = err
			return
		}
		os.Setenv(realZFSEnv, realZFS)
		os.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	var b [3]byte
	rand.Read(b[:])
	name := "arbortest" + hex.EncodeToString(b[:])
	file := filepath.Join(tmp, "pool.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil || os.Truncate(file, 2<<30) != nil {
		pool.err = fmt.Errorf("pool file: %v", err)
		return
	}
	if out, err := exec.Command("zpool", "create", "-m", filepath.Join(tmp, "mnt"), name, file).CombinedOutput(); err != nil {
		pool.err = fmt.Errorf("zpool create: %v: %s", err, out)
		return
	}
	undo = append(undo, func() {
		exec.Command("zfs", "umount", name).Run()
		if out, err := exec.Command("zpool", "destroy", "-f", name).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "zpool destroy %s: %v: %s\n", name, err, out)
		}
	})
	pool.name = name
	return cleanup
}

// errNoZFSFuse is why startDaemon cannot run here: a skip, not a failure.
var errNoZFSFuse = errors.New("zfs does not answer and zfs-fuse is not installed")

// startDaemon starts zfs-fuse when ZFS does not answer, and returns how to
// stop it (nil when it was already running or ZFS is in the kernel).
func startDaemon(tmp string) (stop func(), err error) {
	if exec.Command("zpool", "list").Run() == nil {
		return nil, nil
	}
	if _, err := exec.LookPath("zfs-fuse"); err != nil {
		return nil, fmt.Errorf("%w: run make deps", errNoZFSFuse)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("zfs-fuse needs /dev/fuse: %v", err)
	}
	pidFile := filepath.Join(tmp, "zfs-fuse.pid")
	if out, err := exec.Command("zfs-fuse", "--pidfile", pidFile, "--no-kstat-mount").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("start zfs-fuse: %v: %s", err, out)
	}
	for range 50 {
		if exec.Command("zpool", "list").Run() == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("zfs-fuse pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("zfs-fuse pid file: %v", err)
	}
	return func() {
		// zfs-fuse syncs its pools before it exits, which took over 5 s
		// under load once; one that does not stop in 15 s is killed, so
		// that the next package's tests never meet it.
		stopped := func(d time.Duration) bool {
			for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if syscall.Kill(pid, 0) != nil {
					return true
				}
			}
			return false
		}
		syscall.Kill(pid, syscall.SIGTERM)
		if stopped(15 * time.Second) {
			return
		}
		syscall.Kill(pid, syscall.SIGKILL)
		if stopped(5 * time.Second) {
			fmt.Fprintf(os.Stderr, "zfs-fuse (pid %d) did not stop within 15 s of SIGTERM: killed\n", pid)
			return
		}
		fmt.Fprintf(os.Stderr, "zfs-fuse (pid %d) did not stop, even after SIGKILL\n", pid)
	}, nil
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
