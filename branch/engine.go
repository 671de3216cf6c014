package branch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/imgcache"
	"github.com/arbor-env/arbor/cr/imgdelta"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// DefaultLazyBytes is the image size from which arbor serve restores
// lazily (Options.LazyBytes).
const DefaultLazyBytes = 64 << 20

// SnapshotPrefix is where filesystem artifacts live in the snapshotter.
const SnapshotPrefix = "states/"

// Options configure an Engine.
type Options struct {
	// StateDir holds the manifest and the process images.
	StateDir string
	Snap     cr.Snapshotter
	CRIU     *criu.Checkpointer
	// Launcher starts fresh environments from images.
	Launcher *launch.Launcher
	// Limits apply to restored sandboxes (fresh ones use the launcher's);
	// the zero value takes the launcher's, so that a restored child gets
	// the limits and the disk quota of a freshly started sandbox.
	Limits sandbox.Limits
	// HotBytes bounds the process images kept on tmpfs (default 1 GiB);
	// older ones move to disk and are loaded back on demand.
	HotBytes int64
	// NoTmpfs keeps hot images in a plain directory (tests without root
	// mounts).
	NoTmpfs bool
	// Workers bounds concurrent checkpoints and restores (default: cores).
	Workers int
	// WarmCopies is how many pre-restored, frozen copies of every open
	// environment's newest state to keep, so that branch only thaws them.
	WarmCopies int
	// PrepareTTL is how long the copies Prepare made of a state are kept
	// after the last Prepare of that state, unless a branch takes them
	// first (default DefaultPrepareTTL); PrepareCopies bounds the
	// prepared copies of all states together, queued or ready (default
	// DefaultPrepareCopies). docs/engine.md, "Prepared copies".
	PrepareTTL    time.Duration
	PrepareCopies int
	// LazyBytes: process images of at least this many bytes are restored
	// lazily over userfaultfd, their memory copied in after the tree
	// runs (docs/engine.md, "Lazy restore"); 0 or less restores every
	// image eagerly. DefaultLazyBytes is the server's default.
	LazyBytes int64
	// DeltaChain is how many delta images may stand on one whole process
	// image: a checkpoint's image is stored as a delta of its parent
	// state's (the pages that did not change left to it, cr/imgdelta)
	// while that one's chain is shorter, else whole (default
	// DefaultDeltaChain, at most imgdelta.MaxChain; negative: every image
	// whole). docs/engine.md,
	// "Delta images".
	DeltaChain int
	// Inspector, when set, classifies turns (Classify) and keeps its
	// baselines in step with every checkpoint and restore; without it
	// every turn is a full checkpoint. *watch.Inspector (package
	// inspector/watch) is the real one.
	Inspector Inspector
	// NoRecover makes Open close the environments a crash left open, as
	// a fresh start, instead of restoring them at their last committed
	// state (docs/engine.md, "Crash safety"); they are closed as CloseEnv
	// closes an env, so their states stay for Retain.
	NoRecover bool
	// Retain is how long the states of a closed env stay branchable by
	// state id after its close; 0 releases them as soon as nothing needs
	// them (no open env's lineage, pin, pending branch or warm copy).
	// DefaultRetain is the server's default (docs/engine.md, "Retention").
	Retain time.Duration
	// GCInterval is the longest the background GC sleeps between passes
	// (default DefaultGCInterval); closes and releases wake it sooner.
	GCInterval time.Duration
	// GCBatch bounds the states one GC pass deletes (default
	// DefaultGCBatch; artifacts: twice as many).
	GCBatch int
	// HighWater and LowWater are the watermarks of disk pressure, shares
	// of the pool, the cold image store and the hot tmpfs in use (defaults
	// DefaultHighWater, DefaultLowWater): above the high mark GC evicts by
	// the retention policy until under the low mark, and while still
	// above it NewEnv and Branch wait up to PressureWait (default
	// DefaultPressureWait) and are refused with state.ErrNoSpace
	// (docs/engine.md, "Disk pressure"). A high mark above 1 turns it off.
	HighWater, LowWater float64
	PressureWait        time.Duration
	// ImageBudget bounds the process images one env's checkpoints may
	// write (bytes stored, deltas as stored) while it is open; a
	// checkpoint that would go over fails as the agent's doing and the
	// env runs on (docs/engine.md, "Image budget"). 0 means
	// DefaultImageBudget, negative no budget.
	ImageBudget int64
	// DiskReserve admits a new env only if the pool can take what every
	// open env may still write under its disk quota, and the new one's
	// whole quota, above the high mark's reserve: the sum of what open
	// envs may write can then never fill the pool (docs/engine.md, "Disk
	// reservation"). Without it quotas may overcommit the pool, and fair
	// shares stop the env holding the most of a full pool.
	DiskReserve bool
	Logger      *slog.Logger
}

