package branch_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr/criu"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/state"
)

// TestHungDumpFailsAndThaws: a background checkpoint whose CRIU stops in
// the middle of the dump (SIGSTOP at its post-dump notification, with the
// tree seized and frozen) is killed at the CRIU deadline. The env does not
// hang: the next operation runs (the sandbox is thawed), it reports the
// failed checkpoint (TakeCheckpointError, state.ErrCheckpoint), the head
// is the parent again, no CRIU process or client goroutine is left, and
// the next checkpoint is full, succeeds and restores. Before the deadline
// existed, the dump, and with it every later operation on the env, waited
// for the stopped CRIU forever.
func TestHungDumpFailsAndThaws(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	c := r.opts.CRIU
	c.Timeout = 3 * time.Second
	var armed atomic.Bool
	var stopped atomic.Int64
	c.FaultHook = func(stage string, pid int) {
		if stage == "post-dump" && armed.CompareAndSwap(true, false) {
			stopped.Store(int64(pid))
			syscall.Kill(pid, syscall.SIGSTOP)
		}
	}
	ctx := context.Background()
	e := r.e
	env, first, err := e.NewEnv(ctx, testImage(t, r))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "echo one > /tmp/f")
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	parent := env.Head()
	if parent == first {
		t.Fatalf("head did not move from %s", first)
	}
	run(t, e, env, "echo two > /tmp/f")

	armed.Store(true)
	sid, _, err := e.CheckpointAsync(env, state.Proc)
	if err != nil {
		t.Fatal(err)
	}
	// The next operation waits for that checkpoint, then runs.
	done := make(chan error, 1)
	go func() {
		_, err := e.Exec(ctx, env, "true", sandbox.ExecOptions{Timeout: 10 * time.Second})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the env's next operation still waits for a checkpoint whose CRIU stopped: it hangs")
	}
	if err != nil {
		t.Fatalf("exec after the failed checkpoint: %v", err)
	}
	if stopped.Load() == 0 {
		t.Fatal("CRIU sent no post-dump notification: nothing was stopped")
	}
	ckErr := env.TakeCheckpointError()
	if !errors.Is(ckErr, state.ErrCheckpoint) || !strings.Contains(ckErr.Error(), criu.ErrTimeout.Error()) {
		t.Fatalf("checkpoint error: %v, want state.ErrCheckpoint of a CRIU timeout", ckErr)
	}
	t.Logf("reported: %v", ckErr)
	if got := env.Head(); got != parent {
		t.Errorf("head after the failed checkpoint %s: %s, want the parent %s", sid, got, parent)
	}
	if _, err := e.State(sid); !errors.Is(err, state.ErrUnknownState) {
		t.Errorf("state of the failed checkpoint: %v, want state.ErrUnknownState", err)
	}
	sb := env.Sandbox()
	if b, err := os.ReadFile(filepath.Join(sb.FreezerCgroup(), "cgroup.freeze")); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("cgroup.freeze after the failed checkpoint: %q %v, want 0", b, err)
	}
	if got := run(t, e, env, "cat /tmp/f"); got != "two\n" {
		t.Errorf("sandbox after the failed checkpoint: %q, want two", got)
	}
	if err := syscall.Kill(int(stopped.Load()), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the stopped CRIU (pid %d) is still there: %v", stopped.Load(), err)
	}
	var stacks bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&stacks, 2)
	if n := strings.Count(stacks.String(), "criu.(*swrk).call"); n != 0 {
		t.Errorf("%d goroutines still in a CRIU call:\n%s", n, stacks.String())
	}

	// The next checkpoint takes everything, whatever was asked.
	next, err := e.Checkpoint(ctx, env, state.Proc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.State(next)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kind != state.Full || st.Parent != parent {
		t.Errorf("checkpoint after the failure: kind %s parent %s, want full from %s", st.Kind, st.Parent, parent)
	}
	res, err := e.Branch(ctx, branch.Source{State: next}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch from %s: %v %v", next, err, res.Errors)
	}
	if got := run(t, e, res.Children[0], "cat /tmp/f"); got != "two\n" {
		t.Errorf("restored child: %q, want two", got)
	}
}

