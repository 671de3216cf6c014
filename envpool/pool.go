package envpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/internal/progress"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/shcmd"
	"github.com/arbor-env/arbor/state"
)

// PoolOptions configure a Pool. Zero values take the defaults.
type PoolOptions struct {
	// Warm is how many ready environments are kept per task (default 2;
	// negative: none, every reset restores on demand).
	Warm int
	// SetupTimeout bounds each setup command (default 10 min).
	SetupTimeout time.Duration
	// VerifierTimeout bounds a verifier when its task sets no
	// command_timeout (default 2 min).
	VerifierTimeout time.Duration
	// Progress receives human-readable progress of preparing tasks and
	// filling the warm pool (nil: none).
	Progress io.Writer
	Logger   *slog.Logger
	// Lazy: NewPool prepares nothing; the tasks are prepared in the
	// background, in order, and a reset of one not prepared yet waits for
	// it. A task whose setup fails is logged and its resets answer the
	// failure; the pool goes on (a server with a broken task serves the
	// others).
	Lazy bool
	// OnDemand, with Lazy: nothing is prepared in the background; each
	// task is prepared on its first reset (and its warm reserve filled
	// after that).
	OnDemand bool
	// Datasets are prepared an instance at a time, on its first use
	// (docs/tasks.md, "Datasets"); they get no warm reserve.
	Datasets []*Dataset
	// MaxInstances bounds the dataset instances kept prepared (their
	// template environments); the least recently used goes first
	// (default 32).
	MaxInstances int
}

