package branch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/cr/manifest"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// rig is an engine on a fresh btrfs pool with a busybox image and, when
// the debian cache exists, a debian image.
type rig struct {
	e      *branch.Engine
	snap   cr.Snapshotter
	dir    string
	opts   branch.Options
	images *image.Store
}

func quiet() *slog.Logger { return branchtest.Logger() }

func requireCR(tb testing.TB) *criu.Checkpointer {
	tb.Helper()
	c := sandboxtest.CRIU(tb, quiet())
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		tb.Skip("btrfs-progs not installed: run make deps")
	}
	return c
}

func newBtrfs(tb testing.TB, dir string) cr.Snapshotter {
	tb.Helper()
	return sandboxtest.Btrfs(tb, dir, 4<<30, quiet())
}

func newRig(tb testing.TB, snap cr.Snapshotter, dir string, warm int) *rig {
	tb.Helper()
	return newRigLimits(tb, snap, dir, warm, sandbox.Limits{})
}

// newRigLimits is newRig with the sandboxes' limits.
func newRigLimits(tb testing.TB, snap cr.Snapshotter, dir string, warm int, lim sandbox.Limits) *rig {
	tb.Helper()
	return newRigLauncher(tb, snap, dir, warm, func(l *launch.Launcher) { l.Limits = lim })
}

// newRigLauncher is newRig with adjust applied to the launcher (limits,
// isolation, user namespace mode).
func newRigLauncher(tb testing.TB, snap cr.Snapshotter, dir string, warm int, adjust func(*launch.Launcher)) *rig {
	tb.Helper()
	return newRigOptions(tb, snap, dir, func(o *branch.Options) {
		o.WarmCopies = warm
		adjust(o.Launcher)
	})
}

// newRigOptions is newRig with adjust applied to the engine's options
// (the launcher among them) before it opens.
func newRigOptions(tb testing.TB, snap cr.Snapshotter, dir string, adjust func(*branch.Options)) *rig {
	tb.Helper()
	c := requireCR(tb)
	images := &image.Store{Snap: snap, CacheDir: os.Getenv("ARBOR_IMAGE_CACHE"), Logger: quiet()}
	l := &launch.Launcher{Snap: snap, Images: images, InitBinary: sandboxtest.InitBinary(tb), AutoBuild: true, Logger: quiet()}
	if os.Getenv("ARBOR_TEST_USERNS") == "1" { // the whole package in user namespace mode
		l.UserNS = sandbox.UserNSConfig{Enabled: true}
	}
	o := branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Logger: quiet()}
	adjust(&o)
	e, err := branch.Open(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		e.Close(context.Background())
		// The engine keeps its hot images on a tmpfs that outlives it (so
		// a restarted server finds them); a test must not.
		unix.Unmount(filepath.Join(o.StateDir, "images", "hot"), unix.MNT_DETACH)
	})
	return &rig{e: e, snap: snap, dir: dir, opts: o, images: images}
}

// testImage is debian (bash, python3), whose cached rootfs make test
// builds first (a missing cache fails the test), or busybox when
// ARBOR_TEST_IMAGE=busybox.
func testImage(tb testing.TB, r *rig) string {
	tb.Helper()
	if os.Getenv("ARBOR_TEST_IMAGE") == "busybox" {
		return "busybox"
	}
	sandboxtest.DebianCache(tb)
	if _, err := r.images.Get(context.Background(), "debian"); err != nil {
		if err := r.images.Build(context.Background(), "debian", nil); err != nil {
			tb.Fatal(err)
		}
	}
	return "debian"
}

