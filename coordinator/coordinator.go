package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/coordinator/trail"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// Options configure a Coordinator. Zero values take the defaults.
type Options struct {
	Engine *branch.Engine
	// Tasks makes new episodes' envs and runs verifiers; nil: Images
	// (image resets, no tasks).
	Tasks Tasks
	// Classify is the seam tests use to pick turn kinds; nil: the
	// engine's Classify (its inspector; none: every turn full). It is the
	// only classification entry point.
	Classify func(ctx context.Context, env *branch.Env, cmd string) (branch.Turn, error)
	// VerifySkips is the share of turns checkpointed as none, fs or proc
	// whose state is restored and compared with the live env (files,
	// shell state, processes; Engine.Verify), costing a restore each. At
	// 1 (arbor serve --verify-skips) every such turn is verified before
	// the step answers, and misses are in the turn's result. Below 1
	// (--verify-skips=0.01) a random share is verified in the background
	// after the step answered, holding the env's ticket like a background
	// checkpoint (the next operation on the env waits for it); misses are
	// logged with the env, turn and state. Both count in
	// arbor_verify_total{result}. 0: none.
	VerifySkips float64
	// MaxEnvs bounds the envs handed out (default 256).
	MaxEnvs int
	// IdleTTL closes handed-out envs nobody touched for this long since
	// their last operation ended (0 or negative: never). A running
	// operation holds its env's ticket; the janitor waits for it and then
	// keeps the env.
	IdleTTL time.Duration
	// DefaultTimeout is a bash turn's timeout when neither the action nor
	// the task sets one (default 60 s); MaxTimeout caps any (default 1 h).
	DefaultTimeout, MaxTimeout time.Duration
	// InspectTimeout bounds how long the engine's own reads of an env's
	// file tree may wait on a file system that does not answer (a FUSE
	// daemon such as zfs-fuse that hangs): a turn's classification then
	// takes a full checkpoint, a verification reports that it failed
	// (default 2 min; docs/zfs.md).
	InspectTimeout time.Duration
	// Registry receives the metrics; nil: a registry of the coordinator's
	// own.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Hooks hear of the envs handed out and ended and of the states
	// their operations make; nil: nobody (a single host). A cluster
	// node's registry (package cluster) publishes them in etcd.
	Hooks Hooks
	// Trajectories is the file of the turns' records (package trail;
	// arbor serve: trajectories.db in its state dir): every turn's action
	// and observation with the state it led to, and the verdicts of
	// evaluate (trajectory.go). "": a file in a temporary directory,
	// removed at Close.
	Trajectories string
	// AdmitWait bounds how long a reset, step, branch or evaluate waits
	// for admission (admission.go; docs/architecture.md, "Admission
	// control") before it is answered busy with a retry hint (default
	// DefaultAdmitWait; negative: no bound, requests wait their turn).
	AdmitWait time.Duration
	// AdmitSlots: how many of each class run at once.
	AdmitSlots Slots
	// TrajectoryOutput is what a turn's record keeps of each of stdout,
	// stderr, a command and a written file's content, head and tail
	// (default 256 KiB, the sandbox's default output cap).
	TrajectoryOutput int
}

// Hooks hear of the coordinator's envs and states. They are called
// synchronously, with no lock of the coordinator held, before the
// operation that caused them answers: a router that reads what a hook
// published after the answer finds it. They must not call back into the
// coordinator's operations on the same env.
type Hooks interface {
	// EnvOpened: an env was handed out (reset, branch, adopted after a
	// restart).
	EnvOpened(env string)
	// EnvClosed: an env handed out is gone (close, discard, promote, the
	// idle TTL, found closed).
	EnvClosed(env string)
	// StateMade: an operation on env made (or named as its head) the
	// state, whose artifacts this engine holds.
	StateMade(env, state string)
}

// noHooks is the Hooks of a single host.
type noHooks struct{}

func (noHooks) EnvOpened(string)         {}
func (noHooks) EnvClosed(string)         {}
func (noHooks) StateMade(string, string) {}

