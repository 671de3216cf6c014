package router_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/server"
	"github.com/arbor-env/arbor/server/protocol"
)

// stubLocal is the registry's side of a node that has no engine.
type stubLocal struct{}

func (stubLocal) Capacity() cluster.NodeInfo {
	return cluster.NodeInfo{MaxEnvs: 3, Tasks: []string{"count"}, EnvIdleTTLS: 30}
}
func (stubLocal) HasState(string) bool { return true }
func (stubLocal) HasEnv(string) bool   { return true }

func (stubLocal) CloseEnv(context.Context, string) error { return nil }

// hung is a node that takes requests and never answers them (a host
// that stopped without closing its connections).
type hung struct{}

func (hung) Forward(context.Context, uint32, string, msgpack.RawMessage, func(string, any)) func(context.Context) (any, error) {
	return func(ctx context.Context) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
}
func (hung) Capabilities() protocol.Capabilities { return protocol.Capabilities{} }

// register lists a node at addr in etcd with a stub's capacity.
func register(t *testing.T, etcd, id, addr string) *cluster.Node {
	t.Helper()
	n, err := cluster.Connect(context.Background(), cluster.NodeOptions{Endpoints: []string{etcd}, ID: id, Advertise: addr,
		TTL: time.Second, Interval: 200 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register(context.Background(), stubLocal{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// closedAddr is a loopback address nobody listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func wantCode(t *testing.T, what string, err error, code string, start time.Time, d time.Duration) {
	t.Helper()
	var pe *arbor.Error
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	if code == protocol.CodeNodeUnavailable && (!pe.Retryable || !pe.Infra) {
		t.Errorf("%s: %+v: node_unavailable must be retryable and infra", what, pe)
	}
	if took := time.Since(start); took > d {
		t.Errorf("%s: answered after %v, want within %v", what, took, d)
	}
}

// TestNodesGone runs a router in front of nodes that cannot serve (no
// root needed): one that refuses connections, one that never answers.
// Every request is answered, promptly, with the protocol's codes.
func TestNodesGone(t *testing.T) {
	etcd := etcdtest.Start(t)
	rt, addr := startRouter(t, etcd)
	ctx := context.Background()
	c := dial(t, addr)

	start := time.Now()
	_, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	wantCode(t, "reset with no node", err, protocol.CodeNodeUnavailable, start, time.Second)
	_, err = c.Step(ctx, "nope", arbor.Bash("true", 0))
	wantCode(t, "step on an env nobody placed", err, protocol.CodeUnknownEnv, start, time.Second)
	_, err = c.Branch(ctx, arbor.BranchParams{StateID: "snope", N: 1})
	wantCode(t, "branch of a state nobody holds", err, protocol.CodeUnknownState, start, time.Second)
	_, err = c.Step(ctx, "", arbor.Bash("true", 0))
	wantCode(t, "step without env_id", err, protocol.CodeInvalidParams, start, time.Second)

	// A node that refuses connections: its envs and the resets placed on
	// it are answered node_unavailable at once.
	dead := register(t, etcd, "dead", closedAddr(t))
	dead.EnvOpened("e1")
	for end := time.Now().Add(3 * time.Second); len(rt.View().Nodes()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the router does not see the registered node")
		}
	}
	hello, err := c.Hello(ctx, "")
	if err != nil || hello.Capabilities.MaxEnvs != 3 || len(hello.Capabilities.Tasks) != 1 || hello.Capabilities.EnvIdleTTLS != 30 {
		t.Errorf("hello with one node: %+v %v", hello, err)
	}
	start = time.Now()
	_, err = c.Step(ctx, "e1", arbor.Bash("true", 0))
	wantCode(t, "step on an env of a node refusing connections", err, protocol.CodeNodeUnavailable, start, 4*time.Second)
	start = time.Now()
	_, err = c.Reset(ctx, arbor.ResetParams{Task: "count"})
	wantCode(t, "reset on a node refusing connections", err, protocol.CodeNodeUnavailable, start, 4*time.Second)
	_, err = c.Reset(ctx, arbor.ResetParams{Task: "other"})
	wantCode(t, "reset of a task no live node offers", err, protocol.CodeUnknownTask, start, 4*time.Second)
	res, err := c.StepBatch(ctx, []arbor.BatchItem{{EnvID: "e1", Action: arbor.Bash("true", 0)}, {EnvID: "nope", Action: arbor.Bash("true", 0)}}, nil)
	if err != nil || len(res.Results) != 2 || res.Results[0].Error == nil || res.Results[0].Error.Code != protocol.CodeNodeUnavailable ||
		res.Results[1].Error == nil || res.Results[1].Error.Code != protocol.CodeUnknownEnv {
		t.Errorf("step_batch over a dead node and an unknown env: %+v %v", res, err)
	}

	// The node's lease ends: it leaves the registry, its placement stays.
	dead.Close()
	for end := time.Now().Add(5 * time.Second); len(rt.View().Nodes()) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the dead node is still in the router's view after its lease TTL")
		}
	}
	start = time.Now()
	_, err = c.Step(ctx, "e1", arbor.Bash("true", 0))
	wantCode(t, "step on an env of a node gone from the registry", err, protocol.CodeNodeUnavailable, start, time.Second)

	// A node that takes requests and never answers: when its lease ends
	// the router fails what waits on it. It wants a token, which a second
	// router (itself behind a token of its own) presents.
	rt2, taddr := startRouter(t, etcd, "client-secret", "node-secret")
	if c, err = arbor.Dial(ctx, taddr, nil); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Reset(ctx, arbor.ResetParams{Task: "count"})
	wantCode(t, "reset through a router without its token", err, protocol.CodeUnauthorized, time.Now(), time.Second)
	if _, err := c.Hello(ctx, "client-secret"); err != nil {
		t.Fatalf("hello with the router's token: %v", err)
	}
	s, err := server.New(server.Options{Forwarder: hung{}, Token: "node-secret", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(ln)
	defer hs.Close()
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		s.Shutdown(sctx)
	}()
	stuck := register(t, etcd, "stuck", ln.Addr().String())
	for end := time.Now().Add(3 * time.Second); len(rt2.View().Nodes()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the router does not see the stuck node")
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Reset(ctx, arbor.ResetParams{Task: "count"})
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("reset on a live node that never answers was answered (token refused?): %v", err)
	default:
	}
	start = time.Now()
	stuck.Close() // its lease expires after 1 s
	select {
	case err := <-errc:
		wantCode(t, "reset on a node that never answers, once its lease ended", err, protocol.CodeNodeUnavailable, start, 4*time.Second)
		t.Logf("answered %v after the node stopped renewing its lease: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("a request on a node that never answers hangs after its lease ended")
	}
}
