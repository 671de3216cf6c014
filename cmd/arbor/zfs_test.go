package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/cr/zfs"
	"github.com/arbor-env/arbor/internal/servetest"
)

// zfsServe starts the real `arbor --backend zfs serve` with no
// ARBOR_ZFS_DATASET on state dir dir: it must make (or import) its own
// pool there, start zfs-fuse when ZFS does not answer and wire the zfs-fuse
// shim itself. It returns the server, a client and the server's log so far
// (log() reads it at the time of the call). At the end of the test a server
// still running is killed and its pool exported (servetest.Start), so that
// nothing stays imported in a daemon other tests share.
func zfsServe(t *testing.T, ctx context.Context, dir, addr string, more ...string) (*servetest.Server, *arbor.Client, func() string) {
	t.Helper()
	var mu sync.Mutex
	var lines []string
	srv := servetest.Start(t, servetest.Options{StateDir: dir, Addr: addr, Global: zfsGlobal,
		Args: append([]string{"--warm", "1", "--env-idle-ttl", "-1s", "--tasks", ""}, more...),
		OnLine: func(l string) {
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
			if strings.Contains(l, "zfs") || strings.Contains(l, "ERROR") || strings.Contains(l, "WARN") {
				t.Log("serve: " + l)
			}
		}})
	log := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
	return srv, srv.Dial(t, ctx, 4*time.Minute), log
}

// zfsGlobal are the global flags of a server on the zfs backend.
var zfsGlobal = []string{"--backend", "zfs", "--pool-size", "4G"}

// requireZFS skips without the zfs tools (or what a real server needs),
// unsets ARBOR_ZFS_DATASET and returns a fresh state dir.
func requireZFS(t *testing.T) string {
	t.Helper()
	servetest.RequireHost(t)
	if _, err := exec.LookPath("zpool"); err != nil {
		t.Skip("zfs tools not installed (zfs-fuse on this kernel): run make deps")
	}
	t.Setenv("ARBOR_ZFS_DATASET", "")
	return t.TempDir()
}

func zpoolListed(pool string) bool {
	return exec.Command("zpool", "list", "-H", "-o", "name", pool).Run() == nil
}

// zfsStep runs cmd in env and checks its exit status and, unless want is
// empty, the kind of checkpoint the turn took.
func zfsStep(t *testing.T, ctx context.Context, c *arbor.Client, env, cmd, want string) *arbor.StepResult {
	t.Helper()
	s, err := c.Step(ctx, env, arbor.Bash(cmd, 0))
	if err != nil {
		t.Fatalf("step %q: %v", cmd, err)
	}
	if s.Obs.ExitCode != 0 {
		t.Fatalf("step %q: exit %d: %s", cmd, s.Obs.ExitCode, s.Obs.Stderr)
	}
	if want != "" && s.Info.Checkpoint != want {
		t.Errorf("step %q: checkpoint %q, want %q", cmd, s.Info.Checkpoint, want)
	}
	return s
}