func (o Options) withDefaults() Options {
	if o.MaxEnvs <= 0 {
		o.MaxEnvs = 256
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 60 * time.Second
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = time.Hour
	}
	if o.InspectTimeout <= 0 {
		o.InspectTimeout = 2 * time.Minute
	}
	if o.Tasks == nil {
		o.Tasks = Images{E: o.Engine}
	}
	if o.Classify == nil {
		o.Classify = o.Engine.Classify
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Hooks == nil {
		o.Hooks = noHooks{}
	}
	return o
}

// Coordinator owns the turn (Turn, Boundary) and the life of every env it
// hands out: its creation (Reset, Branch), its task, its per-env gate
// (Ticket), its idle TTL and its end (CloseEnv, Discard, Promote). Envs it
// did not hand out (a task pool's templates and warm copies, throwaway
// forks) are not in its registry, so no caller can name them.
//
// Methods that name an env expect the caller to hold the env's ticket.
type Coordinator struct {
	o     Options
	e     *branch.Engine
	tasks Tasks
	log   *slog.Logger
	m     *metrics
	adm   *admission // the queues of admission control (admission.go)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	envs     map[string]*entry         // envs handed out, by id
	lost     map[string]branch.LostEnv // handed out, open at a crash, not restored (recover.go)
	owners   map[string]string         // the tenants of envs no longer handed out, by id (tenants.go)
	reserved int                       // env slots promised to resets and branches in progress
	closed   bool

	observer atomic.Pointer[Observer] // hears of the changes (events.go)

	trail    *trail.Store // the turns' records, for trajectories (trajectory.go)
	trailTmp string       // the temporary directory of trail, if any
}

// entry is what the coordinator keeps per env.
type entry struct {
	env *branch.Env
	// tail is closed when the newest operation queued on the env ends;
	// the next one waits for it (FIFO per env). Guarded by
	// Coordinator.mu, as is failed.
	tail chan struct{}
	// failed is a background checkpoint failure a waiter took from the
	// engine (WaitTurn, settle): the next turn still reports it (the
	// engine makes that turn's checkpoint full).
	failed error
	// The fields below are set at registration or touched only by
	// operations holding the env's ticket.
	task TaskInfo
	seed int64
	// tenant owns the env (tenants.go).
	tenant string
	base   int // the engine's turn count when the episode began
	// pending is the state whose background checkpoint was queued last;
	// its timing is read once the next operation has waited for it.
	pending string
	// recovered is reported (once) by the first operation after a
	// restart restored the env (recover.go).
	recovered *Recovered
	used      atomic.Int64 // unix nanoseconds of the last operation naming it
	// trail is what the env keeps of its turns that no state's record
	// holds yet (trajectory.go).
	trail envTrail
}

// New makes a coordinator on an open engine, adopts the envs the engine
// recovered from a crash of the previous run (recover.go) and starts its
// idle-TTL janitor; Close stops it.
func New(o Options) (*Coordinator, error) {
	if o.Engine == nil {
		return nil, errors.New("coordinator: Options.Engine is required")
	}
	o = o.withDefaults()
	c := &Coordinator{o: o, e: o.Engine, tasks: o.Tasks, log: o.Logger, envs: map[string]*entry{}, lost: map[string]branch.LostEnv{},
		owners: map[string]string{}}
	c.tasks = verdicts{Tasks: o.Tasks, c: c}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.openTrail(); err != nil {
		c.cancel()
		return nil, err
	}
	c.m = newMetrics(o.Registry, o.Engine, func() float64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return float64(len(c.envs))
	})
	c.adm = newAdmission(o, o.Registry)
	o.Registry.MustRegister(tenantEnvs{c})
	c.adoptRecovered(c.ctx)
	if o.IdleTTL > 0 {
		// The janitor closes envs left idle longer than IdleTTL.
		c.wg.Add(1)
		go c.every(min(max(o.IdleTTL/4, 50*time.Millisecond), time.Minute), func() { c.sweep(time.Now()) })
	}
	return c, nil
}

