package criu_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

func setup(t testing.TB) (*criu.Checkpointer, *btrfs.Snapshotter) {
	t.Helper()
	return sandboxtest.CRIU(t, slog.Default()), sandboxtest.Btrfs(t, t.TempDir(), 2<<30, nil)
}

func TestDumpRestore(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	var root string
	if os.Getenv("ARBOR_TEST_IMAGE") == "debian" {
		root = sandboxtest.DebianRoot(t, "")
	} else {
		root = sandboxtest.BusyboxRoot(t, "")
	}
	if out, err := exec.Command("cp", "-a", root+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "crsrc", Root: snap.Path("src"), InitBinary: sandboxtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	// The loop replaces the counter file whole (write, then rename): a
	// reader, or the frozen snapshot, never sees it truncated and empty
	// (make test once read "" between the loop's truncate and its write).
	for _, cmd := range []string{"cd /tmp && export K=v && f() { echo fun; }", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done) >/dev/null 2>&1 &"} {
		if r, err := sb.Exec(ctx, cmd, sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %v %+v", cmd, err, r)
		}
	}
	time.Sleep(300 * time.Millisecond)
	imgs := t.TempDir()
	if d := os.Getenv("ARBOR_TEST_KEEP_IMAGES"); d != "" {
		imgs = d
	}
	st, rec := dump(t, c, snap, sb, "snap1", imgs, false)
	t.Logf("dump: %+v", st)
	if st.PagesWritten == 0 || st.Bytes <= 0 || st.Duration <= 0 {
		t.Errorf("dump stats %+v: want pages written, image bytes and a duration", st)
	}
	// The counter's value when the tree was frozen: the snapshot, taken
	// frozen, holds it.
	atDump := readCount(t, snap.Path("snap1")+"/tmp/count")
	if atDump < 2 {
		t.Fatalf("counter at the dump is %d: the background loop did not run", atDump)
	}
	if r, _ := sb.Exec(ctx, "echo $K; cat /tmp/count", sandbox.ExecOptions{}); !strings.HasPrefix(string(r.Stdout), "v\n") {
		t.Fatalf("source after dump: %q %q", r.Stdout, r.Stderr)
	}
	if err := snap.Clone(ctx, "snap1", "child"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "crchild", Root: snap.Path("child")}, rec, func(join func(int) error) (int, error) {
		return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path("child"), Join: join})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore took %v", time.Since(start))
	defer child.Destroy(ctx)
	r, err := child.Exec(ctx, "echo $K; pwd; f; a=$(cat /tmp/count); sleep 0.3; b=$(cat /tmp/count); echo $a $b", sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("child: %q %q", r.Stdout, r.Stderr)
	lines := strings.Split(string(r.Stdout), "\n")
	if len(lines) < 4 || lines[0] != "v" || lines[1] != "/tmp" || lines[2] != "fun" {
		t.Fatalf("child state: %q", r.Stdout)
	}
	// The restored loop goes on from where it was frozen (a restarted one
	// would count from 1 again) and is still running.
	var a, b int
	if _, err := fmt.Sscan(lines[3], &a, &b); err != nil {
		t.Fatalf("child counter line %q: %v", lines[3], err)
	}
	if a < atDump || b <= a {
		t.Errorf("child counter %d then %d 0.3 s later, frozen at %d: want it to go on from %d and keep counting", a, b, atDump, atDump)
	}
}

// readCount reads the number in file.
func readCount(t *testing.T, file string) int {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %q: %v", file, data, err)
	}
	return n
}

