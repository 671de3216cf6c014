package branch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// Checkpoint takes a checkpoint of env now (high priority) and returns its
// state id. Kind None returns the current head without a checkpoint.
func (e *Engine) Checkpoint(ctx context.Context, env *Env, kind state.Kind) (string, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	job, sid, _, err := e.submitCheckpoint(ctx, env, kind, queue.High, false)
	if err != nil || job == nil {
		return sid, err
	}
	if err := env.awaitCheckpoint(ctx); err != nil {
		return "", err
	}
	return sid, nil
}

// awaitCheckpoint waits for the checkpoint just submitted and returns its
// failure, which it takes (the next checkpoint is full all the same); the
// caller holds env.mu.
func (env *Env) awaitCheckpoint(ctx context.Context) error {
	if _, err := env.gate(ctx); err != nil {
		return err
	}
	if env.ckptErr != nil {
		err := env.ckptErr
		env.ckptErr = nil
		return err
	}
	return nil
}

// CheckpointAsync queues a checkpoint of env at low priority and returns
// the state id it will have and the kind it queued; the next operation on
// env waits for it. It waits for env's previous checkpoint first; when
// that one failed (TakeCheckpointError reports it), the checkpoint is
// full whatever kind asks, as is an env's first one: this is the one
// place that rule lives (docs/engine.md, The path of a step). Kind None
// returns the current head without a checkpoint.
func (e *Engine) CheckpointAsync(env *Env, kind state.Kind) (string, state.Kind, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	_, sid, kind, err := e.submitCheckpoint(context.Background(), env, kind, queue.Low, false)
	return sid, kind, err
}

// submitCheckpoint queues the job and returns the kind it queued; the
// caller holds env.mu. With held, the caller has frozen the sandbox,
// keeps it frozen and settled kind with the Inspector while frozen: the
// job neither freezes, settles nor thaws.
func (e *Engine) submitCheckpoint(ctx context.Context, env *Env, kind state.Kind, prio queue.Priority, held bool) (*queue.Job, string, state.Kind, error) {
	if !kind.Valid() {
		return nil, "", "", fmt.Errorf("%w: checkpoint kind %q", state.ErrInvalid, kind)
	}
	if err := env.usable(); err != nil {
		return nil, "", "", err
	}
	if _, err := env.gate(ctx); err != nil {
		return nil, "", "", err
	}
	if dead(env.sb, nil) {
		// Nothing to dump: the env goes back to its last committed state.
		return nil, "", "", e.revive(ctx, env, sandbox.ErrDead)
	}
	forced := env.mustFull
	if env.mustFull {
		// The previous state never came to be: this one holds changes no
		// state has, whatever the turn's classification saw.
		kind, env.mustFull = state.Full, false
	}
	if kind == state.None && env.head != "" {
		env.dirty = false
		return nil, env.head, state.None, nil
	}
	parent := env.head
	if parent == "" {
		kind = state.Full // the first state has nothing to share
	}
	sid := state.NewID("s")
	// A shell delta may stand for the process image only in a turn's
	// background checkpoint, never in one forced full (the first state,
	// after a failed checkpoint, a branch of a changed env).
	c := &ckpt{e: e, env: env, sb: env.sb, volume: env.volume, sid: sid, parent: parent, turn: env.Turn(), kind: kind,
		allowDelta: prio == queue.Low && !forced && parent != "", held: held}
	job := e.q.Submit(prio, "checkpoint "+sid, c.run)
	env.pending, env.pendingParent, env.pendingCkpt, env.waits = job, parent, c, nil
	env.setHead(sid)
	env.dirty = false
	return job, sid, kind, nil
}

// ckpt is one checkpoint being taken: what it was queued with, then what
// it made so far. Only the parts the kind says changed are written; the
// others are shared with the parent state.
type ckpt struct {
	e           *Engine
	env         *Env
	sb          *sandbox.Sandbox
	volume      string
	sid, parent string
	turn        int
	kind        state.Kind // settling may grow it
	// allowDelta: the processes' part may be a shell delta on the
	// parent's process image instead of a dump, when the Inspector found
	// one (docs/engine.md, "Shell delta states").
	allowDelta bool
	// held: the caller froze the sandbox (and thaws it) and settled kind
	// while frozen: nothing ran since, so it is not settled again.
	held bool

	// start and end are when it ran, end set once it committed (read by
	// the waiter only after the job finished).
	start, end     time.Time
	parentFS       string         // the parent's filesystem snapshot
	ps, st         manifest.State // the parent state, and the one being made
	delta          *inspector.Delta
	fsArt, procArt *manifest.Artifact
	made           []manifest.Artifact // intents begun: undone on failure
	dir            string              // the process image's directory
	dump           criu.DumpStats
	procBytes      int64 // the process image's bytes, once kept
}

