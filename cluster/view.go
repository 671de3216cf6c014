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
)

// ViewOptions configure a View.
type ViewOptions struct {
	Endpoints []string
	// Timeout bounds each etcd call (default 5 s).
	Timeout time.Duration
	// OnNodeGone is called (on the watch goroutine) when a node's key is
	// deleted: its lease ended or it left.
	OnNodeGone func(id string)
	Logger     *slog.Logger
}

// View is a router's picture of the cluster: the live nodes and the
// placements, loaded from etcd and kept current by watches, and the
// state holders, read from etcd when asked. It holds nothing etcd does
// not.
type View struct {
	o   ViewOptions
	cli *clientv3.Client
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	nodes map[string]NodeInfo
	envs  map[string]string // env -> node
	// unpublished holds, per node, the envs placed there since its
	// record was last published (its Envs does not count them yet):
	// those whose placement the watch brought, and those a reset the
	// router placed answered with (the watch may bring it later). A set,
	// so that an env seen both ways counts once.
	unpublished map[string]map[string]bool
}

// Watch loads the cluster from etcd and follows it until Close.
func Watch(ctx context.Context, o ViewOptions) (*View, error) {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.OnNodeGone == nil {
		o.OnNodeGone = func(string) {}
	}
	cli, err := newClient(o.Endpoints, o.Timeout)
	if err != nil {
		return nil, err
	}
	v := &View{o: o, cli: cli, log: o.Logger}
	v.ctx, v.cancel = context.WithCancel(context.Background())
	rev, err := v.load(ctx)
	if err != nil {
		cli.Close()
		return nil, err
	}
	v.wg.Add(1)
	go v.follow(rev)
	return v, nil
}

// load reads the nodes and placements at one revision and replaces the
// view's with them; it reports nodes that vanished meanwhile.
func (v *View) load(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, v.o.Timeout)
	defer cancel()
	r, err := v.cli.Txn(ctx).Then(clientv3.OpGet(nodesPrefix, clientv3.WithPrefix()), clientv3.OpGet(envsPrefix, clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, fmt.Errorf("%w: load cluster: %v", ErrUnavailable, err)
	}
	nodes, envs := map[string]NodeInfo{}, map[string]string{}
	for _, kv := range r.Responses[0].GetResponseRange().Kvs {
		var n NodeInfo
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			v.log.Warn("bad node record", slog.String("key", string(kv.Key)), slog.Any("err", err))
			continue
		}
		nodes[idOf(string(kv.Key), nodesPrefix)] = n
	}
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		var p Placement
		if json.Unmarshal(kv.Value, &p) == nil {
			envs[idOf(string(kv.Key), envsPrefix)] = p.Node
		}
	}
	v.mu.Lock()
	var gone []string
	for id := range v.nodes {
		if _, ok := nodes[id]; !ok {
			gone = append(gone, id)
		}
	}
	v.nodes, v.envs, v.unpublished = nodes, envs, map[string]map[string]bool{}
	v.mu.Unlock()
	for _, id := range gone {
		v.o.OnNodeGone(id)
	}
	return r.Header.Revision, nil
}

// follow applies the watched changes; when the watch fails (etcd
// compacted past it, or went away) it loads the view again and watches
// from there.
func (v *View) follow(rev int64) {
	defer v.wg.Done()
	for v.ctx.Err() == nil {
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(v.ctx))
		// envs/ and nodes/ only: the range ends where states/ begins
		// (keys.go), so routers do not hear of every state made.
		wc := v.cli.Watch(ctx, envsPrefix, clientv3.WithRange(statesPrefix), clientv3.WithRev(rev+1))
		for wr := range wc {
			if err := wr.Err(); err != nil {
				v.log.Warn("watch cluster", slog.Any("err", err))
				break
			}
			for _, ev := range wr.Events {
				v.apply(ev)
			}
			rev = wr.Header.Revision
		}
		cancel()
		for v.ctx.Err() == nil {
			r, err := v.load(v.ctx)
			if err == nil {
				rev = r
				break
			}
			v.log.Warn("reload cluster", slog.Any("err", err))
			select {
			case <-v.ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (v *View) apply(ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	put := ev.Type == clientv3.EventTypePut
	switch {
	case len(key) > len(nodesPrefix) && key[:len(nodesPrefix)] == nodesPrefix:
		id := idOf(key, nodesPrefix)
		if !put {
			v.mu.Lock()
			_, had := v.nodes[id]
			delete(v.nodes, id)
			delete(v.unpublished, id)
			v.mu.Unlock()
			if had {
				v.log.Info("node gone", slog.String("node", id))
				v.o.OnNodeGone(id)
			}
			return
		}
		var n NodeInfo
		if err := json.Unmarshal(ev.Kv.Value, &n); err != nil {
			v.log.Warn("bad node record", slog.String("key", key), slog.Any("err", err))
			return
		}
		v.mu.Lock()
		v.nodes[id] = n
		delete(v.unpublished, id)
		v.mu.Unlock()
	case len(key) > len(envsPrefix) && key[:len(envsPrefix)] == envsPrefix:
		id := idOf(key, envsPrefix)
		var p Placement
		if put && json.Unmarshal(ev.Kv.Value, &p) != nil {
			return
		}
		v.mu.Lock()
		if put {
			v.envs[id] = p.Node
			v.markUnpublished(p.Node, id)
		} else {
			if u := v.unpublished[v.envs[id]]; u != nil {
				delete(u, id)
			}
			delete(v.envs, id)
		}
		v.mu.Unlock()
	}
}

// Nodes lists the live nodes by id.
func (v *View) Nodes() []NodeInfo {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]NodeInfo, 0, len(v.nodes))
	for _, n := range v.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Node returns a live node.
func (v *View) Node(id string) (NodeInfo, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	n, ok := v.nodes[id]
	return n, ok
}

// Place orders the live nodes that offer task ("" for any) and are not
// draining by load, least loaded first, counting the pending resets the caller has sent to
// each and the envs placed there since the node last published its load.
// Full nodes come last.
func (v *View) Place(task string, pending map[string]int) []NodeInfo {
	v.mu.Lock()
	type cand struct {
		n    NodeInfo
		load float64
	}
	var cs []cand
	for id, n := range v.nodes {
		if task != "" && !n.HasTask(task) || n.Draining {
			continue
		}
		n.Envs += pending[id] + len(v.unpublished[id])
		cs = append(cs, cand{n, n.Load()})
	}
	v.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].load != cs[j].load {
			return cs[i].load < cs[j].load
		}
		return cs[i].n.ID < cs[j].n.ID
	})
	out := make([]NodeInfo, len(cs))
	for i, c := range cs {
		out[i] = c.n
	}
	return out
}

