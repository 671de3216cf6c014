package router_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/e2b"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/router"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// ttl is the nodes' lease in these tests: short, so that a dead node
// leaves the registry quickly.
const ttl = 2 * time.Second

const maxEnvs = 16

func quiet() *slog.Logger { return branchtest.Logger() }

// connTracker is a listener that remembers its connections, so a test
// can cut them all as a dying process would (the server's websockets are
// hijacked: http.Server.Close does not close them).
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *connTracker) cut() {
	l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// node is one real Arbor node: its own engine (btrfs pool, CRIU), a
// coordinator whose hooks are the node's registry, a protocol server on
// its own loopback address.
type node struct {
	id, addr string
	ln       *connTracker
	reg      *cluster.Node
	eng      *branch.Engine
	tr       *cluster.Transfer
	killOnce sync.Once
}

// classify checkpoints every turn full but `true`, which changes nothing
// (the overhead test's steps without a checkpoint).
func classify(_ context.Context, _ *branch.Env, cmd string) (branch.Turn, error) {
	if cmd == "true" {
		return branch.Turn{Kind: state.None}, nil
	}
	return branch.Turn{Kind: state.Full}, nil
}

// startNode starts a node of maxEnvs envs; with tasks, its resets take
// them from a task pool of its own (one warm env each).
func startNode(t testing.TB, etcd, id, ip string, tasks ...envpool.Task) *node {
	t.Helper()
	return startNodeMax(t, etcd, id, ip, maxEnvs, tasks...)
}

// startNodeMax is startNode with room for max envs.
func startNodeMax(t testing.TB, etcd, id, ip string, max int, tasks ...envpool.Task) *node {
	t.Helper()
	rig := branchtest.ForTest(t, branchtest.Options{})
	var pool coordinator.Tasks
	if len(tasks) > 0 {
		p, err := envpool.NewPool(context.Background(), rig.Engine, tasks, envpool.PoolOptions{Warm: 1, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		pool = coordinator.FromEnvpool(p)
	}
	raw, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listen on %s (loopback): %v", ip, err)
	}
	n := &node{id: id, addr: raw.Addr().String(), ln: &connTracker{Listener: raw}, eng: rig.Engine}
	ctx := context.Background()
	n.reg, err = cluster.Connect(ctx, cluster.NodeOptions{Endpoints: []string{etcd}, ID: id, Advertise: n.addr, Transfer: n.addr,
		TTL: ttl, Interval: 300 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	co, err := coordinator.New(coordinator.Options{Engine: rig.Engine, Classify: classify, MaxEnvs: max,
		Hooks: n.reg, Tasks: pool, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	n.tr = cluster.NewTransfer(cluster.TransferOptions{Coordinator: co, Node: n.reg, Timeout: time.Minute, Logger: quiet()})
	routes := e2b.New(e2b.Options{Coordinator: co, Logger: quiet()}).Routes()
	routes[cluster.TransferPrefix] = n.tr.Handler()
	s, err := server.New(server.Options{Coordinator: co, Handlers: routes, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	n.tr.UseStepKeys(s)
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(n.ln)
	if err := n.reg.Register(ctx, cluster.CoordinatorLocal(co)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.kill()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(sctx)
		hs.Close()
		co.Close()
	})
	return n
}

// kill makes the node die as far as the cluster can tell: its
// connections cut, its listener closed, its lease no longer renewed
// (not revoked: it expires after the TTL).
func (n *node) kill() {
	n.killOnce.Do(func() {
		n.ln.cut()
		n.reg.Close()
	})
}

// startRouter starts a router on 127.0.0.1; tokens (none, or the
// clients' and the nodes') as arbor router's --token and --node-token.
func startRouter(t testing.TB, etcd string, tokens ...string) (*router.Router, string) {
	t.Helper()
	var token, nodeToken string
	if len(tokens) == 2 {
		token, nodeToken = tokens[0], tokens[1]
	}
	rt, err := router.New(context.Background(), router.Options{Endpoints: []string{etcd}, NodeToken: nodeToken, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Forwarder: rt, Token: token, Logger: quiet(),
		Handlers: e2b.NewProxy(e2b.ProxyOptions{Placer: rt, Auth: tenant.Auth{Token: token}, Logger: quiet()}).Routes()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler()) // 127.0.0.1
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		hs.Close()
		rt.Close()
	})
	return rt, strings.TrimPrefix(hs.URL, "http://")
}

// dial connects a client to addr (a node or the router), closed when tb
// ends.
func dial(tb testing.TB, addr string) *arbor.Client {
	tb.Helper()
	c, err := arbor.Dial(context.Background(), addr, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func etcdClient(t testing.TB, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// placement is the node etcd records for env ("" for none).
func placement(t testing.TB, cli *clientv3.Client, env string) string {
	t.Helper()
	r, err := cli.Get(context.Background(), cluster.EnvKey(env))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	var p cluster.Placement
	if err := json.Unmarshal(r.Kvs[0].Value, &p); err != nil {
		t.Fatal(err)
	}
	return p.Node
}

// keysOf counts the keys under prefix whose name ends in suffix.
// resetOn resets busybox envs through c until one is placed on node n
// (the router places by load), and returns that env's id; the others
// stay open.
func resetOn(t testing.TB, c *arbor.Client, cli *clientv3.Client, n *node) string {
	t.Helper()
	for {
		r, err := c.Reset(context.Background(), arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		if placement(t, cli, r.EnvID) == n.id {
			return r.EnvID
		}
	}
}

// replicaOf waits up to 20 s for env's replica record to name state,
// and returns it.
func replicaOf(t testing.TB, cli *clientv3.Client, env, state string) cluster.Replica {
	t.Helper()
	var rp cluster.Replica
	for end := time.Now().Add(20 * time.Second); rp.State != state; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no replica of state %s after 20 s (replica %+v)", state, rp)
		}
		if g, err := cli.Get(context.Background(), cluster.ReplicaKey(env)); err == nil && len(g.Kvs) > 0 {
			json.Unmarshal(g.Kvs[0].Value, &rp)
		}
	}
	return rp
}

func keysOf(t *testing.T, cli *clientv3.Client, prefix, suffix string) int {
	t.Helper()
	r, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range r.Kvs {
		if strings.HasSuffix(string(kv.Key), suffix) {
			n++
		}
	}
	return n
}

func sh(t testing.TB, c *arbor.Client, env, cmd string) *arbor.StepResult {
	t.Helper()
	r, err := c.Step(context.Background(), env, arbor.Bash(cmd, 20*time.Second))
	if err != nil {
		t.Fatalf("step %q in %s: %v", cmd, env, err)
	}
	if r.Obs.ExitCode != 0 {
		t.Fatalf("step %q in %s: exit %d, stderr %q", cmd, env, r.Obs.ExitCode, r.Obs.Stderr)
	}
	return r
}

func out(r *arbor.StepResult) string { return strings.TrimSpace(string(r.Obs.Stdout)) }

// nodeUnavailable checks that err is the router's retryable infra error
// and that it came within d of start.
func nodeUnavailable(t *testing.T, what string, err error, start time.Time, d time.Duration) {
	t.Helper()
	var pe *arbor.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeNodeUnavailable || !pe.Retryable || !pe.Infra {
		t.Fatalf("%s: %v, want node_unavailable (retryable, infra)", what, err)
	}
	if took := time.Since(start); took > d {
		t.Errorf("%s: answered after %v, want within %v", what, took, d)
	}
	t.Logf("%s: %v (after %v)", what, err, time.Since(start).Round(time.Millisecond))
}

func TestCluster(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	a := startNode(t, etcd, "a", "127.0.0.2")
	b := startNode(t, etcd, "b", "127.0.0.3")
	rt, addr := startRouter(t, etcd)
	ctx := context.Background()
	c := dial(t, addr)

	var hello *arbor.HelloResult
	var err error
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if hello, err = c.Hello(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if hello.Capabilities.MaxEnvs == 2*maxEnvs || time.Now().After(end) {
			break
		}
	}
	if hello.Version != 1 || hello.Capabilities.MaxEnvs != 2*maxEnvs || hello.Capabilities.MaxInFlight != 256 ||
		hello.Capabilities.MaxFrameBytes != 8<<20 || len(hello.Capabilities.Methods) != len(protocol.Methods) {
		t.Fatalf("hello through the router: %+v", hello)
	}

	// Resets spread over both nodes.
	var envs []string
	resets := map[string]*arbor.ResetResult{}
	on := map[string][]string{}
	for i := 0; i < 4; i++ {
		r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
		if err != nil {
			t.Fatalf("reset %d: %v", i, err)
		}
		envs = append(envs, r.EnvID)
		resets[r.EnvID] = r
		n := placement(t, cli, r.EnvID)
		on[n] = append(on[n], r.EnvID)
	}
	if len(on[a.id]) != 2 || len(on[b.id]) != 2 {
		t.Fatalf("4 resets on two empty nodes: %v, want two on each", on)
	}
	if got := keysOf(t, cli, cluster.Prefix+"states/", "/"+a.id); got < 2 {
		t.Errorf("state keys of node a: %d, want its two resets' states at least", got)
	}

	// Steps, pipelined, on every env: each env is its own.
	var wg sync.WaitGroup
	for i, env := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh(t, c, env, "mkdir -p /work; cd /work; echo "+string(rune('0'+i))+" > id")
		}()
	}
	wg.Wait()
	step := map[string]*arbor.StepResult{}
	for i, env := range envs {
		r := sh(t, c, env, "cat id; hostname >/dev/null")
		if out(r) != string(rune('0'+i)) || r.Obs.Cwd != "/work" {
			t.Errorf("env %d (%s): stdout %q cwd %q", i, env, out(r), r.Obs.Cwd)
		}
		step[env] = r
	}

	ea, eb := on[a.id][0], on[b.id][0]
	t.Run("branch", func(t *testing.T) {
		br, err := c.Branch(ctx, arbor.BranchParams{EnvID: eb, N: 2})
		if err != nil {
			t.Fatal(err)
		}
		for i, kid := range br.EnvIDs {
			// Children go by load (branch.go's spread), a tie to the
			// source's node: the first one is there; the second where
			// the load says (TestBranchAcrossNodes checks the spread).
			n := placement(t, cli, kid)
			if i == 0 && n != b.id || n != a.id && n != b.id {
				t.Errorf("child %d (%s) of an env of node b placed on %q", i, kid, n)
			}
			t.Logf("child %d on node %s", i, n)
			sh(t, c, kid, "echo kid >> id")
		}
		if got := out(sh(t, c, eb, "cat id")); strings.Contains(got, "kid") {
			t.Errorf("a child's write reached its parent: %q", got)
		}
		// By state id: routed to the node whose registry holds it.
		bs, err := c.Branch(ctx, arbor.BranchParams{StateID: step[ea].Info.StateID, N: 1})
		if err != nil {
			t.Fatalf("branch a state of node a by id: %v", err)
		}
		if n := placement(t, cli, bs.EnvIDs[0]); n != a.id {
			t.Errorf("branch of a state of node a made its child on %q", n)
		}
		// promote goes to the child's node, where its origin is.
		sh(t, c, br.EnvIDs[0], "echo promoted > id")
		pr, err := c.Promote(ctx, br.EnvIDs[0])
		if err != nil || pr.EnvID != eb {
			t.Fatalf("promote: %+v, %v", pr, err)
		}
		if got := out(sh(t, c, eb, "cat id")); got != "promoted" {
			t.Errorf("after promote the origin reads %q", got)
		}
		if n := placement(t, cli, br.EnvIDs[0]); n != "" {
			t.Errorf("a promoted (closed) child keeps its placement on %q", n)
		}
		for _, id := range []string{br.EnvIDs[1], bs.EnvIDs[0]} {
			if err := c.CloseEnv(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("rollback", func(t *testing.T) {
		env := on[a.id][1]
		info, err := c.Rollback(ctx, env, resets[env].Info.StateID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Restored != resets[env].Info.StateID {
			t.Errorf("rollback info: %+v", info)
		}
		r, err := c.Step(ctx, env, arbor.Bash("cat /work/id", 10*time.Second))
		if err != nil || r.Obs.ExitCode == 0 {
			t.Errorf("after rollback to the reset the file is still there: %+v %v", r, err)
		}
		st, err := c.States(ctx, env)
		if err != nil || st.EnvID != env || len(st.States) == 0 {
			t.Errorf("states: %+v %v", st, err)
		}
	})

	t.Run("batch, envs, pin", func(t *testing.T) {
		items := []arbor.BatchItem{{EnvID: ea, Action: arbor.Bash("echo A", 0)}, {EnvID: "nope", Action: arbor.Bash("true", 0)},
			{EnvID: eb, Action: arbor.Bash("echo B", 0)}}
		var mu sync.Mutex
		seen := map[int]bool{}
		res, err := c.StepBatch(ctx, items, func(it arbor.BatchItemResult) {
			mu.Lock()
			seen[it.Index] = true
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Results) != 3 || res.Results[0].Result == nil || out(res.Results[0].Result) != "A" ||
			res.Results[2].Result == nil || out(res.Results[2].Result) != "B" ||
			res.Results[1].Error == nil || res.Results[1].Error.Code != protocol.CodeUnknownEnv {
			t.Fatalf("step_batch over two nodes: %+v", res.Results)
		}
		mu.Lock()
		if len(seen) != 3 {
			t.Errorf("step_batch notifications for items %v, want 0, 1, 2", seen)
		}
		mu.Unlock()
		list, err := c.Envs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != len(envs) {
			t.Errorf("envs through the router: %d, want %d", len(list), len(envs))
		}
		// pin and unpin states of both nodes; an unknown id changes none.
		sa, sb := step[ea].Info.StateID, step[eb].Info.StateID
		if err := c.Pin(ctx, sa, sb); err != nil {
			t.Fatal(err)
		}
		if err := c.Unpin(ctx, sa, sb); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, sa, "snope"); !errors.Is(err, arbor.ErrUnknownState) {
			t.Errorf("release of an unknown state: %v", err)
		}
	})

	t.Run("prepare", func(t *testing.T) {
		// A state of each node (the resets': the branch above shipped
		// eb's later state to a as well): each node prepares its own (its
		// engine counts the copy) and the router merges the answers.
		sa, sb := resets[ea].Info.StateID, resets[eb].Info.StateID
		if _, err := c.Prepare(ctx, []string{sa, "snope"}, 1, false); !errors.Is(err, arbor.ErrUnknownState) {
			t.Errorf("prepare of an unknown state: %v, want unknown_state", err)
		}
		res, err := c.Prepare(ctx, []string{sa, sb}, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		if res.Prepared[sa] != 1 || res.Ready[sa] != 1 || res.Prepared[sb] != 1 || res.Ready[sb] != 1 || len(res.Refused) != 0 {
			t.Fatalf("prepare of a state of each node through the router: %+v", res)
		}
		for _, n := range []*node{a, b} {
			u, err := n.eng.Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.Prepare.Ready != 1 {
				t.Errorf("node %s holds %d prepared copies, want 1 (its own state's)", n.id, u.Prepare.Ready)
			}
		}
	})

	t.Run("python client", func(t *testing.T) {
		py := ""
		for _, p := range []string{"/usr/bin/python3", "python3"} {
			if exec.Command(p, "-c", "import msgpack, websockets").Run() == nil {
				py = p
				break
			}
		}
		if py == "" {
			t.Skip("no python3 with msgpack and websockets: run make deps")
		}
		script := `
import sys
from arbor_env import Client
with Client(sys.argv[1]) as c:
    env = c.env(image="busybox")
    obs, info = env.reset()
    obs, reward, term, trunc, info = env.step("echo py > /tmp/p; cat /tmp/p")
    assert obs["stdout"].strip() == "py", obs
    kids = env.branch(2)
    for k in kids:
        o = k.step("cat /tmp/p")[0]
        assert o["stdout"].strip() == "py", o
        k.close()
    env.close()
print("ok")
`
		cmd := exec.Command(py, "-c", script, "ws://"+addr+"/v1/ws")
		abs, _ := filepath.Abs("../clients/python")
		cmd.Env = append(os.Environ(), "PYTHONPATH="+abs, "PYTHONDONTWRITEBYTECODE=1")
		b, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(b), "ok") {
			t.Fatalf("python client through the router: %v\n%s", err, b)
		}
	})

	t.Run("close", func(t *testing.T) {
		env := on[a.id][1]
		if err := c.CloseEnv(ctx, env); err != nil {
			t.Fatal(err)
		}
		if n := placement(t, cli, env); n != "" {
			t.Errorf("closed env still placed on %q", n)
		}
		if _, err := c.Step(ctx, env, arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
			t.Errorf("step on a closed env: %v", err)
		}
	})

	t.Run("overhead", func(t *testing.T) {
		// Not a benchmark (that is issue 17's later part): a figure in the
		// log of what the router adds to a step.
		direct := dial(t, a.addr)
		p50 := func(c *arbor.Client, a arbor.Action, n int) time.Duration {
			var d []time.Duration
			for i := 0; i < n; i++ {
				start := time.Now()
				if _, err := c.Step(ctx, ea, a); err != nil {
					t.Fatal(err)
				}
				d = append(d, time.Since(start))
			}
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[len(d)/2]
		}
		// `true` takes no checkpoint (classify): the step's path alone.
		noop := arbor.Bash("true", 0)
		t.Logf("step p50 without a checkpoint: direct %v, router %v", p50(direct, noop, 31), p50(c, noop, 31))
		// Each of these makes a state (a full checkpoint, waited for by
		// the next step) whose key the node writes to etcd.
		write := arbor.Bash("date > f", 0)
		t.Logf("step p50 with a new state each: direct %v, router %v", p50(direct, write, 5), p50(c, write, 5))
	})

	t.Run("node dies", func(t *testing.T) {
		// A step running on b when b dies is answered at once, not when
		// it would have ended.
		long := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := c.Step(ctx, on[b.id][1], arbor.Bash("sleep 8", 20*time.Second))
			long <- err
		}()
		time.Sleep(500 * time.Millisecond)
		b.kill()
		select {
		case err := <-long:
			nodeUnavailable(t, "step running on the killed node", err, start, 3*time.Second)
		case <-time.After(10 * time.Second):
			t.Fatal("a step on a killed node hangs")
		}
		start = time.Now()
		_, err := c.Step(ctx, eb, arbor.Bash("true", 0))
		nodeUnavailable(t, "step on an env of the killed node", err, start, 4*time.Second)
		// New resets go to the node left, also while the dead one is still
		// in the registry (its lease has not ended yet).
		for i := 0; i < 2; i++ {
			r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
			if err != nil {
				t.Fatalf("reset with node b dead: %v", err)
			}
			if n := placement(t, cli, r.EnvID); n != a.id {
				t.Errorf("reset with node b dead placed on %q", n)
			}
		}
		// Its registry keys vanish with the lease; its placements stay, so
		// its envs are still answered node_unavailable, not unknown_env.
		end := time.Now().Add(ttl + 3*time.Second)
		for keysOf(t, cli, cluster.NodeKey(b.id), "") > 0 || keysOf(t, cli, cluster.Prefix+"states/", "/"+b.id) > 0 {
			if time.Now().After(end) {
				t.Fatalf("node b's keys are still there %v after it died (lease TTL %v)", ttl+3*time.Second, ttl)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("node b's keys gone %v after it died", time.Since(start).Round(time.Millisecond))
		if n := placement(t, cli, eb); n != b.id {
			t.Errorf("placement of an env of the dead node: %q", n)
		}
		start = time.Now()
		_, err = c.Step(ctx, eb, arbor.Bash("true", 0))
		nodeUnavailable(t, "step on an env of a node gone from the registry", err, start, time.Second)
		// (eb's reset state: its later state went to node a with a branch
		// child, which a holds now.)
		_, err = c.Branch(ctx, arbor.BranchParams{StateID: resets[eb].Info.StateID, N: 1})
		if !errors.Is(err, arbor.ErrUnknownState) {
			t.Errorf("branch of a state only the dead node held: %v, want unknown_state", err)
		}
		hello, err := c.Hello(ctx, "")
		if err != nil || hello.Capabilities.MaxEnvs != maxEnvs {
			t.Errorf("hello with one node left: max_envs %v, %v", hello.Capabilities.MaxEnvs, err)
		}
		if got := rt.View().Nodes(); len(got) != 1 || got[0].ID != a.id {
			t.Errorf("router's live nodes: %v", got)
		}
	})

	t.Run("lease revoked", func(t *testing.T) {
		// A node whose lease ends while its connection stays up (a host
		// cut off from etcd and the router): the watch fails its request.
		r, err := cli.Get(ctx, cluster.NodeKey(a.id))
		if err != nil || len(r.Kvs) == 0 {
			t.Fatalf("node a's key: %v", err)
		}
		long := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := c.Step(ctx, ea, arbor.Bash("sleep 8", 20*time.Second))
			long <- err
		}()
		time.Sleep(500 * time.Millisecond)
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(r.Kvs[0].Lease)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-long:
			nodeUnavailable(t, "step on a node whose lease was revoked", err, start, 3*time.Second)
		case <-time.After(10 * time.Second):
			t.Fatal("a step on a node whose lease was revoked hangs")
		}
		// The node renews: a new lease, its key and state keys again, and
		// its envs are served once more.
		end := time.Now().Add(5 * time.Second)
		for {
			if _, ok := rt.View().Node(a.id); ok {
				break
			}
			if time.Now().After(end) {
				t.Fatal("node a did not register again after its lease was revoked")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := out(sh(t, c, ea, "cat id")); got == "" {
			t.Errorf("env of the renewed node: %q", got)
		}
		if nodes, err := rt.View().StateNodes(ctx, step[ea].Info.StateID); err != nil || len(nodes) != 1 {
			t.Errorf("state key of node a after it renewed: %v %v", nodes, err)
		}
	})
}