// DefaultImageBudget is Options.ImageBudget's default: twice the default
// memory limit of a sandbox.
const DefaultImageBudget = 2 << 30

// Engine runs checkpoints, branches and rollbacks.
type Engine struct {
	o     Options
	log   *slog.Logger
	man   *manifest.Manifest
	cache *imgcache.Cache
	q     *queue.Queue
	// gcMu keeps garbage collection apart from everything that adds
	// references to states (commits, heads, branches).
	gcMu sync.RWMutex
	// passMu makes GC passes one at a time, the deletion of their
	// artifacts (outside gcMu) included.
	passMu sync.Mutex
	// importMu makes Imports one at a time (two streams may carry the
	// same artifact).
	importMu sync.Mutex

	stats coordStats

	// The background GC (gc.go): its wake-up, its stop, its totals, and
	// how far tests moved the clock retention is measured with (now).
	gcNudge  chan struct{}
	gcCancel context.CancelFunc
	gcDone   chan struct{}
	gcStats  gcStats
	clockOff atomic.Int64
	// lazyBytes is Options.LazyBytes (SetLazyBytes).
	lazyBytes atomic.Int64
	pr        pressure // disk pressure (pressure.go)
	// failed: why recent states' checkpoints failed (failed.go).
	failed failedStates

	mu     sync.Mutex
	envs   map[string]*Env
	warm   map[string][]*warmCopy // state id -> frozen copies
	lost   map[string]LostEnv     // envs of an earlier run that Open could not restore
	refs   map[string]int         // states held by branches in flight (hold)
	closed bool
	bg     sync.WaitGroup
	// prep is the prepared copies by state id (prepare.go), prepStats
	// their totals (PrepareStats), both under mu.
	prep      map[string]*prepEntry
	prepStats PrepareStats
}

