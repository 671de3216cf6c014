package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/server"
)

// One engine (btrfs pool, CRIU, busybox image) and one task pool serve
// every test of the package; each test makes its own Server on them when
// it needs other limits.
var (
	skipReason string
	engine     *branch.Engine
	pool       *envpool.Pool
)

// testTask is a busybox task: a counter file the agent must raise.
var testTask = envpool.Task{
	Name: "count", Image: "busybox",
	Setup:       []string{"mkdir -p /work && echo 0 > /work/n && cd /work"},
	Instruction: "Make the number in /work/n at least 3.",
	Verifier:    `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi`,
	MaxTurns:    40,
}

func quiet() *slog.Logger {
	if os.Getenv("ARBOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func TestMain(m *testing.M) {
	cleanup, err := setup()
	if err != nil {
		skipReason = err.Error()
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	os.Exit(code)
}

// initBinary is $ARBOR_INIT or arbor-init built into dir.
func initBinary(dir string) (string, error) {
	if p := os.Getenv("ARBOR_INIT"); p != "" {
		return p, nil
	}
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(dir, "arbor-init")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/arbor-init")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build arbor-init: %v: %s", err, b)
	}
	return out, nil
}

func setup() (cleanup func(), err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root: sandboxes use namespaces, cgroups and mounts")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return nil, errors.New("btrfs-progs not installed: run make deps")
	}
	c, err := criu.New("", quiet())
	if errors.Is(err, cr.ErrUnavailable) {
		return nil, fmt.Errorf("criu 4.x not installed: run make deps (%v)", err)
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "arbor-server-test-")
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		os.RemoveAll(dir)
	}
	defer func() {
		if err != nil {
			cleanup()
			cleanup = nil
		}
	}()
	init, err := initBinary(dir)
	if err != nil {
		return nil, err
	}
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 4 << 30, Logger: quiet()})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { snap.Unmount(context.Background()) })
	images := &image.Store{Snap: snap, Logger: quiet()}
	l := &envpool.Launcher{Snap: snap, Images: images, InitBinary: init, AutoBuild: true, Logger: quiet()}
	in, ierr := inspector.New(inspector.Options{Logger: quiet()})
	if ierr != nil {
		in = inspector.NewFallback(inspector.Options{Logger: quiet()})
	}
	undo = append(undo, func() { in.Close() })
	o := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Inspector: in, Logger: quiet()}
	engine, err = branch.Open(ctx, o)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		engine.Close(context.Background())
		unix.Unmount(filepath.Join(o.StateDir, "images", "hot"), unix.MNT_DETACH)
	})
	pool, err = envpool.NewPool(ctx, engine, []envpool.Task{testTask}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { pool.Close(context.Background()) })
	return cleanup, nil
}

// newServer serves the shared engine and pool on a loopback test server.
func newServer(t testing.TB, o server.Options) (*server.Server, string) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	o.Engine = engine
	if o.Pool == nil {
		o.Pool = server.FromEnvpool(pool)
	}
	if o.Logger == nil {
		o.Logger = quiet()
	}
	s, err := server.New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
	})
	return s, strings.TrimPrefix(hs.URL, "http://")
}
