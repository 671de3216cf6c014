package branch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// restored is a sandbox brought back from a state, with its root volume.
type restored struct {
	sb     *sandbox.Sandbox
	volume string
	fsLoc  string // the snapshot the root was cloned from
	// imageShell is the shell state of the process image, read before a
	// shell delta was run on it; nil for a state without one.
	imageShell *inspector.ShellState
	// lazy is the daemon of a lazy restore (the sandbox holds it).
	lazy *criu.LazyPages
	// tracked: the Inspector tracks it already, under the id of the env
	// it becomes, its baseline taken (a warm copy, frozen since).
	tracked bool
}

// handedOut lowers a lazy restore's daemon to the background once its
// sandbox is handed out (a branch child registered, a rollback swapped
// in): before, its tree's first touches (init's answer, the Inspector's
// baseline) are served at full priority; after, its copy of the pages
// nobody asked for yields the CPU to the restores still running.
func (e *Engine) handedOut(r restored) {
	if r.lazy == nil {
		return
	}
	if err := r.lazy.Background(); err != nil {
		e.log.Warn("lazy restore", slog.Any("err", err))
	}
}

// restore brings state sid back as a new sandbox named name: a writable
// clone of the state's filesystem snapshot as root, and its process image
// restored by CRIU into it. Nothing is left behind on failure.
func (e *Engine) restore(ctx context.Context, sid, name string) (restored, error) {
	return e.restoreFrom(ctx, sid, name, nil)
}

