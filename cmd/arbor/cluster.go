package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/arbor-env/arbor/cluster"
)

// clusterFlags are arbor serve's flags for running as a cluster node
// (docs/cluster.md).
type clusterFlags struct {
	etcd      string
	nodeID    string
	advertise string
	ttl       time.Duration
	drain     time.Duration
	replicas  int
}

func (c *clusterFlags) add(f *pflag.FlagSet) {
	f.StringVar(&c.etcd, "cluster-etcd", envOr("ARBOR_CLUSTER_ETCD", ""), "etcd client URLs (comma-separated): join the cluster there as a node (docs/cluster.md); env ARBOR_CLUSTER_ETCD")
	f.StringVar(&c.nodeID, "node-id", envOr("ARBOR_NODE_ID", ""), "this node's id in the cluster, stable across restarts (default: the host name)")
	f.StringVar(&c.advertise, "advertise", envOr("ARBOR_ADVERTISE", ""), "host:port where routers reach this node (default: the --listen address)")
	f.DurationVar(&c.ttl, "cluster-ttl", 10*time.Second, "lease of the node's registration: a node that stops renewing it is gone from the cluster this long after")
	f.IntVar(&c.replicas, "replicas", 1, "copies of each env's last committed state in the cluster: 2 ships it to a second node as it goes, where a router restores the env if this node dies (docs/cluster.md, \"Replicas\")")
	f.DurationVar(&c.drain, "drain-timeout", 0, "on SIGINT/SIGTERM, first migrate the node's envs to other nodes for up to this long (0: no drain; the envs close as on a single server)")
}

// splitURLs splits a comma-separated list of URLs.
func splitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// connect joins the cluster when --cluster-etcd is set (nil otherwise).
func (c *clusterFlags) connect(ctx context.Context, listen net.Addr, log *slog.Logger) (*cluster.Node, error) {
	if c.etcd == "" {
		return nil, nil
	}
	id := c.nodeID
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-id not given and no host name: %w", err)
		}
		id = h
	}
	if strings.ContainsAny(id, "/ ") {
		return nil, fmt.Errorf("--node-id %q: no slashes or spaces", id)
	}
	adv := c.advertise
	if adv == "" {
		adv = listen.String()
	}
	host, _, err := net.SplitHostPort(adv)
	if err != nil {
		return nil, fmt.Errorf("--advertise %q: want host:port: %w", adv, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("--advertise: %q is not an address routers can reach; give --advertise HOST:PORT", adv)
	}
	return cluster.Connect(ctx, cluster.NodeOptions{Endpoints: splitURLs(c.etcd), ID: id, Advertise: adv, Transfer: adv, TTL: c.ttl, Logger: log})
}
