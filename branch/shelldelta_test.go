package branch_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/inspector"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// shellDigest reads env's shell state as the inspector does.
func shellDigest(t *testing.T, env *branch.Env) string {
	t.Helper()
	sb := env.Sandbox()
	st, err := inspector.ReadShell(context.Background(), inspector.Target{Shell: sb, Cgroup: sb.FreezerCgroup(), LiveRoot: sb.Root()})
	if err != nil {
		t.Fatalf("read the shell of %s: %v", env.ID, err)
	}
	return st.Digest
}

// shellProbe is a readable summary of what the turns change, for the
// error messages.
const shellProbe = `echo "cwd=$(pwd) dirs=$(dirs -l -p | tr '\n' ,) K=${K-} A=${A[*]-} umask=$(umask) noglob=$(shopt -po noglob)"; type f 2>/dev/null | tail -n +2 | tr -d '\n'; alias | tr '\n' ,`

// TestShellDeltas: turns that change only the shell's own state are
// checkpointed as shell deltas on the last process image, not dumps, and
// every such state, branched, rolled back to, and stepped on again,
// holds the shell the live env had. Turns a delta cannot reproduce
// (traps, readonly variables, limits, descriptors) are dumped.
func TestShellDeltas(t *testing.T) {
	in := newInspector(t)
	dir := t.TempDir()
	r := newRigOptions(t, newBtrfs(t, dir), dir, func(o *branch.Options) { o.Inspector = in })
	img := testImage(t, r)
	if img != "debian" {
		t.Skip("shell deltas need bash (the debian image)")
	}
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "mkdir -p /work/a /work/b '/work/c d'")
	turns := []struct {
		name, cmd string
		delta     bool // recorded as a shell delta (else a dump)
	}{
		{"export", "export K=v1", true},
		{"cd", "cd /work/a", true},
		{"pushd", "pushd /work/b >/dev/null; pushd '/work/c d' >/dev/null", true},
		{"function", "f() { echo \"f $1\"; }", true},
		{"alias", "alias ll='ls -l'", true},
		{"set -o", "set -o noglob", true},
		{"umask", "umask 027", true},
		{"array and popd", "A=(x 'y z'); popd >/dev/null", true},
		{"files and shell", "echo hi > /work/file; export K=v2", true},
		{"back to the image", "cd /; dirs -c; unset K A; unset -f f; unalias ll; set +o noglob; umask 022", true},
		{"redo", "export K=v3; cd /work/b", true},

		{"trap", "trap 'echo bye' USR1", false},
		{"after a dump", "export K=v4", true},
		{"readonly", "readonly RO=1", false},
		{"ulimit", "ulimit -S -n 512", false},
		{"descriptor", "exec 3>/work/log", false},
		{"after the dumps", "cd /work/a; export K=v5", true},
	}
	type ref struct {
		name, sid, digest, probe string
	}
	var refs []ref
	dumps := 0
	for _, tt := range turns {
		run(t, e, env, tt.cmd)
		turn, err := e.Classify(ctx, env, tt.cmd)
		if err != nil {
			t.Fatal(err)
		}
		sid, kind, err := e.CheckpointAsync(env, turn.Kind)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Checkpoint(ctx, env, state.None); err != nil { // waits for it
			t.Fatalf("%s: checkpoint: %v", tt.name, err)
		}
		st, err := e.State(sid)
		if err != nil {
			t.Fatal(err)
		}
		if kind != state.Proc && kind != state.Full {
			t.Errorf("%s: classified %s (%v), want proc or full", tt.name, kind, turn.Reasons)
		}
		if delta := st.ShellDigest != ""; delta != tt.delta || st.Dumped() == tt.delta {
			t.Errorf("%s: state kind %s, shell delta %v (%q), want delta %v", tt.name, st.Kind, delta, st.ShellDelta, tt.delta)
		}
		if st.Dumped() {
			dumps++
		}
		refs = append(refs, ref{tt.name, sid, shellDigest(t, env), run(t, e, env, shellProbe)})
	}
	t.Logf("%d turns, %d dumps", len(turns), dumps)
	if u, _ := e.Usage(); u.Coord.ShellDeltas != int64(len(turns)-dumps) {
		t.Errorf("Usage().Coord.ShellDeltas = %d, want %d", u.Coord.ShellDeltas, len(turns)-dumps)
	}

	check := func(what string, child *branch.Env, r ref) {
		t.Helper()
		if got := run(t, e, child, shellProbe); got != r.probe {
			t.Errorf("%s of %q: shell %q, live was %q", what, r.name, got, r.probe)
		}
		if got := shellDigest(t, child); got != r.digest {
			t.Errorf("%s of %q: shell digest differs from the live one", what, r.name)
		}
	}
	for _, r := range refs {
		res, err := e.Branch(ctx, branch.Source{State: r.sid}, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range res.Children {
			if res.Errors[i] != nil {
				t.Fatalf("branch %q: %v", r.name, res.Errors[i])
			}
			check("branch", c, r)
			e.CloseEnv(ctx, c)
		}
	}

	// Rollback to a delta state, then a new turn's delta applies on the
	// image under it, not on the restored live shell.
	back := refs[4] // alias
	if err := e.Rollback(ctx, env, back.sid); err != nil {
		t.Fatal(err)
	}
	check("rollback", env, back)
	st := deltaTurn(t, e, env, "export K=after-rollback; cd /work")
	sid := st.ID
	if st.ShellDigest == "" {
		t.Errorf("turn after rollback: dumped (kind %s), want a shell delta", st.Kind)
	}
	after := ref{"after rollback", sid, shellDigest(t, env), run(t, e, env, shellProbe)}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch after rollback: %v %v", err, res.Errors)
	}
	check("branch", res.Children[0], after)

	// The base image stays while a delta state needs it: the env closed,
	// only the pinned delta state keeps the lineage.
	if err := e.Pin(sid); err != nil {
		t.Fatal(err)
	}
	e.CloseEnv(ctx, env)
	e.CloseEnv(ctx, res.Children[0])
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch of the pinned delta state after GC: %v %v", err, res.Errors)
	}
	check("branch after GC", res.Children[0], after)
}

