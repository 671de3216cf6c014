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
		return nil, "", "", fmt.Errorf("%w: checkpoint kind %q", ErrBadRequest, kind)
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
	turn := env.Turn()
	sb, volume := env.sb, env.volume
	// A shell delta may stand for the process image only in a turn's
	// background checkpoint, never in one forced full (the first state,
	// after a failed checkpoint, a branch of a changed env).
	delta := prio == queue.Low && !forced && parent != ""
	job := e.q.Submit(prio, "checkpoint "+sid, func(ctx context.Context) error {
		return e.checkpoint(ctx, env, sb, volume, sid, parent, turn, kind, delta, held)
	})
	env.pending, env.pendingParent = job, parent
	env.setHead(sid)
	env.dirty = false
	return job, sid, kind, nil
}

// checkpoint writes the artifacts of one state and commits it. Only the
// parts the kind says changed are written; the others are shared with the
// parent state. With allowDelta, the processes' part may be a shell delta
// on the parent's process image instead of a dump, when the Inspector
// found one (docs/engine.md, "Shell delta states"). It undoes everything
// on failure. held says the caller froze the sandbox (and thaws it) and
// settled kind while frozen: nothing ran since, so it is not settled again.
func (e *Engine) checkpoint(ctx context.Context, env *Env, sb *sandbox.Sandbox, volume, sid, parent string, turn int, kind state.Kind, allowDelta, held bool) (err error) {
	start := time.Now()
	envID := env.ID
	in := e.o.Inspector
	parentFS := env.headFS()
	var ps manifest.State
	if parent != "" {
		if ps, err = e.man.GetState(parent); err != nil {
			return fmt.Errorf("%w: parent state %s: %v", ErrCheckpoint, parent, err)
		}
	}
	st := manifest.State{ID: sid, Env: envID, Parent: parent, Turn: turn, FS: ps.FS, Proc: ps.Proc,
		ShellDelta: ps.ShellDelta, ShellDigest: ps.ShellDigest, Created: time.Now(), Timings: map[string]time.Duration{}}
	var delta *inspector.Delta
	var fsArt, procArt *manifest.Artifact
	var made []manifest.Artifact
	defer func() {
		if err != nil {
			for _, a := range made {
				e.deleteArtifact(context.Background(), a)
				e.man.AbortArtifact(a.ID)
			}
			if agentCaused(err) {
				// The sandbox's own doing: the cause stays testable
				// (docs/protocol.md, Errors: env_error).
				err = fmt.Errorf("%w: state %s of env %s: %w", ErrCheckpoint, sid, envID, err)
				e.log.Info("checkpoint failed on the sandbox's own state", slog.String("env", envID), slog.String("state", sid), slog.Any("err", err))
			} else {
				err = fmt.Errorf("%w: state %s of env %s: %v", ErrCheckpoint, sid, envID, err)
				e.log.Error("checkpoint failed", slog.String("env", envID), slog.String("state", sid), slog.Any("err", err))
			}
			e.failed.add(sid, err)
		}
	}()
	var dir string
	// plan records the intents for the artifacts kind needs.
	plan := func() error {
		st.Kind = kind
		if kind == state.FS || kind == state.Full {
			id := state.NewID("f")
			fsArt = &manifest.Artifact{ID: id, Kind: manifest.ArtifactFS, Location: SnapshotPrefix + id, Created: time.Now()}
			st.FS = id
		}
		if delta != nil {
			st.ShellDelta, st.ShellDigest = delta.Script, delta.Digest
		} else if kind == state.Proc || kind == state.Full {
			st.ShellDelta, st.ShellDigest = "", ""
			id := state.NewID("p")
			procArt = &manifest.Artifact{ID: id, Kind: manifest.ArtifactProc, Location: id, Created: time.Now()}
			st.Proc = id
		}
		for _, a := range []*manifest.Artifact{fsArt, procArt} {
			if a == nil {
				continue
			}
			if err := e.man.BeginArtifact(*a); err != nil {
				return err
			}
			made = append(made, *a)
		}
		if procArt != nil {
			var err error
			if dir, err = e.cache.NewDir(procArt.Location); err != nil {
				return err
			}
		}
		return nil
	}
	var dump criu.DumpStats
	var procBytes int64 // the process image's bytes, once kept
	err = sb.Exclusive(func() error {
		t := time.Now()
		if !held {
			if err := sb.Freeze(); err != nil {
				return fmt.Errorf("freeze: %w", err)
			}
			defer sb.Thaw()
			st.Timings["freeze"] = time.Since(t)
		}
		if in != nil && !held && (kind != state.Full || allowDelta) {
			// A background process may have written or run since the
			// turn was classified: the inspector re-checks, frozen (for
			// a full checkpoint only the processes a shell delta would
			// take from the last image).
			t = time.Now()
			k, why, _ := in.Settle(ctx, envID, kind, e.target(sb, volume, parentFS, ""))
			if k != kind {
				e.log.Info("checkpoint grew while settling", slog.String("env", envID), slog.String("from", string(kind)),
					slog.String("to", string(k)), slog.Any("why", why))
				kind = k
			}
			st.Timings["settle"] = time.Since(t)
		}
		if in != nil && allowDelta && ps.Proc != "" && (kind == state.Proc || kind == state.Full) {
			if d, ok := in.TakeShellDelta(envID); ok {
				delta = &d
			}
		}
		if err := plan(); err != nil {
			return err
		}
		crashPoint("intent", made)
		if fsArt != nil {
			t = time.Now()
			if err := e.o.Snap.Snapshot(ctx, volume, fsArt.Location); err != nil {
				return fmt.Errorf("snapshot files: %w", err)
			}
			st.Timings["snapshot"] = time.Since(t)
			fsArt.Bytes = e.snapshotBytes(ctx, env, volume)
		}
		if procArt != nil {
			t = time.Now()
			// What init and the shell hold goes with the image: every
			// restore of it must bring back the same (sandbox.Restore).
			rec, err := sb.Isolation()
			if err != nil {
				return err
			}
			if err := sandbox.WriteIsolationRecord(dir, rec); err != nil {
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
			dump, err = e.o.CRIU.Dump(ctx, criu.DumpRequest{PID: sb.InitPID(), Dir: dir, FreezeCgroup: sb.FreezerCgroup(), UserNS: sb.UserNS().Enabled, Root: sb.Root()})
			if err != nil {
				return err
			}
			// A lazily restored tree whose page daemon failed may have
			// read, and so dumped, zeros (docs/engine.md, "Lazy restore").
			if err := sb.Err(); err != nil {
				return fmt.Errorf("dump: %w", err)
			}
			st.Timings["dump"] = time.Since(t)
		}
		if in != nil {
			fsNow := parentFS
			if fsArt != nil {
				fsNow = fsArt.Location
			}
			k := kind
			if delta != nil {
				// The processes' part is the delta, which TakeShellDelta
				// made the shell's baseline; the image stays the base.
				k = state.None
				if fsArt != nil {
					k = state.FS
				}
			}
			if err := in.Checkpointed(envID, k, e.target(sb, volume, fsNow, "")); err != nil {
				e.log.Warn("inspector baseline after checkpoint", slog.String("env", envID), slog.Any("err", err))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	crashPoint("dump", made)
	if fsArt != nil && fsArt.Bytes > 0 {
		if err := e.man.SetArtifactBytes(fsArt.ID, fsArt.Bytes); err != nil {
			return err
		}
	}
	if procArt != nil {
		// Thawed: the delta is made while the sandbox runs on.
		t := time.Now()
		base, ds, err := e.deltaImage(ctx, dir, dump.Bytes, ps.Proc, sb.UserNS().Enabled)
		if err != nil {
			return err
		}
		if base != "" {
			st.Timings["delta"] = time.Since(t)
		}
		n, err := e.cache.Commit(procArt.Location)
		if err != nil {
			return fmt.Errorf("keep process image: %w", err)
		}
		if err := e.checkImageBudget(env, n); err != nil {
			return err
		}
		procBytes = n
		if base != "" {
			err = e.man.SetArtifactDelta(procArt.ID, base, n, n+ds.Before-ds.After)
		} else {
			err = e.man.SetArtifactBytes(procArt.ID, n)
		}
		if err != nil {
			return err
		}
		st.Timings["frozen_by_criu"] = dump.FrozenTime
	}
	st.Timings["total"] = time.Since(start)
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	ids := make([]string, 0, len(made))
	for _, a := range made {
		ids = append(ids, a.ID)
	}
	crashPoint("commit", made)
	if err := e.man.CommitState(st, ids...); err != nil {
		return fmt.Errorf("commit state: %w", err)
	}
	made = nil // committed: nothing to undo
	env.images.Add(procBytes)
	e.stats.checkpoints.Add(1)
	if delta != nil {
		e.stats.shellDeltas.Add(1)
	}
	e.stats.checkpointNanos.Add(int64(st.Timings["total"]))
	if fsArt != nil {
		env.setHeadFS(fsArt.Location)
	}
	e.log.Debug("checkpoint", slog.String("env", envID), slog.String("state", sid), slog.String("kind", string(kind)),
		slog.Bool("shell_delta", delta != nil), slog.Duration("took", st.Timings["total"]))
	e.afterCheckpoint(parent, sid)
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
		return nil, fmt.Errorf("%w: %s", ErrUnknownState, id)
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