// TestServeQuickStartZFS runs the README's quick start against the real
// `arbor --backend zfs serve` with no dataset given and no manual set-up:
// the server makes its own file-backed pool in the state dir (starting
// zfs-fuse when ZFS does not answer, and saying so; wiring the zfs-fuse
// shim itself when the zfs found is zfs-fuse's) and then serves reset,
// step with every checkpoint kind (the eBPF inspector classifies), branch,
// rollback, promote, discard, evaluate and close. A clean stop exports the
// pool, leaves nothing mounted below the state dir and stops the zfs-fuse
// it started (unless another pool is in use). A second start on the same
// state dir imports the pool again, and a state of the closed env is still
// branchable (retention).
func TestServeQuickStartZFS(t *testing.T) {
	dir, addr := requireZFS(t), servetest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	answered := exec.Command("zpool", "list").Run() == nil
	realZFS, err := exec.LookPath("zfs")
	if err != nil {
		t.Fatal(err)
	}
	fuse := zfs.IsFuse(realZFS)
	pool, _ := zfs.PoolName(dir)

	srv, c, log := zfsServe(t, ctx, dir, addr)
	if !answered && !strings.Contains(log(), "started zfs-fuse") {
		t.Errorf("ZFS did not answer before the start, and the server's log does not say it started zfs-fuse:\n%s", log())
	}
	if fuse && !strings.Contains(log(), "compatibility shim") {
		t.Errorf("zfs is zfs-fuse's, and the server's log does not say it wired the shim:\n%s", log())
	}
	if !strings.Contains(log(), "made zfs pool file") {
		t.Errorf("the server's log does not say it made its pool file:\n%s", log())
	}
	out, err := exec.Command("zfs", "list", "-H", "-o", "mountpoint", pool+"/arbor").CombinedOutput()
	if want := filepath.Join(dir, "zfs", "mnt", "arbor"); err != nil || strings.TrimSpace(string(out)) != want {
		t.Fatalf("root dataset %s/arbor: mountpoint %q (%v), want %s", pool, out, err, want)
	}

	// The quick start: reset, a step, branch, states, evaluate.
	r, err := c.Reset(ctx, arbor.ResetParams{Task: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	zfsStep(t, ctx, c, env, "ls /; cat README", "none")
	greeted := zfsStep(t, ctx, c, env, `printf '%s\n' "$GREETING" > greeting.txt; : > /work/app.txt`, "fs").Info.StateID
	zfsStep(t, ctx, c, env, "export MODE=test", "proc")
	zfsStep(t, ctx, c, env, "exec 3>>/work/app.txt", "proc")
	head := zfsStep(t, ctx, c, env, "echo more >&3", "full").Info.StateID
	st, err := c.States(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if st.Head != head {
		t.Errorf("states: head %s, want %s", st.Head, head)
	}
	kinds := map[string]bool{}
	for _, s := range st.States {
		kinds[s.Kind] = true
	}
	for _, k := range []string{"full", "fs", "proc"} {
		if !kinds[k] {
			t.Errorf("states of %s: no %s state in %+v", env, k, st.States)
		}
	}
	if ev, err := c.Evaluate(ctx, env); err != nil || ev.Reward != 1 {
		t.Errorf("evaluate: %+v %v, want reward 1", ev, err)
	}
	b, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 3})
	if err != nil || len(b.EnvIDs) != 3 || len(b.Errors) != 0 {
		t.Fatalf("branch 3: %+v %v", b, err)
	}
	for i, kid := range b.EnvIDs {
		// Each child has the parent's files, variables and open
		// descriptor, and its own writes.
		s := zfsStep(t, ctx, c, kid, "echo kid"+strconv.Itoa(i)+" >&3; cat greeting.txt /work/app.txt; echo $MODE", "")
		if want := "hello, arbor\nmore\nkid" + strconv.Itoa(i) + "\ntest\n"; string(s.Obs.Stdout) != want {
			t.Errorf("child %d: %q, want %q", i, s.Obs.Stdout, want)
		}
	}
	s := zfsStep(t, ctx, c, env, "cat /work/app.txt", "")
	if s.Obs.Stdout != "more\n" {
		t.Errorf("parent after its children wrote: %q, want the parent's file alone", s.Obs.Stdout)
	}
	// Rollback to the state right after the greeting: app.txt empty, no
	// MODE, no descriptor 3.
	if _, err := c.Rollback(ctx, env, greeted); err != nil {
		t.Fatal(err)
	}
	s = zfsStep(t, ctx, c, env, "cat greeting.txt /work/app.txt; echo mode=$MODE; ls /proc/self/fd/3 2>/dev/null || echo no-fd3", "")
	if s.Obs.Stdout != "hello, arbor\nmode=\nno-fd3\n" {
		t.Errorf("after rollback to %s: %q", greeted, s.Obs.Stdout)
	}
	// Promote the first child (the env takes its state), discard the second.
	p, err := c.Promote(ctx, b.EnvIDs[0])
	if err != nil || p.EnvID != env {
		t.Fatalf("promote %s: %+v %v, want env %s", b.EnvIDs[0], p, err, env)
	}
	s = zfsStep(t, ctx, c, env, "cat /work/app.txt", "")
	if s.Obs.Stdout != "more\nkid0\n" {
		t.Errorf("after promote: %q, want the child's file", s.Obs.Stdout)
	}
	if err := c.Discard(ctx, b.EnvIDs[1]); err != nil {
		t.Errorf("discard: %v", err)
	}
	if _, err := c.Step(ctx, b.EnvIDs[1], arbor.Bash("true", 0)); !errors.Is(err, arbor.ErrUnknownEnv) {
		t.Errorf("step on a discarded branch: %v, want unknown_env", err)
	}
	for _, e := range []string{b.EnvIDs[2], env} {
		if err := c.CloseEnv(ctx, e); err != nil {
			t.Errorf("close %s: %v", e, err)
		}
	}
	if envs, err := c.Envs(ctx); err != nil || len(envs) != 0 {
		t.Errorf("envs after close: %+v %v, want none", envs, err)
	}
	c.Close()

	// A clean stop: pool exported, nothing mounted, daemon as found.
	if err := srv.Stop(3 * time.Minute); err != nil {
		t.Fatalf("arbor serve after SIGTERM: %v\n%s", err, srv.Tail())
	}
	if zpoolListed(pool) {
		t.Errorf("after a clean stop the pool %s is still imported", pool)
	}
	if m := mountsBelow(dir); len(m) != 0 {
		t.Errorf("after a clean stop, still mounted below the state dir: %v", m)
	}
	if strings.Contains(log(), "started zfs-fuse") {
		pid, _ := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "zfs", "zfs-fuse.pid"))))
		if pid > 0 && syscall.Kill(pid, 0) == nil && !strings.Contains(log(), "zfs-fuse left running: other pools are imported") {
			t.Errorf("the zfs-fuse the server started (pid %d) still runs after a clean stop, and the log does not say why", pid)
		}
	}

	// A second start imports the pool; the closed env's states are
	// retained, so its greeting state is still branchable.
	srv, c, log = zfsServe(t, ctx, dir, addr)
	defer c.Close()
	if !strings.Contains(log(), "imported zfs pool") {
		t.Errorf("second start on the same state dir: the log does not say it imported the pool:\n%s", log())
	}
	b, err = c.Branch(ctx, arbor.BranchParams{StateID: greeted, N: 1})
	if err != nil || len(b.EnvIDs) != 1 {
		t.Fatalf("branch the retained state %s after a restart: %+v %v", greeted, b, err)
	}
	s = zfsStep(t, ctx, c, b.EnvIDs[0], "cat greeting.txt", "")
	if s.Obs.Stdout != "hello, arbor\n" {
		t.Errorf("branch of the retained state: %q", s.Obs.Stdout)
	}
	if err := srv.Stop(3 * time.Minute); err != nil {
		t.Fatalf("second arbor serve after SIGTERM: %v\n%s", err, srv.Tail())
	}
	if zpoolListed(pool) {
		t.Errorf("after the second clean stop the pool %s is still imported", pool)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}
