package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// NodeOptions configure a Node. Zero values take the defaults.
type NodeOptions struct {
	// Endpoints are etcd's client URLs.
	Endpoints []string
	// ID names the node in the cluster; it must be stable across the
	// node's restarts (its envs are recorded under it).
	ID string
	// Advertise is host:port where routers reach the node's websocket.
	Advertise string
	// Transfer is host:port where the node serves state transfers
	// (Transfer.Handler; "": none), published in its NodeInfo.
	Transfer string
	// TTL of the node's lease (default 10 s): a node that stops keeping
	// it alive is gone from the registry this long after.
	TTL time.Duration
	// Interval between publications of the node's load and sweeps of its
	// state keys (default TTL/3).
	Interval time.Duration
	// Timeout bounds each etcd call (default 5 s).
	Timeout time.Duration
	// StateGrace is how long a state's key stays before the sweep may
	// find the state gone (default 1 min): a step's state is committed
	// by its background checkpoint after the step answered, and until
	// then the engine does not list it.
	StateGrace time.Duration
	Version    string
	Logger     *slog.Logger
}

func (o NodeOptions) withDefaults() NodeOptions {
	if o.TTL <= 0 {
		o.TTL = 10 * time.Second
	}
	if o.TTL < time.Second {
		o.TTL = time.Second // etcd leases count whole seconds
	}
	if o.Interval <= 0 {
		o.Interval = o.TTL / 3
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.StateGrace <= 0 {
		o.StateGrace = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Local is what a node's registry asks of the node it publishes.
type Local interface {
	// Capacity fills MaxEnvs, Tasks and EnvIdleTTLS.
	Capacity() NodeInfo
	// HasState reports whether the node still holds the state (its
	// key is deleted once the engine's GC removed it).
	HasState(id string) bool
	// HasEnv reports whether the node still answers for the env: open,
	// or lost in a crash restart (it answers env_lost until the env is
	// closed), so that its placement is kept.
	HasEnv(id string) bool
	// CloseEnv closes an env of this node that the cluster answers for
	// elsewhere now (Node.fence).
	CloseEnv(ctx context.Context, id string) error
}

// Node publishes one Arbor node in etcd. It is the coordinator's Hooks
// (coordinator.Options.Hooks): envs opened and closed and states made are
// recorded as they happen, before the operation answers.
type Node struct {
	o   NodeOptions
	cli *clientv3.Client
	log *slog.Logger

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	mu         sync.Mutex
	lease      clientv3.LeaseID
	local      Local // nil until Register
	registered bool
	started    time.Time
	envs       map[string]string   // env -> the placement value this node put
	states     map[string]stateRec // keys put under the lease
	lost       map[string]bool     // envs whose placement could not be written yet
	closing    map[string]string   // closed envs: the placement value to delete
	draining   bool                // published: the node takes no new env
	kick       chan struct{}       // asks the publisher to publish the load now
}

// stateRec is a state whose key the node put.
type stateRec struct {
	env string
	at  time.Time
}

// Connect opens the node's etcd client and grants its lease. The hooks
// work from then on; the node is not listed until Register.
func Connect(ctx context.Context, o NodeOptions) (*Node, error) {
	o = o.withDefaults()
	if o.ID == "" || o.Advertise == "" || len(o.Endpoints) == 0 {
		return nil, fmt.Errorf("cluster node: endpoints, id and advertise address are required")
	}
	cli, err := newClient(o.Endpoints, o.Timeout)
	if err != nil {
		return nil, err
	}
	n := &Node{o: o, cli: cli, log: o.Logger.With(slog.String("node", o.ID)), envs: map[string]string{},
		states: map[string]stateRec{}, lost: map[string]bool{}, closing: map[string]string{}, started: time.Now(), kick: make(chan struct{}, 1)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.grant(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	return n, nil
}

// newClient opens an etcd client and checks that etcd answers.
func newClient(endpoints []string, timeout time.Duration) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %v: %v", ErrUnavailable, endpoints, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := cli.Get(ctx, Prefix+"probe"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: read from %v: %v", ErrUnavailable, endpoints, err)
	}
	return cli, nil
}

// grant takes a new lease and keeps it alive until the node closes; when
// it ends early (etcd unreachable for longer than the TTL) the node
// grants another and publishes itself again (renew).
func (n *Node) grant(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
	defer cancel()
	l, err := n.cli.Grant(ctx, int64(n.o.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("%w: grant lease: %v", ErrUnavailable, err)
	}
	ka, err := n.cli.KeepAlive(n.ctx, l.ID)
	if err != nil {
		return fmt.Errorf("%w: keep lease alive: %v", ErrUnavailable, err)
	}
	n.mu.Lock()
	n.lease = l.ID
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for range ka {
		}
		if n.ctx.Err() != nil {
			return
		}
		n.log.Warn("lease lost: registering again")
		n.renew()
	}()
	return nil
}

// renew grants a new lease after the old one ended and publishes the
// node and its state keys under it, retrying until it works or the node
// closes.
func (n *Node) renew() {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if err := n.grant(n.ctx); err == nil {
			n.mu.Lock()
			states := make(map[string]string, len(n.states))
			for s, r := range n.states {
				states[s] = r.env
			}
			n.mu.Unlock()
			for s, e := range states {
				n.putState(e, s)
			}
			if err := n.publish(); err != nil {
				n.log.Warn("publish node", slog.Any("err", err))
			}
			n.fence()
			return
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// fence closes the envs open here whose placement names another node:
// while this node's lease had ended (cut off, its process alive), a
// router restored them from their replicas there (docs/cluster.md,
// "Replicas"), and the cluster answers for them from that node. Their
// copies here would run on unseen, holding room, and answer a client
// that reached this node directly.
func (n *Node) fence() {
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	r, err := n.cli.Get(ctx, envsPrefix, clientv3.WithPrefix())
	if err != nil {
		n.log.Warn("list placements to fence envs restored elsewhere", slog.Any("err", err))
		return
	}
	moved := map[string]string{} // env -> the node that answers for it
	n.mu.Lock()
	local := n.local
	for _, e := range r.Kvs {
		var p Placement
		id := idOf(string(e.Key), envsPrefix)
		if n.envs[id] == "" || json.Unmarshal(e.Value, &p) != nil || p.Node == "" || p.Node == n.o.ID {
			continue
		}
		moved[id] = p.Node
		delete(n.lost, id) // never put this node's placement back
	}
	n.mu.Unlock()
	if local == nil {
		return
	}
	for id, node := range moved {
		n.log.Warn("an env of this node was restored on another node while its lease had ended: closing its copy here",
			slog.String("env", id), slog.String("node", node))
		if err := local.CloseEnv(ctx, id); err != nil {
			n.log.Warn("close an env restored elsewhere", slog.String("env", id), slog.Any("err", err))
		}
	}
}

// Register lists the node in the cluster: it puts its NodeInfo under its
// lease (waiting up to the TTL for an earlier run's key of the same id to
// expire: a node killed and restarted at once; ErrNodeIDTaken when a live
// node keeps it), then deletes the placements left under its id by an
// earlier run for envs it no longer has, and starts publishing its load
// every Interval.
func (n *Node) Register(ctx context.Context, local Local) error {
	n.mu.Lock()
	n.local = local
	n.mu.Unlock()
	deadline := time.Now().Add(n.o.TTL + 2*time.Second)
	for {
		info, lease := n.info()
		tctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
		r, err := n.cli.Txn(tctx).If(clientv3.Compare(clientv3.CreateRevision(NodeKey(n.o.ID)), "=", 0)).
			Then(clientv3.OpPut(NodeKey(n.o.ID), info, clientv3.WithLease(lease))).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("%w: register node %s: %v", ErrUnavailable, n.o.ID, err)
		}
		if r.Succeeded {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("register node %s: %w", n.o.ID, ErrNodeIDTaken)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	// Only the holder of the id's key may judge its placements.
	if err := n.dropStale(ctx); err != nil {
		return err
	}
	n.mu.Lock()
	n.registered = true
	n.mu.Unlock()
	n.log.Info("registered in the cluster", slog.String("addr", n.o.Advertise), slog.Duration("ttl", n.o.TTL))
	n.wg.Add(1)
	go n.publisher()
	return nil
}

// dropStale deletes the placements recorded under this node's id for
// envs it does not have (closed when an earlier run stopped, or lost).
func (n *Node) dropStale(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
	defer cancel()
	r, err := n.cli.Get(ctx, envsPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("%w: list placements: %v", ErrUnavailable, err)
	}
	type kv struct {
		key string
		rev int64
	}
	var stale []kv
	n.mu.Lock()
	local := n.local
	for _, e := range r.Kvs {
		var p Placement
		id := idOf(string(e.Key), envsPrefix)
		if json.Unmarshal(e.Value, &p) != nil || p.Node != n.o.ID || n.envs[id] != "" {
			continue
		}
		stale = append(stale, kv{string(e.Key), e.ModRevision})
	}
	n.mu.Unlock()
	keep := stale[:0]
	for _, e := range stale {
		if local == nil || !local.HasEnv(idOf(e.key, envsPrefix)) {
			keep = append(keep, e)
		}
	}
	stale = keep
	for _, e := range stale {
		// Each only if nobody rewrote it since it was read.
		if _, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.key), "=", e.rev)).Then(clientv3.OpDelete(e.key)).Commit(); err != nil {
			return fmt.Errorf("%w: delete stale placement: %v", ErrUnavailable, err)
		}
	}
	if len(stale) > 0 {
		n.log.Info("dropped placements of envs this node no longer has", slog.Int("envs", len(stale)))
	}
	return nil
}

// info is the node's record now, and the lease to put it under.
func (n *Node) info() (string, clientv3.LeaseID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var info NodeInfo
	if n.local != nil {
		info = n.local.Capacity()
	}
	info.ID, info.Addr, info.Transfer, info.Version, info.Started, info.Updated = n.o.ID, n.o.Advertise, n.o.Transfer, n.o.Version, n.started, time.Now()
	info.Envs = len(n.envs)
	info.Draining = n.draining
	sort.Strings(info.Tasks)
	b, _ := json.Marshal(info)
	return string(b), n.lease
}

// publish puts the node's record under its lease.
func (n *Node) publish() error {
	n.mu.Lock()
	registered := n.registered
	n.mu.Unlock()
	if !registered {
		return nil
	}
	info, lease := n.info()
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	if _, err := n.cli.Put(ctx, NodeKey(n.o.ID), info, clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("%w: publish node: %v", ErrUnavailable, err)
	}
	return nil
}

// publishSoon asks the publisher to publish the load (envs opened or
// closed) without making the operation wait for it: routers count the
// resets they placed until the node's next publication.
func (n *Node) publishSoon() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// publisher publishes the load, retries placements that failed and
// deletes the keys of states the node no longer holds, every Interval.
func (n *Node) publisher() {
	defer n.wg.Done()
	t := time.NewTicker(n.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.kick:
			if err := n.publish(); err != nil && n.ctx.Err() == nil {
				n.log.Warn("publish node", slog.Any("err", err))
			}
			continue
		case <-t.C:
		}
		if err := n.publish(); err != nil && n.ctx.Err() == nil {
			n.log.Warn("publish node", slog.Any("err", err))
		}
		n.retryPlacements()
		n.sweepStates()
	}
}

func (n *Node) retryPlacements() {
	n.mu.Lock()
	var ids []string
	for id := range n.lost {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	for _, id := range ids {
		n.mu.Lock()
		val, open := n.envs[id]
		n.mu.Unlock()
		var err error
		if open {
			err = n.put(EnvKey(id), val)
		} else {
			err = n.delMine(id)
		}
		if err == nil {
			n.mu.Lock()
			delete(n.lost, id)
			n.mu.Unlock()
		}
	}
}

// sweepStates deletes the keys of states recorded more than StateGrace
// ago that the node no longer holds (deleted by the engine's GC, or a
// background checkpoint that failed: the state never came to be).
func (n *Node) sweepStates() {
	n.mu.Lock()
	local := n.local
	var ids []string
	for s, r := range n.states {
		if time.Since(r.at) > n.o.StateGrace {
			ids = append(ids, s)
		}
	}
	n.mu.Unlock()
	if local == nil {
		return
	}
	for _, s := range ids {
		if local.HasState(s) {
			continue
		}
		n.mu.Lock()
		delete(n.states, s)
		n.mu.Unlock()
		if err := n.del(StateKey(s, n.o.ID)); err != nil {
			n.log.Warn("delete state key", slog.String("state", s), slog.Any("err", err))
			continue
		}
		n.log.Debug("state gone: key deleted", slog.String("state", s))
	}
}

func (n *Node) put(key, val string, opts ...clientv3.OpOption) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	_, err := n.cli.Put(ctx, key, val, opts...)
	return err
}

func (n *Node) del(key string) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	_, err := n.cli.Delete(ctx, key)
	return err
}

