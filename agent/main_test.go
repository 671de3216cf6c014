package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/server"
)

// One engine (btrfs pool, CRIU, busybox image) serves every test of the
// package; each test makes its own server on it.
var (
	skipReason string
	engine     *branch.Engine
	snap       cr.Snapshotter
)

func quiet() *slog.Logger { return branchtest.Logger() }

func TestMain(m *testing.M) {
	rig, err := branchtest.New(branchtest.Options{})
	if errors.Is(err, branchtest.ErrSkip) {
		skipReason = err.Error()
	} else if err != nil {
		// Only "cannot run here" skips; any other setup error fails.
		fmt.Fprintf(os.Stderr, "agent tests: set up the engine: %v\n", err)
		os.Exit(1)
	} else {
		engine, snap = rig.Engine, rig.Snap
	}
	code := m.Run()
	if rig != nil {
		rig.Close()
	}
	os.Exit(code)
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
