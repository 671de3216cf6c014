// Package admit is the coordinator's admission control (docs/architecture.md,
// "Admission control"): each class of operation (reset, step, branch,
// evaluate) runs at most Slots at once; the rest wait in a bounded queue
// served round robin across tenants, then across the clients of a tenant,
// then in arrival order, so a client with 200 envs stepping cannot starve
// one with 2. A request that would wait longer than its bound (the
// queue's Wait, or sooner its context's deadline) is refused with a
// state.ErrBusy carrying a retry-after hint (state.RetryAfter) instead of
// waiting: at once when the queue ahead of it, times the class's recent
// service time, already passes the bound, else when the bound passes while
// it waits.
//
// Pure logic, no syscalls: the clock is a field tests set.
//
// Locks: Queue.mu is a leaf; no callback runs under it.
package admit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/arbor-env/arbor/state"
)

// Options configure a Queue.
type Options struct {
	// Slots: operations of the class that run at once (at least 1).
	Slots int
	// Wait bounds a request's time in the queue; 0 or negative: no
	// bound (requests wait their turn however long, still fairly).
	Wait time.Duration
	// MaxQueued bounds the requests waiting (0: no bound but Wait's);
	// one more is refused busy at once.
	MaxQueued int
}

// Queue admits the operations of one class.
type Queue struct {
	o   Options
	now func() time.Time

	mu      sync.Mutex
	running int
	queued  int
	// tenants with waiters, in round-robin order; next is served first.
	tenants []*tenantQ
	byName  map[string]*tenantQ
	// service is the recent service time (an exponential moving average
	// of the admitted operations' durations; 0 until one ended).
	service time.Duration
	// waited is the recent wait of admitted requests (the same average).
	waited time.Duration
	// resumed are paused tickets waiting for a slot again, served first.
	resumed []*waiter
	busy    int64
}

type tenantQ struct {
	name    string
	clients []*clientQ
	byName  map[string]*clientQ
}

type clientQ struct {
	name    string
	waiters []*waiter
}

type waiter struct {
	ready   chan struct{}
	granted bool
}

// New makes a Queue.
func New(o Options) *Queue {
	o.Slots = max(o.Slots, 1)
	return &Queue{o: o, now: time.Now, byName: map[string]*tenantQ{}}
}

// Stats is what a Queue holds now.
type Stats struct {
	Running, Queued, Slots int
	// Service is the recent service time (0: none measured yet).
	Service time.Duration
	// Waited is the recent wait in the queue of the admitted requests.
	Waited time.Duration
	// Busy counts the requests refused since the queue was made.
	Busy int64
}

// Stats reads the queue.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{Running: q.running, Queued: q.queued, Slots: q.o.Slots, Service: q.service, Waited: q.waited, Busy: q.busy}
}

// Ticket is an admitted request's slot: Done gives it back.
type Ticket struct {
	q *Queue
	// Waited is how long the request waited in the queue.
	Waited time.Duration

	mu      sync.Mutex
	start   time.Time     // when it last took its slot
	held    time.Duration // time it held a slot before its last Pause
	paused  bool          // its slot given back (PauseAfter)
	resumed bool          // PauseAfter's resume ran
	ended   bool
}

// Done ends the admitted operation: its slot (unless paused) goes to the
// next waiter, and the time it held one into the recent service time.
// Later calls do nothing.
func (t *Ticket) Done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	held := t.held
	if !t.paused {
		held += t.q.now().Sub(t.start)
	}
	t.q.done(held, !t.paused)
}

// PauseAfter gives the ticket's slot back if its operation still runs
// after d, for as long as it waits on something other than the server's
// work (a step's command running in its sandbox, on the sandbox's own
// CPU): when a step held its slot for the whole command, 16 envs running
// `sleep 600` made every other env's step busy. The resume it returns
// ends that wait: it takes a slot again if the ticket gave its one back,
// waiting as long as it takes (the operation was admitted and is under
// way: a command that ran must be classified and committed), never
// refused, and served before every request not admitted yet. An
// operation shorter than d keeps its slot throughout, so the queue's
// fairness and bounds still govern what the server does at once.
func (t *Ticket) PauseAfter(d time.Duration) (resume func()) {
	timer := time.AfterFunc(d, t.pause)
	return func() {
		timer.Stop()
		t.mu.Lock()
		defer t.mu.Unlock()
		t.resumed = true // a pause not run yet does nothing
		if !t.paused || t.ended {
			return
		}
		t.q.resume()
		t.paused = false
		t.start = t.q.now()
	}
}

