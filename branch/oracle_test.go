package branch_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr/imgcompare"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// criuOracle dumps a's and b's process trees (left running) and returns
// how their images differ (cr/imgcompare): the skip fuzzer's second
// oracle, blind to what the probe and the Inspector read.
func criuOracle(ctx context.Context, tb testing.TB, e *branch.Engine, a, b *branch.Env) []imgcompare.Diff {
	tb.Helper()
	dir := tb.TempDir()
	var sets [2]imgcompare.Set
	for i, env := range []*branch.Env{a, b} {
		d := filepath.Join(dir, []string{"a", "b"}[i])
		if err := os.Mkdir(d, 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := e.DumpForCompare(ctx, env, d); err != nil {
			tb.Fatalf("dump %s for the CRIU oracle: %v", env.ID, err)
		}
		// ARBOR_ORACLE_KEEP names a directory that keeps the images
		// of every comparison, to read a miss with crit.
		if k := os.Getenv("ARBOR_ORACLE_KEEP"); k != "" {
			if err := exec.Command("cp", "-a", d, filepath.Join(k, env.ID)).Run(); err != nil {
				tb.Logf("keep the images of %s: %v", env.ID, err)
			}
		}
		s, err := imgcompare.Load(d)
		if err != nil {
			tb.Fatalf("load the images of %s: %v", env.ID, err)
		}
		sets[i] = s
		os.RemoveAll(d) // the pages: a run of many turns must not fill /tmp
	}
	return imgcompare.Compare(sets[0], sets[1], imgcompare.Options{RenameA: a.Sandbox().ID(), RenameB: b.Sandbox().ID()})
}

func diffText(diffs []imgcompare.Diff) string {
	var b strings.Builder
	for _, d := range diffs {
		b.WriteString("    " + d.String() + "\n")
	}
	return b.String()
}

// TestCRIUOracle: an exact branch of an env dumps to the same images as
// the env, once normalised; an env whose shell holds one more descriptor,
// or whose daemon has another nice, does not.
func TestCRIUOracle(t *testing.T) {
	r := branchtest.ForTest(t, branchtest.Options{})
	e := r.Engine
	ctx := context.Background()
	run := func(env *branch.Env, cmd string) {
		t.Helper()
		if _, err := e.Exec(ctx, env, cmd, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
			t.Fatalf("%q: %v", cmd, err)
		}
	}
	// The sleeper has exec'd before the checkpoint: one caught between
	// fork and exec would exec again in each tree, each with its own
	// address space layout.
	setup := "mkdir -p /work && cd /work && echo abc > /work/f && exec 3</work/f && head -c 1 <&3 >/dev/null; sleep 1000 </dev/null >/dev/null 2>&1 & until grep -qx sleep /proc/$!/comm; do :; done"
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, env)
	run(env, setup)
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err == nil {
		err = res.Errors[0]
	}
	if err != nil {
		t.Fatal(err)
	}
	child := res.Children[0]
	defer e.CloseEnv(ctx, child)
	start := time.Now()
	if d := criuOracle(ctx, t, e, env, child); len(d) != 0 {
		t.Fatalf("an exact branch differs from its env:\n%s", diffText(d))
	}
	t.Logf("exact branch: no difference (the oracle took %v)", time.Since(start).Round(time.Millisecond))

	// Two more branches of the state, one of which runs a turn the other
	// does not match: the oracle must name the field.
	tests := []struct {
		name       string
		same, diff string
		file, want string // a reported field: the file's prefix and a part of its path
	}{
		{"one more descriptor", "true", "exec 7</etc/passwd", "fdinfo-", "[fd=7]"},
		{"moved offset", "true", "head -c 2 <&3 >/dev/null", "files.img", ".reg.pos"},
		{"an ignored signal", "true", "trap '' USR2", "core-", ".tc.sigactions"},
		{"nice of the sleeper", "renice -n 0 -p $! >/dev/null", "renice -n 5 -p $! >/dev/null", "core-", ".thread_core.sched_nice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := e.Branch(ctx, branch.Source{State: sid}, 2)
			if err == nil {
				err = errors.Join(res.Errors...)
			}
			if err != nil {
				t.Fatal(err)
			}
			a, b := res.Children[0], res.Children[1]
			defer e.CloseEnv(ctx, a)
			defer e.CloseEnv(ctx, b)
			run(a, tt.same)
			run(b, tt.diff)
			d := criuOracle(ctx, t, e, a, b)
			if !slices.ContainsFunc(d, func(d imgcompare.Diff) bool {
				return strings.HasPrefix(d.File, tt.file) && strings.Contains(d.Field, tt.want)
			}) {
				t.Fatalf("after %q against %q the oracle reports no %s field %s:\n%s", tt.diff, tt.same, tt.file, tt.want, diffText(d))
			}
			t.Logf("%q against %q:\n%s", tt.diff, tt.same, diffText(d))
		})
	}
}
