package coordinator

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestAgentOutcomes: what an agent does to its own sandbox is its outcome
// (docs/protocol.md, Errors): each attempt, run as a turn of the count
// task, leaves the next turn, a forced checkpoint, a branch of the env, a
// branch of the attempt's state id and evaluate either working or failing
// with env_error (infra false, not retryable), never with an infra code a
// trainer would mask. "" means the operation works.
func TestAgentOutcomes(t *testing.T) {
	ctx := context.Background()
	const env, unrestorable = protocol.CodeEnvError, protocol.CodeUnrestorableState
	tests := []struct {
		name, cmd string
		// Expected codes of: the attempt's turn, the next turn, checkpoint,
		// branch of the env, branch of the attempt's state, evaluate.
		turn, next, ckpt, branchEnv, branchState, eval string
	}{
		// Under the ghost limit: CRIU copies the file into the image.
		{name: "held deleted file of 2 MiB", cmd: holdDeleted(2)},
		{name: "held deleted file of 80 MiB", cmd: holdDeleted(80), ckpt: env, branchEnv: env, branchState: env, eval: env},
		{name: "rm /bin/sh", cmd: "rm /bin/sh"},
		{name: "rm /bin/sh, then the shell ends", cmd: "rm /bin/sh; exit 3", turn: env, next: env},
		{name: "rm the start directory", cmd: "cd /; rm -rf /work"},
		{name: "rm the start directory from inside", cmd: "rm -rf /work"},
		// The control channel is in no file tree (sandbox/ctl): removing
		// /.arbor, or an impostor where an older init listened, changes
		// nothing.
		{name: "rm -rf /.arbor", cmd: "rm -rf /.arbor"},
		// A POSIX message queue (CRIU has no image for it): every
		// state that would hold it is refused, unrestorable_state,
		// neither infra nor retryable; the turns go on. The attempt's
		// turn wrote the forger's report, so it took a checkpoint (of
		// the files at least), which was refused; evaluate forks the
		// env's state, refused too: the agent cannot trade a bad
		// reward for an error a trainer masks.
		{name: "a POSIX message queue", cmd: "forger mqueue", ckpt: unrestorable, branchEnv: unrestorable, branchState: unrestorable, eval: unrestorable},
		// Four processes holding 20000 descriptors each (over
		// criu.MaxDescriptors): CRIU would run into its timeout on every
		// dump, a checkpoint_failed a trainer masks; the dump is refused
		// as the agent's doing before CRIU runs.
		{name: "80000 descriptors held", cmd: manyDescriptors, ckpt: env, branchEnv: env, branchState: env, eval: env},
		{name: "an impostor at the old control socket path", cmd: "forger rebind </dev/null >/dev/null 2>&1 & while [ ! -e /tmp/forger-rebind ]; do sleep 0.01; done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCoordinator(t, Options{})
			r := reset(t, c, ResetRequest{Task: "count"})
			sandboxtest.InstallForger(t, r.Env.Sandbox().Root())
			check := func(op, want string, err error) {
				t.Helper()
				pe := protocol.ErrorOf(err)
				got := ""
				if pe != nil {
					got = pe.Code
					if pe.Infra || pe.Retryable {
						t.Errorf("%s: %+v: the agent's doing answered as infra or retryable", op, pe)
					}
				}
				if got != want {
					t.Errorf("%s: %q (%v), want %q", op, got, err, want)
				}
			}
			tr, err := c.Turn(ctx, r.Env.ID, Action{Tool: "bash", Cmd: tt.cmd})
			check("the attempt's turn", tt.turn, err)
			sid := r.StateID
			if err == nil {
				sid = tr.StateID
			}
			tr2, err := c.Turn(ctx, r.Env.ID, Action{Tool: "bash", Cmd: "echo hi"})
			check("the next turn", tt.next, err)
			if err == nil && string(tr2.Result.Stdout) != "hi\n" {
				t.Errorf("the next turn: %q", tr2.Result.Stdout)
			}
			_, err = c.Checkpoint(ctx, r.Env.ID)
			check("checkpoint", tt.ckpt, err)
			b, err := c.Branch(ctx, BranchRequest{EnvID: r.Env.ID, N: 1})
			if err == nil && b.Errors != nil {
				err = b.Errors[0]
			}
			check("branch of the env", tt.branchEnv, err)
			_, err = c.Branch(ctx, BranchRequest{StateID: sid, N: 1})
			check("branch of the attempt's state", tt.branchState, err)
			ev, err := c.Evaluate(ctx, r.Env.ID, false)
			check("evaluate", tt.eval, err)
			if err == nil && ev.Reward != 0 {
				t.Errorf("evaluate: reward %v, want 0 (the count task is unsolved)", ev.Reward)
			}
		})
	}
}

