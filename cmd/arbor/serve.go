package main

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/arbor-env/arbor/server/e2b"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/llmproxy"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/server"
)

func init() { subcommands = append(subcommands, newServeCmd) }

//go:embed default-task.yaml
var defaultTask []byte

// serveOptions are the flags of arbor serve.
type serveOptions struct {
	listen      string
	token       string
	tokensFile  string
	tasksDir    string
	recipesDir  string
	warm        int
	prepare     string
	imageBudget string
	maxCompare  string
	maxAnswers  string
	diskAdmit   string
	idleTTL     time.Duration
	retain      time.Duration
	prepareTTL  time.Duration
	prepareMax  int
	deltaChain  int
	lazy        string
	highWater   float64
	lowWater    float64
	maxEnvs     int
	maxInFlight int
	maxBatch    int
	maxFrame    string
	maxUnread   string
	workers     int
	grace       time.Duration
	mcp         bool
	e2b         bool
	inspect     string
	verifySkips float64
	llmUpstream string
	extraCaps   bool
	disk        string
	userNS      userNSFlags   // userns.go
	cluster     clusterFlags  // cluster.go
	registry    registryFlags // image.go: reset and tasks pull registry references
	pullFrom    []string
	waitLock    time.Duration
	admitWait   time.Duration
	admitSlots  []string
}

