package branch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/branch/branchtest"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/state"
)

// Honest outcome attribution (docs/protocol.md, Errors: env_error): what
// an agent does to its own sandbox either checkpoints, branches and
// restores like anything else, or fails with an error that names the
// agent's state as the cause (cr.ErrAgentState, sandbox.ErrBroken), never
// with a bare infrastructure failure. Real CRIU, btrfs and sandboxes.

// holdDeleted starts a process holding a deleted file of mib MiB open on
// fd 3 (the command of issue 33, made race-free: the file is removed once
// the process holds it).
func holdDeleted(mib int) string {
	return "dd if=/dev/zero of=/tmp/g bs=1M count=" + itoa(mib) + " 2>/dev/null; sleep 100000 3</tmp/g >/dev/null 2>&1 & " +
		`until [ "$(readlink /proc/$!/fd/3)" = /tmp/g ]; do :; done; rm /tmp/g`
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// TestHeldDeletedFileUnderGhostLimit: a process holding a deleted 2 MiB
// file open (under criu.DefaultGhostLimit) no longer fails the checkpoint:
// the turn's background checkpoint commits, and branches of it hold the
// file's contents through the same descriptor.
func TestHeldDeletedFileUnderGhostLimit(t *testing.T) {
	e, env := busyboxEnv(t)
	ctx := context.Background()
	run(t, e, env, holdDeleted(2))
	sid, _, err := e.CheckpointAsync(env, state.Proc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitCheckpoint(ctx, env); err != nil {
		t.Fatal(err)
	}
	if err := env.TakeCheckpointError(); err != nil {
		t.Fatalf("checkpoint with a held deleted 2 MiB file: %v", err)
	}
	const probe = `p=$(pidof sleep); readlink /proc/$p/fd/3 | sed 's/[.]cr[.][0-9a-f]*[.]ghost//'; wc -c < /proc/$p/fd/3`
	want := "/tmp/g (deleted)\n2097152\n"
	if got := run(t, e, env, probe); got != want {
		t.Fatalf("live env: %q, want %q", got, want)
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err != nil || res.Errors[0] != nil {
		t.Fatalf("branch of the state: %v %v", err, res)
	}
	defer e.CloseEnv(ctx, res.Children[0])
	if got := run(t, e, res.Children[0], probe); got != want {
		t.Errorf("branch: %q, want %q", got, want)
	}
	branchesMatch(t, e, env, probe, want)
}

// TestHeldDeletedFileOverGhostLimit: a deleted file over the limit held
// open fails the checkpoint with cr.ErrAgentState (and state.ErrCheckpoint),
// naming the file, its size, the process and the descriptor; a branch of
// the env and of the failed state id say the same, and once the process
// is gone the env checkpoints and branches again.
func TestHeldDeletedFileOverGhostLimit(t *testing.T) {
	e, env := busyboxEnv(t)
	ctx := context.Background()
	run(t, e, env, branchtest.GhostHolder)
	sid, _, err := e.CheckpointAsync(env, state.Proc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitCheckpoint(ctx, env); err != nil {
		t.Fatal(err)
	}
	ckErr := env.TakeCheckpointError()
	if !errors.Is(ckErr, cr.ErrAgentState) || !errors.Is(ckErr, state.ErrCheckpoint) {
		t.Fatalf("checkpoint with a held deleted 72 MiB file: %v; want cr.ErrAgentState and state.ErrCheckpoint", ckErr)
	}
	for _, want := range []string{"72.0 MiB", "/tmp/big", "fd 0", "pid ", "64.0 MiB limit"} {
		if !strings.Contains(ckErr.Error(), want) {
			t.Errorf("checkpoint error %q does not say %q", ckErr, want)
		}
	}
	// The failed state id, by branch and by look-up: the cause, not
	// merely an unknown id.
	if _, err := e.State(sid); !errors.Is(err, state.ErrUnknownState) || !errors.Is(err, cr.ErrAgentState) {
		t.Errorf("state %s whose checkpoint failed: %v; want state.ErrUnknownState wrapping cr.ErrAgentState", sid, err)
	}
	if err := e.StateFailure(sid); !errors.Is(err, cr.ErrAgentState) {
		t.Errorf("StateFailure(%s) = %v", sid, err)
	}
	if _, err := e.Branch(ctx, branch.Source{State: sid}, 1); !errors.Is(err, cr.ErrAgentState) {
		t.Errorf("branch of the failed state %s: %v; want cr.ErrAgentState", sid, err)
	}
	if _, err := e.Branch(ctx, branch.Source{Env: env}, 1); !errors.Is(err, cr.ErrAgentState) {
		t.Errorf("branch of the env: %v; want cr.ErrAgentState", err)
	}
	run(t, e, env, "kill $(pidof sleep); wait 2>/dev/null; true")
	branchesMatch(t, e, env, "echo ok", "ok\n")
}

// TestControlPathsHarmless: a process inside removes /.arbor (where an
// older init listened on ctl.sock) or binds a socket of its own at the old
// path, which answers every request with a forged result. The server
// reaches init over a channel in no file tree (sandbox/ctl), so commands,
// checkpoints and branches go on with real results, in the env and in
// its children; the impostor is never asked anything.
func TestControlPathsHarmless(t *testing.T) {
	dir := t.TempDir()
	e := newRig(t, newBtrfs(t, dir), dir, 0).e
	ctx := context.Background()
	for _, tt := range []struct {
		name, cmd string
	}{
		{name: "rm -rf /.arbor", cmd: "rm -rf /.arbor"},
		{name: "re-bound", cmd: "forger rebind </dev/null >/dev/null 2>&1 & while [ ! -e /tmp/forger-rebind ]; do sleep 0.01; done"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env, _, err := e.NewEnv(ctx, "busybox")
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseEnv(ctx, env)
			sandboxtest.InstallForger(t, env.Sandbox().Root())
			run(t, e, env, "cd /tmp; "+tt.cmd)
			// A checkpoint detaches; the server connects again after it.
			if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
				t.Fatalf("checkpoint: %v", err)
			}
			if got := run(t, e, env, "echo still; pwd"); got != "still\n/tmp\n" {
				t.Fatalf("the command after the checkpoint: %q", got)
			}
			branchesMatch(t, e, env, "echo ok; pwd; test ! -e /tmp/pwned || echo pwned", "ok\n/tmp\n")
			if got := run(t, e, env, "echo parent; test ! -e /tmp/pwned || echo pwned"); got != "parent\n" {
				t.Fatalf("the env after the branch: %q", got)
			}
		})
	}
}

// TestShellRemoved: the agent removes /bin/sh. Commands run on in the
// shell that is up; once a command ends that shell, none can start, and
// that command, the next ones and KillAllButInit (evaluate's first step)
// say the sandbox was broken from inside (sandbox.ErrBroken), naming the
// shell. The env still checkpoints and branches.
func TestShellRemoved(t *testing.T) {
	e, env := busyboxEnv(t)
	ctx := context.Background()
	if got := run(t, e, env, "rm /bin/sh; echo still here"); got != "still here\n" {
		t.Fatalf("the shell after rm /bin/sh: %q", got)
	}
	branchesMatch(t, e, env, "echo ok", "ok\n")
	o := sandbox.ExecOptions{Timeout: 5 * time.Second}
	for _, cmd := range []string{"exit 3", "echo next"} {
		if _, err := e.Exec(ctx, env, cmd, o); !errors.Is(err, sandbox.ErrBroken) || !strings.Contains(err.Error(), "/bin/sh") {
			t.Errorf("%q with no shell to start: %v; want sandbox.ErrBroken naming /bin/sh", cmd, err)
		}
	}
	if _, err := env.Sandbox().KillAllButInit(ctx); !errors.Is(err, sandbox.ErrBroken) {
		t.Errorf("KillAllButInit with no shell to start: %v; want sandbox.ErrBroken", err)
	}
	if _, err := e.Checkpoint(ctx, env, state.Full); err != nil {
		t.Errorf("checkpoint of the env with no shell: %v", err)
	}
}

// TestHeldFileDirectoryReplaced: a process holds a deleted file whose
// directory the agent then replaced by a regular file. CRIU cannot put
// the file back where it was named (its ghost's directory is not one):
// the branch fails with the agent's state as the cause (env_error), not
// as the server's restore failure.
func TestHeldFileDirectoryReplaced(t *testing.T) {
	e, env := busyboxEnv(t)
	ctx := context.Background()
	run(t, e, env, `mkdir /d && echo x > /d/f && sleep 100000 3</d/f >/dev/null 2>&1 & `+
		`until [ "$(readlink /proc/$!/fd/3)" = /d/f ]; do :; done; rm -rf /d && echo file > /d`)
	sid, err := e.Checkpoint(ctx, env, state.Full)
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	res, err := e.Branch(ctx, branch.Source{State: sid}, 1)
	if err == nil {
		err = res.Errors[0]
		if err == nil {
			defer e.CloseEnv(ctx, res.Children[0])
			t.Logf("the branch restored (CRIU placed the file): nothing to attribute")
			return
		}
	}
	if !errors.Is(err, cr.ErrAgentState) {
		t.Fatalf("branch of a state whose held file's directory is a file: %v, want cr.ErrAgentState", err)
	}
	t.Logf("refused: %v", err)
}
