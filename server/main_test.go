package server_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/state"
)

// One engine (btrfs pool, CRIU, busybox image) and one task pool serve
// every test of the package; each test makes its own Server on them when
// it needs other limits.
var (
	skipReason string
	engine     *branch.Engine
	pool       *envpool.Pool
	images     *image.Store
)

// testTask is a busybox task: a counter file the agent must raise.
var testTask = envpool.Task{
	Name: "count", Image: "busybox",
	Setup:       []string{"mkdir -p /work && echo 0 > /work/n && cd /work"},
	Instruction: "Make the number in /work/n at least 3.",
	Verifier:    `n=$(cat /work/n); if [ "$n" -ge 3 ]; then echo 1; else echo 0; fi`,
	MaxTurns:    40,
}

func quiet() *slog.Logger { return branchtest.Logger() }

func TestMain(m *testing.M) {
	branchtest.Main(m, "server", branchtest.Options{Inspector: true}, &skipReason, func(rig *branchtest.Rig) (func(), error) {
		engine, images = rig.Engine, rig.Images
		var err error
		pool, err = envpool.NewPool(context.Background(), engine, []envpool.Task{testTask}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
		if err != nil {
			return nil, err
		}
		return func() { pool.Close(context.Background()) }, nil
	})
}

// classifyAs is a Classify that gives every turn kind k.
func classifyAs(k state.Kind) func(context.Context, *branch.Env, string) (branch.Turn, error) {
	return func(context.Context, *branch.Env, string) (branch.Turn, error) { return branch.Turn{Kind: k}, nil }
}

// newServer makes a server on the shared engine and task pool whose
// coordinator checkpoints every turn full.
func newServer(t testing.TB, o server.Options) (*server.Server, string) {
	t.Helper()
	return newServerWith(t, o, coordinator.Options{})
}

// newServerWith makes a server on the shared engine whose coordinator
// has options co (Classify nil: every turn full; Tasks nil: the shared
// task pool).
func newServerWith(t testing.TB, o server.Options, co coordinator.Options) (*server.Server, string) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	co.Engine = engine
	if co.Tasks == nil {
		co.Tasks = coordinator.FromEnvpool(pool)
	}
	if co.Classify == nil {
		co.Classify = coordinator.Full
	}
	if o.Logger == nil {
		o.Logger = quiet()
	}
	co.Logger = o.Logger
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	co.Registry = o.Registry
	c, err := coordinator.New(co)
	if err != nil {
		t.Fatal(err)
	}
	o.Coordinator = c
	s, err := server.New(o)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
		c.Close()
	})
	return s, strings.TrimPrefix(hs.URL, "http://")
}