// run writes the artifacts of one state and commits it; it undoes
// everything on failure.
func (c *ckpt) run(ctx context.Context) (err error) {
	c.start = time.Now()
	c.parentFS = c.env.headFS()
	if c.parent != "" {
		if c.ps, err = c.e.man.GetState(c.parent); err != nil {
			return fmt.Errorf("%w: parent state %s: %v", state.ErrCheckpoint, c.parent, err)
		}
	}
	ps := c.ps
	c.st = manifest.State{ID: c.sid, Env: c.env.ID, Parent: c.parent, Turn: c.turn, FS: ps.FS, Proc: ps.Proc,
		ShellDelta: ps.ShellDelta, ShellDigest: ps.ShellDigest, Created: time.Now(), Timings: map[string]time.Duration{}}
	defer func() {
		if err != nil {
			err = c.fail(err)
		}
	}()
	if err := c.sb.Exclusive(func() error { return c.frozen(ctx) }); err != nil {
		return err
	}
	crashPoint("dump", c.made)
	if err := c.keep(ctx); err != nil {
		return err
	}
	return c.commit()
}

// fail undoes what c made and returns err as the checkpoint's failure.
func (c *ckpt) fail(err error) error {
	e, envID := c.e, c.env.ID
	for _, a := range c.made {
		e.deleteArtifact(context.Background(), a)
		e.man.AbortArtifact(a.ID)
	}
	if agentCaused(err) {
		// The sandbox's own doing: the cause stays testable
		// (docs/protocol.md, Errors: env_error, unrestorable_state).
		err = fmt.Errorf("%w: state %s of env %s: %w", state.ErrCheckpoint, c.sid, envID, err)
		e.log.Info("checkpoint failed on the sandbox's own state", slog.String("env", envID), slog.String("state", c.sid), slog.Any("err", err))
	} else {
		err = fmt.Errorf("%w: state %s of env %s: %v", state.ErrCheckpoint, c.sid, envID, err)
		e.log.Error("checkpoint failed", slog.String("env", envID), slog.String("state", c.sid), slog.Any("err", err))
	}
	e.failed.add(c.sid, err)
	return err
}

// frozen is what is taken with the sandbox frozen: the kind settled, the
// intents, the files' snapshot, the processes' dump and the Inspector's
// new baseline.
func (c *ckpt) frozen(ctx context.Context) error {
	if !c.held {
		t := time.Now()
		if err := c.sb.Freeze(); err != nil {
			return fmt.Errorf("freeze: %w", err)
		}
		defer c.sb.Thaw()
		c.st.Timings["freeze"] = time.Since(t)
	}
	c.settle(ctx)
	if err := c.plan(); err != nil {
		return err
	}
	if c.procArt == nil && (c.fsArt != nil || c.delta != nil) {
		// The state keeps an earlier process image, which holds no
		// POSIX message queue nor undumpable descriptor (a dump
		// refuses them): one living now would be lost
		// (docs/inspector.md, "Kernel state coverage").
		if err := criu.RefuseUnrestorable(c.sb.InitPID()); err != nil {
			return err
		}
	}
	crashPoint("intent", c.made)
	if c.fsArt != nil {
		t := time.Now()
		if err := c.e.o.Snap.Snapshot(ctx, c.volume, c.fsArt.Location); err != nil {
			return fmt.Errorf("snapshot files: %w", err)
		}
		c.st.Timings["snapshot"] = time.Since(t)
		c.fsArt.Bytes = c.e.snapshotBytes(ctx, c.env, c.volume)
	}
	if c.procArt != nil {
		t := time.Now()
		if err := c.dumpProcs(ctx); err != nil {
			return err
		}
		c.st.Timings["dump"] = time.Since(t)
	}
	c.rebaseline()
	return nil
}