// Close stops the janitor. The envs stay with the engine, whose Close
// destroys them.
func (c *Coordinator) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	if o := c.observer.Load(); o != nil {
		(*o).Close()
	}
	c.closeTrail()
}

// Engine is the engine the coordinator drives, for the cluster's state
// transfers; adapters go through the coordinator's methods instead.
func (c *Coordinator) Engine() *branch.Engine { return c.e }

// MaxEnvs is the bound on the envs handed out.
func (c *Coordinator) MaxEnvs() int { return c.o.MaxEnvs }

// IdleTTL is how long a handed-out env may stay unused before the
// coordinator closes it (0: never).
func (c *Coordinator) IdleTTL() time.Duration { return max(c.o.IdleTTL, 0) }

// TaskNames lists the tasks Reset accepts.
func (c *Coordinator) TaskNames() []string { return c.tasks.TaskNames() }

// Tasks pages through the tasks, or a dataset's instances.
func (c *Coordinator) Tasks(dataset, cursor string, limit int) (TaskPage, error) {
	return c.tasks.List(dataset, cursor, limit)
}

// Ticket queues an operation on the envs ids in the order of the calls:
// wait blocks until the operations queued before it on those envs have
// ended, release lets the next one run. Releasing marks the envs used
// (the idle TTL counts from the end of an operation, however long it
// ran). Ids not handed out take no ticket.
func (c *Coordinator) Ticket(ids ...string) (wait, release func()) {
	t := c.take(ids...)
	return t.wait, t.release
}

// ticket is one operation's place in the FIFO of each env it names.
type ticket struct {
	prevs, nexts []chan struct{}
	held         []*entry
}

// take queues a ticket on the envs ids (Ticket).
func (c *Coordinator) take(ids ...string) *ticket {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &ticket{}
	for _, id := range ids {
		m, ok := c.envs[id]
		if !ok || id == "" {
			continue
		}
		next := make(chan struct{})
		t.prevs, m.tail = append(t.prevs, m.tail), next
		t.nexts = append(t.nexts, next)
		t.held = append(t.held, m)
	}
	return t
}

func (t *ticket) wait() {
	for _, p := range t.prevs {
		<-p
	}
}

// ready reports, without waiting, whether every operation queued before
// t has ended.
func (t *ticket) ready() bool {
	for _, p := range t.prevs {
		select {
		case <-p:
		default:
			return false
		}
	}
	return true
}

func (t *ticket) release() {
	now := time.Now().UnixNano()
	for _, m := range t.held {
		m.used.Store(now)
	}
	for _, n := range t.nexts {
		close(n)
	}
}

// register records an env handed out, and labels it so that a restarted
// coordinator can adopt it again (recover.go).
// An ephemeral env (one an MCP session started, which dies with the
// process) is labelled with its tenant only: after a crash nobody would
// own it, but its states still belong to its tenant.
func (c *Coordinator) register(env *branch.Env, task TaskInfo, seed int64, base int, ephemeral bool, tenant string) *entry {
	l := map[string]string{labelTenant: tenant}
	if !ephemeral {
		l = labels(task, base, seed, tenant)
	}
	if !ephemeral || tenant != "" {
		if err := c.e.SetLabels(env, l); err != nil {
			c.log.Warn("label env", slog.String("env", env.ID), slog.Any("err", err))
		}
	}
	closed := make(chan struct{})
	close(closed)
	m := &entry{env: env, tail: closed, task: task, seed: seed, base: base, tenant: tenant}
	m.used.Store(time.Now().UnixNano())
	c.mu.Lock()
	c.envs[env.ID] = m
	c.mu.Unlock()
	c.o.Hooks.EnvOpened(env.ID)
	return m
}

// forget drops an env from the registry.
func (c *Coordinator) forget(id string) {
	c.mu.Lock()
	m, ok := c.envs[id]
	if ok {
		c.owners[id] = m.tenant
	}
	delete(c.envs, id)
	c.mu.Unlock()
	if ok {
		c.o.Hooks.EnvClosed(id)
	}
}

