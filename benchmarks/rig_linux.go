package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector/watch"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/server"
)

// rig is everything one benchmark run stands on: a btrfs (or zfs) pool in
// a temporary state directory, the image store, one engine and the servers
// (one per classifier) that play traces through protocol v1 on loopback.
type rig struct {
	o       Options
	log     *slog.Logger
	dir     string
	backend string
	snap    snapshotter
	criu    *criu.Checkpointer
	images  *image.Store
	launch  *launch.Launcher
	// e is Arbor's engine (with the Inspector when one can run); base is
	// an engine without one, for the full-every-turn baseline.
	e, base *branch.Engine
	in      *watch.Inspector
	inNote  string

	servers []*serverHandle
}

// serverHandle is a server on a loopback port and a client connected to it.
type serverHandle struct {
	name   string
	e      *branch.Engine
	co     *coordinator.Coordinator
	c      *arbor.Client
	cancel context.CancelFunc
	done   chan error
}

// snapshotter is a pool the rig made and takes down with Unmount.
type snapshotter interface {
	cr.Snapshotter
	Unmount(ctx context.Context) error
}

// newRig makes a rig on backend "btrfs" or "zfs" (Arbor's engine only:
// the baselines run on btrfs).
func newRig(ctx context.Context, o Options, backend string) (r *rig, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: arbor bench needs root (namespaces, CRIU, btrfs)", ErrUnavailable)
	}
	dir, err := os.MkdirTemp(o.WorkDir, "arbor-bench-*")
	if err != nil {
		return nil, err
	}
	r = &rig{o: o, log: o.Logger, dir: dir, backend: backend}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	// Not a typed nil in r.snap when Open fails: Close unmounts r.snap.
	if backend == "zfs" {
		var s *zfs.Snapshotter
		if s, err = zfs.Open(ctx, zfs.Options{StateDir: dir, PoolSize: 16 << 30, Logger: r.log}); err == nil {
			r.snap = s
		}
	} else {
		var s *btrfs.Snapshotter
		if s, err = btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 16 << 30, Logger: r.log}); err == nil {
			r.snap = s
		}
	}
	if err != nil {
		return r, fmt.Errorf("open %s pool: %w", backend, err)
	}
	r.criu, err = criu.New(o.CRIU, r.log)
	if err != nil {
		return r, fmt.Errorf("criu: %w", err)
	}
	r.images = &image.Store{Snap: r.snap, Logger: r.log}
	r.launch = &launch.Launcher{Snap: r.snap, Images: r.images, InitBinary: o.InitBinary, AutoBuild: true, Logger: r.log}
	if o.Classifier != "full" {
		r.in, err = watch.New(watch.Options{Logger: r.log})
		if err != nil {
			r.inNote = fmt.Sprintf("eBPF unavailable (%v): the Inspector ran on the btrfs change list", err)
			r.in = watch.NewFallback(watch.Options{Logger: r.log})
		}
	} else {
		r.inNote = "--classifier full: Arbor ran without the Inspector, full every turn"
	}
	eo := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: r.snap, CRIU: r.criu,
		Launcher: r.launch, WarmCopies: o.WarmCopies, LazyBytes: o.LazyBytes, Logger: r.log}
	if r.in != nil { // not a typed nil in the interface
		eo.Inspector = r.in
	}
	r.e, err = branch.Open(ctx, eo)
	if err != nil {
		return r, fmt.Errorf("open engine: %w", err)
	}
	if backend == "zfs" {
		return r, nil
	}
	// The baseline is CRIU's whole dump of every turn: no delta images.
	r.base, err = branch.Open(ctx, branch.Options{StateDir: filepath.Join(dir, "engine-base"), Snap: r.snap, CRIU: r.criu,
		Launcher: r.launch, DeltaChain: -1, Logger: r.log})
	if err != nil {
		return r, fmt.Errorf("open baseline engine: %w", err)
	}
	return r, nil
}

// image makes sure name is built and returns it.
func (r *rig) image(ctx context.Context, name string) error {
	if _, err := r.images.Get(ctx, name); err == nil {
		return nil
	} else if !errors.Is(err, image.ErrNotFound) {
		return err
	}
	return r.images.Build(ctx, name, nil)
}

// serve starts a server on engine e (its coordinator classifies with
// classify; nil: the engine's inspector) and connects a client to it.
func (r *rig) serve(ctx context.Context, name string, e *branch.Engine,
	classify func(context.Context, *branch.Env, string) (branch.Turn, error)) (*serverHandle, error) {
	co, err := coordinator.New(coordinator.Options{Engine: e, Classify: classify, Logger: r.log, MaxEnvs: 1024})
	if err != nil {
		return nil, err
	}
	s, err := server.New(server.Options{Coordinator: co, Logger: r.log, Version: "bench"})
	if err != nil {
		co.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	h := &serverHandle{name: name, e: e, co: co, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- s.Serve(sctx, ln, 10*time.Second) }()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	h.c, err = arbor.Dial(dctx, ln.Addr().String(), nil)
	if err != nil {
		cancel()
		<-h.done
		return nil, fmt.Errorf("dial server %s: %w", name, err)
	}
	r.servers = append(r.servers, h)
	return h, nil
}

func (h *serverHandle) close() {
	h.c.Close()
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
	}
	h.co.Close()
}

// Close stops the servers and the engine and removes the pool. A second
// Close does nothing.
func (r *rig) Close() {
	for _, h := range r.servers {
		h.close()
	}
	r.servers = nil
	defer func() { r.e, r.base, r.in, r.snap, r.dir = nil, nil, nil, nil, "" }()
	for _, e := range []struct {
		e   *branch.Engine
		dir string
	}{{r.e, "engine"}, {r.base, "engine-base"}} {
		if e.e == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := e.e.Close(ctx); err != nil {
			r.log.Warn("close engine", slog.Any("err", err))
		}
		cancel()
		// The engine keeps hot images on a tmpfs that outlives it.
		unix.Unmount(filepath.Join(r.dir, e.dir, "images", "hot"), unix.MNT_DETACH)
	}
	if r.in != nil {
		r.in.Close()
	}
	if r.snap != nil {
		if err := r.snap.Unmount(context.Background()); err != nil {
			r.log.Warn("unmount pool", slog.Any("err", err))
		}
	}
	if r.dir != "" && !r.o.KeepWorkDir {
		os.RemoveAll(r.dir)
	}
}

var (
	_ snapshotter = (*btrfs.Snapshotter)(nil)
	_ snapshotter = (*zfs.Snapshotter)(nil)
)