// EnvOpened records the env's placement on this node before the
// operation that made it answers (one etcd write; the node's new load is
// published in the background).
func (n *Node) EnvOpened(env string) {
	if n.ctx.Err() != nil {
		return // closed: the node is leaving or dead
	}
	b, _ := json.Marshal(Placement{Node: n.o.ID, Created: time.Now()})
	n.mu.Lock()
	n.envs[env] = string(b)
	n.mu.Unlock()
	if err := n.put(EnvKey(env), string(b)); err != nil {
		n.log.Warn("record placement (retried)", slog.String("env", env), slog.Any("err", err))
		n.mu.Lock()
		n.lost[env] = true
		n.mu.Unlock()
	}
	n.publishSoon()
}

// EnvClosed deletes the env's placement, unless another node rewrote it
// since this one put it.
func (n *Node) EnvClosed(env string) {
	if n.ctx.Err() != nil {
		return // closed: the node is leaving or dead
	}
	n.mu.Lock()
	n.closing[env] = n.envs[env]
	delete(n.envs, env)
	n.mu.Unlock()
	if err := n.delMine(env); err != nil {
		n.log.Warn("delete placement (retried)", slog.String("env", env), slog.Any("err", err))
		n.mu.Lock()
		n.lost[env] = true
		n.mu.Unlock()
	}
	n.publishSoon()
}