// settle has the Inspector re-check the kind, frozen, and takes the shell
// delta that may stand for the processes' dump.
func (c *ckpt) settle(ctx context.Context) {
	in := c.e.o.Inspector
	if in == nil {
		return
	}
	if !c.held && (c.kind != state.Full || c.allowDelta) {
		// A background process may have written or run since the
		// turn was classified: the inspector re-checks, frozen (for
		// a full checkpoint only the processes a shell delta would
		// take from the last image).
		t := time.Now()
		k, why, _ := in.Settle(ctx, c.env.ID, c.kind, c.e.target(c.sb, c.volume, c.parentFS, ""))
		if k != c.kind {
			c.e.log.Info("checkpoint grew while settling", slog.String("env", c.env.ID), slog.String("from", string(c.kind)),
				slog.String("to", string(k)), slog.Any("why", why))
			c.kind = k
		}
		c.st.Timings["settle"] = time.Since(t)
	}
	if c.allowDelta && c.ps.Proc != "" && (c.kind == state.Proc || c.kind == state.Full) {
		if d, ok := in.TakeShellDelta(c.env.ID); ok {
			c.delta = &d
		}
	}
}

// plan records the intents for the artifacts the kind needs.
func (c *ckpt) plan() error {
	st := &c.st
	st.Kind = c.kind
	if c.kind == state.FS || c.kind == state.Full {
		id := state.NewID("f")
		c.fsArt = &manifest.Artifact{ID: id, Kind: manifest.ArtifactFS, Location: SnapshotPrefix + id, Created: time.Now()}
		st.FS = id
	}
	if c.delta != nil {
		st.ShellDelta, st.ShellDigest = c.delta.Script, c.delta.Digest
	} else if c.kind == state.Proc || c.kind == state.Full {
		st.ShellDelta, st.ShellDigest = "", ""
		id := state.NewID("p")
		c.procArt = &manifest.Artifact{ID: id, Kind: manifest.ArtifactProc, Location: id, Created: time.Now()}
		st.Proc = id
	}
	for _, a := range []*manifest.Artifact{c.fsArt, c.procArt} {
		if a == nil {
			continue
		}
		if err := c.e.man.BeginArtifact(*a); err != nil {
			return err
		}
		c.made = append(c.made, *a)
	}
	if c.procArt != nil {
		var err error
		if c.dir, err = c.e.cache.NewDir(c.procArt.Location); err != nil {
			return err
		}
	}
	return nil
}

// dumpProcs dumps the frozen sandbox's processes into c.dir.
func (c *ckpt) dumpProcs(ctx context.Context) error {
	sb := c.sb
	// What init and the shell hold goes with the image: every
	// restore of it must bring back the same (sandbox.Restore).
	rec, err := sb.Isolation()
	if err != nil {
		return err
	}
	if err := sandbox.WriteIsolationRecord(c.dir, rec); err != nil {
		return err
	}
	// A lazily restored tree is dumped once all its memory is
	// in: CRIU would dump the pages still missing as zeros
	// (docs/engine.md, "Lazy restore").
	wctx, cancel := context.WithTimeout(ctx, lazyDumpWait)
	err = sb.WaitHeld(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("wait for the lazy restore's pages: %w", err)
	}
	c.dump, err = c.e.o.CRIU.Dump(ctx, dumpRequest(sb, c.dir))
	if err != nil {
		return err
	}
	// A lazily restored tree whose page daemon failed may have
	// read, and so dumped, zeros (docs/engine.md, "Lazy restore").
	if err := sb.Err(); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	return nil
}

// rebaseline tells the Inspector what the checkpoint took: its new
// baseline.
func (c *ckpt) rebaseline() {
	in := c.e.o.Inspector
	if in == nil {
		return
	}
	fsNow := c.parentFS
	if c.fsArt != nil {
		fsNow = c.fsArt.Location
	}
	k := c.kind
	if c.delta != nil {
		// The processes' part is the delta, which TakeShellDelta
		// made the shell's baseline; the image stays the base.
		k = state.None
		if c.fsArt != nil {
			k = state.FS
		}
	}
	if err := in.Checkpointed(c.env.ID, k, c.e.target(c.sb, c.volume, fsNow, "")); err != nil {
		c.e.log.Warn("inspector baseline after checkpoint", slog.String("env", c.env.ID), slog.Any("err", err))
	}
}

