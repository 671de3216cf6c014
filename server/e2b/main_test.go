package e2b_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/e2b"
)

// One engine (btrfs pool, CRIU, the Inspector, busybox image) and one
// task pool serve every test of the package; each test makes its own
// server on them.
var (
	skipReason string
	engine     *branch.Engine
	pool       *envpool.Pool
)

// e2bTask is the template the SDK's tests create sandboxes of.
var e2bTask = envpool.Task{Name: "e2b-task", Image: "busybox", Instruction: "A sandbox for the E2B SDK."}

// tenantTokens are the API keys: two tenants.
const tenantTokens = `tok-alpha alpha
tok-beta beta
`

func quiet() *slog.Logger { return branchtest.Logger() }

func TestMain(m *testing.M) {
	branchtest.Main(m, "e2b", branchtest.Options{Inspector: true}, &skipReason, func(rig *branchtest.Rig) (func(), error) {
		engine = rig.Engine
		var err error
		pool, err = envpool.NewPool(context.Background(), engine, []envpool.Task{e2bTask}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
		if err != nil {
			return nil, err
		}
		return func() { pool.Close(context.Background()) }, nil
	})
}

// newServer is an Arbor server (protocol v1 and the E2B API on one
// coordinator) with the tokens above, on loopback; it answers its base
// URL.
func newServer(t testing.TB) (string, *coordinator.Coordinator) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	toks, err := tenant.Parse(strings.NewReader(tenantTokens))
	if err != nil {
		t.Fatal(err)
	}
	co, err := coordinator.New(coordinator.Options{Engine: engine, Tasks: coordinator.FromEnvpool(pool), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	api := e2b.New(e2b.Options{Coordinator: co, Auth: tenant.Auth{Tokens: toks}, Logger: quiet()})
	s, err := server.New(server.Options{Coordinator: co, Tokens: toks, Logger: quiet(), Handlers: api.Routes()})
	if err != nil {
		co.Close()
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
		co.Close()
	})
	return hs.URL, co
}