func (t *Ticket) pause() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.paused || t.ended || t.resumed {
		return
	}
	t.paused = true
	t.held += t.q.now().Sub(t.start)
	t.q.release()
}

// Admit waits for a slot for a request of client of tenant. It answers a
// Ticket once admitted, an error wrapping state.ErrBusy (with
// state.RetryAfter's hint) when the request would wait longer than its
// bound, or ctx's error if it ends first.
func (q *Queue) Admit(ctx context.Context, tenant, client string) (*Ticket, error) {
	start := q.now()
	bound, byDeadline := q.o.Wait, false
	if d, ok := ctx.Deadline(); ok && (bound <= 0 || d.Sub(start) < bound) {
		bound, byDeadline = max(d.Sub(start), time.Nanosecond), true
	}
	q.mu.Lock()
	if q.running < q.o.Slots && q.queued == 0 && len(q.resumed) == 0 {
		q.running++
		q.waited = average(q.waited, 0)
		q.mu.Unlock()
		return &Ticket{q: q, start: start}, nil
	}
	c := q.client(tenant, client)
	ahead := q.ahead(tenant, c) + len(q.resumed)
	est := q.estimate(ahead)
	if (q.o.MaxQueued > 0 && q.queued >= q.o.MaxQueued) || (bound > 0 && q.service > 0 && est > bound) {
		q.busy++
		hint := q.hint(est)
		q.drop(tenant, c)
		running, queued := q.running, q.queued // read under q.mu
		q.mu.Unlock()
		return nil, state.RetryAfterError(hint, fmt.Errorf("%w: %d operations running, %d waiting, about %v to wait here, the bound is %v: retry in %v",
			state.ErrBusy, running, queued, est.Round(time.Millisecond), bound, hint.Round(time.Millisecond)))
	}
	w := &waiter{ready: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	q.queued++
	q.mu.Unlock()

	var timeout <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		timeout = t.C
	}
	var err error
	select {
	case <-w.ready:
	case <-ctx.Done():
		if !byDeadline || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = ctx.Err() // else the request's own bound passed: busy
		}
	case <-timeout:
	}
	q.mu.Lock()
	if w.granted {
		now := q.now()
		q.waited = average(q.waited, now.Sub(start))
		q.mu.Unlock()
		return &Ticket{q: q, start: now, Waited: now.Sub(start)}, nil
	}
	q.remove(tenant, client, w)
	if err == nil {
		q.busy++
		est = q.estimate(q.queued)
		hint := q.hint(est)
		err = state.RetryAfterError(hint, fmt.Errorf("%w: waited %v for one of %d slots (%d waiting): retry in %v",
			state.ErrBusy, bound, q.o.Slots, q.queued, hint.Round(time.Millisecond)))
	}
	q.mu.Unlock()
	return nil, err
}

// hint is how long a refused request should wait before it tries again:
// its estimated wait est, the time the requests ahead of it take to drain
// (at least one slot's turnover, at least 10 ms, at most a minute). Not
// est less the bound, the earliest its wait would fit: every request
// refused together would come back together into the same full queue
// (BenchmarkAdmitFlood in package server: ten times the busy answers for
// about the same steps per second). Under q.mu.
func (q *Queue) hint(est time.Duration) time.Duration {
	h := max(est, q.service/time.Duration(q.o.Slots), 10*time.Millisecond)
	return min(h, time.Minute)
}

// estimate is the wait of a request with ahead requests served before it:
// each slot ends one operation per service time. Under q.mu.
func (q *Queue) estimate(ahead int) time.Duration {
	return time.Duration(ahead+1) * q.service / time.Duration(q.o.Slots)
}

