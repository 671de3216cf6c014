package branch

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/manifest"
)

// Fair shares of the pool (docs/engine.md, "Fair shares"). Each sandbox
// root has its own quota, but the quotas of the open envs together may
// be more than the pool holds: four envs each writing 1.9 GiB under a
// 2 GiB quota fill an 8 GiB pool, and then every env's writes and
// checkpoints fail and no reset or branch is admitted. When eviction
// cannot bring a full pool back under its high mark, the env that holds
// the most of it is stopped, if it holds more than its share: the high
// mark's bytes divided by the open envs. Its processes are killed at once
// and it is closed, its later calls answer ErrOverShare (the agent's
// outcome), and its room comes back when its root and states go. An env
// within its share is never stopped; a pool full of envs within their
// shares refuses new ones (Admit) instead.

// stopOverShare stops at most one env over its share of the pool, as
// measured by its quota's charge (what it wrote that still exists, in
// its root or in its checkpoints). pool is the pool as last measured. It
// reports whether it stopped one.
func (e *Engine) stopOverShare(ctx context.Context, pool DiskUsage) bool {
	q, ok := e.o.Snap.(cr.Quotaer)
	if !ok || pool.Total <= 0 {
		return false
	}
	envs := e.Envs()
	if len(envs) == 0 {
		return false
	}
	share := int64(e.o.HighWater*float64(pool.Total)) / int64(len(envs))
	var top *Env
	var topBytes int64
	for _, env := range envs {
		env.fsMu.Lock()
		vol, stopped := env.pubVolume, env.stopped
		env.fsMu.Unlock()
		if vol == "" || stopped != nil {
			continue
		}
		u, err := q.Quota(ctx, vol)
		if err != nil {
			continue // closed under us, or a backend that cannot tell
		}
		if u.Charged > topBytes {
			top, topBytes = env, u.Charged
		}
	}
	if top == nil || topBytes <= share {
		return false
	}
	e.stopEnv(top, fmt.Errorf("%w: env %s held %d MiB of a pool %.0f%% full (%d MiB); its share is %d MiB (%d open envs)",
		ErrOverShare, top.ID, topBytes>>20, 100*pool.Fraction(), pool.Total>>20, share>>20, len(envs)))
	return true
}

// stopEnv kills env's processes now and closes it once the call running
// on it (if any) has returned; its later calls answer cause.
func (e *Engine) stopEnv(env *Env, cause error) {
	env.fsMu.Lock()
	env.stopped = cause
	sb := env.pubSb
	env.fsMu.Unlock()
	e.pr.mu.Lock()
	e.pr.stats.Stopped++
	e.pr.mu.Unlock()
	e.log.Warn("env stopped: over its share of a full pool", slog.String("env", env.ID), slog.Any("cause", cause))
	if sb != nil {
		sb.Kill()
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return // Close closes it
	}
	e.bg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.bg.Done()
		if err := e.closeEnv(context.Background(), env); err != nil {
			e.log.Warn("close stopped env", slog.String("env", env.ID), slog.Any("err", err))
		}
		e.nudgeGC()
	}()
}

// Image budget (docs/engine.md, "Image budget"): the process images an
// open env's checkpoints wrote that still exist are bounded by
// Options.ImageBudget. env.images counts what its checkpoints committed;
// only when that count would go over is the exact figure read from the
// manifest (the GC may have deleted some since, after a rollback), so the
// common checkpoint costs an add.

// checkImageBudget fails, as the agent's doing, a checkpoint of env whose
// process image of n bytes would take env over its budget.
func (e *Engine) checkImageBudget(env *Env, n int64) error {
	b := e.o.ImageBudget
	if b <= 0 || env.images.Load()+n <= b {
		return nil
	}
	held, err := e.imageCharge(env.ID)
	if err != nil {
		return fmt.Errorf("image budget: %w", err)
	}
	env.images.Store(held)
	if held+n <= b {
		return nil
	}
	return fmt.Errorf("%w: its process image of %d MiB would take the env's checkpoints to %d MiB of the image store, over its budget of %d MiB (docs/engine.md, \"Image budget\")",
		cr.ErrAgentState, n>>20, (held+n)>>20, b>>20)
}

// imageCharge is the bytes of the process images env's own states made
// (not those a state shares with its parent) that the manifest still has.
func (e *Engine) imageCharge(envID string) (int64, error) {
	states, err := e.man.States(envID)
	if err != nil {
		return 0, err
	}
	proc := make(map[string]string, len(states)) // state -> its process image
	for _, s := range states {
		proc[s.ID] = s.Proc
	}
	var held int64
	seen := map[string]bool{}
	for _, s := range states {
		if s.Proc == "" || seen[s.Proc] {
			continue
		}
		pp, mine := proc[s.Parent]
		if !mine && s.Parent != "" {
			// The parent is another env's state (a branch's source).
			if ps, err := e.man.GetState(s.Parent); err == nil {
				pp = ps.Proc
			}
		}
		if s.Parent != "" && pp == s.Proc {
			continue // the parent's image, counted with the parent
		}
		seen[s.Proc] = true
		a, err := e.man.GetArtifact(s.Proc)
		if err != nil || a.Kind != manifest.ArtifactProc {
			continue // collected since
		}
		held += a.Bytes
	}
	return held, nil
}

// Disk reservation (docs/engine.md, "Disk reservation"), with
// Options.DiskReserve: what the open envs may still write under their
// quotas, what envs admitted but not registered yet reserved, and the new
// envs' whole quotas must fit in the pool's free room above the high
// mark's reserve.

// reserve reserves the quotas of n new envs on pool (as last measured),
// or says why it cannot ("" and a release when it did).
func (e *Engine) reserve(ctx context.Context, pool DiskUsage, n int) (release func(), why string) {
	q := e.o.Launcher.Limits.DiskQuota()
	qr, ok := e.o.Snap.(cr.Quotaer)
	if !e.o.DiskReserve || n <= 0 || q <= 0 || !ok || pool.Name != DiskPool {
		return func() {}, ""
	}
	e.pr.reserveMu.Lock()
	defer e.pr.reserveMu.Unlock()
	envs := e.Envs()
	var left int64 // what the open envs may still write
	for _, env := range envs {
		env.fsMu.Lock()
		vol := env.pubVolume
		env.fsMu.Unlock()
		u, err := qr.Quota(ctx, vol)
		if err != nil {
			left += q // closed under us, or unreadable: its whole quota
			continue
		}
		left += max(q-u.Charged, 0)
	}
	room := pool.Free - int64((1-e.o.HighWater)*float64(pool.Total))
	need := left + e.pr.pending + int64(n)*q
	if need > room {
		return nil, fmt.Sprintf("pool reserved: %d open envs may still write %d MiB and %d MiB are reserved for envs starting; %d new need %d MiB more, of %d MiB free above the high mark's reserve (a quota of %d MiB each)",
			len(envs), left>>20, e.pr.pending>>20, n, (int64(n)*q)>>20, max(room, 0)>>20, q>>20)
	}
	e.pr.pending += int64(n) * q
	return func() {
		e.pr.reserveMu.Lock()
		e.pr.pending -= int64(n) * q
		e.pr.reserveMu.Unlock()
	}, ""
}
