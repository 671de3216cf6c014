package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/arbor-env/arbor/server/e2b"

	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/router"
	"github.com/arbor-env/arbor/server"
)

func init() { subcommands = append(subcommands, newRouterCmd) }

// routerOptions are the flags of arbor router.
type routerOptions struct {
	etcd        string
	listen      string
	token       string
	tokensFile  string
	nodeToken   string
	maxInFlight int
	maxFrame    string
	maxUnread   string
	grace       time.Duration
}

func newRouterCmd(g *globalOptions) *cobra.Command {
	o := &routerOptions{}
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Route protocol v1 to the nodes of a cluster (ws://ADDR/v1/ws, as arbor serve)",
		Long: `Serve protocol v1 in front of the nodes registered in etcd (arbor serve
--cluster-etcd): each request goes to the node holding its env or state, resets
to the least loaded live node. The router keeps no state of its own; a node that
is gone is answered node_unavailable (retryable, infra). See docs/cluster.md.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return runRouter(c.Context(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.etcd, "etcd", envOr("ARBOR_CLUSTER_ETCD", ""), "etcd client URLs (comma-separated); env ARBOR_CLUSTER_ETCD")
	f.StringVar(&o.listen, "listen", envOr("ARBOR_ROUTER_LISTEN", "127.0.0.1:7880"), "address to listen on")
	f.StringVar(&o.token, "token", os.Getenv("ARBOR_TOKEN"), "bearer token clients must present (required off loopback; env ARBOR_TOKEN)")
	f.StringVar(&o.tokensFile, "tokens", os.Getenv("ARBOR_TOKENS"), "file of tokens and their tenants, as arbor serve --tokens: each client's requests present its own token to the nodes, which must run with the same file (env ARBOR_TOKENS)")
	f.StringVar(&o.nodeToken, "node-token", os.Getenv("ARBOR_NODE_TOKEN"), "token to present to the nodes (their --token; default: --token); env ARBOR_NODE_TOKEN")
	f.IntVar(&o.maxInFlight, "max-in-flight", 256, "most outstanding requests per client connection")
	f.StringVar(&o.maxFrame, "max-frame", "8M", "largest message a client may send (keep it at most the nodes' --max-frame)")
	f.StringVar(&o.maxUnread, "max-unread", "64M", "answers a connection may hold unread before the router stops reading its requests")
	f.DurationVar(&o.grace, "grace", 30*time.Second, "how long shutdown waits for running requests")
	return cmd
}

func runRouter(ctx context.Context, o *routerOptions) error {
	log := slog.Default()
	if o.etcd == "" {
		return fmt.Errorf("--etcd is required")
	}
	auth, err := loadAuth(o.token, o.tokensFile)
	if err != nil {
		return err
	}
	maxFrame, maxUnread, err := wireLimits(o.maxFrame, o.maxUnread, o.listen, auth)
	if err != nil {
		return err
	}
	if o.nodeToken == "" {
		o.nodeToken = o.token
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	r, err := router.New(ctx, router.Options{Endpoints: splitURLs(o.etcd), NodeToken: o.nodeToken,
		ForwardTokens: auth.Tokens != nil, Logger: log})
	if err != nil {
		return err
	}
	defer r.Close()
	// The E2B API by proxy: each sandbox's requests go to its node.
	e2bRoutes := e2b.NewProxy(e2b.ProxyOptions{Placer: r, Auth: auth, Logger: log}).Routes()
	s, err := server.New(server.Options{Forwarder: r, Token: o.token, Tokens: auth.Tokens, MaxInFlight: o.maxInFlight,
		MaxFrameBytes: int(maxFrame), MaxUnreadBytes: int(maxUnread), Handlers: e2bRoutes, Logger: log})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "arbor: routing protocol v1 on ws://%s/v1/ws to the cluster at %s; Ctrl-C stops\n", ln.Addr(), o.etcd)
	return s.Serve(ctx, ln, o.grace)
}

// wireLimits parses the --max-frame and --max-unread sizes and refuses a
// listen address off loopback without a token: what arbor serve and arbor
// router check of their websocket before they start.
func wireLimits(maxFrame, maxUnread, listen string, auth tenant.Auth) (frame, unread int64, err error) {
	if frame, err = parseSize(maxFrame); err != nil {
		return 0, 0, fmt.Errorf("parse --max-frame: %w", err)
	}
	if unread, err = parseSize(maxUnread); err != nil {
		return 0, 0, fmt.Errorf("parse --max-unread: %w", err)
	}
	if !auth.Required() && !server.IsLoopback(listen) {
		return 0, 0, fmt.Errorf("listening on %s needs a token: pass --token or --tokens, or set ARBOR_TOKEN", listen)
	}
	return frame, unread, nil
}

// loadAuth is the token rule of --token and --tokens (tenant.Auth).
func loadAuth(token, tokensFile string) (tenant.Auth, error) {
	a := tenant.Auth{Token: token}
	if tokensFile != "" {
		t, err := tenant.Load(tokensFile)
		if err != nil {
			return a, fmt.Errorf("--tokens: %w", err)
		}
		a.Tokens = t
	}
	return a, nil
}