func (o PoolOptions) withDefaults() PoolOptions {
	if o.Warm == 0 {
		o.Warm = 2
	}
	if o.Warm < 0 {
		o.Warm = 0
	}
	if o.SetupTimeout <= 0 {
		o.SetupTimeout = 10 * time.Minute
	}
	if o.VerifierTimeout <= 0 {
		o.VerifierTimeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxInstances <= 0 {
		o.MaxInstances = 32
	}
	return o
}

// Pool prepares tasks once and hands out environments restored from their
// post-setup checkpoints. The environments it holds in reserve (each
// task's template and its warm copies) are engine environments too, never
// handed to the coordinator, so no client can name them. What becomes of
// an environment once handed out (its turns, branches, idle TTL, close)
// is the coordinator's (package coordinator).
type Pool struct {
	e     *branch.Engine
	o     PoolOptions
	log   *slog.Logger
	tasks []Task
	// datasets by name; read-only after NewPool.
	datasets map[string]*Dataset

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	fill   *progress.Meter

	mu     sync.Mutex
	closed bool
	filled int // warm environments made so far
	// slots are the tasks' and the dataset instances' in use.
	slots map[string]*taskSlot
	// retired names the task of the post-setup states of instances whose
	// slot was evicted (envs reset from them live on).
	retired map[string]string
}

// taskSlot is one prepared task: its template environment (kept open so
// its post-setup state stays alive) and the warm environments restored
// from that state.
type taskSlot struct {
	task     Task
	template *branch.Env
	state    string
	// dir is where setup left the shell: the verifier runs there.
	dir  string
	took time.Duration
	kick chan struct{}

	mu    sync.Mutex
	ready []*branch.Env

	// done is closed once prepare ended, err its failure; start runs it.
	done  chan struct{}
	err   error
	start sync.Once
	// instance: a dataset instance's slot, evicted when unused (users,
	// lastUse: under Pool.mu).
	instance bool
	users    int
	lastUse  time.Time
}

// newSlot is the slot of task t, not prepared yet.
func newSlot(t Task) *taskSlot {
	return &taskSlot{task: t, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// prepared says whether s's preparation ended well.
func (s *taskSlot) prepared() bool {
	select {
	case <-s.done:
		return s.err == nil
	default:
		return false
	}
}

// NewPool prepares every task (image, exported env, setup commands, then a
// full checkpoint: the post-setup state) and starts filling the warm pool
// in the background. A task whose setup fails fails NewPool, with an error
// naming the task and the command; nothing is left behind.
func NewPool(ctx context.Context, e *branch.Engine, tasks []Task, o PoolOptions) (_ *Pool, err error) {
	o = o.withDefaults()
	seen := map[string]bool{}
	for _, t := range tasks {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: two tasks named %q", ErrInvalidTask, t.Name)
		}
		seen[t.Name] = true
	}
	p := &Pool{e: e, o: o, log: o.Logger, tasks: slices.Clone(tasks), slots: map[string]*taskSlot{},
		datasets: map[string]*Dataset{}, retired: map[string]string{}}
	for _, d := range o.Datasets {
		if seen[d.Name] || p.datasets[d.Name] != nil {
			return nil, fmt.Errorf("%w: dataset %q has the name of another task or dataset", ErrInvalidTask, d.Name)
		}
		p.datasets[d.Name] = d
	}
	for _, t := range tasks {
		p.slots[t.Name] = newSlot(t)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if o.Lazy && o.OnDemand {
		return p, nil // Pool.slot prepares a task on its first reset
	}
	if o.Lazy {
		// In order, one at a time, in the background; resets wait for
		// theirs (Pool.slot).
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for _, t := range tasks {
				if p.ctx.Err() != nil {
					return
				}
				p.ensure(p.ctx, p.slots[t.Name])
			}
		}()
		return p, nil
	}
	defer func() {
		if err != nil {
			p.cancel()
			for _, s := range p.slots {
				p.closeQuietly(s.template, "template of failed pool")
			}
		}
	}()
	meter := progress.New(o.Progress, "preparing tasks", len(tasks))
	for _, t := range tasks {
		s := p.slots[t.Name]
		s.start.Do(func() {})
		if err := p.prepare(ctx, s, meter); err != nil {
			meter.Finish(err)
			return nil, err
		}
		close(s.done)
		meter.Add(1, fmt.Sprintf("%s ready in %s", t.Name, s.took.Round(time.Millisecond)))
	}
	if len(tasks) > 0 {
		meter.Finish(nil)
	}
	if o.Warm > 0 && len(tasks) > 0 {
		p.fill = progress.New(o.Progress, "filling warm pool", o.Warm*len(tasks))
		for _, t := range tasks {
			p.wg.Add(1)
			go p.fillLoop(p.slots[t.Name])
		}
	}
	return p, nil
}

// ensure prepares s unless that began already, and waits for it to end.
func (p *Pool) ensure(ctx context.Context, s *taskSlot) error {
	s.start.Do(func() {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			err := p.prepare(p.ctx, s, progress.New(nil, "", 0))
			s.err = err
			close(s.done)
			if err != nil {
				p.log.Error("task setup failed: its resets answer this until the server restarts", slog.String("task", s.task.Name), slog.Any("err", err))
				return
			}
			p.log.Info("task ready", slog.String("task", s.task.Name), slog.Duration("took", s.took))
			if !s.instance && p.o.Warm > 0 {
				p.wg.Add(1)
				go p.fillLoop(s)
			}
			if s.instance {
				p.evictInstances()
			}
		}()
	})
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slot returns the prepared slot of the task or instance called name,
// preparing it first if need be; release ends its use (an instance's slot
// in use is never evicted).
func (p *Pool) slot(ctx context.Context, name string) (s *taskSlot, release func(), err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil, state.ErrShuttingDown
	}
	s, ok := p.slots[name]
	if !ok {
		p.mu.Unlock()
		t, err := p.instanceTask(name)
		if err != nil {
			return nil, nil, err
		}
		p.mu.Lock()
		if s, ok = p.slots[name]; !ok {
			s = newSlot(t)
			s.instance = true
			p.slots[name] = s
		}
	}
	s.users++
	s.lastUse = time.Now()
	p.mu.Unlock()
	release = func() {
		p.mu.Lock()
		s.users--
		s.lastUse = time.Now()
		p.mu.Unlock()
	}
	if err := p.ensure(ctx, s); err != nil {
		release()
		if s.instance {
			// A failed instance is tried again on its next use.
			p.mu.Lock()
			if p.slots[name] == s && s.users == 0 {
				delete(p.slots, name)
			}
			p.mu.Unlock()
		}
		return nil, nil, err
	}
	return s, release, nil
}

// instanceTask resolves "DATASET/NAME" to its instance's task.
func (p *Pool) instanceTask(name string) (Task, error) {
	ds, inst, ok := splitInstance(name)
	d := p.datasets[ds]
	if !ok || d == nil {
		return Task{}, fmt.Errorf("%w: %q (tasks: %s; datasets: %s)", state.ErrUnknownTask, name, strings.Join(p.taskNames(), ", "), strings.Join(p.datasetNames(), ", "))
	}
	i, ok := d.Index(inst)
	if !ok {
		return Task{}, fmt.Errorf("%w: dataset %s has no instance %q", state.ErrUnknownTask, ds, inst)
	}
	return d.Instance(i)
}

// evictInstances closes the templates of the least recently used
// instances not in use while more than MaxInstances are prepared. Their
// post-setup states live on while envs reset from them do; an evicted
// instance is prepared again on its next use.
func (p *Pool) evictInstances() {
	p.mu.Lock()
	var live []*taskSlot
	for _, s := range p.slots {
		if s.instance && s.prepared() {
			live = append(live, s)
		}
	}
	slices.SortFunc(live, func(a, b *taskSlot) int { return a.lastUse.Compare(b.lastUse) })
	var out []*taskSlot
	for _, s := range live {
		if len(live)-len(out) <= p.o.MaxInstances {
			break
		}
		if s.users > 0 {
			continue
		}
		delete(p.slots, s.task.Name)
		p.retired[s.state] = s.task.Name
		out = append(out, s)
	}
	p.mu.Unlock()
	for _, s := range out {
		p.log.Info("instance evicted", slog.String("task", s.task.Name))
		p.closeQuietly(s.template, "template of evicted instance")
	}
}

// prepare makes a task's template environment and its post-setup state.
func (p *Pool) prepare(ctx context.Context, s *taskSlot, meter *progress.Meter) (err error) {
	t := s.task
	start := time.Now()
	meter.Step(fmt.Sprintf("%s: starting image %s", t.Name, t.Image))
	// Resets branch from this env's states, whose isolation records carry
	// the task's capability set.
	env, _, err := p.e.NewEnvWith(ctx, t.Image, launch.Options{Caps: t.Caps})
	if err != nil {
		return fmt.Errorf("%w: task %s: start image %s: %w", ErrSetup, t.Name, t.Image, err)
	}
	defer func() {
		if err != nil {
			p.closeQuietly(env, "template of failed task")
		}
	}()
	// Setup goes straight to the sandbox (serialized with the engine's
	// checkpoint of the initial state) so that it does not count as
	// turns: an episode starts at turn 0.
	sb := env.Sandbox()
	dir := ""
	run := func(what, cmd string) error {
		r, err := sb.Exec(ctx, cmd, sandbox.ExecOptions{Timeout: p.o.SetupTimeout})
		if err == nil {
			dir = r.Cwd
		}
		switch {
		case err != nil:
			return fmt.Errorf("%w: task %s: %s %q: %w", ErrSetup, t.Name, what, cmd, err)
		case r.TimedOut:
			return fmt.Errorf("%w: task %s: %s %q timed out after %s", ErrSetup, t.Name, what, cmd, p.o.SetupTimeout)
		case r.ShellRestarted:
			return fmt.Errorf("%w: task %s: %s %q ended the shell (setup must not exit)", ErrSetup, t.Name, what, cmd)
		case r.ExitCode != 0:
			out := r.Stderr
			if len(strings.TrimSpace(string(out))) == 0 {
				out = r.Stdout
			}
			return fmt.Errorf("%w: task %s: %s %q exited with status %d: %s", ErrSetup, t.Name, what, cmd, r.ExitCode,
				strings.TrimSpace(tail(string(out), 500)))
		}
		return nil
	}
	if len(t.Env) > 0 {
		if err := run("export of env", exportCmd(t.Env)); err != nil {
			return err
		}
	}
	for i, c := range t.Setup {
		meter.Step(fmt.Sprintf("%s: setup %d/%d", t.Name, i+1, len(t.Setup)))
		if err := run(fmt.Sprintf("setup command %d/%d", i+1, len(t.Setup)), c); err != nil {
			return err
		}
	}
	sid, err := p.e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		return fmt.Errorf("task %s: checkpoint after setup: %w", t.Name, err)
	}
	if dir == "" {
		// No setup command ran: the shell's first directory.
		if r, err := sb.Exec(ctx, "true", sandbox.ExecOptions{Timeout: p.o.SetupTimeout}); err == nil {
			dir = r.Cwd
		}
	}
	s.template, s.state, s.dir, s.took = env, sid, dir, time.Since(start)
	p.log.Info("task prepared", slog.String("task", t.Name), slog.String("image", t.Image),
		slog.String("state", sid), slog.Duration("took", s.took))
	return nil
}

