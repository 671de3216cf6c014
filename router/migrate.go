package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// move is an env being migrated: the requests for it that arrive
// meanwhile wait for done, then are sent on one after the other, in
// arrival order, each once the one before it was sent (tail).
type move struct {
	done chan struct{}
	tail chan struct{}
}

// moving returns the wait of a request for env while env is migrated
// (nil when it is not): wait blocks until the migration ended and the
// requests for env that arrived before this one were sent; sent lets the
// next one go. It is called on the read loop, in arrival order.
func (r *Router) moving(env string) (wait func(ctx context.Context) error, sent func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.moves[env]
	if m == nil {
		return nil, nil
	}
	prev, next := m.tail, make(chan struct{})
	m.tail = next
	var once sync.Once
	return func(ctx context.Context) error {
			for _, ch := range []chan struct{}{m.done, prev} {
				select {
				case <-ch:
				case <-ctx.Done():
					once.Do(func() { close(next) })
					return state.Errorf(state.ErrShuttingDown, "router is shutting down")
				}
			}
			return nil
		}, func() {
			once.Do(func() { close(next) })
		}
}

// held wraps the answer of a request for env that must wait for env's
// migration: once it ended, send sends the request (to the env's node
// then) and its answer is waited for.
func (r *Router) held(ctx context.Context, env string, send func(ctx context.Context) answer) answer {
	wait, sent := r.moving(env)
	if wait == nil {
		return send(ctx)
	}
	return func(ctx context.Context) (any, error) {
		if err := wait(ctx); err != nil {
			return nil, err
		}
		a := send(ctx)
		sent()
		return a(ctx)
	}
}

// migrate moves env to another node (p.Node, else the least loaded live
// node that serves transfers): the source ships the env's lineage while
// it runs (precopy), then the router holds the requests for the env
// that arrive, the source stops the env at its last committed state,
// ships what it did since and the target adopts it under the same id,
// which rewrites its placement in etcd; the held requests then go to the
// target in their order (docs/cluster.md, "Live migration").
//
// With Options.ForwardTokens the client must see the env first: the
// node is asked for its states with the client's token, and another
// tenant's env is answered as the node answers it (unknown_env).
func (r *Router) migrate(ctx context.Context, p protocol.MigrateParams) answer {
	src, err := r.envNode(ctx, p.EnvID)
	if err != nil {
		return fail(err)
	}
	if !r.o.ForwardTokens {
		return r.migrateFrom(ctx, p, src)
	}
	check, err := r.send(ctx, src, protocol.MethodStates, protocol.EnvParams{EnvID: p.EnvID}, nil)
	if err != nil {
		return fail(err)
	}
	return func(ctx context.Context) (any, error) {
		if _, err := check.wait(ctx); err != nil {
			return nil, err
		}
		return r.migrateFrom(ctx, p, src)(ctx)
	}
}

// migrateFrom moves env p.EnvID from node src (migrate).
func (r *Router) migrateFrom(ctx context.Context, p protocol.MigrateParams, src string) answer {
	from, ok := r.view.Node(src)
	if !ok {
		return fail(unavailable(src, "it is not in the cluster registry"))
	}
	if from.Transfer == "" {
		return fail(state.Errorf(state.ErrInvalid, "node %s serves no state transfers: its envs cannot migrate", src))
	}
	var to cluster.NodeInfo
	if p.Node != "" {
		if to, ok = r.view.Node(p.Node); !ok {
			return fail(unavailable(p.Node, "it is not in the cluster registry"))
		}
	} else {
		for _, n := range r.view.Place("", nil) {
			if n.ID != src && n.Transfer != "" && n.Envs < n.MaxEnvs {
				to, ok = n, true
				break
			}
		}
		if !ok {
			return fail(state.Errorf(state.ErrTooManyEnvs, "no other live node can take env %s", p.EnvID))
		}
	}
	if to.ID == src {
		return fail(state.Errorf(state.ErrInvalid, "env %s is on node %s already", p.EnvID, src))
	}
	if to.Transfer == "" || to.Draining {
		return fail(state.Errorf(state.ErrInvalid, "node %s serves no state transfers or is draining", to.ID))
	}
	return func(ctx context.Context) (any, error) {
		start := time.Now()
		pre, err := r.ship.Migrate(ctx, "precopy", from.Transfer, to.Transfer, p.EnvID)
		if err != nil {
			return nil, migrateErr(err)
		}
		m := &move{done: make(chan struct{}), tail: make(chan struct{})}
		close(m.tail)
		r.mu.Lock()
		if r.moves[p.EnvID] != nil {
			r.mu.Unlock()
			return nil, state.Errorf(state.ErrInvalid, "env %s is being migrated already", p.EnvID)
		}
		r.moves[p.EnvID] = m
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			delete(r.moves, p.EnvID)
			r.mu.Unlock()
			close(m.done)
		}()
		st, err := r.ship.Migrate(ctx, "migrate", from.Transfer, to.Transfer, p.EnvID)
		if err != nil {
			return nil, migrateErr(err)
		}
		// The target wrote the placement before it answered; the watch
		// may bring it later than the held requests go.
		r.view.Moved(p.EnvID, to.ID)
		res := protocol.MigrateResult{EnvID: p.EnvID, Node: to.ID, From: src, StateID: st.State,
			PauseS: st.Pause.Seconds(), TookS: time.Since(start).Seconds(), PreBytes: pre.Bytes, Bytes: st.Bytes}
		r.log.Info("migrated env", slog.String("env", p.EnvID), slog.String("from", src), slog.String("to", to.ID),
			slog.Duration("pause", st.Pause), slog.Duration("took", time.Since(start)), slog.Int64("pre_bytes", pre.Bytes), slog.Int64("bytes", st.Bytes))
		return res, nil
	}
}

