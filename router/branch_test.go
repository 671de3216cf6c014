package router_test

import (
	"context"
	"strconv"
	"testing"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/cluster/etcdtest"
)

// TestBranchAcrossNodes branches through the router over two real
// nodes: the children are spread by load, the state is shipped once to
// the node that did not hold it (not once per child), and every child,
// on either node, holds the parent's files, shell and the memory of its
// background process, independently of its siblings.
func TestBranchAcrossNodes(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdClient(t, etcd)
	a := startNode(t, etcd, "a", "127.0.0.2")
	b := startNode(t, etcd, "b", "127.0.0.3")
	nodes := map[string]*node{a.id: a, b.id: b}
	_, addr := startRouter(t, etcd)
	ctx := context.Background()
	c := dial(t, addr)
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	src := placement(t, cli, env)
	sh(t, c, env, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && echo data > /work/file")
	sh(t, c, env, counterStart)
	base, err := strconv.Atoi(out(sh(t, c, env, counterRead)))
	if err != nil {
		t.Fatal(err)
	}
	other := a
	if src == a.id {
		other = b
	}

	check := func(what string, br *arbor.BranchResult, n int) map[string]int {
		t.Helper()
		if len(br.EnvIDs) != n || len(br.Errors) != 0 {
			t.Fatalf("%s: children %v errors %v", what, br.EnvIDs, br.Errors)
		}
		on := map[string]int{}
		for i, kid := range br.EnvIDs {
			on[placement(t, cli, kid)]++
			if got := string(sh(t, c, kid, shellState).Obs.Stdout); got != "cwd=/work K=v\nfun\ndata\n" {
				t.Errorf("%s: child %d: %q", what, i, got)
			}
			// Each child's process continues from the same memory.
			if got := out(sh(t, c, kid, counterRead)); got != strconv.Itoa(base+1) {
				t.Errorf("%s: child %d (node %s): counter %s, want %d", what, i, placement(t, cli, kid), got, base+1)
			}
			sh(t, c, kid, "echo kid"+strconv.Itoa(i)+" > /work/file")
		}
		return on
	}
	br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("branch(4) of an env of node %s: %.3f s", src, br.TookS)
	on := check("branch(4) by env", br, 4)
	t.Logf("children: %v", on)
	if on[a.id] != 2 || on[b.id] != 2 {
		t.Errorf("branch(4) from one env on two empty nodes: %v, want two on each", on)
	}
	if imported, _ := other.tr.Imported(); imported != 1 {
		t.Errorf("node %s imported %d states for its children, want 1 (once per node)", other.id, imported)
	}
	if n := keysOf(t, cli, cluster.StateKey(br.StateID, ""), ""); n != 2 {
		t.Errorf("holders of the branched state in etcd: %d, want both nodes", n)
	}
	if got := out(sh(t, c, env, "cat /work/file")); got != "data" {
		t.Errorf("a child's write reached its parent: %q", got)
	}
	for _, kid := range br.EnvIDs {
		if err := c.CloseEnv(ctx, kid); err != nil {
			t.Fatal(err)
		}
	}

	// By state id: the state other holds already is not shipped again.
	bs, err := c.Branch(ctx, arbor.BranchParams{StateID: br.StateID, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	on = check("branch(4) by state", bs, 4)
	t.Logf("children by state id: %v", on)
	if on[a.id] == 0 || on[b.id] == 0 {
		t.Errorf("branch(4) by state id: %v, want children on both nodes", on)
	}
	if imported, _ := other.tr.Imported(); imported != 1 {
		t.Errorf("node %s imported %d states, want still 1", other.id, imported)
	}
	for _, kid := range bs.EnvIDs {
		if nodes[placement(t, cli, kid)] == other {
			// A child of a shipped state knows no origin there: it
			// cannot be promoted (its origin lives on another node).
			if _, err := c.Promote(ctx, kid); err == nil {
				t.Errorf("promote of a child on another node than its origin succeeded")
			}
		}
	}
}
