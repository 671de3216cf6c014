package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/server"
)

// One engine (btrfs pool, CRIU, busybox image) serves every test of the
// package; each test makes its own server on it.
var (
	skipReason string
	engine     *branch.Engine
	snap       cr.Snapshotter
)

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
	dir, err := os.MkdirTemp("", "arbor-agent-test-")
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
	bs, err := btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 2 << 30, Logger: quiet()})
	if err != nil {
		return nil, err
	}
	snap = bs
	undo = append(undo, func() { bs.Unmount(context.Background()) })
	images := &image.Store{Snap: bs, Logger: quiet()}
	l := &envpool.Launcher{Snap: bs, Images: images, InitBinary: init, AutoBuild: true, Logger: quiet()}
	o := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: bs, CRIU: c, Launcher: l, Logger: quiet()}
	engine, err = branch.Open(ctx, o)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() {
		engine.Close(context.Background())
		unix.Unmount(filepath.Join(o.StateDir, "images", "hot"), unix.MNT_DETACH)
	})
	return cleanup, nil
}

// served is an arbor server (protocol v1 and the MCP endpoint) on the
// shared engine.
type served struct {
	addr  string // host:port
	tools *agent.Tools
	mcp   *agent.Handler
}

func newServer(t testing.TB, token string) *served {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	tools, err := agent.New(agent.Options{Engine: engine, Snap: snap, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h := tools.Handler(agent.HandlerOptions{Token: token, Logger: quiet()})
	s, err := server.New(server.Options{Engine: engine, Token: token, Logger: quiet(),
		Handlers: map[string]http.Handler{agent.MCPPath: h, agent.MCPPath + "/": h}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("close mcp handler: %v", err)
		}
		s.Shutdown(ctx)
		hs.Close()
	})
	return &served{addr: strings.TrimPrefix(hs.URL, "http://"), tools: tools, mcp: h}
}