// Open starts an engine on o.StateDir, recovering what a crash left: half
// written artifacts are deleted, states whose artifacts vanished are
// dropped, and every environment the previous run left open is restored
// under its id at its last committed state (Env.Recovered says which);
// one that cannot be is closed and reported by Lost. With o.NoRecover
// they are all closed instead, as CloseEnv closes an env: their states
// stay usable for Options.Retain (a lost env's until ForgetLost).
func Open(ctx context.Context, o Options) (e *Engine, err error) {
	if o.Snap == nil || o.CRIU == nil || o.Launcher == nil || o.StateDir == "" {
		return nil, fmt.Errorf("%w: engine needs StateDir, Snap, CRIU and Launcher", state.ErrInvalid)
	}
	if o.HotBytes <= 0 {
		o.HotBytes = 1 << 30
	}
	if o.Limits == (sandbox.Limits{}) {
		o.Limits = o.Launcher.Limits
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Retain < 0 {
		o.Retain = 0
	}
	if o.GCInterval <= 0 {
		o.GCInterval = DefaultGCInterval
	}
	if o.GCBatch <= 0 {
		o.GCBatch = DefaultGCBatch
	}
	if o.HighWater <= 0 {
		o.HighWater = DefaultHighWater
	}
	if o.LowWater <= 0 || o.LowWater >= o.HighWater {
		o.LowWater = min(DefaultLowWater, o.HighWater-0.1)
	}
	if o.PressureWait <= 0 {
		o.PressureWait = DefaultPressureWait
	}
	if o.ImageBudget == 0 {
		o.ImageBudget = DefaultImageBudget
	}
	if o.PrepareTTL <= 0 {
		o.PrepareTTL = DefaultPrepareTTL
	}
	if o.PrepareCopies <= 0 {
		o.PrepareCopies = DefaultPrepareCopies
	}
	if o.DeltaChain == 0 {
		o.DeltaChain = DefaultDeltaChain
	}
	if o.DeltaChain > imgdelta.MaxChain {
		return nil, fmt.Errorf("delta chain %d: at most %d", o.DeltaChain, imgdelta.MaxChain)
	}
	e = &Engine{o: o, log: o.Logger, envs: map[string]*Env{}, warm: map[string][]*warmCopy{}, prep: map[string]*prepEntry{},
		lost: map[string]LostEnv{}, refs: map[string]int{}, gcNudge: make(chan struct{}, 1)}
	e.lazyBytes.Store(o.LazyBytes)
	e.cache, err = imgcache.Open(imgcache.Options{
		HotDir: filepath.Join(o.StateDir, "images", "hot"), ColdDir: filepath.Join(o.StateDir, "images", "cold"),
		HotBytes: o.HotBytes, NoMount: o.NoTmpfs, Logger: o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("open image cache: %w", err)
	}
	// The clean-ups hold their own references: a failed return sets the
	// named result e to nil before they run.
	cache := e.cache
	defer func() {
		if err != nil {
			if cerr := cache.Close(); cerr != nil {
				o.Logger.Warn("close image cache", slog.Any("err", cerr))
			}
		}
	}()
	e.man, err = manifest.Open(filepath.Join(o.StateDir, "manifest.db"), manifest.Options{Logger: o.Logger, Exists: e.artifactExists})
	if err != nil {
		return nil, fmt.Errorf("open manifest: %w", err)
	}
	man := e.man
	defer func() {
		if err != nil {
			man.Close()
		}
	}()
	open, err := e.recover(ctx)
	if err != nil {
		return nil, err
	}
	e.q = queue.New(o.Workers, o.Logger)
	e.initPressure()
	e.restoreEnvs(ctx, open)
	e.startGC()
	return e, nil
}

func (e *Engine) artifactExists(a manifest.Artifact) bool {
	if a.Kind == manifest.ArtifactProc {
		return e.cache.Has(a.Location)
	}
	vols, err := e.o.Snap.List(context.Background(), a.Location)
	if err != nil {
		return true // cannot tell: keep it
	}
	for _, v := range vols {
		if v.Name == a.Location {
			return true
		}
	}
	return false
}

// recover puts the manifest and the disk back in order after a crash and
// returns the environments the previous run left open, to be restored
// (none with NoRecover: they are closed).
func (e *Engine) recover(ctx context.Context) ([]manifest.Env, error) {
	rep, err := e.man.Recover()
	if err != nil {
		return nil, fmt.Errorf("recover manifest: %w", err)
	}
	for _, a := range rep.HalfWritten {
		e.deleteArtifact(ctx, a)
	}
	for _, a := range rep.Missing {
		e.deleteArtifact(ctx, a) // a delta whose base is gone is still on disk
	}
	if n := len(rep.HalfWritten) + len(rep.Missing) + len(rep.RemovedStates); n > 0 {
		e.log.Warn("recovered from an unclean stop", slog.Int("half_written", len(rep.HalfWritten)),
			slog.Int("missing_artifacts", len(rep.Missing)), slog.Int("removed_states", len(rep.RemovedStates)))
	}
	envs, err := e.man.Envs()
	if err != nil {
		return nil, fmt.Errorf("list envs: %w", err)
	}
	var open []manifest.Env
	for _, env := range envs {
		switch {
		case env.Closed && env.Lost != "":
			// Lost in an earlier restart: still reported until released.
			e.lost[env.ID] = LostEnv{ID: env.ID, Image: env.Image, Origin: env.Origin, Head: env.Head,
				Labels: env.Labels, Err: errors.New(env.Lost)}
		case env.Closed:
		case e.o.NoRecover:
			// Closed as CloseEnv closes an env: its lineage is kept for
			// the retention from now on, then collected.
			if err := e.man.ReleaseEnvAt(env.ID, e.now()); err != nil {
				return nil, fmt.Errorf("close stale env %s: %w", env.ID, err)
			}
		default:
			open = append(open, env)
		}
	}
	// States an earlier version left unreleased when it closed envs
	// (a graceful Close, NoRecover) are released now, their retention
	// starting now.
	if n, err := e.man.ReleaseClosedAt(e.now()); err != nil {
		return nil, err
	} else if n > 0 {
		e.log.Info("released the states of envs closed without releasing them", slog.Int("states", n))
	}
	if n := sandbox.RemoveStaleCgroups(); n > 0 {
		e.log.Info("removed cgroups of sandboxes of an earlier run", slog.Int("count", n))
	}
	// Roots of environments of an earlier run are of no use any more:
	// their processes died with it, and a restored env gets a new root
	// cloned from its state.
	vols, err := e.o.Snap.List(ctx, launch.VolumePrefix)
	if err == nil {
		for _, v := range vols {
			if strings.HasPrefix(v.Name, launch.VolumePrefix) {
				e.o.Snap.Destroy(ctx, v.Name)
			}
		}
	}
	return open, nil
}

// deleteArtifact removes an artifact's files (logging a failure, which
// it also returns); one already gone is no failure.
func (e *Engine) deleteArtifact(ctx context.Context, a manifest.Artifact) error {
	var err error
	if a.Kind == manifest.ArtifactProc {
		err = e.cache.Remove(ctx, a.Location)
		if errors.Is(err, imgcache.ErrNotFound) {
			err = nil
		}
	} else {
		err = e.o.Snap.Destroy(ctx, a.Location)
		if errors.Is(err, cr.ErrNotFound) {
			err = nil
		}
	}
	if err != nil {
		e.log.Warn("delete artifact", slog.String("artifact", a.ID), slog.Any("err", err))
	}
	return err
}

// Close waits for running work, destroys every environment and closes it
// as CloseEnv does (its states are released: they stay for
// Options.Retain, in this run's files for the next run to branch from or
// collect), then closes the manifest and the image cache (which unmounts
// the hot images' tmpfs it mounted, moving them to disk).
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	envs := make([]*Env, 0, len(e.envs))
	for _, env := range e.envs {
		envs = append(envs, env)
	}
	warm := e.warm
	e.warm = map[string][]*warmCopy{}
	for _, p := range e.prep {
		p.wake()
	}
	e.prep = map[string]*prepEntry{}
	e.mu.Unlock()
	e.stopGC()
	var errs []error
	for _, env := range envs {
		if err := e.closeEnv(ctx, env); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ws := range warm {
		for _, w := range ws {
			w.destroy(ctx, e)
		}
	}
	e.bg.Wait()
	// The image cache goes last: its tmpfs is unmounted once the queue's
	// checkpoints have written their images (they move to disk first).
	errs = append(errs, e.q.Close(ctx), e.man.Close(), e.cache.Close())
	return errors.Join(errs...)
}

// Env is one live environment: a sandbox and its lineage of states.
type Env struct {
	ID    string
	Image string
	// Origin is the environment whose state this one was branched from
	// ("" for a fresh one); promote hands the state back to it.
	Origin string

	mu      sync.Mutex // held for the whole of each operation on the env
	sb      *sandbox.Sandbox
	volume  string
	gen     int
	head    string       // newest state id (its checkpoint may still run)
	turn    atomic.Int64 // written under mu, read without it (Turn)
	dirty   bool         // changed since head was checkpointed
	pending *queue.Job
	// pendingParent is the head before the pending checkpoint, restored
	// if that checkpoint fails.
	pendingParent string
	// pendingCkpt is the pending job's checkpoint and waits the stretches
	// operations waited for it: the part of them its run covers is its
	// exposed time, counted once it finished.
	pendingCkpt *ckpt
	waits       []span
	ckptErr     error // the last background checkpoint's failure, until taken
	// mustFull: a checkpoint failed, so the next one takes everything,
	// whatever the turn's classification says.
	mustFull bool
	closed   bool

	fsMu  sync.Mutex // guards fsLoc, pubHead, labels, recovered, charged: read without env.mu
	fsLoc string     // snapshot of the head's filesystem artifact
	// pubHead mirrors head for readers that must not wait for env.mu
	// (which a gate may hold for a whole checkpoint).
	pubHead string
	labels  map[string]string
	// recovered is set once, when Open restored the env after a crash.
	recovered *Recovered
	// charged is what root volume chargedVol had written at its last file
	// snapshot (cr.QuotaUsage.Charged): the base of the next snapshot's
	// size. A new root (rollback, revive) starts from 0.
	charged    int64
	chargedVol string
	// pubSb and pubVolume mirror sb and volume for the pool's fair-share
	// check (share.go), which must not wait for env.mu; stopped is why
	// that check stopped the env (nil: it did not).
	pubSb     *sandbox.Sandbox
	pubVolume string
	stopped   error
	// images is what the env's committed checkpoints wrote to the image
	// store (Options.ImageBudget).
	images atomic.Int64

	stats *coordStats // the engine's, shared by all envs
}

// Sandbox is the environment's current sandbox (it changes on rollback).
func (env *Env) Sandbox() *sandbox.Sandbox {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.sb
}

// Head is the environment's newest state id (its checkpoint may still be
// running).
func (env *Env) Head() string {
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	return env.pubHead
}

// setHead moves the head; the caller holds env.mu.
func (env *Env) setHead(sid string) {
	env.head = sid
	env.fsMu.Lock()
	env.pubHead = sid
	env.fsMu.Unlock()
}

// Turn is the number of commands run in the environment's lineage. It
// does not wait for an operation running on the env.
func (env *Env) Turn() int { return int(env.turn.Load()) }

// TakeCheckpointError returns (once) the failure of a background
// checkpoint, so the server can report it instead of it going unnoticed.
func (env *Env) TakeCheckpointError() error {
	env.mu.Lock()
	defer env.mu.Unlock()
	err := env.ckptErr
	env.ckptErr = nil
	return err
}

// gate waits for the environment's background checkpoint, raising its
// priority; it returns how long the caller was held up. Callers hold env.mu.
func (env *Env) gate(ctx context.Context) (time.Duration, error) {
	if env.pending == nil {
		return 0, nil
	}
	start := time.Now()
	err := env.pending.Wait(ctx)
	waited := time.Since(start)
	env.waits = append(env.waits, span{start, start.Add(waited)})
	if ctx.Err() != nil {
		return waited, ctx.Err()
	}
	if env.stats != nil && env.pendingCkpt != nil {
		// The part of the checkpoint's run an operation waited through
		// is checkpoint latency the policy's thinking did not hide; a
		// wait while it sat queued behind others' is not its time, and
		// one checkpoint is never exposed for longer than it ran, however
		// many operations waited for it (arbor_checkpoint_exposed_seconds_total).
		env.stats.exposed.Add(int64(env.pendingCkpt.exposed(env.waits)))
	}
	env.pending, env.pendingCkpt, env.waits = nil, nil, nil
	if err != nil {
		// That state never came to be: the head is its parent again and
		// the sandbox has changes no state holds.
		env.ckptErr = err
		env.setHead(env.pendingParent)
		env.dirty = true
		env.mustFull = true
	}
	return time.Since(start), nil
}

func (e *Engine) register(env *Env) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return state.ErrClosed
	}
	e.envs[env.ID] = env
	env.publish()
	return nil
}