// exportCmd exports env in a POSIX shell, keys in order.
func exportCmd(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = "export " + k + "=" + shcmd.Quote(env[k])
	}
	return strings.Join(parts, "; ")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// fillLoop keeps s.ready at p.o.Warm environments until the pool closes.
func (p *Pool) fillLoop(s *taskSlot) {
	defer p.wg.Done()
	backoff := time.Second
	for {
		s.mu.Lock()
		need := p.o.Warm - len(s.ready)
		s.mu.Unlock()
		if need <= 0 {
			select {
			case <-p.ctx.Done():
				return
			case <-s.kick:
				continue
			}
		}
		res, err := p.e.Branch(p.ctx, branch.Source{State: s.state}, need)
		failed := err != nil
		if err == nil {
			for i, child := range res.Children {
				if res.Errors[i] != nil {
					failed = true
					err = res.Errors[i]
					continue
				}
				if !p.addReady(s, child) {
					return
				}
			}
		}
		if p.ctx.Err() != nil {
			return
		}
		if !failed {
			backoff = time.Second
			continue
		}
		p.log.Warn("fill warm pool", slog.String("task", s.task.Name), slog.Any("err", err), slog.Duration("retry_in", backoff))
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// addReady puts a freshly restored environment into s's reserve; it
// reports false (and closes the environment) when the pool is closing.
func (p *Pool) addReady(s *taskSlot, env *branch.Env) bool {
	// The template is not the parent an agent would promote into.
	env.Origin = ""
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.closeQuietly(env, "warm env after close")
		return false
	}
	p.filled++
	initialDone := p.filled == p.o.Warm*len(p.tasks)
	p.mu.Unlock()
	// The meter first: WaitWarm returns once the env is in the reserve,
	// and by then the progress shows it (TestPoolResetEvaluate once read
	// "1/4" after WaitWarm had returned).
	if p.fill != nil {
		p.fill.Add(1, s.task.Name)
		if initialDone {
			p.fill.Finish(nil)
		}
	}
	s.mu.Lock()
	s.ready = append(s.ready, env)
	s.mu.Unlock()
	return true
}

// take removes a live ready environment from s, or returns nil.
func (p *Pool) take(s *taskSlot) *branch.Env {
	defer func() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}()
	for {
		s.mu.Lock()
		if len(s.ready) == 0 {
			s.mu.Unlock()
			return nil
		}
		env := s.ready[0]
		s.ready = s.ready[1:]
		s.mu.Unlock()
		select {
		case <-env.Sandbox().Exited():
			p.log.Warn("warm env died in reserve", slog.String("task", s.task.Name), slog.String("env", env.ID))
			p.closeQuietly(env, "dead warm env")
			continue
		default:
			return env
		}
	}
}