// lookup finds an env handed out to ctx's tenant and marks it used. An
// env the engine no longer has is forgotten; another tenant's env is
// answered as one nobody handed out.
func (c *Coordinator) lookup(ctx context.Context, id string) (*branch.Env, *entry, error) {
	if id == "" {
		return nil, nil, fmt.Errorf("%w: env_id: required string is missing", state.ErrInvalidParams)
	}
	t := tenant.From(ctx)
	c.mu.Lock()
	m, ok := c.envs[id]
	l, lost := c.lost[id]
	c.mu.Unlock()
	if (ok && !t.Sees(m.tenant)) || (lost && !t.Sees(l.Labels[labelTenant])) {
		ok, lost = false, false
	}
	if lost {
		return nil, nil, lostError(l)
	}
	if !ok {
		return nil, nil, fmt.Errorf("%w: no open env %q", state.ErrUnknownEnv, id)
	}
	if _, err := c.e.Env(id); err != nil {
		c.forget(id)
		return nil, nil, fmt.Errorf("%w: env %q is closed", state.ErrUnknownEnv, id)
	}
	m.used.Store(time.Now().UnixNano())
	return m.env, m, nil
}

// Env returns an env handed out (and marks it used).
// It answers for every tenant: callers hold an env they were handed.
func (c *Coordinator) Env(id string) (*branch.Env, error) {
	env, _, err := c.lookup(everyTenant(), id)
	return env, err
}

// Origin is the env that env id was branched from, which a promote
// replaces ("" for none, or no such env).
func (c *Coordinator) Origin(id string) string {
	env, err := c.e.Env(id)
	if err != nil {
		return ""
	}
	return env.Origin
}

// Task returns the task of an env handed out.
func (c *Coordinator) Task(id string) (TaskInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.envs[id]
	if !ok {
		return TaskInfo{}, false
	}
	return m.task, true
}

// reserve promises n env slots; release with unreserve.
func (c *Coordinator) reserve(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return state.ErrShuttingDown
	}
	if have := len(c.envs) + c.reserved; have+n > c.o.MaxEnvs {
		return fmt.Errorf("%w: %d envs open or being made, %d more would pass the limit of %d; close some",
			state.ErrTooManyEnvs, have, n, c.o.MaxEnvs)
	}
	c.reserved += n
	return nil
}

func (c *Coordinator) unreserve(n int) {
	c.mu.Lock()
	c.reserved -= n
	c.mu.Unlock()
}

// observePending reads the timing of the env's last background checkpoint
// (which the operation now running has waited for) into the metrics.
func (c *Coordinator) observePending(m *entry) {
	if m.pending == "" {
		return
	}
	if st, err := c.e.State(m.pending); err == nil {
		if d, ok := st.Timings["total"]; ok {
			c.m.checkpoint.WithLabelValues("background").Observe(d.Seconds())
		}
	}
	m.pending = ""
}

// ResetResult is a new episode's env, registered.
type ResetResult struct {
	Env         *branch.Env
	StateID     string
	Task        TaskInfo
	Instruction string
}

// Reset starts an episode (of a task or an image) and hands out its env.
func (c *Coordinator) Reset(ctx context.Context, req ResetRequest) (*ResetResult, error) {
	if req.Image == "" && req.Task == "" && req.Dataset == "" {
		return nil, fmt.Errorf("%w: reset needs image, task or dataset", state.ErrInvalidParams)
	}
	ticket, err := c.admit(ctx, ClassReset)
	if err != nil {
		return nil, err
	}
	defer ticket.Done()
	admitted := time.Now()
	if err := c.reserve(1); err != nil {
		return nil, err
	}
	defer c.unreserve(1)
	res, err := c.tasks.Reset(ctx, req)
	if err != nil {
		return nil, err
	}
	task := res.Task
	if task.Image == "" {
		task.Image = res.Env.Image
	}
	if req.MaxTurns != nil {
		task.MaxTurns = *req.MaxTurns
	}
	c.register(res.Env, task, req.Seed, res.Env.Turn(), req.Ephemeral, tenant.From(ctx).Name)
	c.trailReset(res.StateID)
	c.o.Hooks.StateMade(res.Env.ID, res.StateID)
	c.m.checkpoints.WithLabelValues(string(state.Full)).Inc()
	c.m.reset.Observe(time.Since(admitted).Seconds())
	c.publish(Event{Type: EventReset, Env: res.Env.ID, Task: task.Name, State: res.StateID, Kind: string(state.Full)})
	c.log.Debug("reset", slog.String("env", res.Env.ID), slog.String("task", task.Name), slog.String("image", task.Image))
	return &ResetResult{Env: res.Env, StateID: res.StateID, Task: task, Instruction: res.Instruction}, nil
}