func run(tb testing.TB, e *branch.Engine, env *branch.Env, cmd string) string {
	tb.Helper()
	res, err := e.Exec(context.Background(), env, cmd, sandbox.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		tb.Fatalf("exec %q in %s: %v", cmd, env.ID, err)
	}
	if res.ExitCode != 0 {
		tb.Fatalf("exec %q in %s: exit %d, stderr %q", cmd, env.ID, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// counterCmd starts a background process whose memory holds a counter that
// answers (and increments) on each read, so a restore that lost the
// process's memory, or restarted it, is visible.
func counterCmd(img string) (start, read string) {
	if img == "debian" {
		start = `python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7070)); s.listen(8); n = 0
while True:
    c, _ = s.accept(); n += 1; c.sendall(str(n).encode()); c.close()
' >/dev/null 2>&1 &
for i in $(seq 50); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 7070)).close()' 2>/dev/null && break; sleep 0.1; done`
		read = `python3 -c 'import socket; print(socket.create_connection(("127.0.0.1", 7070)).recv(16).decode())'`
		return
	}
	// busybox: the counter lives in a shell loop's memory and is only
	// reported through a file when asked.
	start = `(n=0; while :; do if [ -e /tmp/ask ]; then n=$((n+1)); echo $n > /tmp/answer; rm /tmp/ask; fi; sleep 0.02; done) >/dev/null 2>&1 &`
	read = `rm -f /tmp/answer; touch /tmp/ask; while [ ! -s /tmp/answer ]; do sleep 0.02; done; cat /tmp/answer`
	return
}

// shellState prints what a state check compares.
const shellState = `echo "cwd=$(pwd) K=$K"; f; cat /work/file`

func TestBranchAndRollback(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	branchAndRollback(t, r)
}

func branchAndRollback(t *testing.T, r *rig) {
	ctx := context.Background()
	img := testImage(t, r)
	t.Logf("image %s", img)
	e := r.e
	parent, _, err := e.NewEnv(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	start, read := counterCmd(img)
	run(t, e, parent, "mkdir -p /work && cd /work && export K=v && f() { echo fun; } && echo data > /work/file")
	run(t, e, parent, start)
	base, err := strconv.Atoi(strings.TrimSpace(run(t, e, parent, read)))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	next := func(k int) string { return strconv.Itoa(base + k) }
	sid, err := e.Checkpoint(ctx, parent, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("branch(3) took %v", res.Took)
	want := "cwd=/work K=v\nfun\ndata\n"
	for i, child := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		if got := run(t, e, child, shellState); got != want {
			t.Errorf("child %d state: %q, want %q", i, got, want)
		}
		// The process continues from the checkpointed memory: its next
		// answer is the same in every child, as it is in the parent.
		if got := strings.TrimSpace(run(t, e, child, read)); got != next(1) {
			t.Errorf("child %d counter: %q, want %s", i, got, next(1))
		}
		if child.Head() != sid {
			t.Errorf("child %d head %s, want %s", i, child.Head(), sid)
		}
	}
	if got := strings.TrimSpace(run(t, e, parent, read)); got != next(1) {
		t.Errorf("parent counter: %q, want %s", got, next(1))
	}
	// Children are independent of each other and of the parent.
	c0 := res.Children[0]
	run(t, e, c0, "echo changed > /work/file; export K=c0; cd /; f() { echo c0fun; }; "+read+" >/dev/null")
	for i, env := range append([]*branch.Env{parent}, res.Children[1:]...) {
		if got := run(t, e, env, shellState); got != want {
			t.Errorf("env %d sees a sibling's change: %q", i, got)
		}
	}
	if got := strings.TrimSpace(run(t, e, res.Children[1], read)); got != next(2) {
		t.Errorf("child 1 counter after its sibling moved on: %q, want %s", got, next(2))
	}
	// Rollback restores files, shell state and process memory.
	run(t, e, parent, "rm /work/file; unset K; cd /; unset -f f; "+read+" >/dev/null; "+read+" >/dev/null")
	if err := e.Rollback(ctx, parent, sid); err != nil {
		t.Fatal(err)
	}
	if got := run(t, e, parent, shellState); got != want {
		t.Errorf("after rollback: %q, want %q", got, want)
	}
	if got := strings.TrimSpace(run(t, e, parent, read)); got != next(1) {
		t.Errorf("counter after rollback: %q, want %s", got, next(1))
	}
	// Branching from an env with changes checkpoints it first.
	run(t, e, parent, "echo later > /work/later")
	res2, err := e.Branch(ctx, branch.Source{Env: parent}, 1)
	if err != nil {
		t.Fatalf("branch of a live env: %v", err)
	}
	if res2.Errors[0] != nil {
		t.Fatalf("branch of a live env: %v", res2.Errors[0])
	}
	if res2.State == sid {
		t.Errorf("branch of a changed env reused the old state")
	}
	if got := run(t, e, res2.Children[0], "cat /work/later"); got != "later\n" {
		t.Errorf("branch of live env lacks the latest file: %q", got)
	}
	for _, c := range append(res.Children, res2.Children...) {
		if err := e.CloseEnv(ctx, c); err != nil {
			t.Errorf("close child: %v", err)
		}
	}
}

func TestFailedRestoreKeepsSource(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo one > /f")
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.State(sid)
	if err != nil {
		t.Fatal(err)
	}
	// Delete the process image behind the engine's back.
	for _, d := range []string{"hot", "cold"} {
		os.RemoveAll(filepath.Join(r.opts.StateDir, "images", d, st.Proc))
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, cerr := range res.Errors {
		if !errors.Is(cerr, state.ErrRestore) || res.Children[i] != nil {
			t.Errorf("child %d: err %v, env %v; want state.ErrRestore and no env", i, cerr, res.Children[i])
		}
	}
	t.Logf("reported: %v", res.Errors[0])
	if err := e.Rollback(ctx, env, sid); !errors.Is(err, state.ErrRestore) {
		t.Errorf("rollback to a broken state: %v, want state.ErrRestore", err)
	}
	if got := run(t, e, env, "cat /f; echo more >> /f; cat /f"); got != "one\none\nmore\n" {
		t.Errorf("source env after failed restores: %q", got)
	}
	if _, err := e.Branch(ctx, branch.Source{State: "s-nonexistent"}, 1); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("branch of unknown state: %v", err)
	}
	if _, err := e.Branch(ctx, branch.Source{State: sid}, 0); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("branch n=0: %v", err)
	}
}

func TestCheckpointKindsShareArtifacts(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, s0, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitCheckpoint(ctx, env); err != nil { // the reset's, in the background
		t.Fatal(err)
	}
	start := time.Now()
	run(t, e, env, "echo a > /a")
	s1, err := e.Checkpoint(ctx, env, state.FS)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "X=1")
	s2, err := e.Checkpoint(ctx, env, state.Proc)
	if err != nil {
		t.Fatal(err)
	}
	s3, err := e.Checkpoint(ctx, env, state.None)
	if err != nil || s3 != s2 {
		t.Fatalf("kind none: %s %v, want the head %s", s3, err, s2)
	}
	st0, _ := e.State(s0)
	st1, _ := e.State(s1)
	st2, _ := e.State(s2)
	if st1.Proc != st0.Proc || st1.FS == st0.FS {
		t.Errorf("fs checkpoint: %+v vs %+v", st1, st0)
	}
	if st2.FS != st1.FS || st2.Proc == st1.Proc {
		t.Errorf("proc checkpoint: %+v vs %+v", st2, st1)
	}
	// Written counts what this env's checkpoints made since start: one
	// file snapshot and one process image, not the reset's artifacts.
	w, err := e.Written(env.ID, start)
	if err != nil {
		t.Fatal(err)
	}
	if p, f := w[manifest.ArtifactProc], w[manifest.ArtifactFS]; p.Count != 1 || p.Bytes <= 0 || f.Count != 1 {
		t.Errorf("Written since the first turn: proc %+v, fs %+v; want one of each, the image with bytes", p, f)
	}
	res, err := e.Branch(ctx, branch.Source{State: s2}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatal(err, res.Errors)
	}
	if got := run(t, e, res.Children[0], "cat /a; echo $X"); got != "a\n1\n" {
		t.Errorf("restore of paired artifacts: %q", got)
	}
	lin, err := e.Lineage(s2)
	if err != nil || len(lin) != 3 || lin[0].ID != s0 {
		t.Errorf("lineage %v %v", lin, err)
	}
}

func TestReleaseAndGC(t *testing.T) {
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
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatal(err, res.Errors)
	}
	child := res.Children[0]
	run(t, e, child, "echo c > /c")
	csid, err := e.Checkpoint(ctx, child, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CloseEnv(ctx, env); err != nil {
		t.Fatal(err)
	}
	// The child descends from sid: it must still restore.
	if _, err := e.State(sid); err != nil {
		t.Fatalf("parent state collected while a child descends from it: %v", err)
	}
	before, _ := e.Usage()
	if err := e.CloseEnv(ctx, child); err != nil {
		t.Fatal(err)
	}
	// The background GC may have begun already; GC collects the rest now.
	if err := e.GC(ctx); err != nil {
		t.Fatal(err)
	}
	after, _ := e.Usage()
	if _, err := e.State(csid); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("state of a closed lineage survived GC: %v", err)
	}
	if after.Manifest.States != 0 || after.Images.HotCount+after.Images.ColdCount != 0 {
		t.Errorf("GC left states or images: before %+v after %+v", before.Manifest, after)
	}
	vols, _ := r.snap.List(ctx, branch.SnapshotPrefix)
	if len(vols) != 0 {
		t.Errorf("GC left snapshots: %v", vols)
	}
}

func TestWarmCopies(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 2)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo w > /w; W=1")
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 2) // fails the test if the warm copies never appear
	before, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("branch(3) with 2 warm copies took %v", res.Took)
	// Two children are thawed warm copies; only the third is restored by
	// a (high-priority) queue job. Without the warm copies all three are.
	after, err := e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if n := after.Queue.High.Completed - before.Queue.High.Completed; n != 1 {
		t.Errorf("branch(3) with 2 warm copies ran %d restores, want 1 (the other two children thawed warm copies)", n)
	}
	for i, c := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		if got := run(t, e, c, "cat /w; echo $W"); got != "w\n1\n" {
			t.Errorf("child %d (warm=%v): %q", i, i < 2, got)
		}
	}
}