// publish mirrors env's sandbox and volume for readers without env.mu;
// the caller holds env.mu (or env is not shared yet).
func (env *Env) publish() {
	env.fsMu.Lock()
	env.pubSb, env.pubVolume = env.sb, env.volume
	env.fsMu.Unlock()
}

// closedErr is the error of an operation on a closed env: why the
// fair-share check stopped it, or state.ErrClosed.
func (env *Env) closedErr() error {
	if err := env.stopErr(); err != nil {
		return err
	}
	return fmt.Errorf("%w: env %s", state.ErrClosed, env.ID)
}

// usable is nil when operations may run on env: it is neither closed nor
// stopped by the fair-share check (whose close may still be waiting for
// env.mu: a stopped env is never revived or rolled back meanwhile). The
// caller holds env.mu.
func (env *Env) usable() error {
	if env.closed {
		return env.closedErr()
	}
	return env.stopErr()
}

// stopErr is why the fair-share check stopped env, or nil.
func (env *Env) stopErr() error {
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	return env.stopped
}

// Env returns the open environment id.
func (e *Engine) Env(id string) (*Env, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	env, ok := e.envs[id]
	if !ok {
		if l, ok := e.lost[id]; ok {
			return nil, fmt.Errorf("%w: env %s (head %s): %v", state.ErrLost, id, l.Head, l.Err)
		}
		return nil, fmt.Errorf("%w: %s", state.ErrUnknownEnv, id)
	}
	return env, nil
}

