// Package router is Arbor's cluster router (arbor router): protocol v1 at
// the URL of a single server, in front of many nodes. It is a
// server.Forwarder: package server speaks the protocol to clients, and the
// router sends each request to the node that holds its env (or state) over
// one pipelined websocket per node (the Go client, clients/go), placing
// resets on the least loaded live node. It keeps nothing etcd does not
// hold (package cluster's View); a node that is gone is answered with the
// retryable infra error node_unavailable, never a hang.
//
// Order per env: requests are sent to their node on the client
// connection's read loop, in the order they arrived, over the one
// connection to that node, so the node receives them in that order.
//
// OpenEnv connections (server.OpenEnvPlacer, docs/openenv.md) are
// proxied whole to one node: placed like a reset, or on the node of the
// session they attach to.
//
// Branch children are placed by load over the nodes (branch.go): the
// state is shipped once to each other node that takes children. Migrate
// moves an env between nodes (migrate.go); the env's requests wait in
// the router meanwhile, in order. Release,
// pin, unpin and prepare naming states of several nodes are sent to each
// (all or nothing per node, not across nodes).
//
// Lock order: Router.mu (connections, pending counts, migrations), then
// nodeConn.mu; cluster.View's lock is a leaf.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// Options configure a Router.
type Options struct {
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// NodeToken is presented to the nodes (their --token).
	NodeToken string
	// ForwardTokens: the requests of a client present the client's own
	// token to the nodes instead of NodeToken (the router and the nodes
	// run with the same tokens file: each client's view through the
	// router is its tenant's; docs/security.md, "Tenants"). The router's
	// own work (shipping states, migrations) still uses NodeToken.
	ForwardTokens bool
	// DialTimeout bounds a connection to a node (default 3 s).
	DialTimeout time.Duration
	// Timeout bounds each etcd call (default 5 s).
	Timeout time.Duration
	// ShipTimeout bounds one state's shipment between nodes for a
	// branch (default 10 min).
	ShipTimeout time.Duration
	Logger      *slog.Logger
}

// Router forwards protocol v1 to the cluster's nodes.
type Router struct {
	o    Options
	log  *slog.Logger
	view *cluster.View
	ship *cluster.ShipClient

	mu      sync.Mutex
	conns   map[connKey]*nodeConn
	pending map[string]int   // resets sent to each node, not yet answered
	moves   map[string]*move // envs being migrated (migrate.go)
	order   map[string]*envOrder
	failing map[string]chan struct{} // envs being restored from a replica
}

// connKey names a connection to a node: the node and the token it
// presents (NodeToken, or a client's with Options.ForwardTokens).
type connKey struct{ node, token string }

// nodeConn is the router's connection to one node, dialed when first
// needed and again after it dropped.
type nodeConn struct {
	id   string
	mu   sync.Mutex
	c    *arbor.Client
	addr string
	// failed is when a dial last failed: no new dial before a second has
	// passed, so a dead node costs one dial timeout, not one per request.
	failed time.Time
}

// New starts a router on the cluster at o.Endpoints.
func New(ctx context.Context, o Options) (*Router, error) {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	r := &Router{o: o, log: o.Logger, conns: map[connKey]*nodeConn{}, pending: map[string]int{}, moves: map[string]*move{}, order: map[string]*envOrder{}, failing: map[string]chan struct{}{},
		ship: cluster.NewShipClient(o.NodeToken, o.ShipTimeout)}
	v, err := cluster.Watch(ctx, cluster.ViewOptions{Endpoints: o.Endpoints, Timeout: o.Timeout, Logger: o.Logger, OnNodeGone: r.nodeGone})
	if err != nil {
		return nil, err
	}
	r.view = v
	return r, nil
}

// Close stops following etcd and closes the connections to the nodes;
// requests in flight fail.
func (r *Router) Close() {
	r.view.Close()
	r.mu.Lock()
	conns := r.conns
	r.conns = map[connKey]*nodeConn{}
	r.mu.Unlock()
	for _, nc := range conns {
		nc.close()
	}
}

