package branch

import (
	"context"
	"log/slog"

	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/cr/queue"
	"github.com/arbor-env/arbor/sandbox/launch"
)

// warmCopy is a sandbox restored from a state ahead of time and kept
// frozen: a branch from that state only has to thaw it.
type warmCopy struct {
	id    string
	state string
	r     restored
}

func (w *warmCopy) destroy(ctx context.Context, e *Engine) {
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
	e.fillWarm(sid, e.o.WarmCopies)
}

// fillWarm queues low-priority restores of n frozen copies of sid.
func (e *Engine) fillWarm(sid string, n int) {
	for i := 0; i < n; i++ {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return
		}
		e.bg.Add(1)
		e.mu.Unlock()
		e.q.Submit(queue.Low, "warm "+sid, func(ctx context.Context) error {
			defer e.bg.Done()
			id := launch.NewID()
			e.gcMu.RLock()
			r, err := e.restore(ctx, sid, id+"-0")
			e.gcMu.RUnlock()
			if err != nil {
				e.log.Warn("warm copy", slog.String("state", sid), slog.Any("err", err))
				return err
			}
			if err := r.sb.Freeze(); err != nil {
				(&warmCopy{r: r}).destroy(ctx, e)
				return err
			}
			w := &warmCopy{id: id, state: sid, r: r}
			e.mu.Lock()
			// Keep it only while the state is still some env's newest.
			keep := !e.closed && e.isHead(sid)
			if keep {
				e.warm[sid] = append(e.warm[sid], w)
			}
			e.mu.Unlock()
			if !keep {
				w.destroy(ctx, e)
			}
			return nil
		})
	}
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

// takeWarm removes up to n warm copies of sid and queues replacements.
func (e *Engine) takeWarm(sid string, n int) []*warmCopy {
	e.mu.Lock()
	ws := e.warm[sid]
	k := min(n, len(ws))
	out := ws[:k:k]
	if k == len(ws) {
		// No entry for a state without copies: every branched state id
		// would stay in the map (and keep its state from GC).
		delete(e.warm, sid)
	} else {
		e.warm[sid] = ws[k:]
	}
	e.mu.Unlock()
	if k > 0 {
		e.fillWarm(sid, k)
	}
	return out
}

// dropWarm destroys the warm copies of sid.
func (e *Engine) dropWarm(ctx context.Context, sid string) {
	if sid == "" {
		return
	}
	e.mu.Lock()
	ws := e.warm[sid]
	delete(e.warm, sid)
	e.mu.Unlock()
	for _, w := range ws {
		w.destroy(ctx, e)
	}
}

// adoptWarm thaws a warm copy and makes it an environment at state st.
func (e *Engine) adoptWarm(ctx context.Context, w *warmCopy, st manifest.State, origin string) (*Env, error) {
	if err := w.r.sb.Thaw(); err != nil {
		w.destroy(ctx, e)
		return nil, err
	}
	return e.adopt(ctx, w.id, w.r, st, origin)
}
