package branch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// Recovered says at which state an environment was brought back after the
// engine (or its sandbox) died: its last committed state and that state's
// turn. Everything the env did after that state is gone.
type Recovered struct {
	State string
	Turn  int
}

// LostEnv is an environment of an earlier run that Open could not restore
// (no committed state, a restore that failed); it is closed in the
// manifest and its id answers state.ErrLost.
type LostEnv struct {
	ID, Image, Origin string
	// Head is the state a restore was tried from ("" when there was none).
	Head   string
	Labels map[string]string
	Err    error
}

// RevivedError is what the operation that found an environment's sandbox
// dead returns once the engine restored the env at its last committed
// state: the env is usable again (the operation may be retried), but what
// it did since that state is gone. It matches ErrRevived and
// sandbox.ErrDead.
type RevivedError struct {
	Env   string
	State string
	Turn  int
	Cause error // how the sandbox was found dead
}

func (r *RevivedError) Error() string {
	return fmt.Sprintf("sandbox of env %s died (%v); the env was restored to state %s (turn %d)", r.Env, r.Cause, r.State, r.Turn)
}

// Unwrap lets errors.Is match ErrRevived and sandbox.ErrDead.
func (r *RevivedError) Unwrap() []error { return []error{ErrRevived, sandbox.ErrDead} }

// crashHook, when set (tests only: export_test.go), is called by each
// checkpoint at each phase of the crash-safety protocol: "intent" (intents
// recorded, nothing written yet), "dump" (snapshot and process image
// written, not accounted), "commit" (everything written, the state not yet
// committed), with the artifacts made so far. The crash tests kill the
// process there.
var crashHook func(phase string, made []manifest.Artifact)

func crashPoint(phase string, made []manifest.Artifact) {
	if crashHook != nil {
		crashHook(phase, made)
	}
}

// restoreEnvs brings back the environments a crash left open, each as a
// high-priority queue job (so at most Workers at a time), under their ids
// and at their heads, which are the last states the manifest committed.
// One that cannot be restored is closed and kept in e.lost.
func (e *Engine) restoreEnvs(ctx context.Context, open []manifest.Env) {
	if len(open) == 0 {
		return
	}
	start := time.Now()
	e.log.Info("restoring the environments of the previous run", slog.Int("count", len(open)))
	var done, lost atomic.Int64
	jobs := make([]*queue.Job, len(open))
	for i, rec := range open {
		jobs[i] = e.q.Submit(queue.High, "recover "+rec.ID, func(ctx context.Context) error {
			env, err := e.recoverEnv(ctx, rec)
			n := done.Add(1)
			if err != nil {
				lost.Add(1)
				e.markLost(rec, err)
				e.log.Error("environment lost in the restart", slog.String("env", rec.ID), slog.String("head", rec.Head),
					slog.Int64("done", n), slog.Int("of", len(open)), slog.Any("err", err))
				return err
			}
			e.log.Info("restored environment", slog.String("env", rec.ID), slog.String("state", env.recovered.State),
				slog.Int("turn", env.recovered.Turn), slog.Int64("done", n), slog.Int("of", len(open)))
			return nil
		})
	}
	for _, j := range jobs {
		j.Wait(ctx) // failures are in e.lost
	}
	e.log.Info("restored the environments of the previous run", slog.Int64("restored", done.Load()-lost.Load()),
		slog.Int64("lost", lost.Load()), slog.Duration("took", time.Since(start)))
}

// recoverEnv restores env record rec at its head under its own id.
func (e *Engine) recoverEnv(ctx context.Context, rec manifest.Env) (*Env, error) {
	if rec.Head == "" {
		return nil, errors.New("it has no committed state (its first checkpoint never finished)")
	}
	st, err := e.man.GetState(rec.Head)
	if err != nil {
		return nil, fmt.Errorf("head state: %w", err)
	}
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	r, err := e.restore(ctx, st.ID, rec.ID+"-0")
	if err != nil {
		return nil, err
	}
	env := &Env{ID: rec.ID, Image: rec.Image, Origin: rec.Origin, sb: r.sb, volume: r.volume, head: st.ID, pubHead: st.ID,
		fsLoc: r.fsLoc, stats: &e.stats, labels: maps.Clone(rec.Labels),
		recovered: &Recovered{State: st.ID, Turn: st.Turn}}
	env.turn.Store(int64(st.Turn))
	if err := e.register(env); err != nil {
		r.sb.Destroy(context.Background())
		e.o.Snap.Destroy(context.Background(), r.volume)
		return nil, err
	}
	e.track(ctx, env, r.imageShell)
	return env, nil
}

