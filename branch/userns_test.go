package branch_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/zfs/zfstest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// newUserNSRig is newRig with sandboxes in user namespace mode.
func newUserNSRig(t *testing.T, warm int) (*rig, sandbox.UserNSConfig) {
	t.Helper()
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, warm)
	u := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	r.opts.Launcher.UserNS = u // the engine's launcher; nothing launched yet
	return r, u
}

// checkUserNS fails unless env's sandbox runs in u's user namespace: the
// maps seen inside, root inside unable to write a host-wide sysctl, the
// mode the sandbox reports and the owner on the host of a file made inside.
func checkUserNS(t *testing.T, e *branch.Engine, env *branch.Env, u sandbox.UserNSConfig) {
	t.Helper()
	want := fmt.Sprintf("0 %d %d", u.HostID, u.Size)
	// The sysctl write puts back the value that is there (and must fail).
	out := run(t, e, env, "cat /proc/self/uid_map /proc/self/gid_map; id -u; touch /tmp/userns-probe; "+
		"cat /proc/sys/kernel/core_pattern > /tmp/cp; cat /tmp/cp > /proc/sys/kernel/core_pattern 2>/dev/null && echo written || echo refused")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != want || strings.Join(strings.Fields(lines[1]), " ") != want || lines[2] != "0" || lines[3] != "refused" {
		t.Fatalf("env %s: maps, uid and core_pattern write %q, want %q twice, uid 0, refused", env.ID, out, want)
	}
	sb := env.Sandbox()
	if got := sb.UserNS(); got != u {
		t.Errorf("env %s: sandbox mode %v, want %v", env.ID, got, u)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb.Root(), "tmp", "userns-probe"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != u.HostID || st.Gid != u.HostID {
		t.Errorf("env %s: file made inside is %d:%d on the host, want %d:%d", env.ID, st.Uid, st.Gid, u.HostID, u.HostID)
	}
}

// TestUserNSBranch: a checkpoint of a sandbox in user namespace mode
// branches into children with the same uid map and ownership, and the
// engine's branch, rollback and live-branch scenario holds in the mode.
func TestUserNSBranch(t *testing.T) {
	r, u := newUserNSRig(t, 0)
	ctx := context.Background()
	e := r.e
	parent, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	checkUserNS(t, e, parent, u)
	run(t, e, parent, "echo p > /work/p; P=1")
	for _, kind := range []state.Kind{state.Full, state.Proc} {
		run(t, e, parent, "P=$((P+1))")
		sid, err := e.Checkpoint(ctx, parent, kind)
		if err != nil {
			t.Fatalf("checkpoint %v: %v", kind, err)
		}
		res, err := e.Branch(ctx, branch.Source{State: sid}, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range res.Children {
			if res.Errors[i] != nil {
				t.Fatalf("%v child %d: %v", kind, i, res.Errors[i])
			}
			checkUserNS(t, e, c, u)
			if got := run(t, e, c, "cat /work/p; echo $P"); got != "p\n"+run(t, e, parent, "echo $P") {
				t.Errorf("%v child %d state %q", kind, i, got)
			}
			if err := e.CloseEnv(ctx, c); err != nil {
				t.Errorf("close child: %v", err)
			}
		}
	}
	branchAndRollback(t, r)
}

// TestUserNSWarmAndPromote: warm copies and promote (both restores) keep
// the mode.
func TestUserNSWarmAndPromote(t *testing.T) {
	r, u := newUserNSRig(t, 2)
	ctx := context.Background()
	e := r.e
	parent, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, parent, "echo base > /f")
	if _, err := e.Checkpoint(ctx, parent, state.Full); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 2)
	res, err := e.Branch(ctx, branch.Source{Env: parent}, 2)
	if err != nil || res.Errors[0] != nil || res.Errors[1] != nil {
		t.Fatal(err, res.Errors)
	}
	for _, c := range res.Children {
		checkUserNS(t, e, c, u)
	}
	draft := res.Children[0]
	run(t, e, draft, "echo drafted > /f")
	if _, err := e.Promote(ctx, draft); err != nil {
		t.Fatal(err)
	}
	checkUserNS(t, e, parent, u)
	if got := run(t, e, parent, "cat /f"); got != "drafted\n" {
		t.Errorf("parent after promote: %q", got)
	}
}

// TestUserNSBranchZFS runs the branch/rollback scenario in user namespace
// mode on the zfs backend: shifted images need nothing of the backend but
// chown (zfs-fuse here, see docs/zfs.md).
func TestUserNSBranchZFS(t *testing.T) {
	requireCR(t)
	r := newRig(t, zfstest.NewRoot(t), t.TempDir(), 0)
	u := sandbox.UserNSConfig{Enabled: true}.WithDefaults()
	r.opts.Launcher.UserNS = u
	env, _, err := r.e.NewEnv(context.Background(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	checkUserNS(t, r.e, env, u)
	branchAndRollback(t, r)
}