// migrateErr is a failed migration's protocol error: the env stays where
// it was.
func migrateErr(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) || protocol.CodeOf(err) != protocol.CodeInternal {
		return err
	}
	return state.Errorf(state.ErrRestore, "migration failed, the env stays on its node: %v", err)
}

// redirect resends a request answered unknown_env by node when the env's
// placement names another live node now (it migrated while the request
// was on its way, through another router or before this one held it).
// The resend waits for the env's earlier requests (wait), so that it
// keeps its place.
func (r *Router) redirect(ctx context.Context, env, node, method string, params msgpack.RawMessage, raw msgpack.RawMessage, err error,
	wait func(context.Context) error) (msgpack.RawMessage, error) {
	if protocol.CodeOf(err) != protocol.CodeUnknownEnv {
		return raw, err
	}
	now, gerr := r.view.FreshEnvNode(ctx, env)
	if gerr != nil || now == "" || now == node {
		return raw, err
	}
	if werr := wait(ctx); werr != nil {
		return nil, werr
	}
	r.view.Moved(env, now)
	s, serr := r.send(ctx, now, method, params, nil)
	if serr != nil {
		return nil, serr
	}
	return s.wait(ctx)
}

// failover restores env, whose node is gone from the registry, on the
// node holding its replica (arbor serve --replicas 2): that node adopts
// it at the replicated state, its last committed one there, and the
// placement names it from then on (docs/cluster.md, "Replicas"). Without
// a live replica the env's requests answer node_unavailable, as before.
// One restore per env at a time; the others wait for it.
func (r *Router) failover(ctx context.Context, env, dead string) (string, error) {
	r.mu.Lock()
	if ch, ok := r.failing[env]; ok {
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", state.Errorf(state.ErrShuttingDown, "router is shutting down")
		}
		if now, err := r.view.FreshEnvNode(ctx, env); err == nil && now != dead {
			if _, live := r.view.Node(now); live {
				return now, nil
			}
		}
		return "", unavailable(dead, "it is not in the cluster registry, and no replica of the env could be restored")
	}
	ch := make(chan struct{})
	r.failing[env] = ch
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.failing, env)
		r.mu.Unlock()
		close(ch)
	}()
	gone := unavailable(dead, "it is not in the cluster registry (its lease ended: the node died or left), and the env has no live replica")
	rp, err := r.view.Replica(ctx, env)
	if err != nil || rp.Node == "" || rp.Node == dead {
		return "", gone
	}
	to, ok := r.view.Node(rp.Node)
	if !ok || to.Transfer == "" {
		return "", gone
	}
	start := time.Now()
	if err := r.ship.Adopt(ctx, to.Transfer, env, rp); err != nil && !strings.Contains(err.Error(), "open here already") {
		return "", unavailable(dead, fmt.Sprintf("it is gone, and restoring the env's replica on node %s failed: %v", rp.Node, err))
	}
	r.ship.Keep(ctx, to.Transfer, rp.State, false)
	r.view.Moved(env, rp.Node)
	r.log.Warn("restored an env of a dead node from its replica", slog.String("env", env), slog.String("dead", dead),
		slog.String("node", rp.Node), slog.String("state", rp.State), slog.Duration("took", time.Since(start)))
	return rp.Node, nil
}
