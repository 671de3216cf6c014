package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
	"github.com/arbor-env/arbor/internal/servetest"
)

// freeAddrOn is host:port with a port of ip free a moment ago.
func freeAddrOn(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeDrainsOnSIGTERM: two real arbor serve nodes on 127.0.0.2 and
// 127.0.0.3 in a cluster on an embedded etcd; node a, with
// --drain-timeout, gets SIGTERM with an env open: it migrates the env to
// node b before it exits, and the env answers there with its shell and
// files, its placement naming b.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	servetest.RequireHost(t)
	etcd := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, ca := startServe(t, ctx, t.TempDir(), freeAddrOn(t, "127.0.0.2"),
		"--cluster-etcd", etcd, "--node-id", "a", "--cluster-ttl", "2s", "--drain-timeout", "60s")
	defer ca.Close()
	b, cb := startServe(t, ctx, t.TempDir(), freeAddrOn(t, "127.0.0.3"),
		"--cluster-etcd", etcd, "--node-id", "b", "--cluster-ttl", "2s")
	defer cb.Close()
	defer b.Stop(time.Minute)
	r, err := ca.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	step(t, ctx, ca, r.EnvID, "export K=v; echo data > f")
	if _, err := ca.States(ctx, r.EnvID); err != nil { // waits for the checkpoint
		t.Fatal(err)
	}
	start := time.Now()
	if err := a.Stop(2 * time.Minute); err != nil {
		t.Fatalf("arbor serve after SIGTERM: %v", err)
	}
	t.Logf("node a drained and stopped in %v", time.Since(start))
	s, err := cb.Step(ctx, r.EnvID, arbor.Bash(`echo "$K $(cat f)"`, 0))
	if err != nil {
		t.Fatalf("the env on node b after a's SIGTERM: %v", err)
	}
	if got := strings.TrimSpace(string(s.Obs.Stdout)); got != "v data" {
		t.Errorf("the env on node b: %q, want \"v data\"", got)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	g, err := cli.Get(ctx, cluster.EnvKey(r.EnvID))
	if err != nil || len(g.Kvs) == 0 {
		t.Fatalf("placement after the drain: %v", err)
	}
	var p cluster.Placement
	if err := json.Unmarshal(g.Kvs[0].Value, &p); err != nil || p.Node != "b" {
		t.Errorf("placement after the drain: %+v %v, want node b", p, err)
	}
}