// Envs lists the open environments.
func (e *Engine) Envs() []*Env {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*Env, 0, len(e.envs))
	for _, env := range e.envs {
		out = append(out, env)
	}
	return out
}

// EnvRecords lists the manifest's record of every environment, closed
// ones included (until the GC forgets them), by id: what a view of whole
// lineages needs beside the open ones (Envs).
func (e *Engine) EnvRecords() ([]manifest.Env, error) { return e.man.Envs() }

// NewEnv starts a fresh environment from image and queues the checkpoint
// of its initial state in the background; it returns that state's id.
func (e *Engine) NewEnv(ctx context.Context, imageName string) (*Env, string, error) {
	return e.NewEnvWith(ctx, imageName, launch.Options{})
}

// NewEnvWith is NewEnv with launch options (a task's capability set).
func (e *Engine) NewEnvWith(ctx context.Context, imageName string, o launch.Options) (*Env, string, error) {
	release, err := e.admit(ctx, 1)
	if err != nil {
		return nil, "", err
	}
	defer release()
	le, err := e.o.Launcher.LaunchWith(ctx, imageName, o)
	if err != nil {
		return nil, "", err
	}
	env := &Env{ID: le.ID, Image: imageName, sb: le.Sandbox, volume: le.Volume, dirty: true, stats: &e.stats}
	if err := e.man.PutEnv(manifest.Env{ID: env.ID, Image: imageName, Created: time.Now()}); err != nil {
		le.Close(context.Background())
		return nil, "", fmt.Errorf("record env: %w", err)
	}
	if err := e.register(env); err != nil {
		le.Close(context.Background())
		return nil, "", err
	}
	e.track(ctx, env, nil)
	sid, _, err := e.CheckpointAsync(env, state.Full)
	if err != nil {
		e.closeEnv(context.Background(), env)
		return nil, "", err
	}
	return env, sid, nil
}

