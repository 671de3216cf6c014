package branch

import (
	"context"
	"log/slog"
	"sync"
)

// aheadClones makes the writable roots of a branch's cold children before
// their restores reach them, one after another in one goroutine outside
// the restore queue. A clone on btrfs waits mostly for the file system's
// transaction commit, not for a CPU, and a restore that finds its root
// made spends its worker slot on CRIU (docs/engine.md, "Roots cloned
// ahead"). Clones one at a time: concurrent ones only queue on btrfs's
// locks (BenchmarkCloneFanOut in cr/btrfs).
type aheadClones struct {
	e     *Engine
	src   string // the state's file snapshot
	roots map[string]*aheadRoot
	done  chan struct{} // closed when the goroutine has ended
}

// aheadRoot is one child's root. Whoever takes it first (its restore, or
// the branch's cleanup) owns what the goroutine made; a restore that
// finds it not started, failed or already taken clones its root itself.
type aheadRoot struct {
	mu    sync.Mutex
	state aheadState
	made  chan struct{} // closed when the goroutine's clone of it ended
}

type aheadState int

const (
	aheadPending aheadState = iota // not started
	aheadMaking                    // the goroutine clones it now
	aheadMade                      // made, nobody's yet
	aheadTaken                     // a restore's or the cleanup's (or failed)
	aheadGone                      // the branch returned: a restore now is of a child nobody waits for
)

// cloneAhead starts cloning src as each of vols, in order, until ctx ends
// or finish is called (in a goroutine of its own when the caller is done
// with the roots: it may wait for a clone in flight). Nil once the engine
// is closed: the restores clone their own roots.
func (e *Engine) cloneAhead(ctx context.Context, src string, vols []string) *aheadClones {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.bg.Add(1)
	e.mu.Unlock()
	a := &aheadClones{e: e, src: src, roots: make(map[string]*aheadRoot, len(vols)), done: make(chan struct{})}
	order := make([]*aheadRoot, len(vols))
	for i, v := range vols {
		order[i] = &aheadRoot{made: make(chan struct{})}
		a.roots[v] = order[i]
	}
	go func() {
		defer close(a.done)
		for i, r := range order {
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			if r.state != aheadPending {
				r.mu.Unlock()
				continue
			}
			r.state = aheadMaking
			r.mu.Unlock()
			// Under the GC lock as a restore's own clone is.
			e.gcMu.RLock()
			err := e.o.Snap.Clone(ctx, src, vols[i])
			e.gcMu.RUnlock()
			r.mu.Lock()
			if err != nil {
				// Its restore clones it again and reports what fails.
				r.state = aheadTaken
			} else {
				r.state = aheadMade
			}
			close(r.made)
			r.mu.Unlock()
		}
	}()
	return a
}

// take reports whether vol was made ahead, and is the caller's now; when
// it is being made it waits for that. False: the caller clones vol itself
// (nothing of it exists). A nil a takes nothing.
func (a *aheadClones) take(ctx context.Context, vol string) (bool, error) {
	if a == nil {
		return false, nil
	}
	r := a.roots[vol]
	if r == nil {
		return false, nil
	}
	r.mu.Lock()
	if r.state == aheadMaking {
		r.mu.Unlock()
		select {
		case <-r.made:
		case <-ctx.Done():
			// The cleanup takes it once it is made.
			return false, ctx.Err()
		}
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	if r.state == aheadGone {
		// finish ran: every child the caller waited for was handed
		// over or given up, so this one would only be destroyed.
		return false, errAbandoned
	}
	made := r.state == aheadMade
	r.state = aheadTaken
	return made, nil
}

// finish ends the goroutine (no root not started yet is made) and
// destroys the roots it made that no restore took: children that failed
// before their clone, or whose jobs never ran because the caller gave up.
// A restore that asks for its root after that is of a child nobody waits
// for any more: take answers errAbandoned. finish waits for a clone in
// flight only, and the engine's Close for finish.
func (a *aheadClones) finish() {
	defer a.e.bg.Done()
	for _, r := range a.roots {
		r.mu.Lock()
		if r.state == aheadPending {
			r.state = aheadGone
		}
		r.mu.Unlock()
	}
	<-a.done
	for vol, r := range a.roots {
		r.mu.Lock()
		made := r.state == aheadMade
		r.state = aheadGone
		r.mu.Unlock()
		if made {
			if err := a.e.o.Snap.Destroy(context.Background(), vol); err != nil {
				a.e.log.Warn("remove root cloned ahead for a child never restored", slog.String("volume", vol), slog.Any("err", err))
			}
		}
	}
}
