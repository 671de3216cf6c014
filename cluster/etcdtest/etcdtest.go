// Package etcdtest starts a real etcd server inside a test process
// (go.etcd.io/etcd/server/v3/embed) for the tests of the cluster pieces:
// its data in a temporary directory, its client and peer URLs on free
// ports of 127.0.0.1.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts an etcd server, stopped when tb ends, and returns its
// client URL.
func Start(tb testing.TB) string {
	tb.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "arbor-test"
	cfg.Dir = tb.TempDir()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	client, peer := freeURL(tb), freeURL(tb)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		tb.Fatal("etcd did not become ready in 30 s")
	}
	return client.String()
}

// freeURL is http://127.0.0.1:PORT with a port free a moment ago.
func freeURL(tb testing.TB) url.URL {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port)}
}