// keep records the artifacts' sizes and keeps the process image, as a
// delta on the parent's where that pays; the sandbox runs on meanwhile.
func (c *ckpt) keep(ctx context.Context) error {
	e := c.e
	if c.fsArt != nil && c.fsArt.Bytes > 0 {
		if err := e.man.SetArtifactBytes(c.fsArt.ID, c.fsArt.Bytes); err != nil {
			return err
		}
	}
	if c.procArt == nil {
		return nil
	}
	// Thawed: the delta is made while the sandbox runs on.
	t := time.Now()
	base, ds, err := e.deltaImage(ctx, c.dir, c.dump.Bytes, c.ps.Proc, c.sb.UserNS().Enabled)
	if err != nil {
		return err
	}
	if base != "" {
		c.st.Timings["delta"] = time.Since(t)
	}
	n, err := e.cache.Commit(c.procArt.Location)
	if err != nil {
		return fmt.Errorf("keep process image: %w", err)
	}
	if err := e.checkImageBudget(c.env, n); err != nil {
		return err
	}
	c.procBytes = n
	if base != "" {
		err = e.man.SetArtifactDelta(c.procArt.ID, base, n, n+ds.Before-ds.After)
	} else {
		err = e.man.SetArtifactBytes(c.procArt.ID, n)
	}
	if err != nil {
		return err
	}
	c.st.Timings["frozen_by_criu"] = c.dump.FrozenTime
	return nil
}

// commit commits the state: from here on nothing is undone.
func (c *ckpt) commit() error {
	e := c.e
	c.st.Timings["total"] = time.Since(c.start)
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	ids := make([]string, 0, len(c.made))
	for _, a := range c.made {
		ids = append(ids, a.ID)
	}
	crashPoint("commit", c.made)
	if err := e.man.CommitState(c.st, ids...); err != nil {
		return fmt.Errorf("commit state: %w", err)
	}
	c.made = nil // committed: nothing to undo
	c.env.images.Add(c.procBytes)
	e.stats.checkpoints.Add(1)
	if c.delta != nil {
		e.stats.shellDeltas.Add(1)
	}
	e.stats.checkpointNanos.Add(int64(c.st.Timings["total"]))
	c.end = c.start.Add(c.st.Timings["total"])
	if c.fsArt != nil {
		c.env.setHeadFS(c.fsArt.Location)
	}
	e.log.Debug("checkpoint", slog.String("env", c.env.ID), slog.String("state", c.sid), slog.String("kind", string(c.kind)),
		slog.Bool("shell_delta", c.delta != nil), slog.Duration("took", c.st.Timings["total"]))
	e.afterCheckpoint(c.parent, c.sid)
	return nil
}

// State returns the manifest record of a state.
func (e *Engine) State(id string) (manifest.State, error) {
	st, err := e.man.GetState(id)
	if errors.Is(err, manifest.ErrNotFound) {
		return st, e.unknownState(id)
	}
	return st, err
}

// Lineage returns a state and its ancestors, root first.
func (e *Engine) Lineage(id string) ([]manifest.State, error) {
	l, err := e.man.Lineage(id)
	if errors.Is(err, manifest.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", state.ErrUnknownState, id)
	}
	return l, err
}

// States lists the committed states of an environment, oldest first.
func (e *Engine) States(envID string) ([]manifest.State, error) { return e.man.States(envID) }

// Written sums the artifacts an environment's states reference that were
// made at or after since, by kind: what that env's checkpoints wrote. It
// reads records, not pool usage, so artifacts the GC removes meanwhile
// (another env's, at the end of its retention) do not count against it.
func (e *Engine) Written(envID string, since time.Time) (map[manifest.ArtifactKind]manifest.KindUsage, error) {
	states, err := e.man.States(envID)
	if err != nil {
		return nil, err
	}
	out := map[manifest.ArtifactKind]manifest.KindUsage{}
	seen := map[string]bool{}
	for _, s := range states {
		for _, id := range []string{s.FS, s.Proc} {
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			a, err := e.man.GetArtifact(id)
			if err != nil {
				return nil, err
			}
			if a.Created.Before(since) {
				continue
			}
			u := out[a.Kind]
			u.Count++
			u.Bytes += a.Bytes
			out[a.Kind] = u
		}
	}
	return out, nil
}

