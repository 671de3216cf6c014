package branch_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/launch"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestTaskAttributesSurviveBranch: what a task holds that CRIU's images
// have no field for (CPU affinity, I/O priority, timer slack, the
// coredump filter, the autogroup's nice), set on the shell itself and on a
// background process, comes back in every branch as in the live env: the
// dump records it and the restore gives it back before the tree runs
// (docs/inspector.md, "Kernel state coverage"). Without that, the
// children had the defaults (affinity 3, ioprio none, slack 50000).
func TestTaskAttributesSurviveBranch(t *testing.T) {
	e, env := busyboxEnv(t)
	// Each process sets its own timer slack, coredump filter and
	// autogroup nice (another's needs CAP_SYS_NICE, which a hardened
	// sandbox lacks); affinity and I/O priority of a process of the same
	// user need none.
	// The daemon keeps a zombie child (a task without memory), which
	// the restore brings back as one.
	run(t, e, env, `sh -c 'echo 77777 > /proc/self/timerslack_ns; echo 0x7 > /proc/self/coredump_filter; true & exec sleep 1000' </dev/null >/dev/null 2>&1 & p=$!; sleep 0.2; taskset -p 1 $p >/dev/null; ionice -c 2 -n 7 -p $p`)
	run(t, e, env, `taskset -p 1 $$ >/dev/null; ionice -c 3 -p $$; echo 123456 > /proc/$$/timerslack_ns; echo 0x13 > /proc/$$/coredump_filter; echo 4 > /proc/$$/autogroup`)
	// The timer slack of another process is read from the host: inside,
	// reading it needs CAP_SYS_NICE too.
	const probe = `grep -l '^State:.*zombie' /proc/[0-9]*/status | wc -l; for p in $$ $(pidof sleep); do echo "$p: $(taskset -p $p | sed 's/.*: //') $(ionice -p $p) $(cat /proc/$p/coredump_filter) $(sed 's/.* nice //' /proc/$p/autogroup)"; done`
	before := run(t, e, env, probe)
	lines := strings.Split(strings.TrimSpace(before), "\n")
	if len(lines) != 3 || lines[0] != "1" || !strings.HasSuffix(lines[1], " 1 idle 00000013 4") || !strings.HasSuffix(lines[2], " 1 best-effort: prio 7 00000007 4") {
		t.Fatalf("the test needs the shell and the daemon with their attributes set, got:\n%s", before)
	}
	slack := timerSlack(t, env)
	if !strings.Contains(slack, "sh 123456\n") || !strings.Contains(slack, "sleep 77777\n") {
		t.Fatalf("the test needs the shell's and the daemon's timer slack set, got:\n%s", slack)
	}
	ctx := context.Background()
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Fatal(err)
	}
	res, err := e.Branch(ctx, branch.Source{Env: env}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, ch := range res.Children {
		if res.Errors[i] != nil {
			t.Fatalf("child %d: %v", i, res.Errors[i])
		}
		defer e.CloseEnv(ctx, ch)
		if got := run(t, e, ch, probe); got != before {
			t.Errorf("child %d:\n%s\nwant (the live env):\n%s", i, got, before)
		}
		if got := timerSlack(t, ch); got != slack {
			t.Errorf("child %d's timer slack:\n%s\nwant (the live env):\n%s", i, got, slack)
		}
	}
}

// timerSlack lists the timer slack of each process of env's sandbox, as
// "COMM NS\n" lines in the order of their pids.
func timerSlack(t *testing.T, env *branch.Env) string {
	t.Helper()
	var b strings.Builder
	queue := []string{strconv.Itoa(env.Sandbox().InitPID())}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		comm, err1 := os.ReadFile("/proc/" + p + "/comm")
		slack, err2 := os.ReadFile("/proc/" + p + "/timerslack_ns")
		kids, err3 := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatal(err)
		}
		if len(slack) == 0 {
			slack = []byte("-\n") // a zombie's
		}
		b.WriteString(strings.TrimSpace(string(comm)) + " " + string(slack))
		queue = append(queue, strings.Fields(string(kids))...)
	}
	return b.String()
}

