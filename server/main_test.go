package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/envpool"
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

func quiet() *slog.Logger { return branchtest.Logger() }

func TestMain(m *testing.M) {
	cleanup, err := setup()
	if errors.Is(err, branchtest.ErrSkip) {
		skipReason = err.Error()
	} else if err != nil {
		// Only "cannot run here" skips; any other setup error fails.
		fmt.Fprintf(os.Stderr, "server tests: set up the engine: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	os.Exit(code)
}

func setup() (cleanup func(), err error) {
	rig, err := branchtest.New(branchtest.Options{Inspector: true})
	if err != nil {
		return nil, err
	}
	engine = rig.Engine
	pool, err = envpool.NewPool(context.Background(), engine, []envpool.Task{testTask}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
	if err != nil {
		rig.Close()
		return nil, err
	}
	return func() {
		pool.Close(context.Background())
		rig.Close()
	}, nil
}

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