// TestCrashDuringCheckpoint kills (SIGKILL) a process in the middle of a
// checkpoint and checks that the manifest it leaves is consistent and the
// states committed before still restore.
func TestCrashDuringCheckpoint(t *testing.T) {
	if os.Getenv("ARBOR_CRASH_HELPER") != "" {
		crashHelper(t)
		return
	}
	requireCR(t)
	dir := t.TempDir()
	snap := newBtrfs(t, dir) // mounted here so the helper reuses it
	_ = snap
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashDuringCheckpoint$", "-test.v")
	cmd.Env = append(os.Environ(), "ARBOR_CRASH_HELPER="+dir, "ARBOR_INIT="+sandboxtest.InitBinary(t))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var committed []string
	buf := make([]byte, 4096)
	var acc string
	for len(committed) < 3 {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatalf("helper ended early: %v (%q)", err, acc)
		}
		acc += string(buf[:n])
		committed = nil
		for _, line := range strings.Split(acc, "\n") {
			if s, ok := strings.CutPrefix(line, "COMMITTED "); ok {
				committed = append(committed, strings.TrimSpace(s))
			}
		}
	}
	// The helper checkpoints in a loop: kill it a moment into the next one.
	time.Sleep(time.Duration(20+len(acc)%40) * time.Millisecond)
	cmd.Process.Kill()
	cmd.Wait()
	t.Logf("killed after %d committed states", len(committed))
	r := newRig(t, snap, dir, 0) // reopens the engine: Recover runs
	u, err := r.e.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Manifest.Intents != 0 {
		t.Errorf("half-written artifacts left after recovery: %+v", u.Manifest)
	}
	for _, sid := range committed {
		res, err := r.e.Branch(context.Background(), branch.Source{State: sid}, 1)
		if err != nil || res.Errors[0] != nil {
			t.Fatalf("committed state %s does not restore after the crash: %v %v", sid, err, res.Errors)
		}
		got := run(t, r.e, res.Children[0], "cat /n")
		if !strings.HasPrefix(got, "turn") {
			t.Errorf("state %s restored to %q", sid, got)
		}
	}
	// Every image directory on disk is accounted for.
	for _, d := range []string{"hot", "cold"} {
		ents, _ := os.ReadDir(filepath.Join(r.opts.StateDir, "images", d))
		for _, ent := range ents {
			if strings.HasPrefix(ent.Name(), ".") {
				t.Errorf("leftover temporary image dir %s/%s", d, ent.Name())
			}
		}
	}
}

