package branch_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/sandbox"
)

// cgroupLimits reads the memory, pids and CPU limits the kernel applies to
// process pid from its cgroups: the v1 controller's files where that
// controller is mounted (hybrid hosts), else the v2 ones.
func cgroupLimits(t *testing.T, pid int) sandbox.Limits {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	v1 := map[string]string{} // controller -> its directory for pid
	v2 := ""
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			t.Fatalf("/proc/%d/cgroup: bad line %q", pid, line)
		}
		if f[0] == "0" && f[1] == "" {
			root := "/sys/fs/cgroup"
			if _, err := os.Stat(filepath.Join(root, "unified", "cgroup.procs")); err == nil {
				root = filepath.Join(root, "unified")
			}
			v2 = filepath.Join(root, f[2])
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			v1[c] = filepath.Join("/sys/fs/cgroup", f[1], f[2])
		}
	}
	read := func(file string) string {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	num := func(s string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("cgroup value %q: %v", s, err)
		}
		return n
	}
	var l sandbox.Limits
	if d, ok := v1["memory"]; ok {
		l.MemoryBytes = num(read(filepath.Join(d, "memory.limit_in_bytes")))
	} else {
		l.MemoryBytes = num(read(filepath.Join(v2, "memory.max")))
	}
	if d, ok := v1["pids"]; ok {
		l.Pids = num(read(filepath.Join(d, "pids.max")))
	} else {
		l.Pids = num(read(filepath.Join(v2, "pids.max")))
	}
	var quota, period int64
	if d, ok := v1["cpu"]; ok {
		quota, period = num(read(filepath.Join(d, "cpu.cfs_quota_us"))), num(read(filepath.Join(d, "cpu.cfs_period_us")))
	} else {
		f := strings.Fields(read(filepath.Join(v2, "cpu.max")))
		if len(f) != 2 || f[0] == "max" {
			t.Fatalf("cpu.max of pid %d: %q, want a quota", pid, f)
		}
		quota, period = num(f[0]), num(f[1])
	}
	l.CPUs = math.Round(float64(quota)/float64(period)*1000) / 1000
	return l
}

// TestLimitsHoldInRestoredChildren: the memory, pids and CPU limits the
// engine is configured with (none of them the defaults) are what the
// kernel applies to a fresh env, to each child a branch restores, and to
// an env rolled back (a restore in place), read from the cgroups of each
// sandbox's init.
func TestLimitsHoldInRestoredChildren(t *testing.T) {
	lim := sandbox.Limits{MemoryBytes: 300 << 20, Pids: 97, CPUs: 0.5}
	if lim.MemoryBytes == sandbox.DefaultLimits.MemoryBytes || lim.Pids == sandbox.DefaultLimits.Pids || lim.CPUs == sandbox.DefaultLimits.CPUs {
		t.Fatal("the test's limits must differ from the defaults, or a restore that lost them would pass")
	}
	e := branchtest.ForTest(t, branchtest.Options{Limits: lim}).Engine
	ctx := context.Background()
	check := func(what string, env *branch.Env) {
		t.Helper()
		got := cgroupLimits(t, env.Sandbox().InitPID())
		if got.MemoryBytes != lim.MemoryBytes || got.Pids != lim.Pids || got.CPUs != lim.CPUs {
			t.Errorf("%s %s: cgroup limits memory %d pids %d cpus %v; want memory %d pids %d cpus %v",
				what, env.ID, got.MemoryBytes, got.Pids, got.CPUs, lim.MemoryBytes, lim.Pids, lim.CPUs)
		}
	}
	parent, first, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	check("fresh env", parent)
	run(t, e, parent, "echo 1 > /n")
	br, err := e.Branch(ctx, branch.Source{Env: parent}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range br.Children {
		if br.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, br.Errors[i])
		}
		check(fmt.Sprintf("branched child %d", i), c)
	}
	// A child of a child: the limits are the engine's, not copied along.
	grand, err := e.Branch(ctx, branch.Source{Env: br.Children[0]}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if grand.Errors[0] != nil {
		t.Fatal(grand.Errors[0])
	}
	check("grandchild", grand.Children[0])
	if err := e.Rollback(ctx, br.Children[1], first); err != nil {
		t.Fatal(err)
	}
	check("rolled-back child", br.Children[1])
	for _, env := range []*branch.Env{grand.Children[0], br.Children[0], br.Children[1], parent} {
		if err := e.CloseEnv(ctx, env); err != nil {
			t.Errorf("close %s: %v", env.ID, err)
		}
	}
}
