package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/origin"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/server/ui"
)

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Coordinator runs every operation: the turn, the envs' life, the
	// errors' codes. The server only speaks the protocol.
	Coordinator *coordinator.Coordinator
	// Forwarder, given instead of a Coordinator, serves every request but
	// hello: the server speaks the protocol (frames, auth, limits,
	// keepalive, backpressure) and the forwarder sends each request on
	// (the cluster router, package router).
	Forwarder Forwarder
	// Token, when set, must be presented by every connection, as
	// "Authorization: Bearer TOKEN" or in hello. Listening on anything but
	// loopback requires one.
	Token string
	// Tokens, when set, maps the tokens connections may present to
	// tenants (docs/security.md, "Tenants"): each request acts for its
	// token's tenant and sees only that tenant's envs and states. Token,
	// if also set, is an admin token.
	Tokens *tenant.Tokens
	// MaxFrameBytes bounds one incoming message (default 8 MiB).
	MaxFrameBytes int
	// MaxInFlight bounds the requests one connection has outstanding
	// (default 256).
	MaxInFlight int
	// MaxUnreadBytes bounds the bytes of answers a connection holds for a
	// client that does not read them (default 64 MiB, at least
	// MaxFrameBytes): over it, the server reads and starts none of that
	// connection's requests until the client has read below it
	// (docs/protocol.md, "Limits").
	MaxUnreadBytes int
	// MaxBatch bounds the items of one step_batch (default 1024).
	MaxBatch int
	// StepKeysPerEnv, StepKeys and StepKeyBytes bound what the server
	// keeps of keyed steps (docs/protocol.md, "Idempotent steps"): the
	// last StepKeysPerEnv keys of each env (default 16), StepKeys keys in
	// all (default 65536) and StepKeyBytes of their results (default
	// 64 MiB; past it the oldest results go and only their keys stay).
	StepKeysPerEnv, StepKeys int
	StepKeyBytes             int64
	// PingInterval is how often the server pings each websocket (default
	// 20 s); PongWait is how long it waits for any frame from the client
	// (a pong or a request) before it drops the connection as half-open
	// (default 60 s, must be longer than PingInterval). The operations a
	// dropped connection started go on; only their answers are lost
	// (docs/protocol.md, "Keepalive").
	PingInterval, PongWait time.Duration
	// WriteWait bounds the write of one frame (default 30 s): a client
	// that takes none of its answers for that long is dropped.
	WriteWait time.Duration
	// MaxAnswerBytes bounds the memory of answers, all connections
	// together: answers queued or being written plus the most the
	// running steps can still output (default 256 MiB; docs/protocol.md,
	// "Limits"). A step that would go over waits for room.
	MaxAnswerBytes int64
	// AllowedOrigins are the browser origins that may open a websocket
	// besides the server's own: a request whose Origin names the host it
	// was sent to (same-origin, what websocket-client sends by default) is
	// accepted, any other Origin refused, so a web page of another site
	// cannot drive a local server (docs/protocol.md, "Authentication and
	// exposure").
	AllowedOrigins []string
	// Registry receives the server's metrics (give the coordinator's the
	// same registry to serve them at one /metrics); nil: a registry of the
	// server's own.
	Registry *prometheus.Registry
	// Version is reported by hello.
	Version string
	Logger  *slog.Logger
	// Handlers are more routes Handler serves, by mux pattern (e.g. the
	// agent tools' MCP endpoint at /v1/mcp and /v1/mcp/).
	Handlers map[string]http.Handler
}

// DefaultMaxAnswerBytes is Options.MaxAnswerBytes's default.
const DefaultMaxAnswerBytes = 256 << 20

