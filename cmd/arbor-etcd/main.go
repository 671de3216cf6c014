// Command arbor-etcd runs a one-member etcd embedded in a process
// (go.etcd.io/etcd/server/v3/embed), for trying a cluster on one machine
// without installing etcd: make cluster-demo starts it (docs/cluster.md).
// Production points its nodes and routers at a real etcd cluster.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func main() {
	dir := flag.String("data-dir", "", "etcd's data directory (required)")
	client := flag.String("listen", "127.0.0.1:23790", "host:port of the client URL (loopback)")
	peer := flag.String("peer", "127.0.0.1:23791", "host:port of the peer URL (loopback)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "arbor-etcd: --data-dir is required")
		os.Exit(2)
	}
	cfg := embed.NewConfig()
	cfg.Name = "arbor-demo"
	cfg.Dir = *dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cu, pu := url.URL{Scheme: "http", Host: *client}, url.URL{Scheme: "http", Host: *peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "arbor-etcd: %v\n", err)
		os.Exit(1)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "arbor-etcd: not ready in 30 s")
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "arbor-etcd: serving %s\n", cu.String())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "arbor-etcd: %v\n", err)
	}
	e.Close()
}