// Tasks returns the loaded tasks in the order given.
func (p *Pool) Tasks() []Task { return slices.Clone(p.tasks) }

// Task returns the task called name.
func (p *Pool) Task(name string) (Task, bool) {
	p.mu.Lock()
	s, ok := p.slots[name]
	p.mu.Unlock()
	if ok {
		return s.task, true
	}
	if t, err := p.instanceTask(name); err == nil {
		return t, true
	}
	return Task{}, false
}

// ResetRequest asks for a new episode: of a task, or of a bare image.
type ResetRequest struct {
	Task, Image string
	// Dataset picks the task among a dataset's instances: the one at
	// Index, else the one Seed picks (Seed modulo their number).
	Dataset string
	Index   *int
	// Seed, when not 0, is exported in the environment's shell as
	// ARBOR_SEED and seeds the shell's $RANDOM, so that commands (and the
	// verifier) that draw randomness from them replay identically. Setup
	// ran before any seed, so a task's files are the same for every seed.
	// A seed costs one more checkpoint at reset, run in the background.
	Seed int64
}

// Reset is a new episode's environment.
type Reset struct {
	Env *branch.Env
	// StateID is the environment's state now (the task's post-setup
	// state, or the seeded state derived from it).
	StateID string
	// Task is the episode's task; for an image-only reset only its Image
	// is set.
	Task Task
	// Instruction is the first observation.
	Instruction string
}