func (o Options) withDefaults() Options {
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = 8 << 20
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.MaxUnreadBytes <= 0 {
		o.MaxUnreadBytes = max(64<<20, o.MaxFrameBytes)
	}
	if o.WriteWait <= 0 {
		o.WriteWait = 30 * time.Second
	}
	if o.MaxAnswerBytes <= 0 {
		o.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1024
	}
	if o.StepKeysPerEnv <= 0 {
		o.StepKeysPerEnv = 16
	}
	if o.StepKeys <= 0 {
		o.StepKeys = 65536
	}
	if o.StepKeyBytes <= 0 {
		o.StepKeyBytes = 64 << 20
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 20 * time.Second
	}
	if o.PongWait <= 0 {
		o.PongWait = max(60*time.Second, 3*o.PingInterval)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Forwarder serves the requests of a server that has no coordinator.
type Forwarder interface {
	// Forward is called on the connection's read loop, in the order the
	// connection's requests arrive, with the request's params undecoded.
	// It sends the request on (or refuses it) without waiting for the
	// answer and returns the function that waits for it, run on the
	// request's own goroutine; a result of type msgpack.RawMessage is
	// sent as it is. notify sends a notification to the request's
	// client (step_batch items).
	// ctx acts for the connection's tenant and carries its token
	// (tenant.Token).
	Forward(ctx context.Context, msgid uint32, method string, params msgpack.RawMessage, notify func(method string, params any)) func(ctx context.Context) (any, error)
	// Capabilities fills what hello reports of the envs behind the
	// forwarder: Tasks, MaxEnvs and EnvIdleTTLS.
	Capabilities() protocol.Capabilities
}

// Server serves protocol v1. Make one with New.
type Server struct {
	o   Options
	c   *coordinator.Coordinator
	log *slog.Logger
	m   *metrics
	up  websocket.Upgrader
	// keys holds the results of keyed steps.
	keys *stepKeys
	ui   *ui.UI

	// ctx bounds every operation; it ends when Shutdown gives up waiting.
	ctx    context.Context
	cancel context.CancelFunc
	ops    sync.WaitGroup

	// oe holds the envs of the OpenEnv endpoint (openenv.go).
	oe oeSessions
	// answers bounds the memory of answers (answers.go).
	answers *answerBudget

	mu       sync.Mutex
	conns    map[*conn]struct{}
	oeConns  map[oeFinisher]struct{}
	draining bool
}

// New makes a server on a coordinator.
func New(o Options) (*Server, error) {
	if (o.Coordinator == nil) == (o.Forwarder == nil) {
		return nil, errors.New("server: give exactly one of Options.Coordinator and Options.Forwarder")
	}
	o = o.withDefaults()
	if o.PongWait <= o.PingInterval {
		return nil, fmt.Errorf("server: PongWait %v must be longer than PingInterval %v", o.PongWait, o.PingInterval)
	}
	if o.MaxUnreadBytes < o.MaxFrameBytes {
		return nil, fmt.Errorf("server: MaxUnreadBytes %d must be at least MaxFrameBytes %d", o.MaxUnreadBytes, o.MaxFrameBytes)
	}
	s := &Server{o: o, c: o.Coordinator, log: o.Logger, conns: map[*conn]struct{}{},
		keys: newStepKeys(o.StepKeysPerEnv, o.StepKeys, o.StepKeyBytes), answers: newAnswerBudget(o.MaxAnswerBytes)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.answers.relieve = s.dropStalled
	s.m = newMetrics(o.Registry, func() float64 { return float64(s.answers.held()) })
	// The web view reads the coordinator's envs and states, or those of
	// the cluster behind a Forwarder that offers them (the router's
	// UISource; docs/ui.md).
	uo := ui.Options{Coordinator: o.Coordinator, Logger: o.Logger}
	if o.Coordinator != nil {
		uo.Diff = newStateDiffs(o.Coordinator, o.Logger)
	}
	if f, ok := o.Forwarder.(interface{ UISource() ui.Source }); ok {
		uo.Source = f.UISource()
	}
	if uo.Source != nil || uo.Coordinator != nil {
		var err error
		if s.ui, err = ui.New(uo); err != nil {
			return nil, err
		}
	}
	s.up = websocket.Upgrader{
		ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10,
		CheckOrigin: s.checkOrigin,
	}
	return s, nil
}

// checkOrigin is the Origin rule of package origin, shared with the MCP
// endpoint.
func (s *Server) checkOrigin(r *http.Request) bool {
	return origin.Rule{Allowed: s.o.AllowedOrigins, Token: s.secured()}.Check(r)
}

// Handler serves /v1/ws, the OpenEnv endpoint /openenv/TASK/ (a server
// with a coordinator; docs/openenv.md), /livez, /readyz, /metrics, Options.Handlers and
// the web view (/ and /ui/, package ui) under the websocket's access
// rules (uiAccess).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/ws", s.serveWS)
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		draining := s.draining
		s.mu.Unlock()
		if draining {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.o.Registry, promhttp.HandlerOpts{}))
	s.openenvRoutes(mux)
	for pattern, h := range s.o.Handlers {
		mux.Handle(pattern, h)
	}
	if s.ui != nil {
		mux.Handle("/", s.uiAccess(s.ui.Handler()))
	}
	// A handler's panic answers its request 500 and is logged; the
	// websocket endpoints recover each message themselves.
	return panics.Handler(s.log, mux)
}

// IsLoopback reports whether an address (a listen address, or a Host
// header: host, host:port, [v6]:port) names this host's loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// Serve serves on ln until ctx ends, then shuts down gracefully, giving
// running operations up to grace to finish. It refuses a non-loopback
// listener without a token.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	if !s.secured() && !IsLoopback(ln.Addr().String()) {
		ln.Close()
		return fmt.Errorf("server: listening on %s needs a token (--token or ARBOR_TOKEN)", ln.Addr())
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	hs.RegisterOnShutdown(s.closeUI) // its event streams never go idle
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("serving", slog.String("addr", ln.Addr().String()), slog.Bool("token", s.secured()), slog.Bool("tenants", s.o.Tokens != nil))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	hs.Shutdown(sctx)
	return s.Shutdown(sctx)
}