// View is the router's picture of the cluster.
func (r *Router) View() *cluster.View { return r.view }

// nodeGone drops the connection to a node whose key vanished: requests
// still waiting on it fail with node_unavailable at once (a node whose
// host vanished without closing its connections would otherwise hold
// them until the keepalive noticed).
func (r *Router) nodeGone(id string) {
	var gone []*nodeConn
	r.mu.Lock()
	for k, nc := range r.conns {
		if k.node == id {
			gone = append(gone, nc)
			delete(r.conns, k)
		}
	}
	r.mu.Unlock()
	for _, nc := range gone {
		nc.close()
	}
}

func (nc *nodeConn) close() {
	nc.mu.Lock()
	c := nc.c
	nc.c = nil
	nc.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// client returns a connection to the live node id that presents the
// token of ctx's client (Options.ForwardTokens), else NodeToken.
func (r *Router) client(ctx context.Context, id string) (*arbor.Client, error) {
	info, ok := r.view.Node(id)
	if !ok {
		return nil, unavailable(id, "it is not in the cluster registry (its lease ended: the node died or left)")
	}
	key := connKey{node: id, token: r.o.NodeToken}
	if r.o.ForwardTokens {
		key.token = tenant.Token(ctx)
	}
	r.mu.Lock()
	nc := r.conns[key]
	if nc == nil {
		nc = &nodeConn{id: id}
		r.conns[key] = nc
	}
	r.mu.Unlock()
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.c != nil {
		select {
		case <-nc.c.Done():
			nc.c = nil
		default:
			if nc.addr == info.Addr {
				return nc.c, nil
			}
			nc.c.Close() // the node came back elsewhere
			nc.c = nil
		}
	}
	if time.Since(nc.failed) < time.Second {
		return nil, unavailable(id, fmt.Sprintf("connecting to %s failed a moment ago", info.Addr))
	}
	dctx, cancel := context.WithTimeout(ctx, r.o.DialTimeout)
	defer cancel()
	c, err := arbor.Dial(dctx, info.Addr, &arbor.Options{Token: key.token})
	if err != nil {
		nc.failed = time.Now()
		return nil, unavailable(id, err.Error())
	}
	nc.c, nc.addr = c, info.Addr
	return c, nil
}

// unavailable is the error of a request whose node cannot be reached.
func unavailable(node, why string) error {
	return state.Errorf(protocol.ErrNodeUnavailable, "node %s is unavailable: %s", node, why)
}

// answer is a function that waits for a request's answer.
type answer = func(ctx context.Context) (any, error)

func fail(err error) answer { return func(context.Context) (any, error) { return nil, err } }

// sent is a request sent to a node.
type sent struct {
	node string
	p    *arbor.Pending
}

// send sends a request to node without waiting for its answer.
func (r *Router) send(ctx context.Context, node, method string, params any, onItem func(arbor.BatchItemResult)) (*sent, error) {
	c, err := r.client(ctx, node)
	if err != nil {
		return nil, err
	}
	if raw, ok := params.(msgpack.RawMessage); ok && len(raw) == 0 {
		params = nil
	}
	p, err := c.Send(method, params, onItem)
	if err != nil {
		return nil, unavailable(node, err.Error())
	}
	return &sent{node: node, p: p}, nil
}

// wait waits for a sent request's answer, undecoded.
func (s *sent) wait(ctx context.Context) (msgpack.RawMessage, error) {
	var raw msgpack.RawMessage
	err := s.p.Wait(ctx, &raw)
	var pe *protocol.Error
	switch {
	case err == nil:
		return raw, nil
	case errors.As(err, &pe):
		return nil, pe
	case errors.Is(err, arbor.ErrClosed):
		return nil, unavailable(s.node, "its connection dropped while the request ran (it may or may not have run)")
	case ctx.Err() != nil:
		return nil, state.Errorf(state.ErrShuttingDown, "router is shutting down")
	default:
		return nil, fmt.Errorf("node %s: %v", s.node, err)
	}
}

// forward sends a request to node and returns the wait for its raw
// answer.
func (r *Router) forward(ctx context.Context, node, method string, params msgpack.RawMessage) answer {
	s, err := r.send(ctx, node, method, params, nil)
	if err != nil {
		return fail(err)
	}
	return func(ctx context.Context) (any, error) {
		raw, err := s.wait(ctx)
		if err != nil {
			return nil, err
		}
		return raw, nil
	}
}

// decoded is fn's answer to a request whose params decode into a P, or
// the decoding's error.
func decoded[P any, PP interface {
	*P
	protocol.Params
}](params msgpack.RawMessage, fn func(p PP) answer) answer {
	p := PP(new(P))
	if err := protocol.DecodeParams(params, p); err != nil {
		return fail(err)
	}
	return fn(p)
}

// Forward serves one request (server.Forwarder).
// ctx carries the client's token (tenant.Token), which the requests sent
// for it present to the nodes when Options.ForwardTokens is set.
func (r *Router) Forward(ctx context.Context, msgid uint32, method string, params msgpack.RawMessage, notify func(string, any)) func(context.Context) (any, error) {
	switch method {
	case protocol.MethodReset:
		return decoded(params, func(p *protocol.ResetParams) answer {
			return r.reset(ctx, *p, params)
		})
	case protocol.MethodStep:
		return decoded(params, func(p *protocol.StepParams) answer {
			return r.toEnv(ctx, p.EnvID, method, params)
		})
	case protocol.MethodCheckpoint, protocol.MethodPromote, protocol.MethodDiscard, protocol.MethodEvaluate,
		protocol.MethodClose, protocol.MethodStates:
		return decoded(params, func(p *protocol.EnvParams) answer {
			return r.toEnv(ctx, p.EnvID, method, params)
		})
	case protocol.MethodRollback:
		return decoded(params, func(p *protocol.RollbackParams) answer {
			return r.toEnv(ctx, p.EnvID, method, params)
		})
	case protocol.MethodBranch:
		return decoded(params, func(p *protocol.BranchParams) answer {
			if p.EnvID != "" {
				return r.held(ctx, p.EnvID, func(ctx context.Context) answer { return r.branch(ctx, *p, params) })
			}
			return r.branch(ctx, *p, params)
		})
	case protocol.MethodMigrate:
		return decoded(params, func(p *protocol.MigrateParams) answer {
			return r.held(ctx, p.EnvID, func(ctx context.Context) answer { return r.migrate(ctx, *p) })
		})
	case protocol.MethodEnvs:
		return decoded(params, func(*protocol.EnvsParams) answer {
			return r.envs(ctx)
		})
	case protocol.MethodRelease, protocol.MethodPin, protocol.MethodUnpin:
		return decoded(params, func(p *protocol.StateIDsParams) answer {
			return r.states(ctx, method, p.StateIDs)
		})
	case protocol.MethodTrajectory:
		// An env's path is where the env is; a state's where its
		// artifacts are (turns that ran on another node before a state
		// was shipped are that node's: the answer lists them as missing).
		return decoded(params, func(p *protocol.TrajectoryParams) answer {
			if p.EnvID != "" {
				return r.toEnv(ctx, p.EnvID, method, params)
			}
			node, err := r.stateNode(ctx, p.StateID)
			if err != nil {
				return fail(err)
			}
			return r.forward(ctx, node, method, params)
		})
	case protocol.MethodTasks:
		// Every node serves the same tasks: the first live one answers.
		return decoded(params, func(*protocol.TasksParams) answer {
			nodes := r.view.Nodes()
			if len(nodes) == 0 {
				return fail(state.Errorf(protocol.ErrNodeUnavailable, "no node is registered"))
			}
			return r.forward(ctx, nodes[0].ID, method, params)
		})
	case protocol.MethodPrepare:
		return decoded(params, func(p *protocol.PrepareParams) answer {
			return r.prepare(ctx, *p)
		})
	case protocol.MethodStepBatch:
		return decoded(params, func(p *protocol.StepBatchParams) answer {
			// A batch naming an env being migrated waits for it as a whole.
			var waits []func(context.Context) error
			var sents []func()
			for _, it := range p.Items {
				if w, sent := r.moving(it.EnvID); w != nil {
					waits, sents = append(waits, w), append(sents, sent)
				}
			}
			if len(waits) == 0 {
				return r.stepBatch(ctx, msgid, p.Items, notify)
			}
			return func(ctx context.Context) (any, error) {
				defer func() {
					for _, s := range sents {
						s()
					}
				}()
				for _, w := range waits {
					if err := w(ctx); err != nil {
						return nil, err
					}
				}
				return r.stepBatch(ctx, msgid, p.Items, notify)(ctx)
			}
		})
	}
	return fail(state.Errorf(protocol.ErrUnknownMethod, "unknown method %q", method))
}

// envNode is the live node holding env.
func (r *Router) envNode(ctx context.Context, env string) (string, error) {
	node, err := r.view.EnvNode(ctx, env)
	if err != nil {
		return "", state.Errorf(protocol.ErrNodeUnavailable, "cluster registry: %v", err)
	}
	if node == "" {
		// Worded as a node words it (coordinator.lookup), so that an env
		// nobody made and another tenant's read alike.
		return "", protocol.ErrorOf(fmt.Errorf("%w: no open env %q", state.ErrUnknownEnv, env))
	}
	return node, nil
}

// toEnv sends a request for env to its node (after env's migration
// when one is under way), resending it to the env's new node when the
// old one answers that it has no such env because the env moved; the
// env's order holds across the move (order.go).
func (r *Router) toEnv(ctx context.Context, env, method string, params msgpack.RawMessage) answer {
	return r.held(ctx, env, func(ctx context.Context) answer {
		node, err := r.envNode(ctx, env)
		if err != nil {
			return fail(err)
		}
		wait, resolve, sentNow, mustWait := r.sequence(env, node)
		var s *sent
		failover := false
		if !mustWait {
			if s, err = r.send(ctx, node, method, params, nil); err != nil {
				if _, live := r.view.Node(node); live {
					resolve()
					return fail(err)
				}
				// Its node is gone: the env may have a replica.
				failover, s = true, nil
			}
		}
		return func(ctx context.Context) (any, error) {
			defer resolve()
			if failover {
				now, ferr := r.failover(ctx, env, node)
				if ferr != nil {
					return nil, ferr
				}
				node = now
			}
			if s == nil {
				if err := wait(ctx); err != nil {
					return nil, err
				}
				s, err = r.send(ctx, node, method, params, nil)
				sentNow()
				if err != nil {
					return nil, err
				}
			}
			raw, err := s.wait(ctx)
			raw, err = r.redirect(ctx, env, node, method, params, raw, err, wait)
			if err != nil {
				return nil, err
			}
			return raw, nil
		}
	})
}

// stateNode is a live node holding the state's artifacts.
func (r *Router) stateNode(ctx context.Context, sid string) (string, error) {
	nodes, err := r.view.StateNodes(ctx, sid)
	if err != nil {
		return "", state.Errorf(protocol.ErrNodeUnavailable, "cluster registry: %v", err)
	}
	for _, n := range nodes {
		if _, ok := r.view.Node(n); ok {
			return n, nil
		}
	}
	// State keys live under their node's lease: none means no live node
	// holds it.
	return "", state.Errorf(state.ErrUnknownState, "no live node holds state %q", sid)
}

// place ranks the live nodes that offer task (any node for "") by their
// load, counting the requests the router has in flight (View.Place).
func (r *Router) place(task string) []cluster.NodeInfo {
	r.mu.Lock()
	pending := maps.Clone(r.pending)
	r.mu.Unlock()
	return r.view.Place(task, pending)
}

// reset places a reset on the least loaded live node that offers the
// task; a node that cannot be reached before the request is sent is
// skipped for the next.
func (r *Router) reset(ctx context.Context, p protocol.ResetParams, params msgpack.RawMessage) answer {
	cands := r.place(p.Task)
	if len(cands) == 0 {
		if p.Task != "" && len(r.view.Nodes()) > 0 {
			// Live nodes, none with the task: as a single server would
			// answer (a node that had it and died is not told apart).
			return fail(state.Errorf(state.ErrUnknownTask, "no live node offers task %q", p.Task))
		}
		return fail(state.Errorf(protocol.ErrNodeUnavailable, "cannot place the reset: no node is registered"))
	}
	var last error
	for _, n := range cands {
		s, err := r.send(ctx, n.ID, protocol.MethodReset, params, nil)
		if err != nil {
			last = err
			r.log.Warn("reset: node unreachable, trying the next", slog.String("node", n.ID), slog.Any("err", err))
			continue
		}
		r.mu.Lock()
		r.pending[n.ID]++
		r.mu.Unlock()
		return func(ctx context.Context) (any, error) {
			raw, err := s.wait(ctx)
			r.mu.Lock()
			if r.pending[s.node]--; r.pending[s.node] <= 0 {
				delete(r.pending, s.node)
			}
			r.mu.Unlock()
			if err != nil {
				return nil, err
			}
			var res struct {
				EnvID string `msgpack:"env_id"`
			}
			if msgpack.Unmarshal(raw, &res) == nil && res.EnvID != "" {
				r.view.Placed(s.node, res.EnvID)
			}
			return raw, nil
		}
	}
	return fail(last)
}

// envs lists the envs of every live node. A node that does not answer
// is left out (its envs answer node_unavailable when named).
func (r *Router) envs(ctx context.Context) answer {
	var ss []*sent
	for _, n := range r.view.Nodes() {
		s, err := r.send(ctx, n.ID, protocol.MethodEnvs, nil, nil)
		if err != nil {
			r.log.Warn("envs: node unreachable", slog.String("node", n.ID), slog.Any("err", err))
			continue
		}
		ss = append(ss, s)
	}
	return func(ctx context.Context) (any, error) {
		out := protocol.EnvsResult{Envs: []protocol.EnvInfo{}}
		for _, s := range ss {
			raw, err := s.wait(ctx)
			if err != nil {
				r.log.Warn("envs: node failed", slog.String("node", s.node), slog.Any("err", err))
				continue
			}
			var part protocol.EnvsResult
			if err := msgpack.Unmarshal(raw, &part); err != nil {
				return nil, fmt.Errorf("node %s: decode envs: %v", s.node, err)
			}
			out.Envs = append(out.Envs, part.Envs...)
		}
		sort.Slice(out.Envs, func(i, j int) bool { return out.Envs[i].EnvID < out.Envs[j].EnvID })
		return out, nil
	}
}

// statesByNode groups state ids by the node holding each, nodes in the
// order their first state was named; an id no live node holds fails.
func (r *Router) statesByNode(ctx context.Context, ids []string) (map[string][]string, []string, error) {
	byNode := map[string][]string{}
	var order []string
	for _, id := range ids {
		node, err := r.stateNode(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		if _, ok := byNode[node]; !ok {
			order = append(order, node)
		}
		byNode[node] = append(byNode[node], id)
	}
	return byNode, order, nil
}

// states sends release, pin or unpin to the nodes holding the states,
// each node its own; an id no live node holds fails the call before any
// is sent.
func (r *Router) states(ctx context.Context, method string, ids []string) answer {
	byNode, order, err := r.statesByNode(ctx, ids)
	if err != nil {
		return fail(err)
	}
	var ss []*sent
	var first error
	for _, node := range order {
		s, err := r.send(ctx, node, method, protocol.StateIDsParams{StateIDs: byNode[node]}, nil)
		if err != nil {
			first = err
			break
		}
		ss = append(ss, s)
	}
	return func(ctx context.Context) (any, error) {
		for _, s := range ss {
			if _, err := s.wait(ctx); err != nil && first == nil {
				first = err
			}
		}
		if first != nil {
			return nil, first
		}
		return protocol.Empty{}, nil
	}
}

// prepare sends each node the prepare of the states it holds and merges
// their answers. A node's over_budget refuses its states' copies (in
// refused) while other nodes prepared theirs; when every node answers
// over_budget, so does the router, and any other failure of a node fails
// the call (what the other nodes prepared stays: it expires).
func (r *Router) prepare(ctx context.Context, p protocol.PrepareParams) answer {
	byNode, order, err := r.statesByNode(ctx, p.StateIDs)
	if err != nil {
		return fail(err)
	}
	ss := make([]*sent, 0, len(order))
	var first error
	for _, node := range order {
		q := p
		q.StateIDs = byNode[node]
		s, err := r.send(ctx, node, protocol.MethodPrepare, q, nil)
		if err != nil {
			first = err // the requests sent before are still waited for
			break
		}
		ss = append(ss, s)
	}
	return func(ctx context.Context) (any, error) {
		out := protocol.PrepareResult{Prepared: map[string]int{}, Ready: map[string]int{}}
		var over error
		ok := 0
		for _, s := range ss {
			raw, err := s.wait(ctx)
			var res protocol.PrepareResult
			if err == nil {
				if err = msgpack.Unmarshal(raw, &res); err != nil {
					err = fmt.Errorf("node %s: decode prepare: %v", s.node, err)
				}
			}
			switch {
			case err == nil:
				ok++
			case protocol.CodeOf(err) == protocol.CodeOverBudget:
				over = err
				// The node's answer carries no counts: all its states
				// read as refused, none prepared.
				res = protocol.PrepareResult{Prepared: map[string]int{}, Ready: map[string]int{}, Refused: map[string]int{}}
				for _, id := range byNode[s.node] {
					res.Prepared[id], res.Ready[id], res.Refused[id] = 0, 0, p.N
				}
			case first == nil:
				first = err
				continue
			default:
				continue
			}
			for id, n := range res.Prepared {
				out.Prepared[id] = n
			}
			for id, n := range res.Ready {
				out.Ready[id] = n
			}
			for id, n := range res.Refused {
				if out.Refused == nil {
					out.Refused = map[string]int{}
				}
				out.Refused[id] = n
			}
		}
		switch {
		case first != nil:
			return nil, first
		case ok == 0 && over != nil:
			return nil, over
		}
		return out, nil
	}
}

// stepBatch splits a step_batch by node: each node gets the items of its
// envs as a step_batch of its own, and each item's notification reaches
// the client under the client's msgid and the item's index in the
// client's batch. Items naming an env the router cannot place fail on
// their own.
func (r *Router) stepBatch(ctx context.Context, msgid uint32, items []protocol.BatchItem, notify func(string, any)) answer {
	results := make([]protocol.BatchItemResult, len(items))
	var mu sync.Mutex // results, between notifications and the final answer
	itemErr := func(i int, err error) {
		results[i] = protocol.BatchItemResult{Index: i, EnvID: items[i].EnvID, Error: protocol.ErrorOf(err)}
	}
	groups := map[string][]int{}
	var order []string
	var failed []int
	for i, it := range items {
		node, err := r.envNode(ctx, it.EnvID)
		if err != nil {
			itemErr(i, err)
			failed = append(failed, i)
			continue
		}
		if _, ok := groups[node]; !ok {
			order = append(order, node)
		}
		groups[node] = append(groups[node], i)
	}
	type part struct {
		s   *sent
		idx []int
	}
	var parts []part
	for _, node := range order {
		idx := groups[node]
		sub := make([]protocol.BatchItem, len(idx))
		for j, i := range idx {
			sub[j] = items[i]
		}
		onItem := func(it arbor.BatchItemResult) {
			if it.Index < 0 || it.Index >= len(idx) {
				return
			}
			it.MsgID, it.Index = msgid, idx[it.Index]
			notify(protocol.NotifyStepBatch, it)
		}
		s, err := r.send(ctx, node, protocol.MethodStepBatch, protocol.StepBatchParams{Items: sub}, onItem)
		if err != nil {
			for _, i := range idx {
				itemErr(i, err)
				failed = append(failed, i)
			}
			continue
		}
		parts = append(parts, part{s, idx})
	}
	return func(ctx context.Context) (any, error) {
		for _, i := range failed {
			notify(protocol.NotifyStepBatch, protocol.BatchItemResult{MsgID: msgid, Index: i, EnvID: items[i].EnvID, Error: results[i].Error})
		}
		var wg sync.WaitGroup
		for _, pt := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res protocol.StepBatchResult
				err := panics.Call(r.log, func() error {
					raw, err := pt.s.wait(ctx)
					if err != nil {
						return err
					}
					if err := msgpack.Unmarshal(raw, &res); err != nil {
						return fmt.Errorf("node %s: decode step_batch: %v", pt.s.node, err)
					}
					return nil
				}, slog.String("method", protocol.MethodStepBatch), slog.String("node", pt.s.node))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					// The node's batch failed as a whole (its connection
					// dropped): every item of it fails, and is notified.
					for _, i := range pt.idx {
						itemErr(i, err)
						notify(protocol.NotifyStepBatch, protocol.BatchItemResult{MsgID: msgid, Index: i, EnvID: items[i].EnvID, Error: results[i].Error})
					}
					return
				}
				for j, it := range res.Results {
					if j >= len(pt.idx) {
						break
					}
					it.MsgID, it.Index = 0, pt.idx[j]
					results[pt.idx[j]] = it
				}
			}()
		}
		wg.Wait()
		return protocol.StepBatchResult{Results: results}, nil
	}
}