// Reset hands out an environment. For a task it is taken from the warm
// pool (restored from the post-setup checkpoint, so setup is not paid
// again) and the pool refills in the background; when the pool is empty
// one is restored on demand. For an image alone it is a fresh environment.
func (p *Pool) Reset(ctx context.Context, req ResetRequest) (_ *Reset, err error) {
	if p.isClosed() {
		return nil, state.ErrShuttingDown
	}
	var (
		env  *branch.Env
		task Task
	)
	if req.Dataset != "" {
		if req.Task != "" {
			return nil, fmt.Errorf("%w: reset names a task and a dataset", state.ErrInvalid)
		}
		if req.Task, err = p.pick(req.Dataset, req.Index, req.Seed); err != nil {
			return nil, err
		}
	}
	switch {
	case req.Task != "":
		s, release, err := p.slot(ctx, req.Task)
		if err != nil {
			return nil, fmt.Errorf("reset %s: %w", req.Task, err)
		}
		defer release()
		if req.Image != "" && req.Image != s.task.Image {
			return nil, fmt.Errorf("%w: task %s runs on image %s, not %s", state.ErrInvalid, s.task.Name, s.task.Image, req.Image)
		}
		task = s.task
		// A ready env of the pool is a new env too: refused under disk
		// pressure like the others (docs/engine.md, "Disk pressure").
		if err := p.e.Admit(ctx); err != nil {
			return nil, fmt.Errorf("reset %s: %w", task.Name, err)
		}
		if env = p.take(s); env == nil {
			res, err := p.e.Branch(ctx, branch.Source{State: s.state}, 1)
			if err != nil {
				return nil, fmt.Errorf("reset %s: restore post-setup state: %w", task.Name, err)
			}
			if err := res.Errors[0]; err != nil {
				return nil, fmt.Errorf("reset %s: restore post-setup state: %w", task.Name, err)
			}
			env = res.Children[0]
			env.Origin = ""
		}
	case req.Image != "":
		task = Task{Image: req.Image}
		env, _, err = p.e.NewEnv(ctx, req.Image)
		if err != nil {
			return nil, fmt.Errorf("reset image %s: %w", req.Image, err)
		}
	default:
		return nil, fmt.Errorf("%w: reset needs a task or an image", state.ErrInvalid)
	}
	defer func() {
		if err != nil {
			p.closeQuietly(env, "env of failed reset")
		}
	}()
	sid := env.Head()
	if req.Seed != 0 {
		if sid, err = p.seed(ctx, env, req.Seed); err != nil {
			return nil, err
		}
	}
	return &Reset{Env: env, StateID: sid, Task: task, Instruction: task.Instruction}, nil
}

// seed exports the seed and checkpoints the result in the background. The
// command runs through the engine (its gate, its turn count, its revive of
// a dead sandbox) like any other; the coordinator takes the episode's
// turn base after it, so the seeded state is the episode's turn 0.
func (p *Pool) seed(ctx context.Context, env *branch.Env, seed int64) (string, error) {
	cmd := fmt.Sprintf("export ARBOR_SEED=%d; RANDOM=%d", seed, seed)
	r, err := p.e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err == nil && (r.ExitCode != 0 || r.TimedOut || r.ShellRestarted) {
		err = fmt.Errorf("exit %d: %s", r.ExitCode, strings.TrimSpace(string(r.Stderr)))
	}
	if err != nil {
		return "", fmt.Errorf("set seed in env %s: %w", env.ID, err)
	}
	sid, _, err := p.e.CheckpointAsync(env, state.Full)
	if err != nil {
		return "", fmt.Errorf("checkpoint seeded env %s: %w", env.ID, err)
	}
	return sid, nil
}

// pick names the instance of dataset ds at index, else the one seed
// picks.
func (p *Pool) pick(ds string, index *int, seed int64) (string, error) {
	d := p.datasets[ds]
	if d == nil {
		return "", fmt.Errorf("%w: no dataset %q (datasets: %s)", state.ErrUnknownTask, ds, strings.Join(p.datasetNames(), ", "))
	}
	if d.Len() == 0 {
		return "", fmt.Errorf("%w: dataset %s has no instances", state.ErrUnknownTask, ds)
	}
	i := 0
	switch {
	case index != nil:
		i = *index
		if i < 0 || i >= d.Len() {
			return "", fmt.Errorf("%w: dataset %s has %d instances, no index %d", state.ErrInvalid, ds, d.Len(), i)
		}
	case seed != 0:
		i = int(uint64(seed) % uint64(d.Len()))
	default:
		return "", fmt.Errorf("%w: reset of dataset %s needs an index or a seed", state.ErrInvalid, ds)
	}
	return ds + "/" + d.Names(i, 1)[0], nil
}