// closeUI ends the web view's event streams, when it serves one.
func (s *Server) closeUI() {
	if s.ui != nil {
		s.ui.Close()
	}
}

// Shutdown drains the server: new requests are refused with
// shutting_down, running operations get until ctx ends to finish (then
// they are cancelled), and every connection is closed. The envs stay with
// the coordinator and the engine, whose Close destroys them.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	s.closeUI()
	done := make(chan struct{})
	go func() { s.ops.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		s.cancel()
		<-done
		err = fmt.Errorf("server: operations cut short by shutdown: %w", ctx.Err())
	}
	s.cancel()
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	oeConns := make([]oeFinisher, 0, len(s.oeConns))
	for c := range s.oeConns {
		oeConns = append(oeConns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.finish(websocket.CloseGoingAway, "server shutting down", 5*time.Second)
	}
	for _, c := range oeConns {
		c.finish(websocket.CloseGoingAway, "server shutting down")
	}
	s.log.Info("drained", slog.Int("connections", len(conns)+len(oeConns)))
	return err
}

// begin registers an operation unless the server drains.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.ops.Add(1)
	return true
}

// ticket queues a request on the envs it names (the coordinator's
// Ticket); a forwarding server keeps no envs, so it takes none.
func (s *Server) ticket(ids ...string) (wait, release func()) {
	if s.c == nil {
		return func() {}, func() {}
	}
	return s.c.Ticket(ids...)
}

// secured reports whether connections must present a token.
func (s *Server) secured() bool { return s.auth().Required() }

// authenticate returns the tenant a token acts for (tenant.Auth):
// Options.Token is the default tenant's without Options.Tokens, an
// admin's with them.
func (s *Server) authenticate(token string) (tenant.Tenant, bool) {
	return s.auth().Authenticate(token)
}

func (s *Server) auth() tenant.Auth { return tenant.Auth{Token: s.o.Token, Tokens: s.o.Tokens} }
