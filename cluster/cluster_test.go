package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
)

// fakeLocal is a node's side as the registry sees it.
type fakeLocal struct {
	mu     sync.Mutex
	states map[string]bool
}

func (l *fakeLocal) Capacity() cluster.NodeInfo {
	return cluster.NodeInfo{MaxEnvs: 4, Tasks: []string{"count"}, EnvIdleTTLS: 60}
}

func (l *fakeLocal) HasEnv(id string) bool { return id == "lost" }

func (l *fakeLocal) CloseEnv(context.Context, string) error { return nil }

func (l *fakeLocal) HasState(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.states[id]
}

func etcdClient(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func get(t *testing.T, cli *clientv3.Client, key string) (string, bool) {
	t.Helper()
	r, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return "", false
	}
	return string(r.Kvs[0].Value), true
}

// eventually polls cond every 50 ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestNodeRegistry(t *testing.T) {
	url := etcdtest.Start(t)
	cli := etcdClient(t, url)
	ctx := context.Background()
	o := cluster.NodeOptions{Endpoints: []string{url}, ID: "n1", Advertise: "127.0.0.2:7878", TTL: time.Second, Interval: 200 * time.Millisecond,
		StateGrace: 300 * time.Millisecond, Logger: quiet()}

	// A placement an earlier run left for an env this run does not have.
	stale, _ := json.Marshal(cluster.Placement{Node: "n1"})
	other, _ := json.Marshal(cluster.Placement{Node: "n2"})
	cli.Put(ctx, cluster.EnvKey("gone"), string(stale))
	cli.Put(ctx, cluster.EnvKey("elsewhere"), string(other))
	cli.Put(ctx, cluster.EnvKey("lost"), string(stale)) // lost in a crash restart: the node still answers env_lost

	gone := map[string]bool{}
	var gmu sync.Mutex
	v, err := cluster.Watch(ctx, cluster.ViewOptions{Endpoints: []string{url}, Logger: quiet(), OnNodeGone: func(id string) {
		gmu.Lock()
		gone[id] = true
		gmu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()

	n, err := cluster.Connect(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	// Before Register: an env adopted after a restart, recorded by the
	// hooks (as coordinator.New calls them).
	n.EnvOpened("kept")
	local := &fakeLocal{states: map[string]bool{"s1": true, "s2": true}}
	if err := n.Register(ctx, local); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, cli, cluster.EnvKey("gone")); ok {
		t.Error("the stale placement of this node survived Register")
	}
	if _, ok := get(t, cli, cluster.EnvKey("elsewhere")); !ok {
		t.Error("Register deleted another node's placement")
	}
	if _, ok := get(t, cli, cluster.EnvKey("lost")); !ok {
		t.Error("Register deleted the placement of an env the node answers env_lost for")
	}
	val, ok := get(t, cli, cluster.NodeKey("n1"))
	if !ok {
		t.Fatal("no node key after Register")
	}
	var info cluster.NodeInfo
	if err := json.Unmarshal([]byte(val), &info); err != nil {
		t.Fatal(err)
	}
	if info.Addr != "127.0.0.2:7878" || info.MaxEnvs != 4 || info.Envs != 1 || len(info.Tasks) != 1 {
		t.Errorf("node info: %+v", info)
	}

	n.EnvOpened("e1")
	n.StateMade("e1", "s1")
	n.StateMade("e1", "s2")
	if node, err := v.EnvNode(ctx, "e1"); err != nil || node != "n1" {
		t.Errorf("EnvNode(e1) = %q, %v; want n1 (read through on a watch miss)", node, err)
	}
	if nodes, err := v.StateNodes(ctx, "s1"); err != nil || len(nodes) != 1 || nodes[0] != "n1" {
		t.Errorf("StateNodes(s1) = %v, %v", nodes, err)
	}
	eventually(t, 2*time.Second, "view sees the node's load", func() bool {
		ni, ok := v.Node("n1")
		return ok && ni.Envs == 2
	})
	if p := v.Place("count", nil); len(p) != 1 || p[0].ID != "n1" || p[0].Envs != 2 {
		t.Errorf("Place(count) = %v, want n1 with its 2 envs", p)
	}
	// The router's own note of the reset, after the watch brought the
	// placement and the load that counts it, does not count it again.
	v.Placed("n1", "e1")
	if p := v.Place("count", nil); len(p) != 1 || p[0].Envs != 2 {
		t.Errorf("Place(count) after Placed of a counted env = %v, want 2 envs, not 3", p)
	}
	if p := v.Place("other", nil); len(p) != 0 {
		t.Errorf("Place(other) = %v, want no node", p)
	}

	// A state the engine deleted loses its key at the next sweep.
	local.mu.Lock()
	delete(local.states, "s2")
	local.mu.Unlock()
	eventually(t, 2*time.Second, "state key of a deleted state goes", func() bool {
		_, ok := get(t, cli, cluster.StateKey("s2", "n1"))
		return !ok
	})

	n.EnvClosed("e1")
	if _, ok := get(t, cli, cluster.EnvKey("e1")); ok {
		t.Error("placement of a closed env is still there")
	}

	// A second node of the same id waits for the first one's key, then
	// gives up.
	o2 := o
	o2.TTL = time.Second
	n2, err := cluster.Connect(ctx, o2)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = n2.Register(rctx, local)
	cancel()
	if !errors.Is(err, cluster.ErrNodeIDTaken) {
		t.Fatalf("second node under a live node's id: %v, want ErrNodeIDTaken", err)
	}
	n2.Close()

	// The node dies (no Leave): its node and state keys vanish after the
	// TTL, the view reports it gone, and its placements stay.
	n.Close()
	eventually(t, 5*time.Second, "node key expires with the lease", func() bool {
		_, ok := get(t, cli, cluster.NodeKey("n1"))
		return !ok
	})
	if _, ok := get(t, cli, cluster.StateKey("s1", "n1")); ok {
		t.Error("state key outlived its node's lease")
	}
	if _, ok := get(t, cli, cluster.EnvKey("kept")); !ok {
		t.Error("placement vanished with the lease; it must stay to say where the env was")
	}
	eventually(t, 2*time.Second, "view reports the node gone", func() bool {
		gmu.Lock()
		defer gmu.Unlock()
		_, live := v.Node("n1")
		return gone["n1"] && !live
	})

	// Restarted under the same id, it registers at once and Leave cleans
	// up everything.
	n3, err := cluster.Connect(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	n3.EnvOpened("kept")
	if err := n3.Register(ctx, local); err != nil {
		t.Fatal(err)
	}
	if err := n3.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, cli, cluster.NodeKey("n1")); ok {
		t.Error("node key after Leave")
	}
	if _, ok := get(t, cli, cluster.EnvKey("kept")); ok {
		t.Error("placement after Leave")
	}
}