// datasetNames lists the datasets, sorted.
func (p *Pool) datasetNames() []string {
	names := make([]string, 0, len(p.datasets))
	for n := range p.datasets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Datasets returns the pool's datasets, sorted by name.
func (p *Pool) Datasets() []*Dataset {
	var ds []*Dataset
	for _, n := range p.datasetNames() {
		ds = append(ds, p.datasets[n])
	}
	return ds
}

func (p *Pool) taskNames() []string {
	names := make([]string, len(p.tasks))
	for i, t := range p.tasks {
		names[i] = t.Name
	}
	return names
}

// Evaluation is a verifier's verdict.
type Evaluation struct {
	Reward float64
	// Details: exit_code, stdout_tail, stderr_tail, duration_s,
	// timed_out, reward_from ("stdout", "exit_status", "rubric",
	// "timeout" or "outputs_too_large"), state_id (the state evaluated),
	// grader ("trusted" or "fork"), setup_s (time to get the grader's
	// sandbox: a pristine copy, or the fork), killed (processes stopped
	// there); with the trusted grader outputs (files, bytes, missing,
	// skipped) and copy_s; with a rubric parts.
	Details map[string]any
}

// Evaluate runs task's verifier on env's current state and scores it;
// env itself is untouched. seed is the episode's (0: none), given to the
// verifier as ARBOR_SEED.
//
// By default it is the trusted grader (docs/tasks.md): the verifier runs
// in a pristine copy of the task's post-setup state (from the warm
// reserve, or restored now) into which the agent's outputs (Task.Outputs,
// read from the state's file snapshot) and then the task's hidden files
// were copied, after every process but init was stopped: nothing of the
// agent's toolchain, processes or other files is there. A task with
// VerifierKeepsProcesses runs it on a fork of env instead, with the
// agent's processes (the weaker model docs/tasks.md describes).
//
// A verifier that fails or times out is a reward; a result the task's
// reward rules refuse is state.ErrVerifierOutput; a fork or sandbox that fails
// is ErrVerifier, never a reward.
func (p *Pool) Evaluate(ctx context.Context, env *branch.Env, task Task, seed int64) (Evaluation, error) {
	if task.Verifier == "" {
		name := task.Name
		if name == "" {
			name = "image " + task.Image
		}
		return Evaluation{}, fmt.Errorf("%w: %s", state.ErrNoVerifier, name)
	}
	if task.trusted() {
		return p.grade(ctx, env, task, seed)
	}
	start := time.Now()
	res, err := p.e.Branch(ctx, branch.Source{Env: env}, 1)
	if err == nil {
		err = res.Errors[0]
	}
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: fork env %s: %w", ErrVerifier, env.ID, err)
	}
	fork := res.Children[0]
	defer p.closeLater(fork, "verifier fork")
	details := map[string]any{"state_id": res.State, "grader": "fork", "setup_s": time.Since(start).Seconds()}
	return p.runVerifier(ctx, fork.Sandbox(), task, seed, p.verifierDir(task), details)
}