// snapshotBytes is the size of the file snapshot just taken of volume:
// what the root wrote since its previous snapshot that still exists (the
// growth of cr.QuotaUsage.Charged), 0 when the backend does not tell
// (docs/engine.md, "Accounting").
func (e *Engine) snapshotBytes(ctx context.Context, env *Env, volume string) int64 {
	q, ok := e.o.Snap.(cr.Quotaer)
	if !ok {
		return 0
	}
	u, err := q.Quota(ctx, volume)
	if err != nil || u.Charged <= 0 {
		return 0
	}
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	base := env.charged
	if env.chargedVol != volume {
		base = 0 // a new root: a clone starts with nothing charged
	}
	env.charged, env.chargedVol = u.Charged, volume
	return max(u.Charged-base, 0)
}

// ImageBytes returns the size of state sid's process image as stored (a
// delta image's own bytes, docs/engine.md "Delta images") and as CRIU
// dumped it (what a restore brings back).
func (e *Engine) ImageBytes(sid string) (stored, whole int64, err error) {
	st, err := e.man.GetState(sid)
	if err != nil {
		return 0, 0, err
	}
	a, err := e.man.GetArtifact(st.Proc)
	if err != nil {
		return 0, 0, err
	}
	return a.Bytes, wholeBytes(a), nil
}

// StateBytes is what a state takes on its own: the sizes of the artifacts
// it made (a new file snapshot for kinds fs and full, a new process image
// for proc and full), and what its lineage, the state and all its
// ancestors, takes: every distinct artifact they reference once. A file
// snapshot's size is 0 when the backend does not tell (docs/engine.md,
// "Accounting").
func (e *Engine) StateBytes(line []manifest.State) (own []int64, total int64) {
	size := map[string]int64{}
	bytes := func(id string) int64 {
		if id == "" {
			return 0
		}
		if n, ok := size[id]; ok {
			return n
		}
		a, err := e.man.GetArtifact(id)
		if err != nil {
			return 0
		}
		size[id] = a.Bytes
		return a.Bytes
	}
	own = make([]int64, len(line))
	for i, st := range line {
		if st.Kind == state.FS || st.Kind == state.Full {
			own[i] += bytes(st.FS)
		}
		if st.Dumped() {
			own[i] += bytes(st.Proc)
		}
		bytes(st.FS)
		bytes(st.Proc)
	}
	for _, n := range size {
		total += n
	}
	return own, total
}

// span is a stretch of time.
type span struct{ from, to time.Time }

// exposed is the part of c's run (as counted in its total) that the
// waits cover: none for a checkpoint that did not commit, at most its
// total.
func (c *ckpt) exposed(waits []span) time.Duration {
	if c.end.IsZero() {
		return 0
	}
	var d time.Duration
	for _, w := range waits {
		from, to := w.from, w.to
		if from.Before(c.start) {
			from = c.start
		}
		if to.After(c.end) {
			to = c.end
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return min(d, c.end.Sub(c.start))
}

// dumpRequest is how the engine asks CRIU to dump sb's tree into dir.
func dumpRequest(sb *sandbox.Sandbox, dir string) criu.DumpRequest {
	return criu.DumpRequest{PID: sb.InitPID(), Dir: dir, FreezeCgroup: sb.FreezerCgroup(), UserNS: sb.UserNS().Enabled, Root: sb.Root()}
}

// DumpForCompare dumps env's process tree into dir (existing, empty) as
// its checkpoints do, leaves it running and records nothing: the skip
// fuzzer compares the images of a live env with a branch's
// (cr/imgcompare). A checkpoint still running is waited for first (its
// failure stays for TakeCheckpointError).
func (e *Engine) DumpForCompare(ctx context.Context, env *Env, dir string) error {
	env.mu.Lock()
	defer env.mu.Unlock()
	if err := env.usable(); err != nil {
		return err
	}
	if _, err := env.gate(ctx); err != nil {
		return err
	}
	// As a checkpoint's dump: no connection of the server's into the
	// sandbox (CRIU cannot dump its socket), the tree frozen without a
	// pending SIGTRAP.
	sb := env.sb
	return sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return fmt.Errorf("freeze: %w", err)
		}
		defer sb.Thaw()
		return e.o.CRIU.DumpForCompare(ctx, dumpRequest(sb, dir))
	})
}