// EnvInfo is one env handed out.
type EnvInfo struct {
	Env  *branch.Env
	Task TaskInfo
	Turn int // since its episode began
	Idle time.Duration
	// Recovered: a restarted server restored the env at this state.
	Recovered *Recovered
}

// Envs lists the envs handed out to ctx's tenant, by id.
func (c *Coordinator) Envs(ctx context.Context) []EnvInfo {
	t := tenant.From(ctx)
	c.mu.Lock()
	metas := make([]*entry, 0, len(c.envs))
	for _, m := range c.envs {
		if t.Sees(m.tenant) {
			metas = append(metas, m)
		}
	}
	c.mu.Unlock()
	now := time.Now()
	out := make([]EnvInfo, 0, len(metas))
	for _, m := range metas {
		if _, err := c.e.Env(m.env.ID); err != nil {
			continue // closed under us; the next lookup forgets it
		}
		info := EnvInfo{Env: m.env, Task: m.task, Turn: m.env.Turn() - m.base, Idle: now.Sub(time.Unix(0, m.used.Load()))}
		if rec := m.env.Recovered(); rec != nil {
			info.Recovered = &Recovered{StateID: rec.State, Turn: rec.Turn - m.base}
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Env.ID < out[j].Env.ID })
	return out
}

// every runs fn each period until the coordinator closes: the idle-TTL
// janitor and the trail's sweeper.
func (c *Coordinator) every(period time.Duration, fn func()) {
	defer c.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// sweep closes the envs idle at now.
func (c *Coordinator) sweep(now time.Time) {
	c.closeIdle(c.idleAt(now))
}

// idleAt lists the envs nobody used for IdleTTL at now, with the time of
// their last use.
func (c *Coordinator) idleAt(now time.Time) map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	idle := map[string]int64{}
	for id, m := range c.envs {
		if used := m.used.Load(); now.Sub(time.Unix(0, used)) > c.o.IdleTTL {
			idle[id] = used
		}
	}
	return idle
}

// closeIdle closes the envs found idle. Each close takes the env's
// ticket, so it waits for an operation that is running (a long command),
// and once it holds it closes the env only if nobody used it since it was
// found idle: an operation marks its env used when it ends (Ticket).
func (c *Coordinator) closeIdle(idle map[string]int64) {
	for id, seen := range idle {
		wait, release := c.Ticket(id)
		wait()
		c.mu.Lock()
		m, ok := c.envs[id]
		c.mu.Unlock()
		if ok && m.used.Load() == seen {
			c.log.Info("closing idle env", slog.String("env", id), slog.Duration("idle_ttl", c.o.IdleTTL))
			if err := c.close(c.ctx, m.env, EventClose); err != nil && !errors.Is(err, state.ErrClosed) {
				c.log.Warn("close idle env", slog.String("env", id), slog.Any("err", err))
			}
		}
		release()
	}
}

// Has reports whether id is an env handed out and still open, without
// counting as a use of it.
func (c *Coordinator) Has(id string) bool {
	c.mu.Lock()
	_, ok := c.envs[id]
	c.mu.Unlock()
	if !ok {
		return false
	}
	_, err := c.e.Env(id)
	return err == nil
}

// Full is a Classify that checkpoints every turn whole (baselines and
// tests).
func Full(context.Context, *branch.Env, string) (branch.Turn, error) {
	return branch.Turn{Kind: state.Full, Reasons: []string{"every turn full"}}, nil
}