func crashHelper(t *testing.T) {
	dir := os.Getenv("ARBOR_CRASH_HELPER")
	snap, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: dir, PoolSize: 4 << 30, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := requireCR(t)
	images := &image.Store{Snap: snap, CacheDir: os.Getenv("ARBOR_IMAGE_CACHE"), Logger: quiet()}
	l := &launch.Launcher{Snap: snap, Images: images, AutoBuild: true, Logger: quiet()}
	e, err := branch.Open(context.Background(), branch.Options{StateDir: filepath.Join(dir, "engine"), Snap: snap, CRIU: c, Launcher: l, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "sleep 1000 &")
	for i := 0; ; i++ {
		run(t, e, env, "echo turn"+strconv.Itoa(i)+" > /n")
		sid, err := e.Checkpoint(ctx, env, state.Full)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("COMMITTED %s\n", sid)
	}
}

func TestPromote(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	parent, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, parent, "echo base > /f")
	res, err := e.Branch(ctx, branch.Source{Env: parent}, 2)
	if err != nil || res.Errors[0] != nil || res.Errors[1] != nil {
		t.Fatal(err, res.Errors)
	}
	draft, other := res.Children[0], res.Children[1]
	if draft.Origin != parent.ID {
		t.Fatalf("origin %q, want %q", draft.Origin, parent.ID)
	}
	run(t, e, draft, "echo drafted > /f; D=1")
	run(t, e, other, "echo discarded > /f")
	if err := e.CloseEnv(ctx, other); err != nil { // discard
		t.Fatal(err)
	}
	sid, err := e.Promote(ctx, draft)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, e, parent, "cat /f; echo $D"); got != "drafted\n1\n" || parent.Head() != sid {
		t.Errorf("parent after promote: %q head %s want %s", got, parent.Head(), sid)
	}
	if _, err := e.Env(draft.ID); !errors.Is(err, state.ErrUnknownEnv) {
		t.Errorf("promoted draft still open: %v", err)
	}
}