// TestPOSIXMessageQueueRefused: a POSIX message queue in the sandbox's
// IPC namespace (CRIU has no image for it) fails the checkpoint that
// meets it (a full one, or one of the files only that would keep the
// process image from before the queue), naming the queue, with
// state.ErrUnrestorableState; a branch
// of that state answers the same, wire code unrestorable_state, neither
// infra nor retryable (a policy could make a queue on purpose so that
// its failing branches error out). The state before the queue still
// branches, and the live env goes on.
func TestPOSIXMessageQueueRefused(t *testing.T) {
	e, env := busyboxEnv(t)
	ctx := context.Background()
	sandboxtest.InstallForger(t, env.Sandbox().Root())
	before, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e, env, "forger mqueue")
	// A checkpoint of the files only, which keeps the image from before
	// the queue, is refused too.
	if _, err := e.Checkpoint(ctx, env, state.FS); !errors.Is(err, state.ErrUnrestorableState) || !strings.Contains(err.Error(), "POSIX message queue /forger") {
		t.Fatalf("files-only checkpoint with a queue: %v; want state.ErrUnrestorableState naming /forger", err)
	}
	sid, _, err := e.CheckpointAsync(env, state.Full)
	if err != nil {
		t.Fatal(err)
	}
	branchtest.WaitFor(t, "the checkpoint to fail", func() bool { return e.StateFailure(sid) != nil })
	ferr := e.StateFailure(sid)
	if !errors.Is(ferr, state.ErrUnrestorableState) || !strings.Contains(ferr.Error(), "POSIX message queue /forger") {
		t.Fatalf("checkpoint with a queue: %v; want state.ErrUnrestorableState naming /forger", ferr)
	}
	_, err = e.Branch(ctx, branch.Source{State: sid}, 1)
	pe := protocol.ErrorOf(err)
	if !errors.Is(err, state.ErrUnrestorableState) || pe.Code != protocol.CodeUnrestorableState || pe.Infra || pe.Retryable ||
		!strings.Contains(pe.Message, "POSIX message queue /forger") {
		t.Fatalf("branch of the state with a queue: %v (%+v); want unrestorable_state naming /forger, not infra, not retryable", err, pe)
	}
	res, err := e.Branch(ctx, branch.Source{State: before}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch of the state before the queue: %v %v", err, res.Errors)
	}
	e.CloseEnv(ctx, res.Children[0])
	if got := run(t, e, env, "echo alive"); got != "alive\n" {
		t.Errorf("live env after the refused checkpoint: %q", got)
	}
}

// TestHeldPOSIXMessageQueueRefused: a process holding a POSIX message
// queue open whose name it removed (no listing of the namespace shows it,
// and CRIU cannot dump the descriptor) makes the checkpoint fail with
// state.ErrUnrestorableState naming the holder, not with an infra error
// of CRIU's.
func TestHeldPOSIXMessageQueueRefused(t *testing.T) {
	e, env := busyboxEnv(t)
	sandboxtest.InstallForger(t, env.Sandbox().Root())
	run(t, e, env, "forger mqheld </dev/null >/dev/null 2>&1 & until [ -e /tmp/forger-mqheld ]; do :; done")
	_, err := e.Checkpoint(context.Background(), env, state.Full)
	if pe := protocol.ErrorOf(err); !errors.Is(err, state.ErrUnrestorableState) || pe.Infra || !strings.Contains(err.Error(), "POSIX message queue /forger-held") || !strings.Contains(err.Error(), "(forger)") {
		t.Fatalf("checkpoint with a held queue: %v; want state.ErrUnrestorableState naming /forger-held and its holder", err)
	}
}

// TestHeldIOURingRefused: an io_uring a process holds (CRIU 4.2 cannot
// dump one) makes the checkpoint fail with state.ErrUnrestorableState
// naming the holder, not with CRIU's own failure, which read as infra.
// The sandbox is unhardened: the hardened one's seccomp profile refuses
// io_uring_setup.
func TestHeldIOURingRefused(t *testing.T) {
	dir := t.TempDir()
	e := newRigLauncher(t, newBtrfs(t, dir), dir, 0, func(l *launch.Launcher) {
		l.Isolation.Unhardened = true
		l.UserNS = sandbox.UserNSConfig{}
	}).e
	env, _, err := e.NewEnv(context.Background(), "busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseEnv(context.Background(), env)
	sandboxtest.InstallForger(t, env.Sandbox().Root())
	if got := run(t, e, env, "forger iouring </dev/null >/dev/null 2>&1 & until [ -e /tmp/forger-iouring ]; do :; done; cat /tmp/forger-iouring"); got != "holding an io_uring\n" {
		t.Fatalf("the test needs a process holding an io_uring: %q", got)
	}
	_, err = e.Checkpoint(context.Background(), env, state.Full)
	if pe := protocol.ErrorOf(err); !errors.Is(err, state.ErrUnrestorableState) || pe.Infra || !strings.Contains(err.Error(), "io_uring descriptor held by pid") || !strings.Contains(err.Error(), "(forger)") {
		t.Fatalf("checkpoint with an io_uring: %v; want state.ErrUnrestorableState naming the io_uring and its holder", err)
	}
}
