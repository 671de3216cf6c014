package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/router"
	"github.com/arbor-env/arbor/server"
)

const tenantTokens = "tok-alpha alpha\ntok-beta beta\ntok-ops ops admin\n"

// startTenantNode starts a node serving with the tokens file above.
func startTenantNode(t *testing.T, etcd, id, ip string, toks *tenant.Tokens) {
	t.Helper()
	rig := branchtest.ForTest(t, branchtest.Options{})
	p, err := envpool.NewPool(context.Background(), rig.Engine, []envpool.Task{oeTask}, envpool.PoolOptions{Warm: 1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s (loopback): %v", ip, err)
	}
	ctx := context.Background()
	reg, err := cluster.Connect(ctx, cluster.NodeOptions{Endpoints: []string{etcd}, ID: id, Advertise: ln.Addr().String(),
		TTL: ttl, Interval: 300 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	co, err := coordinator.New(coordinator.Options{Engine: rig.Engine, Classify: classify, MaxEnvs: maxEnvs,
		Hooks: reg, Tasks: coordinator.FromEnvpool(p), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Coordinator: co, Tokens: toks, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(ln)
	if err := reg.Register(ctx, cluster.CoordinatorLocal(co)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		reg.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(sctx)
		hs.Close()
		co.Close()
	})
}

// TestClusterTenants: a router and two nodes with one tokens file; each
// tenant's view through the router (protocol v1, the web view, OpenEnv)
// is its own, and the other's env and state ids are answered as ids
// nobody made.
func TestClusterTenants(t *testing.T) {
	toks, err := tenant.Parse(strings.NewReader(tenantTokens))
	if err != nil {
		t.Fatal(err)
	}
	etcd := etcdtest.Start(t)
	startTenantNode(t, etcd, "a", "127.0.0.2", toks)
	startTenantNode(t, etcd, "b", "127.0.0.3", toks)
	rt, err := router.New(context.Background(), router.Options{Endpoints: []string{etcd}, ForwardTokens: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Forwarder: rt, Tokens: toks, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
		rt.Close()
	})
	addr := strings.TrimPrefix(hs.URL, "http://")
	for end := time.Now().Add(10 * time.Second); len(rt.View().Place(oeTask.Name, nil)) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the router sees %d nodes, want 2", len(rt.View().Place(oeTask.Name, nil)))
		}
	}
	ctx := context.Background()
	as := func(tok string) *arbor.Client {
		c, err := arbor.Dial(ctx, addr, &arbor.Options{Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b, ops := as("tok-alpha"), as("tok-beta"), as("tok-ops")
	ids := func(c *arbor.Client) []string {
		t.Helper()
		envs, err := c.Envs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range envs {
			out = append(out, e.EnvID)
		}
		return out
	}
	var envA, envB []string
	for i := 0; i < 2; i++ { // two each: both nodes hold some of each tenant's
		ra, err := a.Reset(ctx, arbor.ResetParams{Task: "count"})
		if err != nil {
			t.Fatal(err)
		}
		envA = append(envA, ra.EnvID)
		rb, err := b.Reset(ctx, arbor.ResetParams{Task: "count"})
		if err != nil {
			t.Fatal(err)
		}
		envB = append(envB, rb.EnvID)
	}
	st, err := a.Step(ctx, envA[0], arbor.Action{Tool: "bash", Cmd: "echo 1 > /work/n"})
	if err != nil {
		t.Fatal(err)
	}
	sA, stepped := st.Info.StateID, envA[0]
	slices.Sort(envA)
	slices.Sort(envB)
	if got := ids(a); !slices.Equal(got, envA) {
		t.Errorf("alpha's envs through the router: %v, want %v", got, envA)
	}
	if got := ids(b); !slices.Equal(got, envB) {
		t.Errorf("beta's envs through the router: %v, want %v", got, envB)
	}
	if got := ids(ops); len(got) != 4 {
		t.Errorf("the admin's envs through the router: %v, want all 4", got)
	}

	const nobodysEnv, nobodysState = "0badc0ffee00", "s-0badc0ffee00"
	same := func(what string, other, unknown error, id, nobodys string, code string) {
		t.Helper()
		var po, pu *arbor.Error
		if !errors.As(other, &po) || !errors.As(unknown, &pu) || po.Code != code || pu.Code != code {
			t.Errorf("%s: %v; of an unknown id: %v; want %s", what, other, unknown, code)
			return
		}
		if code == "unknown_env" && strings.ReplaceAll(po.Message, id, "ID") != strings.ReplaceAll(pu.Message, nobodys, "ID") {
			t.Errorf("%s: %q; of an unknown id: %q", what, po.Message, pu.Message)
		}
	}
	step := func(e string) error {
		_, err := b.Step(ctx, e, arbor.Action{Tool: "bash", Cmd: "cat /work/n"})
		return err
	}
	same("step", step(envA[0]), step(nobodysEnv), envA[0], nobodysEnv, "unknown_env")
	closeEnv := func(e string) error { return b.CloseEnv(ctx, e) }
	same("close", closeEnv(envA[1]), closeEnv(nobodysEnv), envA[1], nobodysEnv, "unknown_env")
	branchEnv := func(e string) error { _, err := b.Branch(ctx, arbor.BranchParams{EnvID: e, N: 1}); return err }
	same("branch", branchEnv(envA[0]), branchEnv(nobodysEnv), envA[0], nobodysEnv, "unknown_env")
	migrate := func(e string) error { _, err := b.Migrate(ctx, e, ""); return err }
	same("migrate", migrate(envA[0]), migrate(nobodysEnv), envA[0], nobodysEnv, "unknown_env")
	release := func(s string) error { return b.Release(ctx, s) }
	same("release", release(sA), release(nobodysState), sA, nobodysState, "unknown_state")
	branchState := func(s string) error { _, err := b.Branch(ctx, arbor.BranchParams{StateID: s, N: 1}); return err }
	same("branch from state", branchState(sA), branchState(nobodysState), sA, nobodysState, "unknown_state")
	// n over what one node takes: the branch spreads over both nodes,
	// and the state is refused on its own node before any is shipped.
	spread := func(s string) error { _, err := b.Branch(ctx, arbor.BranchParams{StateID: s, N: maxEnvs}); return err }
	same("branch from state on both nodes", spread(sA), spread(nobodysState), sA, nobodysState, "unknown_state")
	if got := ids(a); !slices.Equal(got, envA) {
		t.Errorf("alpha's envs after beta's tries: %v, want %v", got, envA)
	}
	if r, err := a.Step(ctx, stepped, arbor.Action{Tool: "bash", Cmd: "cat /work/n"}); err != nil || strings.TrimSpace(string(r.Obs.Stdout)) != "1" {
		t.Errorf("alpha's step after beta's tries: %v %v", r, err)
	}

	// The web view through the router: each tenant's rows only.
	rows := func(tok string) []string {
		req, _ := http.NewRequest("GET", "http://"+addr+"/ui/api/envs", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ans struct{ Envs []struct{ ID string } }
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != 200 {
			t.Fatalf("/ui/api/envs as %s: %d %v", tok, resp.StatusCode, err)
		}
		var out []string
		for _, e := range ans.Envs {
			out = append(out, e.ID)
		}
		slices.Sort(out)
		return out
	}
	if got := rows("tok-alpha"); !slices.Equal(got, envA) {
		t.Errorf("alpha's web view through the router: %v, want %v", got, envA)
	}
	if got := rows("tok-beta"); !slices.Equal(got, envB) {
		t.Errorf("beta's web view through the router: %v, want %v", got, envB)
	}

	// OpenEnv through the router: alpha's session is alpha's.
	hdr := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/openenv/count/ws", hdr("tok-alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	c := &oeConn{t: t, ws: ws}
	_, sess := c.obs("reset", nil)
	if got := ids(a); !slices.Contains(got, sess) {
		t.Errorf("alpha's envs %v lack its OpenEnv session %s", got, sess)
	}
	if got := ids(b); slices.Contains(got, sess) {
		t.Errorf("beta sees alpha's OpenEnv session %s", sess)
	}
	if _, err := b.Step(ctx, sess, arbor.Action{Tool: "bash", Cmd: "true"}); err == nil {
		t.Errorf("beta stepped alpha's OpenEnv session %s", sess)
	}
}