// restoreFrom is restore with the new root taken from ahead when it was
// cloned there (a branch's children; nil: none).
func (e *Engine) restoreFrom(ctx context.Context, sid, name string, ahead *aheadClones) (r restored, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w: state %s: %w", state.ErrRestore, sid, err)
		}
	}()
	ph := e.stats.phases.start()
	defer func() { ph.done(err == nil) }()
	st, err := e.man.GetState(sid)
	if err != nil {
		return r, err
	}
	fsA, err := e.man.GetArtifact(st.FS)
	if err != nil {
		return r, fmt.Errorf("filesystem artifact: %w", err)
	}
	procA, err := e.man.GetArtifact(st.Proc)
	if err != nil {
		return r, fmt.Errorf("process artifact: %w", err)
	}
	ph.mark(PhaseManifest)
	dir, release, err := e.cache.Acquire(ctx, procA.Location)
	if err != nil {
		return r, fmt.Errorf("process image %s: %w", procA.ID, err)
	}
	ph.mark(PhaseImage)
	// A lazy restore's daemon keeps the image pinned until it has served
	// every page (serveLazily); every other restore lets it go here.
	var lp *criu.LazyPages
	defer func() {
		if lp == nil {
			release()
		}
	}()
	// A lazy restore's daemon starts beside the clone and the sandbox's
	// set-up (it needs only the images); joined before CRIU restores.
	var started chan lazyStart
	if e.lazy(procA) {
		started = make(chan lazyStart, 1)
		go func() {
			d, err := e.o.CRIU.StartLazyPages(ctx, dir)
			started <- lazyStart{d, err}
		}()
		defer func() {
			if started != nil { // never joined: the restore failed first
				if s := <-started; s.d != nil {
					s.d.Close()
				}
			}
		}()
	}
	vol := launch.VolumePrefix + name
	made, err := ahead.take(ctx, vol)
	if err != nil {
		return r, err
	}
	if !made {
		if err := e.o.Snap.Clone(ctx, fsA.Location, vol); err != nil {
			return r, fmt.Errorf("clone %s: %w", fsA.Location, err)
		}
	}
	defer func() {
		if err != nil {
			if derr := e.o.Snap.Destroy(context.Background(), vol); derr != nil {
				e.log.Warn("remove volume of failed restore", slog.String("volume", vol), slog.Any("err", derr))
			}
		}
	}()
	ph.mark(PhaseClone)
	disk, err := launch.SetDiskQuota(ctx, e.o.Snap, vol, e.o.Limits)
	if err != nil {
		return r, err
	}
	root := e.o.Snap.Path(vol)
	// A state is restored in the mode it was made in, which its root's
	// owner tells (docs/sandbox.md, "User namespace mode").
	u, err := sandbox.UserNSOfRoot(root, e.o.Launcher.UserNS.Size)
	if err != nil {
		return r, err
	}
	expect, err := sandbox.ReadIsolationRecord(dir)
	if err != nil {
		return r, err
	}
	if u.Enabled && started != nil {
		// User namespace mode restores eagerly: lazy restore is not
		// tested in it (docs/engine.md, "Lazy restore").
		if s := <-started; s.d != nil {
			s.d.Close()
		}
		started = nil
	}
	var daemon *criu.LazyPages
	ph.mark(PhaseQuota)
	sb, err := sandbox.Restore(ctx, sandbox.Config{ID: name, Root: root, Limits: e.o.Limits, Isolation: e.isolation(), Disk: disk, Logger: e.log, UserNS: u}, expect,
		func(join func(int) error) (int, error) {
			ph.mark(PhaseCgroup)
			defer ph.mark(PhaseCRIU)
			req := criu.RestoreRequest{Dir: dir, Root: root, Join: join, UserNS: u.Enabled}
			if started == nil {
				return e.o.CRIU.Restore(ctx, req)
			}
			s := <-started
			started = nil
			if s.err != nil {
				return 0, s.err
			}
			daemon = s.d
			return e.o.CRIU.RestoreLazily(ctx, req, daemon)
		})
	ph.mark(PhaseSandbox)
	if err != nil {
		if daemon != nil {
			// sandbox.Restore killed the tree it served.
			daemon.Close()
		}
		return r, err
	}
	if daemon != nil {
		lp = daemon
		e.serveLazily(sb, daemon, release)
		e.stats.phases.add(PhaseLazyStart, daemon.Startup())
	}
	r = restored{sb: sb, volume: vol, fsLoc: fsA.Location, lazy: lp}
	if st.ShellDigest != "" {
		img, err := e.applyShellDelta(ctx, sb, st)
		if err != nil {
			if derr := sb.Destroy(context.Background()); derr != nil {
				e.log.Warn("destroy sandbox of failed restore", slog.String("volume", vol), slog.Any("err", derr))
			}
			return restored{}, err
		}
		r.imageShell = &img
	}
	ph.mark(PhaseShell)
	return r, nil
}

// lazyDumpWait bounds how long a checkpoint waits for a lazily restored
// tree's daemon to have copied all its memory in (a 256 MiB tree takes
// well under a second here; a daemon at nice 19 on a busy machine more).
const lazyDumpWait = 2 * time.Minute

// lazyStart is a lazy-pages daemon started for a restore, or why not.
type lazyStart struct {
	d   *criu.LazyPages
	err error
}

// lazy reports whether a process image is restored lazily: when it is
// at least Options.LazyBytes (docs/engine.md, "Lazy restore").
func (e *Engine) lazy(img manifest.Artifact) bool {
	n := e.lazyBytes.Load()
	return n > 0 && wholeBytes(img) >= n
}

// SetLazyBytes replaces Options.LazyBytes for the restores that start
// from now on (the benchmark times both ways on one engine).
func (e *Engine) SetLazyBytes(n int64) { e.lazyBytes.Store(n) }

