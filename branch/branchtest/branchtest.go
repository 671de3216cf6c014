// Package branchtest stands up a real engine (a btrfs pool in a temporary
// directory, CRIU, the busybox image built on first use) for the tests of
// packages built on branch, usually once per package from TestMain. With
// ARBOR_TEST_BACKEND=zfs the pool is ZFS instead: the zfs backend's own
// pool file in the temporary directory, as `arbor serve --backend zfs`
// makes it (zfs-fuse started and its shim wired when needed; Main makes the
// test binary the shim).
package branchtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

// Logger discards logs unless ARBOR_TEST_LOG is set (then: debug to stderr).
func Logger() *slog.Logger {
	if os.Getenv("ARBOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// Options tune a Rig.
type Options struct {
	// Inspector gives the engine an inspector (eBPF; the fallback when
	// eBPF is unavailable).
	Inspector bool
	// PoolSize of the pool file (default 4 GiB, sparse).
	PoolSize int64
	// Backend is "btrfs" or "zfs"; "" means $ARBOR_TEST_BACKEND, else
	// btrfs.
	Backend string
	// Limits of every sandbox, started or restored.
	Limits sandbox.Limits
	// Isolation of every sandbox (the zero value: hardened).
	Isolation sandbox.Isolation
	// Dir is the state directory to use ("": a fresh temporary one, removed
	// by Close). A Rig on the Dir of one whose process was killed reopens
	// its engine: the crash recovery runs. Close leaves Dir in place.
	Dir string
}

// Rig is an engine and what it stands on.
type Rig struct {
	Engine    *branch.Engine
	Snap      Snapshotter
	Images    *image.Store
	Inspector *watch.Inspector
	Dir       string
	undo      []func()
}

// Snapshotter is a Rig's snapshot backend: btrfs or zfs, each of which
// takes its pool down with Unmount.
type Snapshotter interface {
	cr.Snapshotter
	Unmount(ctx context.Context) error
}

// BackendEnv selects the backend of the Rigs whose Options name none.
const BackendEnv = "ARBOR_TEST_BACKEND"

// ErrSkip wraps the reasons a host cannot run a Rig (not root, tools
// missing); tests skip with its message.
var ErrSkip = errors.New("cannot run a real engine here")

// New makes a Rig in a fresh temporary directory. On error nothing is
// left behind.
func New(o Options) (r *Rig, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: needs root (namespaces, cgroups, mounts)", ErrSkip)
	}
	if o.Backend == "" {
		o.Backend = os.Getenv(BackendEnv)
	}
	switch o.Backend {
	case "", "btrfs":
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
			return nil, fmt.Errorf("%w: btrfs-progs not installed: run make deps", ErrSkip)
		}
	case "zfs":
		if _, err := exec.LookPath("zpool"); err != nil {
			return nil, fmt.Errorf("%w: zfs tools not installed (zfs-fuse on this kernel): run make deps", ErrSkip)
		}
	default:
		return nil, fmt.Errorf("unknown backend %q (%s)", o.Backend, BackendEnv)
	}
	log := Logger()
	c, err := criu.New("", log)
	if errors.Is(err, cr.ErrUnavailable) {
		return nil, fmt.Errorf("%w: criu 4.2+ not installed: run make deps (%v)", ErrSkip, err)
	}
	if err != nil {
		return nil, err
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "arbor-engine-test-"); err != nil {
			return nil, err
		}
	}
	r = &Rig{Dir: dir}
	if o.Dir == "" {
		r.undo = append(r.undo, func() { os.RemoveAll(dir) })
	}
	r.undo = append(r.undo, func() { c.Close() })
	defer func() {
		if err != nil {
			r.Close()
			r = nil
		}
	}()
	init, err := sandboxtest.BuildInit()
	if err != nil {
		return nil, err
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 4 << 30
	}
	ctx := context.Background()
	if o.Backend == "zfs" {
		r.Snap, err = zfs.Open(ctx, zfs.Options{StateDir: dir, PoolSize: o.PoolSize, Logger: log})
	} else {
		r.Snap, err = btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: o.PoolSize, Logger: log})
	}
	if err != nil {
		return nil, err
	}
	r.undo = append(r.undo, func() { r.Snap.Unmount(context.Background()) })
	if o.Inspector {
		// Without eBPF (an optional kernel feature) the fallback inspector
		// stands in; any other error is the rig's and fails it.
		r.Inspector, err = watch.New(watch.Options{Logger: log})
		if errors.Is(err, watch.ErrUnavailable) {
			r.Inspector, err = watch.NewFallback(watch.Options{Logger: log}), nil
		}
		if err != nil {
			return nil, err
		}
		r.undo = append(r.undo, func() { r.Inspector.Close() })
	}
	r.Images = &image.Store{Snap: r.Snap, Logger: log}
	l := &launch.Launcher{Snap: r.Snap, Images: r.Images, InitBinary: init, Limits: o.Limits, Isolation: o.Isolation, AutoBuild: true, Logger: log}
	if os.Getenv("ARBOR_TEST_USERNS") == "1" { // the tests in user namespace mode (docs/sandbox.md)
		l.UserNS = sandbox.UserNSConfig{Enabled: true}
	}
	eo := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: r.Snap, CRIU: c, Launcher: l, Logger: log}
	if r.Inspector != nil { // not a typed nil in the interface
		eo.Inspector = r.Inspector
	}
	if r.Engine, err = branch.Open(ctx, eo); err != nil {
		return nil, err
	}
	r.undo = append(r.undo, func() {
		r.Engine.Close(context.Background())
		// The engine keeps hot images on a tmpfs that outlives it (so a
		// restarted server finds them); a test must not.
		unix.Unmount(filepath.Join(eo.StateDir, "images", "hot"), unix.MNT_DETACH)
	})
	return r, nil
}

// Close undoes everything New made, last first.
func (r *Rig) Close() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
	r.undo = nil
}

// ForTest makes a Rig for one test, closed when tb ends; it skips the test
// when the host cannot run one.
func ForTest(tb testing.TB, o Options) *Rig {
	tb.Helper()
	r, err := New(o)
	if errors.Is(err, ErrSkip) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}