// delMine deletes env's placement if it still holds the value this node
// put (an env migrated away has the target's), and forgets that value.
func (n *Node) delMine(env string) error {
	n.mu.Lock()
	val := n.closing[env]
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	_, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(EnvKey(env)), "=", val)).Then(clientv3.OpDelete(EnvKey(env))).Commit()
	if err == nil {
		n.mu.Lock()
		delete(n.closing, env)
		n.mu.Unlock()
	}
	return err
}

// StateMade records that this node holds the state's artifacts, under its
// lease.
func (n *Node) StateMade(env, state string) {
	if n.ctx.Err() != nil {
		return // closed: the node is leaving or dead
	}
	n.mu.Lock()
	_, known := n.states[state]
	if !known {
		n.states[state] = stateRec{env: env, at: time.Now()}
	}
	n.mu.Unlock()
	if !known {
		n.putState(env, state)
	}
}

func (n *Node) putState(env, state string) {
	n.mu.Lock()
	lease := n.lease
	n.mu.Unlock()
	if err := n.put(StateKey(state, n.o.ID), env, clientv3.WithLease(lease)); err != nil {
		n.log.Warn("record state", slog.String("state", state), slog.Any("err", err))
		return
	}
	n.log.Debug("recorded state", slog.String("state", state), slog.String("env", env))
}