// grade is Evaluate's trusted grader.
func (p *Pool) grade(ctx context.Context, env *branch.Env, task Task, seed int64) (Evaluation, error) {
	s, release, err := p.slot(ctx, task.Name)
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: task %q: %w", ErrVerifier, task.Name, err)
	}
	defer release()
	if s.task.Verifier != task.Verifier {
		return Evaluation{}, fmt.Errorf("%w: task %q is not the one this pool prepared", ErrVerifier, task.Name)
	}
	// The agent's files as the state evaluated holds them; a failure
	// here is the engine's (its error says whose fault), not the
	// verifier's.
	sid, err := p.e.CurrentState(ctx, env)
	if err != nil {
		return Evaluation{}, fmt.Errorf("evaluate env %s: %w", env.ID, err)
	}
	files, release, err := p.e.StateFiles(sid)
	if err != nil {
		return Evaluation{}, fmt.Errorf("evaluate env %s: %w", env.ID, err)
	}
	defer release()
	start := time.Now()
	grader, err := p.pristine(ctx, s)
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: a pristine copy of task %s: %w", ErrVerifier, task.Name, err)
	}
	defer p.closeLater(grader, "grader")
	sb := grader.Sandbox()
	// Setup's shell goes: the verifier is the only thing that runs.
	killed, err := sb.KillAllButInit(ctx)
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: stop the grader's processes: %w", ErrVerifier, err)
	}
	details := map[string]any{"state_id": sid, "grader": "trusted", "setup_s": time.Since(start).Seconds(), "killed": killed}
	copyStart := time.Now()
	outputs := task.Outputs
	if len(outputs) == 0 && s.dir != "" && s.dir != "/" {
		outputs = []string{s.dir}
	}
	limit := task.MaxOutputBytes
	if limit <= 0 {
		limit = DefaultMaxOutputBytes
	}
	var ost outputStats
	err = applyTar(ctx, sb.Root(), func(w io.Writer) error {
		var err error
		ost, err = tarOutputs(ctx, w, files, outputs, limit)
		return err
	})
	details["outputs"] = map[string]any{"paths": outputs, "files": ost.Files, "dirs": ost.Dirs, "links": ost.Links,
		"bytes": ost.Bytes, "missing": ost.Missing, "skipped": ost.Skipped}
	if errors.Is(err, errOutputsTooLarge) {
		// The agent's doing: a failed episode, not an error to mask.
		lo, _ := task.Range()
		details["reward_from"] = "outputs_too_large"
		details["copy_s"] = time.Since(copyStart).Seconds()
		return Evaluation{Reward: lo, Details: details}, nil
	}
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: copy the agent's outputs into the grader: %w", ErrVerifier, err)
	}
	if task.Hidden != "" || len(task.HiddenFiles) > 0 {
		uid, gid := 0, 0
		if u := sb.UserNS(); u.Enabled {
			uid, gid = int(u.HostID), int(u.HostID)
		}
		if err := applyTar(ctx, sb.Root(), func(w io.Writer) error { return tarHidden(ctx, w, task, uid, gid) }); err != nil {
			return Evaluation{}, fmt.Errorf("%w: copy the hidden files into the grader: %w", ErrVerifier, err)
		}
	}
	details["copy_s"] = time.Since(copyStart).Seconds()
	return p.runVerifier(ctx, sb, task, seed, s.dir, details)
}

// applyTar streams what write writes into image.ApplyTar on root.
func applyTar(ctx context.Context, root string, write func(io.Writer) error) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := image.ApplyTar(ctx, root, pr)
		pr.CloseWithError(err)
		done <- err
	}()
	werr := write(pw)
	pw.CloseWithError(werr)
	aerr := <-done
	if werr != nil {
		return werr
	}
	return aerr
}

// pristine is a copy of s's post-setup state nobody used: from the warm
// reserve when one is ready, else restored now.
func (p *Pool) pristine(ctx context.Context, s *taskSlot) (*branch.Env, error) {
	if env := p.take(s); env != nil {
		return env, nil
	}
	res, err := p.e.Branch(ctx, branch.Source{State: s.state}, 1)
	if err != nil {
		return nil, err
	}
	if err := res.Errors[0]; err != nil {
		return nil, err
	}
	env := res.Children[0]
	env.Origin = ""
	return env, nil
}

// runVerifier runs task's verifier in sb as a fresh child of its init,
// after every other process there was stopped (unless the task keeps
// them), and scores it.
func (p *Pool) runVerifier(ctx context.Context, sb *sandbox.Sandbox, task Task, seed int64, dir string, details map[string]any) (Evaluation, error) {
	timeout := task.CommandTimeout
	if timeout <= 0 {
		timeout = p.o.VerifierTimeout
	}
	// The verifier's result must be the verifier's: nothing the agent
	// left running may write to it, so every process but init goes first
	// (unless the task needs them), and the verifier runs as a fresh
	// child of init, not in a shell whose functions, aliases and traps
	// would apply to it.
	if _, done := details["killed"]; !done && !task.VerifierKeepsProcesses {
		killed, err := sb.KillAllButInit(ctx)
		if err != nil {
			return Evaluation{}, fmt.Errorf("%w: stop the agent's processes: %w", ErrVerifier, err)
		}
		details["killed"] = killed
	}
	r, err := sb.Run(ctx, task.Verifier, sandbox.RunOptions{Env: verifierEnv(task, seed), Dir: dir, Timeout: timeout})
	if err != nil {
		return Evaluation{}, fmt.Errorf("%w: run verifier: %w", ErrVerifier, err)
	}
	details["exit_code"] = r.ExitCode
	details["stdout_tail"] = tail(string(r.Stdout), 2048)
	details["stderr_tail"] = tail(string(r.Stderr), 2048)
	details["duration_s"] = r.Duration.Seconds()
	details["timed_out"] = r.TimedOut
	sc, err := task.Score(string(r.Stdout), r.ExitCode, r.TimedOut)
	if err != nil {
		return Evaluation{Details: details}, fmt.Errorf("task %s: %w (exit status %d; stderr: %s)", task.Name, err, r.ExitCode,
			strings.TrimSpace(tail(string(r.Stderr), 300)))
	}
	details["reward_from"] = sc.From
	if sc.Parts != nil {
		details["parts"] = sc.Parts
	}
	return Evaluation{Reward: sc.Reward, Details: details}, nil
}

