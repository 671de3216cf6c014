package branch_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// isolationInside is what a sandbox's shell sees of its own hardening.
const isolationInside = `grep -H -E 'Cap|NoNewPrivs|Seccomp' /proc/1/status /proc/self/status`

// TestBranchKeepsIsolation: CRIU dumps and restores a hardened tree (its
// seccomp filters, capabilities, no_new_privs, /proc masks): children of a
// checkpoint, restored cold or from warm copies, and a rolled-back env
// hold exactly what the parent held, as seen from inside.
func TestBranchKeepsIsolation(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 1)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	want := run(t, e, env, isolationInside)
	self := run(t, e, env, "grep -E 'Cap|NoNewPrivs|Seccomp' /proc/self/status")
	st, err := sandbox.ParseTaskIsolation([]byte(self))
	if err != nil || st.Seccomp != 2 || st.NoNewPrivs != 1 || st.CapBnd != 0xa80425fb {
		t.Fatalf("parent is not hardened: %v %v\n%s", st, err, want)
	}
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 1)
	res, err := e.Branch(ctx, branch.Source{State: sid}, 2) // one warm copy, one cold restore
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		if got := run(t, e, c, isolationInside); got != want {
			t.Errorf("child %d:\n%s\nparent:\n%s", i, got, want)
		}
	}
	run(t, e, env, "echo changed > /tmp/x")
	if err := e.Rollback(ctx, env, sid); err != nil {
		t.Fatal(err)
	}
	if got := run(t, e, env, isolationInside); got != want {
		t.Errorf("after rollback:\n%s\nbefore:\n%s", got, want)
	}
}

// TestRestoreRefusesTamperedRecord: when a state's isolation record does not
// match what its restore brings back, the branch fails with a restore
// error wrapping sandbox.ErrIsolation, and no child is handed out.
func TestRestoreRefusesTamperedRecord(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(r.opts.StateDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != sandbox.IsolationFile {
			return err
		}
		rec, err := sandbox.ReadIsolationRecord(filepath.Dir(p))
		if err != nil {
			return err
		}
		// What a dump of a tree with one more filter would say: within the
		// policy, so only the comparison after the restore can catch it.
		rec.Init.SeccompFilters++
		rec.Shell.SeccompFilters++
		b, _ := json.Marshal(rec)
		n++
		return os.WriteFile(p, b, 0o600)
	})
	if err != nil || n == 0 {
		t.Fatalf("tamper with the record: %d files, %v", n, err)
	}
	before := len(e.Envs())
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if res.Children[0] != nil || !errors.Is(res.Errors[0], state.ErrRestore) || !errors.Is(res.Errors[0], sandbox.ErrIsolation) {
		t.Fatalf("branch with a tampered record: child %v, err %v; want no child and a restore error wrapping ErrIsolation", res.Children[0], res.Errors[0])
	}
	t.Logf("refused: %v", res.Errors[0])
	if got := len(e.Envs()); got != before {
		t.Errorf("%d envs after the refused branch, want %d", got, before)
	}
}
