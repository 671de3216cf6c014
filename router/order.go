package router

import (
	"context"

	"github.com/arbor-env/arbor/state"
)

// envOrder keeps the order of one env's requests across a change of its
// node (a drain or a migration another router made): a request is
// resolved once it was answered, or resent to the env's new node, and
// tail is closed once every request sent so far is resolved. While
// requests sent to the old node are unresolved, a request for the new
// one waits for them, so it cannot overtake one that the old node will
// answer unknown_env and that is then resent.
type envOrder struct {
	node    string
	tail    chan struct{}
	n       int // requests not resolved
	waiting int // requests that wait to be sent (mustWait)
}

// sequence places a request for env, bound for node, in env's order
// (on the read loop, in arrival order). wait blocks until every earlier
// request for env is resolved; resolve marks this one resolved (once
// the earlier ones are). mustWait says the env's node changed while
// earlier requests are unresolved, or an earlier request waits: this one
// must wait before it is sent, and call sent once it was.
func (r *Router) sequence(env, node string) (wait func(context.Context) error, resolve, sent func(), mustWait bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.order[env]
	if o == nil {
		o = &envOrder{tail: closedChan}
		r.order[env] = o
	}
	prev, next := o.tail, make(chan struct{})
	mustWait = o.n > 0 && (o.node != node || o.waiting > 0)
	o.tail, o.node = next, node
	o.n++
	if mustWait {
		o.waiting++
	}
	done, wasSent := false, !mustWait
	sent = func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !wasSent {
			wasSent = true
			o.waiting--
		}
	}
	wait = func(ctx context.Context) error {
		select {
		case <-prev:
			return nil
		case <-ctx.Done():
			return state.Errorf(state.ErrShuttingDown, "router is shutting down")
		}
	}
	resolve = func() {
		r.mu.Lock()
		if done {
			r.mu.Unlock()
			return
		}
		done = true
		if !wasSent {
			wasSent = true
			o.waiting--
		}
		if o.n--; o.n == 0 && r.order[env] == o {
			delete(r.order, env)
		}
		r.mu.Unlock()
		go func() {
			<-prev
			close(next)
		}()
	}
	return wait, resolve, sent, mustWait
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
