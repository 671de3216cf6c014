package branch

import (
	"context"
	"log/slog"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/state"
)

// warmCopy is a sandbox restored from a state ahead of time and kept
// frozen: a branch from that state only has to thaw it.
type warmCopy struct {
	id    string
	state string
	r     restored
	// prepared: made by Prepare (prepare.go), kept until its state's
	// TTL and never refilled; otherwise a head's copy (Options.WarmCopies).
	prepared bool
}

func (w *warmCopy) destroy(ctx context.Context, e *Engine) {
	if w.r.tracked {
		e.untrack(w.id)
	}
	if err := w.r.sb.Destroy(ctx); err != nil {
		e.log.Warn("destroy warm copy", slog.String("state", w.state), slog.Any("err", err))
	}
	e.o.Snap.Destroy(ctx, w.r.volume)
}

// afterCheckpoint keeps the warm copies on the newest state of each
// environment: the previous head's are dropped, the new head gets its own.
func (e *Engine) afterCheckpoint(parent, sid string) {
	if e.o.WarmCopies <= 0 {
		return
	}
	e.dropWarm(context.Background(), parent)
	e.fillWarm(sid, e.o.WarmCopies, nil)
}

// fillWarm queues low-priority restores of n frozen copies of sid: a
// head's (p nil), kept while sid is some env's head, or prepared ones of
// entry p, kept while p is sid's entry (its TTL has not passed), each
// counted out of p.queued when its restore ends.
func (e *Engine) fillWarm(sid string, n int, p *prepEntry) {
	for i := 0; i < n; i++ {
		e.mu.Lock()
		if e.closed {
			if p != nil {
				p.done(n - i)
			}
			e.mu.Unlock()
			return
		}
		e.bg.Add(1)
		e.mu.Unlock()
		e.q.Submit(queue.Low, "warm "+sid, func(ctx context.Context) error {
			defer e.bg.Done()
			if p != nil && e.prepStale(sid, p) {
				return nil // expired before its turn came: not restored at all
			}
			id := state.NewID("")
			e.gcMu.RLock()
			r, err := e.restore(ctx, sid, id+"-0")
			e.gcMu.RUnlock()
			if err == nil {
				r.tracked = e.trackWarm(ctx, id, r)
				if err = r.sb.Freeze(); err != nil {
					(&warmCopy{id: id, r: r}).destroy(ctx, e)
				}
			}
			if err != nil {
				e.log.Warn("warm copy", slog.String("state", sid), slog.Any("err", err))
				if p != nil {
					e.mu.Lock()
					p.done(1)
					e.mu.Unlock()
				}
				return err
			}
			w := &warmCopy{id: id, state: sid, r: r, prepared: p != nil}
			e.mu.Lock()
			// A head's copy is kept only while the state is still some
			// env's newest, a prepared one while its entry lives.
			var keep bool
			if p == nil {
				keep = !e.closed && e.isHead(sid)
			} else {
				keep = !e.closed && e.prep[sid] == p
				if keep {
					p.ready++
				}
				p.done(1)
			}
			if keep {
				e.warm[sid] = append(e.warm[sid], w)
			}
			expired := p != nil && !keep && !e.closed
			e.mu.Unlock()
			if !keep {
				w.destroy(ctx, e)
			}
			if expired {
				e.mu.Lock()
				e.prepStats.Expired++
				e.mu.Unlock()
			}
			return nil
		})
	}
}

// prepStale reports whether a prepared copy's restore, about to start,
// is no longer wanted: the engine closed, or entry p's TTL passed (it may
// still be sid's entry until the GC expires it) or p is no longer sid's
// entry. Then it counts the copy out of p.queued, and as expired unless
// the engine closed. Without this a prepare repeated after its TTL while
// the low-priority queue was backed up would queue past the budget, and
// every orphan would be restored only to be destroyed.
func (e *Engine) prepStale(sid string, p *prepEntry) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed && e.prep[sid] == p && e.now().Before(p.expires) {
		return false
	}
	p.done(1)
	if !e.closed {
		e.prepStats.Expired++
	}
	return true
}

// isHead reports whether sid is the head of an open env; e.mu is held.
func (e *Engine) isHead(sid string) bool {
	for _, env := range e.envs {
		if env.Head() == sid {
			return true
		}
	}
	return false
}

// takeWarm removes up to n warm copies of sid, prepared ones first, and
// queues replacements of the head's copies it took (a prepared copy is
// not replaced: Prepare asked for so many, once).
func (e *Engine) takeWarm(sid string, n int) []*warmCopy {
	e.mu.Lock()
	var ws []*warmCopy
	for _, w := range e.warm[sid] {
		if w.prepared {
			ws = append(ws, w)
		}
	}
	for _, w := range e.warm[sid] {
		if !w.prepared {
			ws = append(ws, w)
		}
	}
	k := min(n, len(ws))
	out := ws[:k:k]
	if k == len(ws) {
		// No entry for a state without copies: every branched state id
		// would stay in the map (and keep its state from GC).
		delete(e.warm, sid)
	} else {
		e.warm[sid] = ws[k:]
	}
	refill := 0
	for _, w := range out {
		if !w.prepared {
			refill++
			continue
		}
		e.prepStats.Taken++
		if p := e.prep[sid]; p != nil {
			p.ready--
			if p.copies() == 0 {
				// All taken: nothing is left for the entry to keep (nor
				// to hold its state from GC for).
				delete(e.prep, sid)
			}
		}
	}
	e.mu.Unlock()
	if refill > 0 {
		e.fillWarm(sid, refill, nil)
	}
	return out
}

// dropWarm destroys the head's warm copies of sid (its prepared ones stay
// until their TTL).
func (e *Engine) dropWarm(ctx context.Context, sid string) {
	if sid == "" {
		return
	}
	e.mu.Lock()
	ws := e.removeWarm(sid, false)
	e.mu.Unlock()
	for _, w := range ws {
		w.destroy(ctx, e)
	}
}

// removeWarm takes sid's warm copies that are prepared ones (prepared)
// or a head's (!prepared) out of e.warm, leaving the others, and returns
// them; e.mu is held.
func (e *Engine) removeWarm(sid string, prepared bool) []*warmCopy {
	var out, keep []*warmCopy
	for _, w := range e.warm[sid] {
		if w.prepared == prepared {
			out = append(out, w)
		} else {
			keep = append(keep, w)
		}
	}
	if len(keep) == 0 {
		delete(e.warm, sid)
	} else {
		e.warm[sid] = keep
	}
	return out
}

// adoptWarm thaws a warm copy and makes it an environment at state st.
func (e *Engine) adoptWarm(ctx context.Context, w *warmCopy, st manifest.State, origin string) (*Env, error) {
	if err := w.r.sb.Thaw(); err != nil {
		w.destroy(ctx, e)
		return nil, err
	}
	return e.adopt(ctx, w.id, w.r, st, origin)
}
