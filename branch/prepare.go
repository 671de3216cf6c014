package branch

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/arbor-env/arbor/state"
)

// The defaults of prepared copies (docs/engine.md, "Prepared copies").
const (
	// DefaultPrepareTTL is how long prepared copies of a state are kept
	// after the last prepare of it (Options.PrepareTTL).
	DefaultPrepareTTL = time.Minute
	// DefaultPrepareCopies bounds the prepared copies of all states
	// together, queued or ready (Options.PrepareCopies).
	DefaultPrepareCopies = 64
)

// prepEntry is the prepared copies of one state: how many are queued
// (restores not yet finished) and ready (frozen in e.warm, marked
// prepared), and when they expire. A copy's job keeps it only while its
// entry is still the state's (an entry that expired and came back is a
// new one). Its fields are under e.mu.
type prepEntry struct {
	queued, ready int
	expires       time.Time
	// idle are closed when no restore is queued any more (Prepare's
	// wait).
	idle []chan struct{}
}

func (p *prepEntry) copies() int { return p.queued + p.ready }

// done counts a queued copy's restore finished (kept or not) and wakes
// the waiters when it was the last; e.mu is held.
func (p *prepEntry) done(k int) {
	p.queued = max(p.queued-k, 0)
	if p.queued == 0 {
		p.wake()
	}
}

func (p *prepEntry) wake() {
	for _, c := range p.idle {
		close(c)
	}
	p.idle = nil
}

// PrepareResult is what Prepare did, by state id: Prepared counts the
// prepared copies of each state, queued or ready, Ready those frozen and
// ready to thaw, Refused the copies asked for that did not fit in the
// budget (Options.PrepareCopies; absent when all fit).
type PrepareResult struct {
	Prepared map[string]int
	Ready    map[string]int
	Refused  map[string]int
}

// PrepareStats count prepared copies (Usage.Prepare): Queued and Ready
// now; since Open, Taken by branches, Expired (destroyed unused because
// their TTL passed, ready or restored after it; counted once destroyed)
// and Refused (over the budget).
type PrepareStats struct {
	Queued, Ready           int
	Taken, Expired, Refused int64
}

