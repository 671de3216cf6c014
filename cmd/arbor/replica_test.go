package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/internal/servetest"
	"github.com/arbor-env/arbor/router"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
)

// busybox's counter: a shell loop whose memory holds n, reported through a
// file when asked (as router's and branch's tests do).
const (
	counterStart = `(n=0; while :; do if [ -e /tmp/ask ]; then n=$((n+1)); echo $n > /tmp/answer; rm /tmp/ask; fi; sleep 0.02; done) >/dev/null 2>&1 &`
	counterRead  = `rm -f /tmp/answer; touch /tmp/ask; while [ ! -s /tmp/answer ]; do sleep 0.02; done; cat /tmp/answer`
)

// TestServeKilledWithReplicas: two real arbor serve nodes on 127.0.0.2
// (a, --replicas 2) and 127.0.0.3 (b, without) on an embedded etcd, a
// router in the test process. An env of a, with files and a background
// counter, is replicated on b (the replica record names its last step's
// state); an env of b has no replica. a gets SIGKILL: a step on its env
// answers node_unavailable at once while a's lease lasts, and once it
// ended the next step answers from b with the replicated files and
// counter, its placement naming b. Then b gets SIGKILL: its own env, which
// had no replica, answers node_unavailable (retryable, infra) at once,
// before and after b's lease ended.
func TestServeKilledWithReplicas(t *testing.T) {
	servetest.RequireHost(t)
	etcd := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ttl = 2 * time.Second
	a, ca := startServe(t, ctx, t.TempDir(), freeAddrOn(t, "127.0.0.2"),
		"--cluster-etcd", etcd, "--node-id", "a", "--cluster-ttl", ttl.String(), "--replicas", "2")
	defer ca.Close()
	b, cb := startServe(t, ctx, t.TempDir(), freeAddrOn(t, "127.0.0.3"),
		"--cluster-etcd", etcd, "--node-id", "b", "--cluster-ttl", ttl.String())
	defer cb.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c := dialRouter(t, ctx, etcd)

	// The envs are made on their nodes directly, so each is where the
	// test wants it; every later request goes through the router.
	r, err := ca.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	routerStep(t, ctx, c, env, "mkdir -p /work && echo data > /work/file")
	routerStep(t, ctx, c, env, counterStart)
	base, err := strconv.Atoi(strings.TrimSpace(routerStep(t, ctx, c, env, counterRead)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Step(ctx, env, arbor.Bash("echo more >> /work/file", 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	last := s.Info.StateID
	r, err = cb.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	orphan := r.EnvID
	routerStep(t, ctx, c, orphan, "echo b > /b")
	if p := placementOf(t, ctx, cli, env); p != "a" {
		t.Fatalf("env %s placed on %q, want a", env, p)
	}
	if p := placementOf(t, ctx, cli, orphan); p != "b" {
		t.Fatalf("env %s placed on %q, want b", orphan, p)
	}

	var rp cluster.Replica
	for end := time.Now().Add(30 * time.Second); rp.State != last; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no replica of state %s after 30 s (replica %+v)", last, rp)
		}
		g, err := cli.Get(ctx, cluster.ReplicaKey(env))
		if err == nil && len(g.Kvs) > 0 {
			json.Unmarshal(g.Kvs[0].Value, &rp)
		}
	}
	if rp.Node != "b" {
		t.Fatalf("replica of %s on %q, want b", env, rp.Node)
	}
	t.Logf("env %s of node a replicated on b at %s", env, rp.State)

	killed := time.Now()
	a.Kill() // SIGKILL, and waits for the process
	// Until its lease ends a is still registered: the router cannot
	// reach it and says so at once.
	start := time.Now()
	_, err = c.Step(ctx, env, arbor.Bash("true", 0))
	unavailable(t, "step on a's env while a's lease lasts", err, start, 5*time.Second)
	waitGone(t, ctx, cli, "a", ttl+10*time.Second)
	t.Logf("node a's key gone %v after the kill", time.Since(killed).Round(time.Millisecond))
	start = time.Now()
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	s, err = c.Step(sctx, env, arbor.Bash("cat /work/file; "+counterRead, 20*time.Second))
	scancel()
	if err != nil {
		t.Fatalf("step on a's env after a's lease ended: %v, want it answered from its replica", err)
	}
	t.Logf("a's env answered from its replica after %v", time.Since(start).Round(time.Millisecond))
	if got, want := string(s.Obs.Stdout), "data\nmore\n"+strconv.Itoa(base+1)+"\n"; got != want {
		t.Errorf("a's env restored from its replica: %q, want %q (its files and counter at %s)", got, want, last)
	}
	if p := placementOf(t, ctx, cli, env); p != "b" {
		t.Errorf("placement of a's env after the failover: %q, want b", p)
	}
	// Its state goes on on b: the counter counts on from there.
	if got := strings.TrimSpace(routerStep(t, ctx, c, env, counterRead)); got != strconv.Itoa(base+2) {
		t.Errorf("the counter on b after the failover: %s, want %d", got, base+2)
	}

	// b has no replicas: its env is lost with it, and says so.
	if g, err := cli.Get(ctx, cluster.ReplicaKey(orphan)); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("replica record of b's env: %v %v, want none", g, err)
	}
	killed = time.Now()
	b.Kill()
	start = time.Now()
	_, err = c.Step(ctx, orphan, arbor.Bash("true", 0))
	unavailable(t, "step on b's env (no replica) while b's lease lasts", err, start, 5*time.Second)
	waitGone(t, ctx, cli, "b", ttl+10*time.Second)
	t.Logf("node b's key gone %v after the kill", time.Since(killed).Round(time.Millisecond))
	start = time.Now()
	_, err = c.Step(ctx, orphan, arbor.Bash("true", 0))
	unavailable(t, "step on b's env (no replica) after b's lease ended", err, start, 5*time.Second)
}

// dialRouter starts a router in the test process on 127.0.0.1 in front of
// the cluster on etcd and returns a client connected to it.
func dialRouter(t *testing.T, ctx context.Context, etcd string) *arbor.Client {
	t.Helper()
	rt, err := router.New(ctx, router.Options{Endpoints: []string{etcd}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Forwarder: rt})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(sctx)
		hs.Close()
		rt.Close()
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := arbor.Dial(dctx, strings.TrimPrefix(hs.URL, "http://"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// routerStep runs cmd in env (at most a minute) and returns its stdout;
// an error or a non-zero exit fails the test.
func routerStep(t *testing.T, ctx context.Context, c *arbor.Client, env, cmd string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := c.Step(sctx, env, arbor.Bash(cmd, 20*time.Second))
	if err != nil {
		t.Fatalf("step %q in %s: %v", cmd, env, err)
	}
	if s.Obs.ExitCode != 0 {
		t.Fatalf("step %q in %s: exit %d: %s", cmd, env, s.Obs.ExitCode, s.Obs.Stderr)
	}
	return string(s.Obs.Stdout)
}

// placementOf is the node etcd records for env ("" for none).
func placementOf(t *testing.T, ctx context.Context, cli *clientv3.Client, env string) string {
	t.Helper()
	g, err := cli.Get(ctx, cluster.EnvKey(env))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) == 0 {
		return ""
	}
	var p cluster.Placement
	if err := json.Unmarshal(g.Kvs[0].Value, &p); err != nil {
		t.Fatal(err)
	}
	return p.Node
}

// waitGone waits (at most d) until node's key has left etcd.
func waitGone(t *testing.T, ctx context.Context, cli *clientv3.Client, node string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		g, err := cli.Get(ctx, cluster.NodeKey(node))
		if err == nil && len(g.Kvs) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("node %s's key still in etcd %v after its kill (%v)", node, d, err)
		}
	}
}

// unavailable checks that err is the router's retryable infra error
// node_unavailable and that it came within d of start.
func unavailable(t *testing.T, what string, err error, start time.Time, d time.Duration) {
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