// TestReadsDoNotWaitForBusyEnv: while a step runs in an env (holding it
// for the whole operation), the engine's listings and accounting answer:
// Envs, Head, Turn, Usage, States and Lineage never wait for the env. The
// step runs until the test releases it, after the reads returned, so the
// order is checked, not a duration.
func TestReadsDoNotWaitForBusyEnv(t *testing.T) {
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	ctx := context.Background()
	e := r.e
	env, _, err := e.NewEnv(ctx, testImage(t, r))
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "true")
	head, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join("/proc", strconv.Itoa(env.Sandbox().InitPID()), "root")
	stepDone := make(chan error, 1)
	go func() {
		_, err := e.Exec(ctx, env, "touch /started; while [ ! -e /release ]; do sleep 0.02; done", sandbox.ExecOptions{Timeout: 2 * time.Minute})
		stepDone <- err
	}()
	defer os.WriteFile(filepath.Join(in, "release"), nil, 0o644)
	for {
		if _, err := os.Stat(filepath.Join(in, "started")); err == nil {
			break
		}
		select {
		case err := <-stepDone:
			t.Fatalf("step ended before it was released: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	reads := make(chan string, 1)
	go func() {
		defer close(reads)
		found := false
		for _, x := range e.Envs() {
			found = found || x == env
		}
		if !found {
			t.Error("Envs does not list the busy env")
		}
		if got := env.Head(); got != head {
			t.Errorf("Head: %s, want %s", got, head)
		}
		if got := env.Turn(); got != 2 {
			t.Errorf("Turn during the second step: %d, want 2", got)
		}
		if u, err := e.Usage(); err != nil || u.Envs != 1 {
			t.Errorf("Usage: %+v %v", u, err)
		}
		if sts, err := e.States(env.ID); err != nil || len(sts) != 2 {
			t.Errorf("States: %d states, %v; want 2", len(sts), err)
		}
		if l, err := e.Lineage(head); err != nil || len(l) != 2 {
			t.Errorf("Lineage: %d states, %v; want 2", len(l), err)
		}
		reads <- "done"
	}()
	select {
	case <-reads:
	case <-time.After(time.Minute):
		t.Fatal("reads still wait for the busy env a minute later")
	}
	select {
	case err := <-stepDone:
		t.Fatalf("the step ended before it was released: %v", err)
	default:
	}
	if err := os.WriteFile(filepath.Join(in, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-stepDone; err != nil {
		t.Fatalf("step: %v", err)
	}
}

// TestSlowRestoreDoesNotStallOthers: a restore whose CRIU is stopped
// (SIGSTOP at setup-namespaces) holds the engine's GC lock for reading
// while it runs. A GC waiting for that lock (here after closing another
// env) must not make every other env's checkpoint wait behind it: the
// checkpoint of a third env completes while the restore is still stopped.
// Before, GC queued in RWMutex.Lock, which blocks new readers, and the
// checkpoint's commit waited for the stopped CRIU.
func TestSlowRestoreDoesNotStallOthers(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two queue workers (two cores): one is held by the stopped restore")
	}
	dir := t.TempDir()
	r := newRig(t, newBtrfs(t, dir), dir, 0)
	c := r.opts.CRIU
	var armed atomic.Bool
	stopped := make(chan int, 1)
	c.FaultHook = func(stage string, pid int) {
		if stage == "setup-namespaces" && armed.CompareAndSwap(true, false) {
			syscall.Kill(pid, syscall.SIGSTOP)
			stopped <- pid
		}
	}
	ctx := context.Background()
	e := r.e
	img := testImage(t, r)
	var envs [3]*branch.Env
	for i := range envs {
		env, _, err := e.NewEnv(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Checkpoint(ctx, env, state.None); err != nil {
			t.Fatal(err)
		}
		envs[i] = env
	}
	src, other, closing := envs[0], envs[1], envs[2]

	armed.Store(true)
	branched := make(chan error, 1)
	go func() {
		res, err := e.Branch(ctx, branch.Source{State: src.Head()}, 1)
		if err == nil {
			err = res.Errors[0]
		}
		branched <- err
	}()
	var pid int
	select {
	case pid = <-stopped:
	case err := <-branched:
		t.Fatalf("branch ended before its CRIU was stopped: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()

	if err := e.CloseEnv(ctx, closing); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.GC(ctx) }()
	// Wait until the GC has started waiting for its lock.
	for !inGC() {
		select {
		case err := <-closed:
			t.Fatalf("GC ended while a restore held the GC lock: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}

	run(t, e, other, "echo x > /tmp/x")
	checkpointed := make(chan error, 1)
	go func() {
		_, err := e.Checkpoint(ctx, other, state.Full)
		checkpointed <- err
	}()
	select {
	case err := <-checkpointed:
		if err != nil {
			t.Fatalf("checkpoint while a restore is stopped: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a checkpoint of another env waits for the stopped restore (behind the GC)")
	}
	resume()
	if err := <-branched; err != nil {
		t.Errorf("branch after its CRIU resumed: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("GC: %v", err)
	}
}

// inGC reports whether a GC pass is waiting for the GC lock: Engine.GC's
// own, or the background GC's that the close nudged (passes run one at a
// time, so Engine.GC may then wait behind it for its turn).
func inGC() bool {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "branch.(*Engine).gcPass(") &&
			(strings.Contains(g, "branch.(*Engine).lockGC(") || strings.Contains(g, "sync.(*RWMutex).Lock(")) {
			return true
		}
	}
	return false
}