// coordStats count checkpoints and how much of their time was exposed.
type coordStats struct {
	checkpoints, checkpointNanos, exposed atomic.Int64
	verified, misses                      atomic.Int64
	revived                               atomic.Int64
	shellDeltas                           atomic.Int64
	deltaImages, deltaSaved               atomic.Int64
	lazyRestores, lazyFailed              atomic.Int64
	phases                                phaseStats
}

// CoordStats are the engine's totals since it opened (checkpoints it
// committed, Verify calls, revives); the coordinator keeps its own counts
// of turns by kind.
type CoordStats struct {
	Checkpoints int64
	// CheckpointTime is the summed duration of the checkpoints taken.
	CheckpointTime time.Duration
	// Exposed is the part of it operations had to wait for (not hidden
	// behind the policy's thinking): of each checkpoint, the part of its
	// run that waits covered, so never more than CheckpointTime.
	Exposed time.Duration
	// Verified counts Verify calls; Misses those that found a difference.
	Verified, Misses int64
	// Revived counts envs whose sandbox died and that were restored at
	// their last committed state (RevivedError).
	Revived int64
	// ShellDeltas counts the checkpoints committed with a shell delta
	// instead of a dump of the processes (docs/engine.md, "Shell delta
	// states").
	ShellDeltas int64
	// DeltaImages counts the process images stored as deltas of their
	// parent state's, DeltaSaved the bytes of pages they left to their
	// bases (docs/engine.md, "Delta images").
	DeltaImages, DeltaSaved int64
	// LazyRestores counts the restores made lazily (Options.LazyBytes),
	// LazyFailed those whose daemon failed after the restore had
	// returned, their sandbox killed (docs/engine.md, "Lazy restore").
	LazyRestores, LazyFailed int64
	// Restores counts the successful restores and RestorePhases sums
	// their time by phase (Phase*; PhaseAdopt: of branch children).
	Restores      int64
	RestorePhases map[string]time.Duration
}

// WaitCheckpoint waits for env's background checkpoint (raising its
// priority) and returns how long it waited; the LLM proxy holds a response
// with it. A failed checkpoint is reported by TakeCheckpointError.
func (e *Engine) WaitCheckpoint(ctx context.Context, env *Env) (time.Duration, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.gate(ctx)
}

// Exec runs one command in env (after its pending checkpoint) and counts a
// turn. When it finds the sandbox dead (its init was killed, before or
// during the command) it restores the env at its last committed state and
// returns a *RevivedError: the env is usable again, the turn did not count.
func (e *Engine) Exec(ctx context.Context, env *Env, cmd string, o sandbox.ExecOptions) (*sandbox.Result, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	if err := env.usable(); err != nil {
		return nil, err // closed, or stopped and its close waits for this call
	}
	if _, err := env.gate(ctx); err != nil {
		return nil, err
	}
	if dead(env.sb, nil) {
		return nil, e.revive(ctx, env, sandbox.ErrDead)
	}
	res, err := e.exec(ctx, env, cmd, o)
	if serr := env.stopErr(); serr != nil {
		// Killed by the fair-share check under the command: never revived.
		return nil, serr
	}
	if err != nil && dead(env.sb, err) {
		return nil, e.revive(ctx, env, err)
	}
	return res, err
}

// exec counts the turn and runs cmd; the caller holds env.mu.
func (e *Engine) exec(ctx context.Context, env *Env, cmd string, o sandbox.ExecOptions) (*sandbox.Result, error) {
	env.turn.Add(1)
	env.dirty = true
	if in := e.o.Inspector; in != nil {
		if err := in.BeginTurn(env.ID); err != nil {
			e.log.Warn("inspector begin turn", slog.String("env", env.ID), slog.Any("err", err))
		}
	}
	return env.sb.Exec(ctx, cmd, o)
}
