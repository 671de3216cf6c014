package branch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/state"
)

// TestImageBudget: an env whose shell holds 80 MB of fresh memory cannot
// make its checkpoints write more process images than its budget (64 MiB
// here): that checkpoint fails as the agent's doing (state.ErrCheckpoint with
// cr.ErrAgentState, the budget named), its image is not kept, and the env
// runs on with its last kept state as its head; images the GC dropped
// (a state rolled away from and released) no longer count. Another
// env, and this one's earlier state, are untouched (docs/engine.md,
// "Image budget").
func TestImageBudget(t *testing.T) {
	dir := t.TempDir()
	r := newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) { o.ImageBudget = 64 << 20 })
	e := r.e
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, env)
	run(t, e, env, "echo small > /f")
	small, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatalf("a small checkpoint under the budget: %v", err)
	}
	before := procBytes(t, e)
	run(t, e, env, `x=$(head -c 80000000 /dev/zero | tr '\0' a); echo ${#x}`)
	_, err = e.Checkpoint(ctx, env, state.Full)
	if !errors.Is(err, state.ErrCheckpoint) || !errors.Is(err, cr.ErrAgentState) || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("checkpoint of 80 MB over a 64 MiB budget: %v, want ErrCheckpoint with ErrAgentState naming the budget", err)
	}
	t.Logf("refused: %v", err)
	if after := procBytes(t, e); after != before {
		t.Errorf("process images %d bytes before, %d after the refused checkpoint: its image was kept", before, after)
	}
	if got := strings.TrimSpace(run(t, e, env, "echo ${#x}; cat /f")); got != "80000000\nsmall" {
		t.Errorf("the env after the refused checkpoint: %q", got)
	}
	if h := env.Head(); h != small {
		t.Errorf("head after the refused checkpoint: %s, want the last state kept, %s", h, small)
	}
	branchCheck(t, e, small, "small")
	// What the env's checkpoints wrote counts while it exists: a state
	// rolled away from and released is collected, and its room under the
	// budget comes back (the second 40 MB fits only so).
	for i := range 2 {
		run(t, e, env, `x=$(head -c 40000000 /dev/zero | tr '\0' b); echo ${#x}`)
		sid, err := e.Checkpoint(ctx, env, state.Full)
		if err != nil {
			t.Fatalf("checkpoint %d of 40 MB: %v", i, err)
		}
		if err := e.Rollback(ctx, env, small); err != nil {
			t.Fatal(err)
		}
		if err := e.Release(sid); err != nil {
			t.Fatal(err)
		}
		branchtest.WaitFor(t, "the released image collected", func() bool { return procBytes(t, e) < before+8<<20 })
	}
	other, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(ctx, other)
	run(t, e, other, "echo other > /f")
	if _, err := e.Checkpoint(ctx, other, state.Full); err != nil {
		t.Errorf("another env's checkpoint: %v", err)
	}
}

// procBytes is the bytes of the ready process images the manifest holds.
func procBytes(t *testing.T, e *branch.Engine) int64 {
	t.Helper()
	u, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	return u.Manifest.Artifacts[manifest.ArtifactProc].Bytes
}

// TestOpenFailsCleanly: an engine whose manifest cannot be opened (its
// path is a directory) returns the error; the clean-up of what Open had
// made (the image cache) does not crash on the nil engine it returns.
func TestOpenFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	c := requireCR(t)
	snap := newBtrfs(t, dir)
	state := filepath.Join(dir, "engine")
	if err := os.MkdirAll(filepath.Join(state, "manifest.db"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := branch.Open(context.Background(), branch.Options{StateDir: state, Snap: snap, CRIU: c, Launcher: &launch.Launcher{Snap: snap}, NoTmpfs: true, Logger: quiet()})
	if err == nil || e != nil {
		t.Fatalf("Open on a manifest path that is a directory: %v, %v", e, err)
	}
	t.Logf("refused: %v", err)
}
