package branch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/arbor-env/arbor/cr/imgcache"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/state"
)

// DefaultRetain is the retention of a closed env's states that the
// server uses when it is not told otherwise (arbor serve --retain); the
// engine's own zero value, Options.Retain = 0, keeps none.
const DefaultRetain = 10 * time.Minute

// The background GC's defaults (docs/engine.md, "Retention").
const (
	// DefaultGCInterval is the longest the GC sleeps between passes when
	// nothing nudges it and no retention ends sooner.
	DefaultGCInterval = time.Minute
	// DefaultGCBatch is how many states one pass deletes at most (and
	// twice as many artifacts).
	DefaultGCBatch = 16
)

// GCStats are the background GC's totals since Open.
type GCStats struct {
	// Passes counts the passes that ran (took the GC lock), with or
	// without garbage to delete.
	Passes int64
	// States and Artifacts count what the passes deleted; Bytes is the
	// size the manifest recorded for those artifacts; Envs counts the
	// records of closed envs deleted once their states were all gone.
	States, Artifacts, Bytes, Envs int64
	// Errors counts passes that failed.
	Errors int64
	// LastPass is how long the last pass held the GC lock (the time
	// commits, restores and branches could have waited for it), LastAt
	// when it ended, MaxPass the longest pass.
	LastPass, MaxPass time.Duration
	LastAt            time.Time
}

// gcStats are GCStats under their lock.
type gcStats struct {
	mu sync.Mutex
	s  GCStats
}

// hold keeps state sid from GC (a branch from it in flight) until unhold.
func (e *Engine) hold(sid string) {
	e.mu.Lock()
	e.refs[sid]++
	e.mu.Unlock()
}

func (e *Engine) unhold(sid string) {
	e.mu.Lock()
	if e.refs[sid]--; e.refs[sid] <= 0 {
		delete(e.refs, sid)
	}
	e.mu.Unlock()
}

// manifestErr words a manifest's missing state as state.ErrUnknownState.
func manifestErr(err error) error {
	if errors.Is(err, manifest.ErrNotFound) {
		return fmt.Errorf("%w: %v", state.ErrUnknownState, err)
	}
	return err
}

// Release marks states as no longer wanted, all of them or (one is
// unknown: state.ErrUnknownState) none. A released state has no retention: GC
// removes it as soon as nothing keeps it (an open env's lineage, a pin, a
// pending branch, a warm copy). Releasing a state an open env still needs
// is harmless: it stays until that env closes, and then goes at once.
func (e *Engine) Release(ids ...string) error {
	if err := manifestErr(e.man.Release(ids...)); err != nil {
		return err
	}
	e.nudgeGC()
	return nil
}

// Pin keeps states (and their ancestors) until Unpin, through the close of
// their env and past its retention; all or (one is unknown:
// state.ErrUnknownState) none.
func (e *Engine) Pin(ids ...string) error { return manifestErr(e.man.Pin(ids...)) }

// Unpin undoes Pin; the states are then kept only as the rest of the
// retention policy says.
func (e *Engine) Unpin(ids ...string) error {
	if err := manifestErr(e.man.Unpin(ids...)); err != nil {
		return err
	}
	e.nudgeGC()
	return nil
}

// now is the time retention is measured at: the wall clock, moved on by
// tests (export_test.go).
func (e *Engine) now() time.Time { return time.Now().Add(time.Duration(e.clockOff.Load())) }

// nudgeGC wakes the background GC (something may have become garbage).
func (e *Engine) nudgeGC() {
	select {
	case e.gcNudge <- struct{}{}:
	default:
	}
}

// startGC starts the background GC; Close stops it (stopGC).
func (e *Engine) startGC() {
	ctx, cancel := context.WithCancel(context.Background())
	e.gcCancel = cancel
	e.gcDone = make(chan struct{})
	go e.gcLoop(ctx)
}

func (e *Engine) stopGC() {
	if e.gcCancel == nil {
		return
	}
	e.gcCancel()
	<-e.gcDone
}

// gcLoop runs passes of bounded work: at once after Open, after a nudge,
// when a retention ends, at the latest every GCInterval; back to back
// while a pass leaves garbage over (releasing the lock in between).
func (e *Engine) gcLoop(ctx context.Context) {
	defer close(e.gcDone)
	wait := time.Duration(0)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-e.gcNudge:
			t.Stop()
		case <-t.C:
		}
		// Prepared copies past their TTL go first: their states may be
		// garbage this very pass.
		prepNext := e.expirePrepared(ctx, e.now())
		_, more, next, err := e.gcPass(ctx, nil)
		var pressured bool
		if err == nil {
			// Disk pressure: evict by the policy after the normal pass.
			pressured, err = e.relieve(ctx)
		}
		wait = e.o.GCInterval
		switch {
		case ctx.Err() != nil, errors.Is(err, state.ErrClosed):
			return
		case err != nil:
			e.log.Warn("garbage collection", slog.Any("err", err))
		case more:
			wait = 0
		case !next.IsZero():
			wait = min(wait, max(next.Sub(e.now()), 0)+10*time.Millisecond)
		}
		if !prepNext.IsZero() {
			wait = min(wait, max(prepNext.Sub(e.now()), 0)+10*time.Millisecond)
		}
		if pressured {
			wait = min(wait, pressureSettle)
		}
	}
}