// manyDescriptors starts four processes holding 20000 descriptors each
// of /dev/null (from 200 up: 196-199 are the shell's channels) and
// returns once they hold them.
const manyDescriptors = `sh -c 'ulimit -n 20000; i=200; while [ $i -lt 20000 ]; do eval "exec $i</dev/null"; i=$((i+1)); done; ` +
	`for j in 1 2 3 4; do sleep 100000 & done; touch /tmp/held; wait' >/dev/null 2>&1 & ` +
	`until [ -e /tmp/held ]; do sleep 0.1; done; rm /tmp/held`

// holdDeleted starts a process holding a deleted file of mib MiB open on
// fd 3 (issue 33's command, made race-free: the file is removed once the
// process holds it).
func holdDeleted(mib int) string {
	return fmt.Sprintf("dd if=/dev/zero of=/tmp/g bs=1M count=%d 2>/dev/null; sleep 100000 3</tmp/g >/dev/null 2>&1 & ", mib) +
		`until [ "$(readlink /proc/$!/fd/3)" = /tmp/g ]; do :; done; rm /tmp/g`
}

// TestProtoErrorAgentState: the agent's own state is env_error whatever
// wraps it; a state whose checkpoint failed for a reason of the server's
// is that failure (checkpoint_failed), infra but not retryable.
func TestProtoErrorAgentState(t *testing.T) {
	agent := fmt.Errorf("%w: the sandbox holds a deleted file", cr.ErrAgentState)
	infra := fmt.Errorf("%w: state s1 of env e1: criu dump: operation failed", state.ErrCheckpoint)
	tests := []struct {
		name             string
		err              error
		code             string
		infra, retryable bool
	}{
		{name: "checkpoint", err: fmt.Errorf("%w: state s1: %w", state.ErrCheckpoint, agent), code: protocol.CodeEnvError},
		{name: "restore", err: fmt.Errorf("%w: state s1: %w", state.ErrRestore, fmt.Errorf("%w: socket removed", sandbox.ErrBroken)), code: protocol.CodeEnvError},
		{name: "impostor", err: fmt.Errorf("%w: %w: served by pid 9", sandbox.ErrBroken, sandbox.ErrImpostor), code: protocol.CodeEnvError},
		{name: "over its share of the pool", err: fmt.Errorf("%w: env e1 held 305 MiB", branch.ErrOverShare), code: protocol.CodeEnvError},
		{name: "verifier's fork", err: fmt.Errorf("%w: fork: %w", envpool.ErrVerifier, agent), code: protocol.CodeEnvError},
		{name: "failed state, agent", err: fmt.Errorf("%w: s1 never came to be: %w", state.ErrUnknownState, fmt.Errorf("%w: %w", state.ErrCheckpoint, agent)), code: protocol.CodeEnvError},
		{name: "failed state, server", err: fmt.Errorf("%w: s1 never came to be: %w", state.ErrUnknownState, infra), code: protocol.CodeCheckpointFail, infra: true},
		{name: "unknown state", err: fmt.Errorf("%w: s1", state.ErrUnknownState), code: protocol.CodeUnknownState},
		{name: "checkpoint, server", err: infra, code: protocol.CodeCheckpointFail, infra: true, retryable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pe := protocol.ErrorOf(tt.err)
			if pe.Code != tt.code || pe.Infra != tt.infra || pe.Retryable != tt.retryable {
				t.Errorf("protocol.ErrorOf(%v) = %+v, want %s infra=%v retryable=%v", tt.err, pe, tt.code, tt.infra, tt.retryable)
			}
			if !errors.Is(pe, &protocol.Error{Code: tt.code}) {
				t.Errorf("errors.Is on the code %s fails", tt.code)
			}
		})
	}
}