// Capabilities are the cluster's, for hello: the tasks any live node
// offers, the envs all of them may hold, and the shortest idle TTL.
func (r *Router) Capabilities() protocol.Capabilities {
	var c protocol.Capabilities
	tasks := map[string]bool{}
	ttl := math.Inf(1)
	for _, n := range r.view.Nodes() {
		c.MaxEnvs += n.MaxEnvs
		for _, t := range n.Tasks {
			tasks[t] = true
		}
		if n.EnvIdleTTLS > 0 {
			ttl = min(ttl, n.EnvIdleTTLS)
		}
	}
	c.Tasks = []string{}
	for t := range tasks {
		c.Tasks = append(c.Tasks, t)
	}
	sort.Strings(c.Tasks)
	if !math.IsInf(ttl, 1) {
		c.EnvIdleTTLS = ttl
	}
	return c
}

// OpenEnvNode places an OpenEnv connection (server.OpenEnvPlacer): a new
// one on the least loaded live node that offers the task, counted as a
// pending env there while it lasts (its resets make their env there); one
// that attaches to a session on the node holding that env (branch
// children stay on their source's node).
func (r *Router) OpenEnvNode(ctx context.Context, task, session string) (addr, token string, done func(), err error) {
	done = func() {}
	var id string
	if session != "" {
		if id, err = r.envNode(ctx, session); err != nil {
			return "", "", nil, err
		}
	} else {
		cands := r.place(task)
		if len(cands) == 0 {
			return "", "", nil, state.Errorf(state.ErrUnknownTask, "no live node offers task %q", task)
		}
		id = cands[0].ID
		r.mu.Lock()
		r.pending[id]++
		r.mu.Unlock()
		done = func() {
			r.mu.Lock()
			if r.pending[id]--; r.pending[id] <= 0 {
				delete(r.pending, id)
			}
			r.mu.Unlock()
		}
	}
	info, ok := r.view.Node(id)
	if !ok {
		done()
		return "", "", nil, unavailable(id, "it is not in the cluster registry (its lease ended: the node died or left)")
	}
	if r.o.ForwardTokens {
		return info.Addr, tenant.Token(ctx), done, nil
	}
	return info.Addr, r.o.NodeToken, done, nil
}