// GC deletes everything no owner needs any more now, in as many bounded
// passes as it takes (the background GC does the same, a pass at a time).
func (e *Engine) GC(ctx context.Context) error {
	for {
		_, more, _, err := e.gcPass(ctx, nil)
		if err != nil || !more {
			return err
		}
	}
}

// gcPass deletes at most Options.GCBatch states no owner needs and the
// artifacts only they used, then at most as many records of closed envs
// left without states; with evict, under disk pressure, the retention of
// closed lineages is ignored (manifest.Policy.Evict) and the pass deletes
// no more than frees *evict's bytes (manifest.Policy.MaxBytes). It
// reports how many states it deleted, whether garbage was left over and
// when the next retention ends.
//
// Only the decision and the state records are under the GC lock: once a
// state's record is gone no branch, rollback or commit can reach its
// artifacts (a commit only refers to its parent's, and an open env's
// lineage is never garbage), so their files are deleted after the lock
// is let go, and their records after their files (crash safety: an
// artifact record without a state is garbage the next pass, or the next
// Open, deletes again; never files nobody knows about).
func (e *Engine) gcPass(ctx context.Context, evict *eviction) (deleted int, more bool, next time.Time, err error) {
	e.passMu.Lock()
	defer e.passMu.Unlock()
	g, p, sids, envMore, err := e.gcDecide(ctx, evict)
	if err != nil || len(g.Artifacts) == 0 {
		return len(sids), g.More || envMore, g.Next, err
	}
	// A deletion is not cut short by Close (its ctx ends only the wait
	// for the lock): an artifact whose files could not be deleted keeps
	// its record, an orphan the next pass tries again.
	var bytes int64
	var failed int
	aids := make([]string, 0, len(g.Artifacts))
	for _, a := range g.Artifacts {
		if err := e.deleteArtifact(context.WithoutCancel(ctx), a); err != nil {
			failed++
			continue
		}
		aids = append(aids, a.ID)
		bytes += a.Bytes
	}
	// The counters change under the same lock as the records, so a
	// reader that sees an artifact gone (Usage, a test) sees it counted.
	e.gcStats.mu.Lock()
	ferr := e.man.ForgetWith(p, nil, aids)
	if ferr == nil {
		e.gcStats.s.Artifacts += int64(len(aids))
		e.gcStats.s.Bytes += bytes
	}
	if ferr != nil {
		err = ferr
	} else if failed > 0 {
		err = fmt.Errorf("garbage collection: %d of %d artifacts could not be deleted", failed, len(g.Artifacts))
	}
	if err != nil {
		e.gcStats.s.Errors++ // the pass failed after its decision
	}
	e.gcStats.mu.Unlock()
	e.log.Debug("garbage collected", slog.Int("states", len(sids)), slog.Int("artifacts", len(aids)),
		slog.Int64("bytes", bytes), slog.Bool("more", g.More), slog.Bool("evict", evict != nil))
	return len(sids), g.More || envMore, g.Next, err
}