// deltaTurn runs cmd as the coordinator's turn does (exec, classify,
// background checkpoint), waits for the checkpoint and returns its state.
func deltaTurn(t *testing.T, e *branch.Engine, env *branch.Env, cmd string) manifest.State {
	t.Helper()
	ctx := context.Background()
	run(t, e, env, cmd)
	turn, err := e.Classify(ctx, env, cmd)
	if err != nil {
		t.Fatal(err)
	}
	sid, _, err := e.CheckpointAsync(env, turn.Kind)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Checkpoint(ctx, env, state.None); err != nil {
		t.Fatalf("checkpoint of %q: %v", cmd, err)
	}
	st, err := e.State(sid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

const deltaCrashEnv = "ARBOR_DELTA_CRASH_HELPER"

// TestShellDeltaAfterCrash: an env whose head is a shell delta state comes
// back after a SIGKILL of the engine's process at that state (the record
// read from the manifest on disk, the delta run on the image), and its
// next turn is a delta on the same image.
func TestShellDeltaAfterCrash(t *testing.T) {
	if dir := os.Getenv(deltaCrashEnv); dir != "" {
		deltaCrashHelper(t, dir)
		return
	}
	requireCR(t)
	dir := t.TempDir()
	snap := newBtrfs(t, dir)
	probe := newRig(t, snap, filepath.Join(dir, "probe"), 0)
	if testImage(t, probe) != "debian" {
		t.Skip("shell deltas need bash (the debian image)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestShellDeltaAfterCrash$", "-test.v")
	cmd.Env = append(os.Environ(), deltaCrashEnv+"="+dir, "ARBOR_INIT="+sandboxtest.InitBinary(t))
	cmd.Stderr = os.Stderr
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "engine", "images", "hot"), unix.MNT_DETACH) })
	out, _ := cmd.Output()
	var envID, sid string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "DELTA" {
			envID, sid = f[1], f[2]
		}
	}
	if sid == "" {
		t.Fatalf("the helper announced no delta state:\n%s", out)
	}
	in := newInspector(t)
	r := newRigOptions(t, snap, dir, func(o *branch.Options) { o.Inspector = in })
	e := r.e
	env, err := e.Env(envID)
	if err != nil {
		t.Fatalf("env %s not back after the crash: %v (lost: %+v)", envID, err, e.Lost())
	}
	if env.Head() != sid {
		t.Fatalf("head %s, want the delta state %s", env.Head(), sid)
	}
	if got := run(t, e, env, `echo "$V $(pwd) $(type -t g)"`); got != "delta /work/a function\n" {
		t.Errorf("shell after recovery: %q, want the delta state's", got)
	}
	st := deltaTurn(t, e, env, "export V=after; cd /work")
	if st.Dumped() {
		t.Errorf("turn after recovery dumped, want a shell delta")
	}
	res, err := e.Branch(context.Background(), branch.Source{State: st.ID}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch after recovery: %v %v", err, res.Errors)
	}
	if got := run(t, e, res.Children[0], `echo "$V $(pwd) $(type -t g)"`); got != "after /work function\n" {
		t.Errorf("branch of the turn after recovery: %q", got)
	}
}

// deltaCrashHelper leaves an env at a shell delta state on the engine in
// dir and SIGKILLs itself.
func deltaCrashHelper(t *testing.T, dir string) {
	ctx := context.Background()
	snap, err := btrfs.Open(ctx, btrfs.Options{StateDir: dir, PoolSize: 4 << 30, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	in := newInspector(t)
	c := requireCR(t)
	images := &image.Store{Snap: snap, CacheDir: os.Getenv("ARBOR_IMAGE_CACHE"), Logger: quiet()}
	l := &launch.Launcher{Snap: snap, Images: images, InitBinary: sandboxtest.InitBinary(t), AutoBuild: true, Logger: quiet()}
	e, err := branch.Open(ctx, branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Inspector: in, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	env, _, err := e.NewEnv(ctx, "debian")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "mkdir -p /work/a")
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	st := deltaTurn(t, e, env, "export V=delta; cd /work/a; g() { :; }")
	if st.Dumped() {
		t.Fatal("the turn dumped: no delta state to recover")
	}
	fmt.Printf("DELTA %s %s\n", env.ID, st.ID)
	os.Stdout.Sync()
	unix.Kill(os.Getpid(), unix.SIGKILL)
	select {}
}