// Leave takes the node out of the cluster on a clean stop, after its
// envs were closed: their placements are deleted and the lease revoked
// (its node and state keys go at once).
func (n *Node) Leave(ctx context.Context) error {
	n.mu.Lock()
	ids := make([]string, 0, len(n.envs))
	for id := range n.envs {
		ids = append(ids, id)
	}
	lease := n.lease
	n.mu.Unlock()
	for _, id := range ids {
		n.EnvClosed(id)
	}
	ctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
	_, err := n.cli.Revoke(ctx, lease)
	cancel()
	n.Close()
	if err != nil {
		return fmt.Errorf("%w: revoke lease: %v", ErrUnavailable, err)
	}
	return nil
}

// Close stops publishing and closes the etcd client without revoking the
// lease: the node's keys vanish when it expires, as for a node that died.
// Hooks called after it do nothing. Close may be called again.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		n.cancel()
		n.wg.Wait()
		n.cli.Close()
	})
}

// SetDraining marks the node as draining (or not) and publishes it at
// once: routers stop placing new envs on it.
func (n *Node) SetDraining(on bool) error {
	n.mu.Lock()
	n.draining = on
	n.mu.Unlock()
	return n.publish()
}

// Peers reads the live nodes' records from etcd, this one included.
func (n *Node) Peers(ctx context.Context) ([]NodeInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
	defer cancel()
	r, err := n.cli.Get(ctx, nodesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("%w: read nodes: %v", ErrUnavailable, err)
	}
	var out []NodeInfo
	for _, kv := range r.Kvs {
		var info NodeInfo
		if json.Unmarshal(kv.Value, &info) == nil {
			out = append(out, info)
		}
	}
	return out, nil
}

// ID is the node's id.
func (n *Node) ID() string { return n.o.ID }