// gcDecide is the part of a pass under the GC lock: it collects the
// garbage, forgets the garbage states' records and at most GCBatch
// records of closed envs left without states, and returns what it found
// (the artifacts are still to be deleted), the policy and the states it
// forgot.
func (e *Engine) gcDecide(ctx context.Context, evict *eviction) (g manifest.Garbage, p manifest.Policy, sids []string, envMore bool, err error) {
	if err := e.lockGC(ctx); err != nil {
		return g, p, nil, false, err
	}
	start := time.Now()
	defer func() {
		took := time.Since(start)
		e.gcMu.Unlock()
		e.gcStats.mu.Lock()
		s := &e.gcStats.s
		s.Passes++
		if err != nil {
			s.Errors++
		}
		s.LastPass, s.LastAt, s.MaxPass = took, time.Now(), max(s.MaxPass, took)
		e.gcStats.mu.Unlock()
	}()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return g, p, nil, false, state.ErrClosed
	}
	p = manifest.Policy{Now: e.now(), Retain: e.o.Retain, MaxStates: e.o.GCBatch, MaxArtifacts: 2 * e.o.GCBatch}
	if evict != nil {
		p.Evict, p.MaxBytes = true, evict.bytes
	}
	for _, env := range e.envs {
		p.Keep = append(p.Keep, env.Head())
	}
	for sid, ws := range e.warm {
		if len(ws) > 0 {
			p.Keep = append(p.Keep, sid)
		}
	}
	for sid := range e.refs {
		p.Keep = append(p.Keep, sid)
	}
	// A prepared state is kept until its TTL passes, while its copies
	// are still being restored too.
	p.Keep = append(p.Keep, e.prepKeep()...)
	e.mu.Unlock()
	if g, err = e.man.Collect(p); err != nil {
		return manifest.Garbage{}, p, nil, false, err
	}
	if len(g.States) > 0 {
		sids = make([]string, len(g.States))
		for i, s := range g.States {
			sids[i] = s.ID
		}
		// The counters change under the same lock as the records, so a
		// reader that sees a state gone (Usage, a test) sees it counted.
		e.gcStats.mu.Lock()
		err = e.man.ForgetWith(p, sids, nil)
		if err == nil {
			e.gcStats.s.States += int64(len(sids))
		}
		e.gcStats.mu.Unlock()
		if err != nil {
			return manifest.Garbage{}, p, nil, false, err
		}
		if evict != nil {
			e.pr.mu.Lock()
			e.pr.stats.Evicted += int64(len(sids))
			e.pr.mu.Unlock()
		}
	}
	envMore, err = e.forgetEnvs()
	return g, p, sids, envMore, err
}

// forgetEnvs drops at most GCBatch records of closed envs whose states
// are all gone (manifest.ForgetEnvs), in a pass, under the GC lock; it
// reports whether some were left over.
func (e *Engine) forgetEnvs() (more bool, err error) {
	e.gcStats.mu.Lock()
	defer e.gcStats.mu.Unlock()
	ids, more, err := e.man.ForgetEnvs(e.o.GCBatch)
	e.gcStats.s.Envs += int64(len(ids))
	return more, err
}

// lockGC takes gcMu for writing without queueing for it: restores (CRIU
// runs of up to criu.Checkpointer.Timeout) hold it for reading, and a
// writer waiting in Lock would block every new reader, so every other
// env's checkpoint commit, branch and rollback would wait for the slowest
// restore in flight.
func (e *Engine) lockGC(ctx context.Context) error {
	for !e.gcMu.TryLock() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Usage is the engine's disk and memory accounting.
type Usage struct {
	Manifest manifest.Usage
	Images   imgcache.Stats
	Queue    queue.Stats
	Envs     int
	// Warm counts the frozen copies ready to thaw, the prepared ones
	// among them; Prepare counts those (prepare.go).
	Warm    int
	Prepare PrepareStats
	Coord   CoordStats
	GC      GCStats
	// Disk is every watched file system, measured now, and Pressure what
	// disk pressure did (docs/engine.md, "Disk pressure").
	Disk     []DiskUsage
	Pressure PressureStats
}

// Usage reports what the engine holds.
func (e *Engine) Usage() (Usage, error) {
	mu, err := e.man.Usage()
	if err != nil {
		return Usage{}, err
	}
	e.mu.Lock()
	n, w := len(e.envs), 0
	for _, ws := range e.warm {
		w += len(ws)
	}
	prep := e.prepareStats()
	e.mu.Unlock()
	c := CoordStats{Checkpoints: e.stats.checkpoints.Load(), CheckpointTime: time.Duration(e.stats.checkpointNanos.Load()),
		Exposed: time.Duration(e.stats.exposed.Load()), Verified: e.stats.verified.Load(), Misses: e.stats.misses.Load(),
		Revived: e.stats.revived.Load(), ShellDeltas: e.stats.shellDeltas.Load(),
		DeltaImages: e.stats.deltaImages.Load(), DeltaSaved: e.stats.deltaSaved.Load(),
		LazyRestores: e.stats.lazyRestores.Load(), LazyFailed: e.stats.lazyFailed.Load()}
	c.Restores, c.RestorePhases = e.stats.phases.snapshot()
	e.gcStats.mu.Lock()
	gs := e.gcStats.s
	e.gcStats.mu.Unlock()
	disk := e.measure()
	e.pr.mu.Lock()
	ps := e.pr.stats
	e.pr.mu.Unlock()
	return Usage{Manifest: mu, Images: e.cache.Stats(), Queue: e.q.Stats(), Envs: n, Warm: w, Prepare: prep, Coord: c, GC: gs,
		Disk: disk, Pressure: ps}, nil
}

// CheckManifest runs the manifest's consistency check (manifest.Check):
// soak tests and tools call it.
func (e *Engine) CheckManifest() error { return e.man.Check() }