// ahead counts the waiters a new waiter of client c of tenant would let
// go first under round robin: its own client's, and of every other
// client as many as its position among its own tenant's and client's
// queues lets through. Under q.mu.
func (q *Queue) ahead(tenant string, c *clientQ) int {
	mine := len(c.waiters) // rounds of its client before it
	t := q.byName[tenant]
	// Rounds of its tenant before it: each round of the tenant serves one
	// of its clients, so it comes after about mine rounds of each client.
	tRounds := 0
	n := 0
	for _, o := range t.clients {
		k := min(len(o.waiters), mine+1)
		if o == c {
			k = mine
		}
		tRounds += k
		n += k
	}
	for _, o := range q.tenants {
		if o == t {
			continue
		}
		for _, oc := range o.clients {
			// Another tenant gets a round per round of this tenant.
			k := min(len(oc.waiters), tRounds+1)
			n += k
		}
	}
	return n
}

// client finds or makes the queue of client of tenant. Under q.mu.
func (q *Queue) client(tenant, client string) *clientQ {
	t, ok := q.byName[tenant]
	if !ok {
		t = &tenantQ{name: tenant, byName: map[string]*clientQ{}}
		q.byName[tenant] = t
		q.tenants = append(q.tenants, t)
	}
	c, ok := t.byName[client]
	if !ok {
		c = &clientQ{name: client}
		t.byName[client] = c
		t.clients = append(t.clients, c)
	}
	return c
}

// drop forgets client c of tenant if it has no waiters. Under q.mu.
func (q *Queue) drop(tenant string, c *clientQ) {
	if len(c.waiters) > 0 {
		return
	}
	t := q.byName[tenant]
	delete(t.byName, c.name)
	t.clients = without(t.clients, c)
	if len(t.clients) == 0 {
		delete(q.byName, tenant)
		q.tenants = without(q.tenants, t)
	}
}

// remove takes w out of its client's queue (it gave up). Under q.mu.
func (q *Queue) remove(tenant, client string, w *waiter) {
	t := q.byName[tenant]
	c := t.byName[client]
	c.waiters = without(c.waiters, w)
	q.queued--
	q.drop(tenant, c)
}

// done ends an admitted operation that held a slot for d in all; holding
// says it holds one now. Under no lock.
func (q *Queue) done(d time.Duration, holding bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.service == 0 {
		q.service = d
	} else {
		q.service = average(q.service, d)
	}
	if holding {
		q.running--
		q.grant()
	}
}

// release gives back a paused ticket's slot. Under no lock.
func (q *Queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running--
	q.grant()
}

// resume waits for a slot for a paused ticket, ahead of every waiter not
// admitted yet. Under no lock.
func (q *Queue) resume() {
	q.mu.Lock()
	if q.running < q.o.Slots && len(q.resumed) == 0 {
		q.running++
		q.mu.Unlock()
		return
	}
	w := &waiter{ready: make(chan struct{})}
	q.resumed = append(q.resumed, w)
	q.mu.Unlock()
	<-w.ready
}

// grant hands free slots to waiters round robin: the first tenant, its
// first client, its oldest waiter; the tenant and the client then go to
// the back of their rings. Under q.mu.
func (q *Queue) grant() {
	for q.running < q.o.Slots && len(q.resumed) > 0 {
		w := q.resumed[0]
		q.resumed = q.resumed[1:]
		w.granted = true
		close(w.ready)
		q.running++
	}
	for q.running < q.o.Slots && q.queued > 0 {
		t := q.tenants[0]
		c := t.clients[0]
		w := c.waiters[0]
		c.waiters = c.waiters[1:]
		w.granted = true
		close(w.ready)
		q.running++
		q.queued--
		t.clients = append(t.clients[1:], c)
		q.tenants = append(q.tenants[1:], t)
		q.drop(t.name, c)
	}
}

// average moves the recent average avg a fifth of the way to d.
func average(avg, d time.Duration) time.Duration { return avg + (d-avg)/5 }

// without is s without e (kept in order).
func without[T comparable](s []T, e T) []T {
	for i, x := range s {
		if x == e {
			return append(s[:i:i], s[i+1:]...)
		}
	}
	return s
}