// verifierEnv is the verifier's whole environment: the task's variables
// and the episode's seed, never what the agent exported in its shell.
func verifierEnv(task Task, seed int64) []string {
	keys := make([]string, 0, len(task.Env))
	for k := range task.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		env = append(env, k+"="+task.Env[k])
	}
	if seed != 0 {
		env = append(env, "ARBOR_SEED="+strconv.FormatInt(seed, 10))
	}
	return env
}

// verifierDir is where the verifier runs: the directory the task's setup
// ended in (where the agent started), whatever the agent did since.
func (p *Pool) verifierDir(task Task) string {
	p.mu.Lock()
	s, ok := p.slots[task.Name]
	p.mu.Unlock()
	if ok && s.prepared() && s.task.Verifier == task.Verifier && s.dir != "" {
		return s.dir
	}
	return "/"
}

// TaskOfState returns the task whose post-setup state is sid or one of
// its ancestors.
func (p *Pool) TaskOfState(sid string) (Task, bool) {
	lineage, err := p.e.Lineage(sid)
	if err != nil {
		return Task{}, false
	}
	p.mu.Lock()
	byState := make(map[string]Task, len(p.slots))
	for _, s := range p.slots {
		if s.prepared() {
			byState[s.state] = s.task
		}
	}
	retired := maps.Clone(p.retired)
	p.mu.Unlock()
	for _, st := range lineage {
		if t, ok := byState[st.ID]; ok {
			return t, true
		}
		if name, ok := retired[st.ID]; ok {
			if t, err := p.instanceTask(name); err == nil {
				return t, true
			}
		}
	}
	return Task{}, false
}

// TaskStats describe one task's reserve.
type TaskStats struct {
	Name     string
	State    string // the post-setup state id
	Ready    int
	Prepared time.Duration // time setup took
}

// Stats is what the pool holds.
type Stats struct {
	Tasks []TaskStats
}

// Stats reports each task's reserve.
func (p *Pool) Stats() Stats {
	var st Stats
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tasks {
		s := p.slots[t.Name]
		ts := TaskStats{Name: t.Name}
		if s.prepared() {
			s.mu.Lock()
			ts.State, ts.Ready, ts.Prepared = s.state, len(s.ready), s.took
			s.mu.Unlock()
		}
		st.Tasks = append(st.Tasks, ts)
	}
	return st
}

// WaitWarm waits until every task has its full reserve of warm
// environments (benchmarks and tests use it).
func (p *Pool) WaitWarm(ctx context.Context) error {
	for {
		full := true
		p.mu.Lock()
		for _, s := range p.slots {
			if s.instance {
				continue
			}
			s.mu.Lock()
			full = full && len(s.ready) >= p.o.Warm
			s.mu.Unlock()
		}
		p.mu.Unlock()
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (p *Pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// closeLater closes env in the background (the pool's Close waits for
// it): an evaluation answers without waiting for its sandbox's teardown.
// Nothing reaches env meanwhile: it was never handed out.
func (p *Pool) closeLater(env *branch.Env, what string) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.closeQuietly(env, what)
	}()
}

func (p *Pool) closeQuietly(env *branch.Env, what string) {
	if env == nil {
		return
	}
	if err := p.e.CloseEnv(context.Background(), env); err != nil && !errors.Is(err, state.ErrClosed) {
		p.log.Warn("close "+what, slog.String("env", env.ID), slog.Any("err", err))
	}
}

// Close stops the background work and closes the environments the pool
// holds in reserve. Handed-out environments stay open (the engine's Close
// ends them).
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("close pool: %w", ctx.Err())
	}
	var errs []error
	p.mu.Lock()
	slots := slices.Collect(maps.Values(p.slots))
	p.mu.Unlock()
	for _, s := range slots {
		if !s.prepared() {
			continue
		}
		s.mu.Lock()
		ready := s.ready
		s.ready = nil
		s.mu.Unlock()
		for _, env := range append(ready, s.template) {
			if err := p.e.CloseEnv(ctx, env); err != nil {
				errs = append(errs, fmt.Errorf("close env %s of task %s: %w", env.ID, s.task.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