// Placed counts an env a reset placed on node, until the node publishes
// its load again.
//
// An env whose placement the watch already brought is left alone: the
// watch counted it then, and a node record that came after it (the node
// writes the placement before it publishes its load, so the watch brings
// them in that order) already counts it; marking it again would count it
// twice until the node's next publish (TestCluster saw three resets of
// four on one of two empty nodes).
func (v *View) Placed(node, env string) {
	v.mu.Lock()
	if _, known := v.envs[env]; !known {
		v.markUnpublished(node, env)
	}
	v.mu.Unlock()
}

// markUnpublished records env as placed on a live node and not yet in
// its published load; v.mu is held.
func (v *View) markUnpublished(node, env string) {
	if _, ok := v.nodes[node]; !ok {
		return
	}
	u := v.unpublished[node]
	if u == nil {
		u = map[string]bool{}
		v.unpublished[node] = u
	}
	u[env] = true
}

// EnvNode returns the node an env was placed on ("" when there is no
// placement). A placement the watch has not brought yet (an env made a
// moment ago) is read from etcd.
func (v *View) EnvNode(ctx context.Context, env string) (string, error) {
	v.mu.Lock()
	node, ok := v.envs[env]
	v.mu.Unlock()
	if ok {
		return node, nil
	}
	return v.FreshEnvNode(ctx, env)
}

// Moved records that env lives on node now (a migration the router
// made, before the watch brings the placement the target wrote).
func (v *View) Moved(env, node string) {
	v.mu.Lock()
	v.envs[env] = node
	v.mu.Unlock()
}

// FreshEnvNode reads env's placement from etcd, not from the view (a
// node that answered it has no such env: the env may have migrated).
func (v *View) FreshEnvNode(ctx context.Context, env string) (string, error) {
	p, err := readJSON[Placement](ctx, v, EnvKey(env), "placement of "+env)
	return p.Node, err
}

// readJSON reads key from etcd, within the view's timeout, and decodes
// its value (none: the zero T); what names the record in errors.
func readJSON[T any](ctx context.Context, v *View, key, what string) (T, error) {
	var out T
	ctx, cancel := context.WithTimeout(ctx, v.o.Timeout)
	defer cancel()
	r, err := v.cli.Get(ctx, key)
	if err != nil {
		return out, fmt.Errorf("%w: read %s: %v", ErrUnavailable, what, err)
	}
	if len(r.Kvs) > 0 {
		if err := json.Unmarshal(r.Kvs[0].Value, &out); err != nil {
			var zero T
			return zero, fmt.Errorf("%s: %w", what, err)
		}
	}
	return out, nil
}

// StateNodes lists the nodes holding a state's artifacts (none: no node
// alive has it).
func (v *View) StateNodes(ctx context.Context, state string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, v.o.Timeout)
	defer cancel()
	r, err := v.cli.Get(ctx, stateNodesPrefix(state), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("%w: read holders of %s: %v", ErrUnavailable, state, err)
	}
	var out []string
	for _, kv := range r.Kvs {
		out = append(out, idOf(string(kv.Key), stateNodesPrefix(state)))
	}
	return out, nil
}

// Close stops following etcd.
func (v *View) Close() {
	v.cancel()
	v.wg.Wait()
	v.cli.Close()
}
