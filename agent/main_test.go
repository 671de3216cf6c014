package agent_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/agent"
	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/server"
)

// One engine (btrfs pool, CRIU, busybox image) serves every test of the
// package; each test makes its own server on it.
var (
	skipReason string
	engine     *branch.Engine
)

func quiet() *slog.Logger { return branchtest.Logger() }

func TestMain(m *testing.M) {
	branchtest.Main(m, "agent", branchtest.Options{}, &skipReason, func(rig *branchtest.Rig) (func(), error) {
		engine = rig.Engine
		return nil, nil
	})
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
	return newTaskServer(t, token)
}

// newTaskServer is newServer with a task pool of tasks (none: images only).
func newTaskServer(t testing.TB, token string, tasks ...envpool.Task) *served {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	var pool coordinator.Tasks
	if len(tasks) > 0 {
		p, err := envpool.NewPool(context.Background(), engine, tasks, envpool.PoolOptions{Warm: -1, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		pool = coordinator.FromEnvpool(p)
	}
	// One coordinator behind both the protocol and the MCP endpoint.
	co, err := coordinator.New(coordinator.Options{Engine: engine, Tasks: pool, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(co.Close)
	tools, err := agent.New(agent.Options{Coordinator: co, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h := tools.Handler(agent.HandlerOptions{Token: token, Logger: quiet()})
	s, err := server.New(server.Options{Coordinator: co, Token: token, Logger: quiet(),
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