// markLost closes rec in the manifest, recording why it was lost (its
// states stay until ForgetLost).
func (e *Engine) markLost(rec manifest.Env, cause error) {
	if err := e.man.MarkLost(rec.ID, cause.Error()); err != nil {
		e.log.Warn("close lost env", slog.String("env", rec.ID), slog.Any("err", err))
	}
	e.mu.Lock()
	e.lost[rec.ID] = LostEnv{ID: rec.ID, Image: rec.Image, Origin: rec.Origin, Head: rec.Head, Labels: maps.Clone(rec.Labels), Err: cause}
	e.mu.Unlock()
}

// ForgetLost drops a lost environment (state.ErrUnknownEnv if id is not one):
// it is no longer reported and its states are released.
func (e *Engine) ForgetLost(ctx context.Context, id string) error {
	e.mu.Lock()
	_, ok := e.lost[id]
	delete(e.lost, id)
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s is not a lost env", state.ErrUnknownEnv, id)
	}
	if err := e.man.ReleaseEnvAt(id, e.now()); err != nil {
		return err
	}
	e.nudgeGC()
	return nil
}

// Lost lists the environments a restart could not restore (this one or an
// earlier one, until ForgetLost), with the reason.
func (e *Engine) Lost() []LostEnv {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]LostEnv, 0, len(e.lost))
	for _, l := range e.lost {
		out = append(out, l)
	}
	return out
}

// Recovered is the state Open restored env at after a crash, nil for an
// env made in this run.
func (env *Env) Recovered() *Recovered {
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	if env.recovered == nil {
		return nil
	}
	r := *env.recovered
	return &r
}

// Labels are the owner's metadata of env (SetLabels), kept across restarts.
func (env *Env) Labels() map[string]string {
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	return maps.Clone(env.labels)
}

// SetLabels merges labels into env's (an empty value removes a key) and
// records them in the manifest, so that after a crash the owner finds
// them on the restored env (task, base turn, seed...).
func (e *Engine) SetLabels(env *Env, labels map[string]string) error {
	if err := e.man.SetLabels(env.ID, labels); err != nil {
		return err
	}
	env.fsMu.Lock()
	defer env.fsMu.Unlock()
	env.labels = manifest.MergeLabels(env.labels, labels)
	return nil
}

// dead reports whether env's sandbox is dead: its init has exited, or an
// operation failed with ErrDead. After another failure it waits a moment
// for init's exit to be seen (a connection reset comes before the reap).
func dead(sb *sandbox.Sandbox, err error) bool {
	if errors.Is(err, sandbox.ErrDead) {
		return true
	}
	wait := time.Duration(0)
	if err != nil && !errors.Is(err, sandbox.ErrBadCommand) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		wait = time.Second
	}
	select {
	case <-sb.Exited():
		return true
	default:
	}
	if wait == 0 {
		return false
	}
	select {
	case <-sb.Exited():
		return true
	case <-time.After(wait):
		return false
	}
}

// revive replaces env's dead sandbox with one restored from its head, its
// last committed state (the caller holds env.mu and has passed the gate,
// so the head is committed). It returns the *RevivedError the operation
// reports, or why the env could not be restored.
func (e *Engine) revive(ctx context.Context, env *Env, cause error) error {
	if err := env.stopErr(); err != nil {
		return err // stopped on purpose: never brought back
	}
	if cause == nil {
		cause = sandbox.ErrDead
	}
	sid := env.head
	if sid == "" {
		return fmt.Errorf("env %s: %w, and it has no committed state to restore", env.ID, cause)
	}
	st, err := e.man.GetState(sid)
	if err != nil {
		return fmt.Errorf("env %s: %w; its state %s: %w", env.ID, cause, sid, err)
	}
	e.gcMu.RLock()
	defer e.gcMu.RUnlock()
	r, err := e.restore(ctx, sid, env.ID+"-"+strconv.Itoa(env.gen+1))
	if err != nil {
		return fmt.Errorf("env %s: %v; restoring it failed: %w", env.ID, cause, err)
	}
	e.swapIn(ctx, env, r, st)
	env.ckptErr, env.mustFull = nil, false
	e.stats.revived.Add(1)
	e.log.Warn("restored an env whose sandbox died", slog.String("env", env.ID), slog.String("state", sid),
		slog.Int("turn", st.Turn), slog.Any("cause", cause))
	return &RevivedError{Env: env.ID, State: sid, Turn: st.Turn, Cause: cause}
}