// TestDumpOrphanHoldingTTY: a background process whose parent exited keeps
// the shell's terminal open (`(sleep 1000 &)`, nohup-style servers); the
// tree must still dump and restore.
func TestDumpOrphanHoldingTTY(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	root := sandboxtest.BusyboxRoot(t, "")
	if os.Getenv("ARBOR_TEST_IMAGE") == "debian" {
		root = sandboxtest.DebianRoot(t, "")
	}
	if out, err := exec.Command("cp", "-a", root+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "orphan", Root: snap.Path("src"), InitBinary: sandboxtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	if _, err := sb.Exec(ctx, "(sleep 1000 &)", sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	imgs := t.TempDir()
	_, rec := dump(t, c, snap, sb, "snap", imgs, false)
	if err := snap.Clone(ctx, "snap", "child"); err != nil {
		t.Fatal(err)
	}
	child, err := sandbox.Restore(ctx, sandbox.Config{ID: "orphan-child", Root: snap.Path("child")}, rec, func(join func(int) error) (int, error) {
		return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path("child"), Join: join})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer child.Destroy(ctx)
	r, err := child.Exec(ctx, "cat /proc/[0-9]*/comm | grep -c sleep", sandbox.ExecOptions{})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "1" {
		t.Fatalf("restored orphan: %v %q %q", err, r.Stdout, r.Stderr)
	}
}

// startSource starts sandbox id on a new volume "src" holding a copy of
// root, destroyed at the end of the test.
func startSource(t testing.TB, snap *btrfs.Snapshotter, id, root string) *sandbox.Sandbox {
	t.Helper()
	ctx := context.Background()
	if err := snap.CreateVolume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", root+"/.", snap.Path("src")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: id, Root: snap.Path("src"), InitBinary: sandboxtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	return sb
}

// dump freezes sb, snapshots its root (volume "src") as name and dumps the
// tree into imgs, as the engine's checkpoint does, returning CRIU's figures
// and the isolation record a restore is checked against.
func dump(t *testing.T, c *criu.Checkpointer, snap *btrfs.Snapshotter, sb *sandbox.Sandbox, name, imgs string, userNS bool) (criu.DumpStats, sandbox.IsolationRecord) {
	t.Helper()
	ctx := context.Background()
	var st criu.DumpStats
	var rec sandbox.IsolationRecord
	err := sb.Exclusive(func() error {
		if err := sb.Freeze(); err != nil {
			return err
		}
		defer sb.Thaw()
		if err := snap.Snapshot(ctx, "src", name); err != nil {
			return err
		}
		var err error
		if rec, err = sb.Isolation(); err != nil {
			return err
		}
		st, err = c.Dump(ctx, criu.DumpRequest{PID: sb.InitPID(), Dir: imgs, FreezeCgroup: sb.FreezerCgroup(), UserNS: userNS})
		return err
	})
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	return st, rec
}

// TestDumpHangKilled: a dump whose CRIU stops in the middle (SIGSTOP once
// it has seized and dumped the tree, at its post-dump notification) is
// killed at Checkpointer.Timeout and fails with ErrTimeout, instead of
// holding the tree and its caller forever; the tree is not left stopped,
// the CRIU is gone, the sandbox runs commands and dumps again.
func TestDumpHangKilled(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	sb := startSource(t, snap, "crhang", sandboxtest.BusyboxRoot(t, ""))
	c.Timeout = 2 * time.Second
	var stopped atomic.Int64
	c.FaultHook = func(stage string, pid int) {
		if stage == "post-dump" && stopped.CompareAndSwap(0, int64(pid)) {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
	}
	done := make(chan error, 1)
	go func() {
		err := sb.Exclusive(func() error {
			// The group is not frozen first: CRIU stops the tree
			// itself, and a CRIU killed half-way must not leave it
			// stopped.
			_, err := c.Dump(ctx, criu.DumpRequest{PID: sb.InitPID(), Dir: t.TempDir(), FreezeCgroup: sb.FreezerCgroup()})
			return err
		})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("dump with a stopped CRIU did not return: it hangs")
	}
	if stopped.Load() == 0 {
		t.Fatalf("CRIU sent no post-dump notification (dump: %v)", err)
	}
	if !errors.Is(err, criu.ErrTimeout) {
		t.Fatalf("dump with a stopped CRIU: %v, want ErrTimeout", err)
	}
	t.Logf("dump: %v", err)
	if err := syscall.Kill(int(stopped.Load()), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the killed CRIU (pid %d) is still there: kill 0: %v", stopped.Load(), err)
	}
	if b, err := os.ReadFile(sb.FreezerCgroup() + "/cgroup.freeze"); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("cgroup.freeze after the killed dump: %q %v, want 0", b, err)
	}
	if r, err := sb.Exec(ctx, "echo alive", sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil || string(r.Stdout) != "alive\n" {
		t.Fatalf("sandbox after the killed dump: %v %+v", err, r)
	}
	c.FaultHook = nil
	dump(t, c, snap, sb, "snap", t.TempDir(), false)
}

// TestRestoreHangKilled: a restore whose CRIU stops once the root task is
// placed (SIGSTOP at setup-namespaces) is killed at the deadline; the
// half-restored sandbox is destroyed with its cgroup (nothing of it is
// left running), and the same images restore afterwards.
func TestRestoreHangKilled(t *testing.T) {
	c, snap := setup(t)
	ctx := context.Background()
	sb := startSource(t, snap, "crrsthang", sandboxtest.BusyboxRoot(t, ""))
	imgs := t.TempDir()
	_, rec := dump(t, c, snap, sb, "snap", imgs, false)
	c.Timeout = 2 * time.Second
	var stopped atomic.Int64
	c.FaultHook = func(stage string, pid int) {
		if stage == "setup-namespaces" && stopped.CompareAndSwap(0, int64(pid)) {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
	}
	var root atomic.Int64 // the restored tree's root task
	restore := func(name string) (*sandbox.Sandbox, error) {
		if err := snap.Clone(ctx, "snap", name); err != nil {
			t.Fatal(err)
		}
		return sandbox.Restore(ctx, sandbox.Config{ID: "crrst-" + name, Root: snap.Path(name)}, rec, func(join func(int) error) (int, error) {
			return c.Restore(ctx, criu.RestoreRequest{Dir: imgs, Root: snap.Path(name), Join: func(pid int) error {
				root.CompareAndSwap(0, int64(pid))
				return join(pid)
			}})
		})
	}
	done := make(chan error, 1)
	go func() {
		child, err := restore("hung")
		if err == nil {
			child.Destroy(ctx)
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("restore with a stopped CRIU did not return: it hangs")
	}
	if stopped.Load() == 0 {
		t.Fatalf("CRIU sent no setup-namespaces notification (restore: %v)", err)
	}
	if !errors.Is(err, criu.ErrTimeout) {
		t.Fatalf("restore with a stopped CRIU: %v, want ErrTimeout", err)
	}
	if err := syscall.Kill(int(stopped.Load()), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the killed CRIU (pid %d) is still there: %v", stopped.Load(), err)
	}
	if root.Load() == 0 {
		t.Fatal("the restore placed no root task")
	}
	// Gone, not even a zombie: its parent (this process) reaped it.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", root.Load())); err == nil {
		t.Errorf("root task %d of the half-restored tree is left: %s", root.Load(), b)
	}
	c.FaultHook = nil
	child, err := restore("ok")
	if err != nil {
		t.Fatal(err)
	}
	defer child.Destroy(ctx)
	if r, err := child.Exec(ctx, "echo alive", sandbox.ExecOptions{}); err != nil || string(r.Stdout) != "alive\n" {
		t.Fatalf("restored after the killed restore: %v %+v", err, r)
	}
}