// serveLazily ties a lazy restore's daemon to the sandbox it serves: the
// sandbox's Destroy closes it (after the tree is killed), a command after
// it failed finds the sandbox dead (sandbox.Failing), and the image stays
// pinned in the cache, out of the GC's and the eviction's reach, until the
// daemon has exited. A daemon that fails while the tree runs has left it
// with pages it can no longer serve: the tree is killed at once, so the
// env is revived at its last committed state on its next command.
func (e *Engine) serveLazily(sb *sandbox.Sandbox, d *criu.LazyPages, release func()) {
	sb.Hold(d)
	e.stats.lazyRestores.Add(1)
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		<-d.Done()
		release()
		if err := d.Err(); err != nil {
			select {
			case <-sb.Exited(): // destroyed (Destroy closed the daemon) or died
			default:
				e.log.Error("lazy-pages daemon failed: killing the sandbox it served", slog.String("sandbox", sb.ID()), slog.Any("err", err))
				e.stats.lazyFailed.Add(1)
				sb.Kill()
			}
		}
	}()
}

// applyShellDelta runs a shell delta state's script in the shell of its
// freshly restored process image and checks that the shell then holds
// the state the checkpoint recorded: a mismatch is an error, never a
// silently different state. It returns the image's shell state, read
// before the script ran (the base of the env's later deltas).
func (e *Engine) applyShellDelta(ctx context.Context, sb *sandbox.Sandbox, st manifest.State) (inspector.ShellState, error) {
	img, err := readShell(ctx, sb)
	if err != nil {
		return img, fmt.Errorf("read the shell of the image: %w", err)
	}
	if st.ShellDelta == "" {
		if img.Digest != st.ShellDigest {
			return img, fmt.Errorf("%w: the image's shell differs from the state's", ErrShellDelta)
		}
		return img, nil
	}
	res, err := sb.Exec(ctx, st.ShellDelta, sandbox.ExecOptions{Timeout: shellDeltaTimeout, MaxOutput: 64 << 10})
	if err != nil {
		return img, fmt.Errorf("run the shell delta: %w", err)
	}
	if res.TimedOut || res.ShellRestarted {
		return img, fmt.Errorf("%w: the script timed out or ended the shell", ErrShellDelta)
	}
	now, err := readShell(ctx, sb)
	if err != nil {
		return img, fmt.Errorf("read the shell after its delta: %w", err)
	}
	if now.Digest != st.ShellDigest {
		return img, fmt.Errorf("%w: exit code %d, stderr %q", ErrShellDelta, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return img, nil
}

// shellDeltaTimeout bounds a shell delta's run; it is builtins only.
const shellDeltaTimeout = 10 * time.Second

// isolation is the policy restored sandboxes must satisfy: the launcher's
// (the server's flags), else the hardened default.
func (e *Engine) isolation() sandbox.Isolation {
	if e.o.Launcher != nil {
		return e.o.Launcher.Isolation
	}
	return sandbox.Isolation{}
}

// Source names what to branch: an open environment (its current state is
// checkpointed first if it changed) or a state id.
type Source struct {
	Env   *Env
	State string
	// Background restores at low priority, behind waiting work (for
	// refilling pools ahead of demand).
	Background bool
}

// BranchResult is what Branch made: one entry per requested child, in
// order; a child that failed has a nil Env and its error.
type BranchResult struct {
	State    string
	Children []*Env
	Errors   []error
	Took     time.Duration
}

// Branch makes n independent environments whose state equals the source
// state, restored in parallel at high priority. A failure is reported per
// child; the others are still returned.
func (e *Engine) Branch(ctx context.Context, src Source, n int) (*BranchResult, error) {
	start := time.Now()
	if n < 1 {
		return nil, fmt.Errorf("%w: branch n=%d, want at least 1", state.ErrInvalid, n)
	}
	release, err := e.admit(ctx, n)
	if err != nil {
		return nil, err
	}
	defer release()
	sid := src.State
	if src.Env != nil {
		var err error
		if sid, err = e.currentState(ctx, src.Env); err != nil {
			return nil, err
		}
	}
	// A pending branch keeps its state: GC leaves it until the children
	// are restored (docs/engine.md, "Retention"). Held and looked up under
	// the GC lock, so that no pass falls between the look-up and the hold.
	e.gcMu.RLock()
	e.hold(sid)
	st, err := e.State(sid)
	e.gcMu.RUnlock()
	defer e.unhold(sid)
	if err != nil {
		return nil, err
	}
	res := &BranchResult{State: sid, Children: make([]*Env, n), Errors: make([]error, n)}
	// Children branched from an environment belong to it (promote hands
	// their state back to it); children of a bare state id to the
	// environment that made the state.
	origin := st.Env
	if src.Env != nil {
		origin = src.Env.ID
	}
	prio := queue.High
	if src.Background {
		prio = queue.Low
	}
	warm := e.takeWarm(sid, n)
	ids := make([]string, n)
	for i := len(warm); i < n; i++ {
		ids[i] = state.NewID("")
	}
	// Two or more cold children of a branch somebody waits for: their
	// roots are cloned ahead, where the backend allows it (a background
	// branch's would queue on btrfs's locks beside the roots of branches
	// waited for). Without the state's file artifact each restore reports
	// that itself.
	var ahead *aheadClones
	ac, canAhead := e.o.Snap.(cr.AheadCloner)
	canAhead = canAhead && ac.CloneAhead()
	if fsA, err := e.man.GetArtifact(st.FS); err == nil && canAhead && n-len(warm) > 1 && prio == queue.High {
		vols := make([]string, 0, n-len(warm))
		for _, id := range ids[len(warm):] {
			vols = append(vols, launch.VolumePrefix+childName(id))
		}
		if ahead = e.cloneAhead(ctx, fsA.Location, vols); ahead != nil {
			// Not waited for: a caller whose ctx ended is answered at
			// once (a clone in flight may take a while).
			defer func() { go ahead.finish() }()
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		i := i
		if i < len(warm) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res.Children[i], res.Errors[i] = e.adoptWarm(ctx, warm[i], st, origin)
			}()
			continue
		}
		id := ids[i]
		h := &handoff{}
		job := e.q.Submit(prio, "branch "+sid+" -> "+id, func(qctx context.Context) error {
			return e.newChild(qctx, ctx, h, id, st, origin, ahead)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.Children[i], res.Errors[i] = h.take(ctx, job)
		}()
	}
	wg.Wait()
	res.Took = time.Since(start)
	return res, nil
}

// currentState returns a state id equal to env's current state,
// checkpointing it (full, high priority) when it changed since its head.
func (e *Engine) currentState(ctx context.Context, env *Env) (string, error) {
	env.mu.Lock()
	dirty, head, unusable := env.dirty, env.head, env.usable()
	env.mu.Unlock()
	if unusable != nil {
		return "", unusable
	}
	if !dirty && head != "" {
		env.mu.Lock()
		_, err := env.gate(ctx)
		failed := env.ckptErr
		env.mu.Unlock()
		if err != nil {
			return "", err
		}
		if failed == nil {
			return head, nil
		}
	}
	return e.Checkpoint(ctx, env, state.Full)
}

// handoff passes a branch child from the queue job that restores it to
// the Branch call that asked for it. The call stops waiting when its ctx
// ends, while the job may still be queued or running: from then on the job
// owns what it makes and destroys it, so that no child is registered that
// nobody holds (docs/engine.md, "Restore, branch, rollback").
type handoff struct {
	mu   sync.Mutex
	env  *Env
	gone bool // the caller stopped waiting
}

// take waits for job and returns the child it handed over. When ctx ends
// first, a child handed over by then is still the caller's; any later one
// is the job's to destroy.
func (h *handoff) take(ctx context.Context, job *queue.Job) (*Env, error) {
	err := job.Wait(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.env != nil {
		return h.env, nil
	}
	h.gone = true
	if err == nil {
		err = errors.New("branch job made no child")
	}
	return nil, err
}

// deliver registers a restored child (adopt) for the caller, or destroys
// it (discard) when the caller has stopped waiting.
func (h *handoff) deliver(adopt func() (*Env, error), discard func()) error {
	h.mu.Lock()
	if h.gone {
		h.mu.Unlock()
		discard()
		return errAbandoned
	}
	defer h.mu.Unlock()
	env, err := adopt()
	h.env = env
	return err
}

// newChild restores st as a new environment called id and hands it over
// through h. ctx is the Branch caller's: a job that starts after it ended
// restores nothing. The restore itself runs under the queue's qctx.
func (e *Engine) newChild(qctx, ctx context.Context, h *handoff, id string, st manifest.State, origin string, ahead *aheadClones) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	r, err := e.restoreFrom(qctx, st.ID, childName(id), ahead)
	if err != nil {
		return err
	}
	t := time.Now()
	defer func() { e.stats.phases.add(PhaseAdopt, time.Since(t)) }()
	defer e.handedOut(r)
	return h.deliver(func() (*Env, error) { return e.adopt(qctx, id, r, st, origin) }, func() { e.discard(r) })
}

// childName is the sandbox (and root volume) name of a new env's first
// sandbox.
func childName(id string) string { return id + "-0" }

// discard destroys a restored sandbox nobody adopted.
func (e *Engine) discard(r restored) {
	ctx := context.Background()
	if err := r.sb.Destroy(ctx); err != nil {
		e.log.Warn("destroy unadopted sandbox", slog.String("volume", r.volume), slog.Any("err", err))
	}
	if err := e.o.Snap.Destroy(ctx, r.volume); err != nil {
		e.log.Warn("remove unadopted volume", slog.String("volume", r.volume), slog.Any("err", err))
	}
}

// adopt registers a restored sandbox as environment id at state st.
func (e *Engine) adopt(ctx context.Context, id string, r restored, st manifest.State, origin string) (*Env, error) {
	parent, _ := e.man.GetEnv(st.Env)
	env := &Env{ID: id, Image: parent.Image, Origin: origin, sb: r.sb, volume: r.volume, head: st.ID, pubHead: st.ID, fsLoc: r.fsLoc, stats: &e.stats}
	env.turn.Store(int64(st.Turn))
	err := e.man.PutEnv(manifest.Env{ID: id, Image: parent.Image, Head: st.ID, Origin: origin, Created: time.Now()})
	if err == nil {
		err = e.register(env)
	}
	if err != nil {
		if r.tracked {
			e.untrack(id)
		}
		e.discard(r)
		return nil, err
	}
	if !r.tracked {
		e.track(ctx, env, r.imageShell)
	}
	return env, nil
}

// Rollback returns env to state sid: its sandbox is replaced by one
// restored from sid. When the restore fails env is left as it was.
func (e *Engine) Rollback(ctx context.Context, env *Env, sid string) error {
	env.mu.Lock()
	defer env.mu.Unlock()
	if err := env.usable(); err != nil {
		return err
	}
	if _, err := env.gate(ctx); err != nil {
		return err
	}
	// The state is looked up under the GC lock: GC cannot take it between
	// the look-up and the restore.
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	st, err := e.State(sid)
	if err != nil {
		return err
	}
	r, err := e.restore(ctx, sid, env.ID+"-"+strconv.Itoa(env.gen+1))
	if err != nil {
		return err
	}
	e.swapIn(ctx, env, r, st)
	e.handedOut(r)
	return nil
}

// swapIn makes r, restored from st, env's sandbox and st its head, and
// destroys the sandbox it replaces (rollback, revive). The caller holds
// env.mu.
func (e *Engine) swapIn(ctx context.Context, env *Env, r restored, st manifest.State) {
	old, oldVol := env.sb, env.volume
	env.gen++
	env.sb, env.volume, env.dirty = r.sb, r.volume, false
	env.publish()
	env.turn.Store(int64(st.Turn))
	env.setHead(st.ID)
	env.setHeadFS(r.fsLoc)
	e.track(ctx, env, r.imageShell)
	if err := e.man.SetHead(env.ID, st.ID); err != nil {
		e.log.Warn("record head after restore", slog.String("env", env.ID), slog.Any("err", err))
	}
	if err := old.Destroy(ctx); err != nil {
		e.log.Warn("destroy replaced sandbox", slog.String("env", env.ID), slog.Any("err", err))
	}
	if err := e.o.Snap.Destroy(ctx, oldVol); err != nil {
		e.log.Warn("remove replaced volume", slog.String("volume", oldVol), slog.Any("err", err))
	}
}

// Promote adopts child's current state as the new state of the environment
// it was branched from (draft/verify loops keep a draft this way): the
// origin is rolled back to it, and the child is closed. It returns the
// adopted state id.
func (e *Engine) Promote(ctx context.Context, child *Env) (string, error) {
	if child.Origin == "" {
		return "", fmt.Errorf("%w: env %s was not branched from another env", state.ErrInvalid, child.ID)
	}
	origin, err := e.Env(child.Origin)
	if err != nil {
		return "", fmt.Errorf("promote %s: origin: %w", child.ID, err)
	}
	sid, err := e.currentState(ctx, child)
	if err != nil {
		return "", err
	}
	if err := e.Rollback(ctx, origin, sid); err != nil {
		return "", err
	}
	return sid, e.CloseEnv(ctx, child)
}

// CloseEnv destroys env and releases its states: they stay for
// Options.Retain, and states that other environments descend from (or
// that are pinned) stay until those release them too. The background
// GC removes them (docs/engine.md, "Retention"); CloseEnv only nudges it.
func (e *Engine) CloseEnv(ctx context.Context, env *Env) error {
	err := e.closeEnv(ctx, env)
	e.nudgeGC()
	return err
}

// closeEnv destroys env and closes it in the manifest releasing its
// states (manifest.ReleaseEnvAt): CloseEnv, Promote and a graceful Close
// all close an env this way, so its lineage falls under the retention
// from now on.
func (e *Engine) closeEnv(ctx context.Context, env *Env) error {
	env.mu.Lock()
	defer env.mu.Unlock()
	if env.closed {
		return nil
	}
	env.gate(ctx)
	env.closed = true
	e.mu.Lock()
	delete(e.envs, env.ID)
	stillHead := e.isHead(env.head)
	e.mu.Unlock()
	if !stillHead {
		e.dropWarm(ctx, env.head)
	}
	if in := e.o.Inspector; in != nil {
		in.Untrack(env.ID)
	}
	return errors.Join(env.sb.Destroy(ctx), e.o.Snap.Destroy(ctx, env.volume), e.man.ReleaseEnvAt(env.ID, e.now()))
}

// CurrentState is the id of a committed state equal to env now: its head,
// or a full checkpoint taken now when the env changed since (or its last
// checkpoint failed). An evaluation reads the env's files from it.
func (e *Engine) CurrentState(ctx context.Context, env *Env) (string, error) {
	return e.currentState(ctx, env)
}

// StateFiles returns the host directory that holds state sid's files (its
// read-only filesystem snapshot), kept from the GC until release is
// called. Nothing may write there; symbolic links in it are the
// sandbox's, to be resolved inside it, never on the host.
func (e *Engine) StateFiles(sid string) (dir string, release func(), err error) {
	// Held and looked up under the GC lock, as a branch does.
	e.gcMu.RLock()
	e.hold(sid)
	st, err := e.State(sid)
	e.gcMu.RUnlock()
	release = func() { e.unhold(sid) }
	if err != nil {
		release()
		return "", nil, err
	}
	a, err := e.man.GetArtifact(st.FS)
	if err != nil {
		release()
		return "", nil, fmt.Errorf("%w: state %s: its file snapshot: %w", state.ErrUnknownState, sid, err)
	}
	return e.o.Snap.Path(a.Location), release, nil
}