func newServeCmd(g *globalOptions) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the environment server (protocol v1 on ws://ADDR/v1/ws)",
		Long: `Run the environment server. With no flags it keeps its state in --state-dir
(a btrfs pool file is created there when the folder is not on btrfs), builds the
busybox image on first run, offers the tasks of ./tasks (or the built-in "hello"
task) and listens on 127.0.0.1:7878. Listening elsewhere needs --token.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return serve(c.Context(), g, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", envOr("ARBOR_LISTEN", "127.0.0.1:7878"), "address to listen on")
	f.StringVar(&o.token, "token", os.Getenv("ARBOR_TOKEN"), "bearer token clients must present (required off loopback; env ARBOR_TOKEN); with --tokens, an admin token")
	f.StringVar(&o.tokensFile, "tokens", os.Getenv("ARBOR_TOKENS"), "file of tokens and their tenants, one \"TOKEN TENANT [admin]\" a line: each tenant sees only its own envs and states (docs/security.md, \"Tenants\"; env ARBOR_TOKENS)")
	f.StringVar(&o.tasksDir, "tasks", envOr("ARBOR_TASKS", ""), "folder of task files (env ARBOR_TASKS; default: ./tasks of the working directory if present, else only the built-in hello task, with a warning)")
	f.StringVar(&o.recipesDir, "recipes", envOr("ARBOR_RECIPES", "images"),
		"folder of image recipe files: a task's image NAME that DIR/NAME.yaml describes is built on first use, and again when the recipe changed (env ARBOR_RECIPES)")
	o.registry.add(f)
	f.StringSliceVar(&o.pullFrom, "pull-from", splitList(envOr("ARBOR_PULL_FROM", "*")),
		"registries (host or host:port) a reset or task may make the server pull from; * is any, an empty value none (only images pulled with arbor image pull) (env ARBOR_PULL_FROM)")
	f.IntVar(&o.warm, "warm", 2, "ready envs kept per task (negative: none)")
	f.StringVar(&o.prepare, "prepare", envOr("ARBOR_PREPARE", "ahead"), "when tasks are prepared (setup run, recipe image built, warm envs filled): ahead (in the background from start, in file order) or on-demand (on a task's first reset)")
	f.DurationVar(&o.idleTTL, "env-idle-ttl", 30*time.Minute, "close envs nobody touched for this long (0 or negative: never)")
	f.DurationVar(&o.retain, "retain", branch.DefaultRetain, "keep a closed env's states branchable by state id for this long (0: release them as soon as nothing needs them)")
	f.DurationVar(&o.prepareTTL, "prepare-ttl", branch.DefaultPrepareTTL, "keep the frozen copies prepare made of a state this long after its last prepare, unless a branch takes them")
	f.IntVar(&o.prepareMax, "prepare-copies", branch.DefaultPrepareCopies, "budget of frozen copies prepare may keep, all states together (queued or ready)")
	f.Float64Var(&o.highWater, "high-water", branch.DefaultHighWater, "share of the pool (and image stores) in use above which GC evicts closed lineages' retained states and, if still above, reset and branch answer no_space (above 1: off)")
	f.Float64Var(&o.lowWater, "low-water", branch.DefaultLowWater, "share in use eviction brings a file system back under")
	f.IntVar(&o.maxEnvs, "max-envs", 256, "most envs handed out at once")
	f.IntVar(&o.maxInFlight, "max-in-flight", 256, "most outstanding requests per connection")
	f.DurationVar(&o.admitWait, "admit-wait", coordinator.DefaultAdmitWait, "longest a reset, step, branch or evaluate waits for admission; one that would wait longer is answered too_many_requests with retry_after_ms (docs/architecture.md, Admission control); 0: no bound")
	f.StringSliceVar(&o.admitSlots, "admit-slots", nil, "operations of a class admitted at once, as CLASS=N (reset, step, branch, evaluate; default per CPU: step 8, reset 2, evaluate 2, branch 1)")
	f.IntVar(&o.maxBatch, "max-batch", 1024, "most items of one step_batch")
	f.StringVar(&o.maxFrame, "max-frame", "8M", "largest message a client may send")
	f.StringVar(&o.maxUnread, "max-unread", "64M", "answers a connection may hold unread before the server stops reading its requests")
	f.StringVar(&o.maxAnswers, "max-answer-memory", "256M", "memory for answers, all connections: queued frames plus what running steps may output (docs/protocol.md, Limits)")
	f.IntVar(&o.deltaChain, "delta-chain", branch.DefaultDeltaChain, "store a checkpoint's process image as a delta of its parent state's (only the pages that changed) while that one's chain of deltas is shorter than this (docs/engine.md, Delta images); negative: every image whole")
	f.StringVar(&o.lazy, "lazy-restore", fmt.Sprintf("%dM", branch.DefaultLazyBytes>>20), "restore process images of at least this size lazily, their memory copied in after the tree runs (docs/engine.md, Lazy restore); 0: every restore eager")
	f.IntVar(&o.workers, "workers", 0, "concurrent checkpoints and restores (default: cores)")
	f.DurationVar(&o.grace, "grace", 30*time.Second, "how long shutdown waits for running requests")
	f.StringVar(&o.inspect, "inspector", envOr("ARBOR_INSPECTOR", "auto"), "turn classification: auto (eBPF, else the snapshot backend's change list), ebpf, fallback, off (every turn full)")
	f.Float64Var(&o.verifySkips, "verify-skips", 0, "share of turns checkpointed none, fs or proc to restore and compare with the live env: alone or 1, every such turn before the step answers (slow; for tests and debugging); below 1 (e.g. 0.01), sampled in the background, misses logged and counted in arbor_verify_total")
	f.Lookup("verify-skips").NoOptDefVal = "1"
	f.StringVar(&o.llmUpstream, "llm-upstream", envOr("ARBOR_LLM_UPSTREAM", ""), "serve the LLM proxy at /v1/llm/ENV_ID/... forwarding to this URL; each request is a turn boundary")
	f.BoolVar(&o.extraCaps, "allow-extra-caps", false, "let task files ask for capabilities beyond Docker's default set (caps:); without it such tasks fail to start (docs/sandbox.md, Isolation)")
	f.StringVar(&o.disk, "disk", envOr("ARBOR_DISK", ""), diskFlagHelp+"; env ARBOR_DISK")
	f.StringVar(&o.maxCompare, "inspector-max-read", envOr("ARBOR_INSPECTOR_MAX_READ", "256M"), "file content the Inspector may read to compare one turn's files (none: read nothing); a file past it counts as changed (docs/inspector.md, Bounded comparisons); env ARBOR_INSPECTOR_MAX_READ")
	f.StringVar(&o.diskAdmit, "disk-admission", envOr("ARBOR_DISK_ADMISSION", "overcommit"), "overcommit: disk quotas together may exceed the pool, and the env holding the most of a full pool beyond its share is stopped; reserve: an env is admitted only if the pool can take every open env's remaining quota and its own (docs/engine.md, Disk reservation); env ARBOR_DISK_ADMISSION")
	f.StringVar(&o.imageBudget, "image-budget", envOr("ARBOR_IMAGE_BUDGET", fmt.Sprintf("%dM", branch.DefaultImageBudget>>20)), "process images one open env's checkpoints may keep in the image store (none: no bound); a checkpoint over it fails as the agent's doing (docs/engine.md, Image budget); env ARBOR_IMAGE_BUDGET")
	o.userNS.add(f)
	o.cluster.add(f)
	f.DurationVar(&o.waitLock, "wait-lock", 0, "when another arbor serve holds the state dir (one still stopping), wait this long for it to end (0: fail at once)")
	f.BoolVar(&o.e2b, "e2b", true, "also serve the E2B-compatible API (sandboxes, commands, files, fork) on the same port (docs/e2b.md)")
	f.BoolVar(&o.mcp, "mcp", false, "also serve the agent tools over MCP at /v1/mcp/ENV_ID and /v1/mcp?task=|image= (docs/agent-tools.md)")
	return cmd
}

// loadTasks reads the tasks and datasets to offer. A broken task file or
// dataset instance is logged by name and left out: the server serves the
// others (docs/tasks.md, "Datasets"). It logs the folder it read and what
// it found, and warns when, with no --tasks, the working directory has no
// ./tasks: the server then offers only the built-in hello task.
func loadTasks(dir string) (envpool.Catalog, error) {
	if dir == "" {
		if st, err := os.Stat("tasks"); err == nil && st.IsDir() {
			dir = "tasks"
		} else {
			cwd, _ := os.Getwd()
			slog.Warn("no --tasks and no ./tasks in the working directory: offering only the built-in hello task (start arbor serve in the repository, or pass --tasks DIR or ARBOR_TASKS)",
				slog.String("cwd", cwd))
		}
	}
	if dir != "" {
		c, problems, err := envpool.LoadDir(dir)
		for _, p := range problems {
			slog.Warn("left out of the tasks", slog.Any("err", p))
		}
		if err == nil {
			abs, _ := filepath.Abs(dir)
			slog.Info("loaded tasks", slog.String("dir", abs), slog.Int("tasks", len(c.Tasks)),
				slog.Int("datasets", len(c.Datasets)), slog.Int("left_out", len(problems)))
		}
		return c, err
	}
	t, err := builtinTask()
	return envpool.Catalog{Tasks: []envpool.Task{t}}, err
}

// builtinTask is the hello task of a server without a task directory.
func builtinTask() (envpool.Task, error) {
	tmp, err := os.CreateTemp("", "arbor-task-*.yaml")
	if err != nil {
		return envpool.Task{}, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(defaultTask); err != nil {
		tmp.Close()
		return envpool.Task{}, err
	}
	tmp.Close()
	t, err := envpool.LoadTask(tmp.Name())
	if err != nil {
		return envpool.Task{}, fmt.Errorf("built-in task: %w", err)
	}
	t.Name = "hello"
	return t, nil
}

// serveLimits are serve's flags that need parsing, checked before anything
// is opened.
type serveLimits struct {
	auth                                      tenant.Auth
	maxFrame, maxUnread                       int64
	sandbox                                   sandbox.Limits
	imageBudget, maxCompare, lazy, maxAnswers int64
}

func (o *serveOptions) limits() (l serveLimits, err error) {
	if l.auth, err = loadAuth(o.token, o.tokensFile); err != nil {
		return l, err
	}
	if l.auth.Tokens != nil && o.token == "" && o.cluster.etcd != "" {
		// The state transfer endpoint (node to node, router to node)
		// takes --token only: without one it would be open.
		return l, fmt.Errorf("a cluster node with --tokens needs --token too: the admin token of its state transfers (docs/cluster.md, \"Tenants\")")
	}
	if l.maxFrame, l.maxUnread, err = wireLimits(o.maxFrame, o.maxUnread, o.listen, l.auth); err != nil {
		return l, err
	}
	if l.sandbox.DiskBytes, err = parseDisk(o.disk); err != nil {
		return l, err
	}
	if o.diskAdmit != "overcommit" && o.diskAdmit != "reserve" {
		return l, fmt.Errorf("--disk-admission %q: want overcommit or reserve", o.diskAdmit)
	}
	if l.imageBudget, err = parseLimit("--image-budget", o.imageBudget); err != nil {
		return l, err
	}
	if o.prepare != "ahead" && o.prepare != "on-demand" {
		return l, fmt.Errorf("--prepare %q: want ahead or on-demand", o.prepare)
	}
	if l.maxCompare, err = parseLimit("--inspector-max-read", o.maxCompare); err != nil {
		return l, err
	}
	if l.lazy, err = parseSize(o.lazy); err != nil {
		return l, fmt.Errorf("--lazy-restore: %w", err)
	}
	if l.maxAnswers, err = parseSize(o.maxAnswers); err != nil {
		return l, fmt.Errorf("--max-answer-memory: %w", err)
	}
	return l, nil
}

func serve(ctx context.Context, g *globalOptions, o *serveOptions) (err error) {
	log := slog.Default()
	lim, err := o.limits()
	if err != nil {
		return err
	}
	catalog, err := loadTasks(o.tasksDir)
	if err != nil {
		return err
	}
	defer func() {
		for _, d := range catalog.Datasets {
			d.Close()
		}
	}()
	// One server per state dir, held until the pool is unmounted (the
	// first defer runs last), before anything is mounted or listened on.
	lock, err := lockStateDir(ctx, g, o.waitLock)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := lock.Release(); rerr != nil {
			log.Warn("release state dir lock", slog.Any("err", rerr))
		}
	}()
	// Listen first: a port in use should fail before minutes of set-up.
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	e, closeEngine, err := openEngine(ctx, g, o, lim, log)
	if err != nil {
		return err
	}
	defer closeEngine()
	p, closePool, err := openPool(ctx, e, catalog, o, log)
	if err != nil {
		return err
	}
	defer closePool()
	// In a cluster the node's registry hears of every env and state
	// from the coordinator (docs/cluster.md).
	node, err := o.cluster.connect(ctx, ln.Addr(), log)
	if err != nil {
		return err
	}
	// One coordinator owns the turn and the envs; the protocol server,
	// the agent tools and the LLM proxy are its adapters.
	slots, err := admitSlots(o.admitSlots)
	if err != nil {
		return err
	}
	if o.admitWait == 0 {
		o.admitWait = -1 // no bound (coordinator.Options.AdmitWait)
	}
	reg := prometheus.NewRegistry()
	coo := coordinator.Options{Engine: e, Tasks: coordinator.FromEnvpool(p), VerifySkips: o.verifySkips,
		MaxEnvs: o.maxEnvs, IdleTTL: o.idleTTL, Registry: reg, Logger: log, AdmitWait: o.admitWait, AdmitSlots: slots,
		// Beside the engine's manifest, so trajectories survive a restart
		// as the states do (docs/protocol.md, "trajectory").
		Trajectories: filepath.Join(g.stateDir, "engine", "trajectories.db")}
	if node != nil { // not a typed nil in the interface
		coo.Hooks = node
		defer node.Close() // after Leave, a no-op; on an error before it, the lease just expires
	}
	co, err := coordinator.New(coo)
	if err != nil {
		return err
	}
	defer co.Close()
	routes, tr, closeRoutes, err := serveRoutes(o, ln.Addr(), co, node, lim.auth, log)
	if err != nil {
		return err
	}
	defer closeRoutes()
	s, err := server.New(server.Options{Coordinator: co, Token: o.token, Tokens: lim.auth.Tokens, Handlers: routes, Registry: reg,
		MaxInFlight: o.maxInFlight, MaxBatch: o.maxBatch, MaxFrameBytes: int(lim.maxFrame), MaxUnreadBytes: int(lim.maxUnread), MaxAnswerBytes: lim.maxAnswers, Logger: log})
	if err != nil {
		return err
	}
	if tr != nil {
		tr.UseStepKeys(s)
	}
	return runServer(ctx, s, ln, co, node, tr, o, reg, log)
}

// openEngine opens the engine and what it stands on: the snapshot backend,
// CRIU, the image store and launcher, the Inspector. closeAll closes them
// in the reverse order, the engine first and the snapshot backend (its
// unmount) last; on an error, openEngine has closed what it opened.
func openEngine(ctx context.Context, g *globalOptions, o *serveOptions, lim serveLimits, log *slog.Logger) (e *branch.Engine, _ func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	snap, err := openSnapshotter(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { unmountSnapshotter(snap, log) })
	c, err := criu.New(g.criuPath, log)
	if err != nil {
		return nil, nil, fmt.Errorf("criu: %w (run make deps, or arbor doctor)", err)
	}
	closers = append(closers, func() { c.Close() })
	registry, err := o.registry.registry()
	if err != nil {
		return nil, nil, err
	}
	registry.PullFrom = pullFromFlag(o.pullFrom)
	images := &image.Store{Snap: snap, Logger: log, Registry: registry}
	// The engine takes the launcher's limits for restored sandboxes.
	l := &launch.Launcher{Snap: snap, Images: images, Limits: lim.sandbox, AutoBuild: true, Progress: os.Stderr, Logger: log,
		Recipes: o.recipesDir, Isolation: sandbox.Isolation{AllowExtraCaps: o.extraCaps}}
	if l.UserNS, err = o.userNS.config(); err != nil {
		return nil, nil, err
	}
	in, err := openInspector(o.inspect, lim.maxCompare, log)
	if err != nil {
		return nil, nil, err
	}
	eo := branch.Options{StateDir: filepath.Join(g.stateDir, "engine"), Snap: snap, CRIU: c,
		Launcher: l, Workers: o.workers, Retain: o.retain, PrepareTTL: o.prepareTTL, PrepareCopies: o.prepareMax, HighWater: o.highWater, LowWater: o.lowWater, LazyBytes: lim.lazy, DeltaChain: o.deltaChain, ImageBudget: lim.imageBudget, DiskReserve: o.diskAdmit == "reserve", Logger: log}
	if in != nil { // not a typed nil in the interface
		closers = append(closers, func() { in.Close() })
		eo.Inspector = in
	}
	if e, err = branch.Open(ctx, eo); err != nil {
		return nil, nil, fmt.Errorf("open engine: %w", err)
	}
	closers = append(closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if cerr := e.Close(cctx); cerr != nil {
			log.Warn("close engine", slog.Any("err", cerr))
		}
	})
	return e, closeAll, nil
}

// openPool offers the tasks and datasets over the engine. It is lazy: the
// server answers at once; the tasks are prepared in the background or on
// their first reset (a reset waits for its own), a dataset's instances on
// their first use, and one whose setup fails is logged and answers its
// resets with the failure.
func openPool(ctx context.Context, e *branch.Engine, catalog envpool.Catalog, o *serveOptions, log *slog.Logger) (*envpool.Pool, func(), error) {
	for _, t := range catalog.Tasks {
		log.Info("task", slog.String("name", t.Name), slog.String("image", t.Image))
	}
	for _, d := range catalog.Datasets {
		log.Info("dataset", slog.String("name", d.Name), slog.Int("instances", d.Len()))
	}
	p, err := envpool.NewPool(ctx, e, catalog.Tasks, envpool.PoolOptions{Warm: o.warm, Progress: os.Stderr, Logger: log,
		Lazy: true, OnDemand: o.prepare == "on-demand", Datasets: catalog.Datasets})
	if err != nil {
		return nil, nil, fmt.Errorf("prepare tasks: %w", err)
	}
	return p, func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if cerr := p.Close(cctx); cerr != nil {
			log.Warn("close pool", slog.Any("err", cerr))
		}
	}, nil
}

// serveRoutes are the handlers beside protocol v1 on the listener: the
// agent tools over MCP (--mcp), the LLM proxy (--llm-upstream), the
// E2B-compatible API (--e2b) and a
// cluster node's state transfers (tr, nil outside a cluster). closeAll
// stops the proxy, then MCP.
func serveRoutes(o *serveOptions, addr net.Addr, co *coordinator.Coordinator, node *cluster.Node, auth tenant.Auth, log *slog.Logger) (routes map[string]http.Handler, tr *cluster.Transfer, closeAll func(), err error) {
	routes, stopMCP, err := mcpRoutes(o.mcp, addr, co, auth, log)
	if err != nil {
		return nil, nil, nil, err
	}
	closeAll = stopMCP
	if o.llmUpstream != "" {
		var lp *llmproxy.Proxy
		if routes, lp, err = addLLMProxy(routes, co, o.llmUpstream, auth, log); err != nil {
			stopMCP()
			return nil, nil, nil, err
		}
		closeAll = func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if cerr := lp.Close(cctx); cerr != nil {
				log.Warn("close llm proxy", slog.Any("err", cerr))
			}
			stopMCP()
		}
	}
	if o.e2b {
		if routes == nil {
			routes = map[string]http.Handler{}
		}
		for p, h := range e2b.New(e2b.Options{Coordinator: co, Auth: auth, Logger: log}).Routes() {
			routes[p] = h
		}
		fmt.Fprintf(os.Stderr, "arbor: E2B-compatible API at http://%s (E2B_API_URL and E2B_SANDBOX_URL; docs/e2b.md)\n", addr)
	}
	if node != nil {
		// Other nodes ship states here, and this node ships its own, on
		// the same listener behind the same token (docs/cluster.md,
		// "State transfer").
		tr = cluster.NewTransfer(cluster.TransferOptions{Coordinator: co, Node: node, Token: o.token, Logger: log})
		if routes == nil {
			routes = map[string]http.Handler{}
		}
		routes[cluster.TransferPrefix] = tr.Handler()
	}
	return routes, tr, closeAll, nil
}

// runServer serves on ln until ctx ends; in a cluster it registers the node
// first, replicates its states (--replicas), drains on SIGTERM (--drain)
// and leaves the cluster last.
func runServer(ctx context.Context, s *server.Server, ln net.Listener, co *coordinator.Coordinator, node *cluster.Node, tr *cluster.Transfer, o *serveOptions, reg *prometheus.Registry, log *slog.Logger) error {
	if node != nil {
		if err := node.Register(ctx, cluster.CoordinatorLocal(co)); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "arbor: serving protocol v1 on ws://%s/v1/ws (metrics on http://%s/metrics); Ctrl-C stops\n", ln.Addr(), ln.Addr())
	if tr != nil && o.cluster.replicas > 1 {
		rctx, stopRep := context.WithCancel(context.Background())
		defer stopRep()
		go tr.Replicate(rctx, time.Second)
	}
	// Say at once what a stop waits for: it can take minutes.
	noticed := make(chan struct{})
	defer close(noticed)
	go func() {
		select {
		case <-noticed:
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, stopNotice(co, reg, tr != nil && o.cluster.drain > 0, o, time.Now()))
		}
	}()
	serveCtx := ctx
	if tr != nil && o.cluster.drain > 0 {
		// SIGTERM (a spot preemption's notice): move the envs away while
		// still serving, then stop (docs/cluster.md, "Drain").
		var cancel context.CancelFunc
		serveCtx, cancel = context.WithCancel(context.Background())
		defer cancel()
		served := make(chan struct{})
		defer close(served)
		go func() {
			select {
			case <-served:
				return
			case <-ctx.Done():
			}
			dctx, dcancel := context.WithTimeout(context.Background(), o.cluster.drain)
			ds, derr := tr.Drain(dctx)
			dcancel()
			log.Info("drained before stopping", slog.Int("moved", len(ds.Moved)), slog.Int("not_moved", len(ds.Failed)), slog.Any("err", derr))
			cancel()
		}()
	}
	err := s.Serve(serveCtx, ln, o.grace)
	if ctx.Err() != nil {
		fmt.Fprintf(os.Stderr, "arbor: requests drained; closing %d envs, the warm pool and the engine (up to %v each)\n",
			len(co.Envs(tenant.With(context.Background(), tenant.Tenant{Admin: true}))), closeTimeout)
	}
	if node != nil {
		// The envs are closed with the engine: they do not come back.
		lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if lerr := node.Leave(lctx); lerr != nil {
			log.Warn("leave the cluster", slog.Any("err", lerr))
		}
	}
	return err
}

// closeTimeout bounds each of the pool's and the engine's close at a stop.
const closeTimeout = time.Minute

// stopNotice is what serve prints the moment it is told to stop: what it
// waits for, and until when.
func stopNotice(co *coordinator.Coordinator, reg prometheus.Gatherer, drain bool, o *serveOptions, now time.Time) string {
	envs := len(co.Envs(tenant.With(context.Background(), tenant.Tenant{Admin: true})))
	inFlight := 0
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "arbor_requests_in_flight" && len(mf.GetMetric()) > 0 {
				inFlight = int(mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
	}
	what := fmt.Sprintf("waiting for %d requests in flight (up to --grace %v, until %s)", inFlight, o.grace, now.Add(o.grace).Format(time.TimeOnly))
	if drain {
		what = fmt.Sprintf("moving %d envs to other nodes (up to --drain-timeout %v), then %s", envs, o.cluster.drain,
			fmt.Sprintf("waiting for the requests in flight (%d now, up to --grace %v, until %s)", inFlight, o.grace, now.Add(o.cluster.drain+o.grace).Format(time.TimeOnly)))
	}
	return fmt.Sprintf("arbor: stopping: %s, then closing %d envs, the warm pool and the engine (up to %v each)", what, envs, closeTimeout)
}

// admitSlots reads --admit-slots' CLASS=N items.
func admitSlots(items []string) (coordinator.Slots, error) {
	var s coordinator.Slots
	for _, it := range items {
		class, v, ok := strings.Cut(it, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 {
			return s, fmt.Errorf("--admit-slots %q: want CLASS=N with N at least 1", it)
		}
		switch class {
		case coordinator.ClassReset:
			s.Reset = n
		case coordinator.ClassStep:
			s.Step = n
		case coordinator.ClassBranch:
			s.Branch = n
		case coordinator.ClassEvaluate:
			s.Evaluate = n
		default:
			return s, fmt.Errorf("--admit-slots %q: no class %q (reset, step, branch, evaluate)", it, class)
		}
	}
	return s, nil
}