// Prepare queues background (queue.Low) restores of up to n frozen copies
// of each state in stateIDs, any committed state and not only an env's
// head, so that a branch from it later only thaws them (docs/engine.md,
// "Prepared copies"). A state that already has prepared copies gets only
// what it lacks of n; each prepare of a state keeps its copies for
// Options.PrepareTTL more. The copies of all states together are bounded
// by Options.PrepareCopies: what does not fit is reported in
// PrepareResult.Refused, and when nothing asked for fits Prepare fails
// with state.ErrOverBudget. An unknown state fails the whole call
// (state.ErrUnknownState) before anything is queued. With wait, Prepare returns
// once the copies of the named states are restored (or failed), or ctx
// ends (its error, with what was prepared by then).
func (e *Engine) Prepare(ctx context.Context, stateIDs []string, n int, wait bool) (PrepareResult, error) {
	if len(stateIDs) == 0 {
		return PrepareResult{}, fmt.Errorf("%w: prepare needs at least one state id", state.ErrInvalid)
	}
	if n < 1 {
		return PrepareResult{}, fmt.Errorf("%w: prepare n=%d, want at least 1", state.ErrInvalid, n)
	}
	ids := make([]string, 0, len(stateIDs))
	seen := map[string]bool{}
	for _, sid := range stateIDs {
		if !seen[sid] {
			seen[sid] = true
			ids = append(ids, sid)
		}
	}
	// Under disk pressure copies would only be dropped again (relieve):
	// refused at once, not waited for as Admit does, since this is a hint.
	if full := e.underPressure(); full != "" {
		return PrepareResult{}, fmt.Errorf("%w: %s, under disk pressure (over %.0f%% until back under %.0f%%): nothing prepared",
			state.ErrNoSpace, full, 100*e.o.HighWater, 100*e.o.LowWater)
	}
	// Looked up and registered under the GC lock, so that no pass falls
	// between the look-up and the entry that keeps the state.
	e.gcMu.RLock()
	for _, sid := range ids {
		if _, err := e.State(sid); err != nil {
			e.gcMu.RUnlock()
			return PrepareResult{}, err
		}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.gcMu.RUnlock()
		return PrepareResult{}, state.ErrClosed
	}
	total := 0
	for _, p := range e.prep {
		total += p.copies()
	}
	budget := max(e.o.PrepareCopies-total, 0)
	expires := e.now().Add(e.o.PrepareTTL)
	refused := map[string]int{}
	type fill struct {
		sid string
		p   *prepEntry
		k   int
	}
	var fills []fill
	added, asked := 0, 0
	for _, sid := range ids {
		p := e.prep[sid]
		lack := n
		if p != nil {
			lack = max(n-p.copies(), 0)
		}
		asked += lack
		k := min(lack, budget)
		budget -= k
		if lack > k {
			refused[sid] = lack - k
		}
		if k == 0 && p == nil {
			continue // nothing to keep it for
		}
		if p == nil {
			p = &prepEntry{}
			e.prep[sid] = p
		}
		p.expires = expires
		p.queued += k
		added += k
		if k > 0 {
			fills = append(fills, fill{sid, p, k})
		}
	}
	if len(refused) > 0 {
		e.prepStats.Refused += int64(asked - added)
	}
	e.mu.Unlock()
	e.gcMu.RUnlock()
	if added == 0 && len(refused) > 0 {
		return PrepareResult{Refused: refused}, fmt.Errorf("%w: %d prepared copies of at most %d are in use; none of the %d asked for fits",
			state.ErrOverBudget, total, e.o.PrepareCopies, asked)
	}
	for _, f := range fills {
		e.fillWarm(f.sid, f.k, f.p)
	}
	e.nudgeGC() // its timer learns the new expiry
	var err error
	if wait {
		err = e.waitPrepared(ctx, ids)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed && err == nil {
		return PrepareResult{}, state.ErrClosed // woken by Close: nothing is prepared
	}
	res := PrepareResult{Prepared: map[string]int{}, Ready: map[string]int{}}
	if len(refused) > 0 {
		res.Refused = refused
	}
	e.mu.Lock()
	for _, sid := range ids {
		if p := e.prep[sid]; p != nil {
			res.Prepared[sid], res.Ready[sid] = p.copies(), p.ready
		} else {
			res.Prepared[sid], res.Ready[sid] = 0, 0
		}
	}
	e.mu.Unlock()
	return res, err
}

// waitPrepared waits until no restore of a prepared copy of ids is
// queued or running. It does not wait on the queue's jobs
// (queue.Job.Wait would raise them to High): the copies stay background
// work.
func (e *Engine) waitPrepared(ctx context.Context, ids []string) error {
	var waits []chan struct{}
	e.mu.Lock()
	for _, sid := range ids {
		if p := e.prep[sid]; p != nil && p.queued > 0 {
			c := make(chan struct{})
			p.idle = append(p.idle, c)
			waits = append(waits, c)
		}
	}
	e.mu.Unlock()
	for _, c := range waits {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// dropPrepared destroys every prepared copy now, whatever its TTL (disk
// pressure: relieve); they count as expired.
func (e *Engine) dropPrepared(ctx context.Context) {
	e.mu.Lock()
	n := len(e.prep)
	e.mu.Unlock()
	if n > 0 {
		e.expirePrepared(ctx, e.now().Add(100*365*24*time.Hour))
	}
}

// prepKeep is the states that prepared copies keep from GC (queued ones
// too: their restores need the state); e.mu is held.
func (e *Engine) prepKeep() []string {
	out := make([]string, 0, len(e.prep))
	for sid := range e.prep {
		out = append(out, sid)
	}
	return out
}

// expirePrepared destroys the prepared copies whose TTL has passed at
// now and forgets their entries (their queued restores destroy what they
// make); it returns when the next entry expires (zero: none).
func (e *Engine) expirePrepared(ctx context.Context, now time.Time) time.Time {
	var gone []*warmCopy
	var next time.Time
	e.mu.Lock()
	var expired []string
	for sid, p := range e.prep {
		if now.Before(p.expires) {
			if next.IsZero() || p.expires.Before(next) {
				next = p.expires
			}
			continue
		}
		expired = append(expired, sid)
	}
	sort.Strings(expired)
	for _, sid := range expired {
		e.prep[sid].wake()
		delete(e.prep, sid)
		gone = append(gone, e.removeWarm(sid, true)...)
	}
	e.mu.Unlock()
	// Not cut short by Close (it ends ctx): they left e.warm above, so
	// Close would not destroy them itself.
	for _, w := range gone {
		w.destroy(context.WithoutCancel(ctx), e)
	}
	// Counted once destroyed: a reader that sees them expired sees them
	// gone.
	e.mu.Lock()
	e.prepStats.Expired += int64(len(gone))
	e.mu.Unlock()
	if len(expired) > 0 {
		e.log.Debug("prepared copies expired", slog.Int("states", len(expired)), slog.Int("copies", len(gone)))
	}
	return next
}

// prepareStats is Usage.Prepare; e.mu is held.
func (e *Engine) prepareStats() PrepareStats {
	s := e.prepStats
	for _, p := range e.prep {
		s.Queued += p.queued
		s.Ready += p.ready
	}
	return s
}