// TestCheckpointAsyncFullAfterFailure: after a background checkpoint
// failed, the next one is full whatever kind it was asked for (the one
// home of that rule), and CheckpointAsync says so.
func TestCheckpointAsyncFullAfterFailure(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	// A process holding open a deleted 72 MiB file, over the ghost
	// limit: its dump fails. The file goes once the process holds it.
	run(t, e, env, branchtest.GhostHolder)
	failing, kind, err := e.CheckpointAsync(env, state.Proc)
	if err != nil || kind != state.Proc {
		t.Fatalf("queue a proc checkpoint: kind %s, %v", kind, err)
	}
	if _, err := e.WaitCheckpoint(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := env.TakeCheckpointError(); !errors.Is(err, state.ErrCheckpoint) {
		t.Fatalf("checkpoint %s with a ghost over the limit: %v, want state.ErrCheckpoint", failing, err)
	}
	run(t, e, env, "kill $(pidof sleep); wait 2>/dev/null; true")
	sid, kind, err := e.CheckpointAsync(env, state.None)
	if err != nil || kind != state.Full || sid == failing {
		t.Fatalf("checkpoint after the failure: %s kind %s, %v; want a new full state", sid, kind, err)
	}
	if _, err := e.WaitCheckpoint(ctx, env); err != nil {
		t.Fatal(err)
	}
	if st, err := e.State(sid); err != nil || st.Kind != state.Full {
		t.Errorf("state %s: %+v %v, want committed full", sid, st, err)
	}
	// The rule is spent: the next checkpoint takes the kind asked for.
	if _, kind, err := e.CheckpointAsync(env, state.None); err != nil || kind != state.None {
		t.Errorf("the checkpoint after: kind %s, %v; want none", kind, err)
	}
}
