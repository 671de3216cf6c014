package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server/protocol"
	"github.com/arbor-env/arbor/state"
)

// TestErrorOf pins the one mapping of errors to protocol codes: state's
// sentinels and those of the task pool, the engine, the image store and
// the sandbox that wrap them, wrapped as callers wrap them.
func TestErrorOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("step in env e-1: %w", err) }
	for _, tt := range []struct {
		name             string
		err              error
		code             string
		infra, retryable bool
	}{
		{"protocol error passes", protocol.Errorf(protocol.CodeUnauthorized, "no"), protocol.CodeUnauthorized, false, false},
		{"invalid params", state.ErrInvalidParams, protocol.CodeInvalidParams, false, false},
		{"unknown env", state.ErrUnknownEnv, protocol.CodeUnknownEnv, false, false},
		{"env lost in a restart", state.ErrLost, protocol.CodeEnvLost, true, false},
		{"unknown state", state.ErrUnknownState, protocol.CodeUnknownState, false, false},
		{"unknown task", state.ErrUnknownTask, protocol.CodeUnknownTask, false, false},
		{"too many envs", state.ErrTooManyEnvs, protocol.CodeTooManyEnvs, false, true},
		{"no space", state.ErrNoSpace, protocol.CodeNoSpace, true, true},
		{"bad request", state.ErrInvalid, protocol.CodeBadRequest, false, false},
		{"no verifier", state.ErrNoVerifier, protocol.CodeBadRequest, false, false},
		{"unknown image", fmt.Errorf("reset image nope: %w", image.ErrNotFound), protocol.CodeBadRequest, false, false},
		{"image without recipe", image.ErrUnknownRecipe, protocol.CodeBadRequest, false, false},
		{"bad image name", image.ErrInvalidName, protocol.CodeBadRequest, false, false},
		{"registry refused", fmt.Errorf("pull x: %w", image.ErrPull), protocol.CodeBadRequest, false, false},
		{"bad layer", fmt.Errorf("pull x: layer 2: %w", image.ErrBadLayer), protocol.CodeBadRequest, false, false},
		{"image without a shell", fmt.Errorf("image x: %w", image.ErrNoShell), protocol.CodeBadRequest, false, false},
		{"command too large", sandbox.ErrBadCommand, protocol.CodeTooLarge, false, false},
		{"restore", state.ErrRestore, protocol.CodeRestoreFailed, true, true},
		{"pool restore keeps the engine's code", fmt.Errorf("reset: %w", state.ErrRestore), protocol.CodeRestoreFailed, true, true},
		{"checkpoint", state.ErrCheckpoint, protocol.CodeCheckpointFail, true, true},
		{"sandbox dead", sandbox.ErrDead, protocol.CodeSandboxFailed, true, true},
		{"sandbox timeout", sandbox.ErrTimeout, protocol.CodeSandboxFailed, true, true},
		{"sandbox closed", sandbox.ErrClosed, protocol.CodeSandboxFailed, true, true},
		{"sandbox unsupported", sandbox.ErrUnsupported, protocol.CodeSandboxFailed, true, true},
		{"sandbox impostor", sandbox.ErrImpostor, protocol.CodeSandboxFailed, true, true},
		{"verifier could not run", envpool.ErrVerifier, protocol.CodeSandboxFailed, true, true},
		{"verifier whose fork failed to restore", fmt.Errorf("%w: fork env e-1: %w", envpool.ErrVerifier, state.ErrRestore),
			protocol.CodeSandboxFailed, true, true},
		{"task setup", envpool.ErrSetup, protocol.CodeSandboxFailed, true, true},
		{"shutting down", state.ErrShuttingDown, protocol.CodeShuttingDown, true, true},
		{"cancelled", context.Canceled, protocol.CodeShuttingDown, true, true},
		{"env closed under the request", state.ErrClosed, protocol.CodeUnknownEnv, false, false},
		{"deadline", context.DeadlineExceeded, protocol.CodeTimeout, true, true},
		{"anything else", errors.New("boom"), protocol.CodeInternal, true, false},
		// Pairs, where the order of the cases decides.
		{"state whose checkpoint failed", fmt.Errorf("%w: state s-1: its checkpoint failed: %w", state.ErrUnknownState, state.ErrCheckpoint),
			protocol.CodeCheckpointFail, true, false},
		{"state whose checkpoint failed on the agent's state", fmt.Errorf("%w: state s-1: its checkpoint failed: %w: %w", state.ErrUnknownState, state.ErrCheckpoint, cr.ErrAgentState),
			protocol.CodeEnvError, false, false},
		{"unrestorable state", fmt.Errorf("%w: state s-1: %w: POSIX message queue /q1", state.ErrRestore, state.ErrUnrestorableState),
			protocol.CodeUnrestorableState, false, false},
		{"state whose checkpoint met unrestorable state", fmt.Errorf("%w: state s-1 never came to be: %w: state s-1 of env e-1: %w: POSIX message queue /q1", state.ErrUnknownState, state.ErrCheckpoint, state.ErrUnrestorableState),
			protocol.CodeUnrestorableState, false, false},
		{"over its share", branch.ErrOverShare, protocol.CodeEnvError, false, false},
		{"wire marker", state.Errorf(protocol.ErrMalformed, "text frame: send msgpack"), protocol.CodeMalformed, false, false},
		{"node gone", state.Errorf(protocol.ErrNodeUnavailable, "node n1 is unavailable"), protocol.CodeNodeUnavailable, true, true},
		{"busy", state.Errorf(state.ErrBusy, "3 requests in flight"), protocol.CodeTooManyReqs, false, true},
		{"invalid task", envpool.ErrInvalidTask, protocol.CodeBadRequest, false, false},
		{"verifier output", fmt.Errorf("%w: not a number", state.ErrVerifierOutput), protocol.CodeVerifierError, false, false},
		{"state released under a restore", fmt.Errorf("%w: state s-1 was released: %w", state.ErrUnknownState, state.ErrRestore),
			protocol.CodeUnknownState, false, false},
		{"task setup that timed out", fmt.Errorf("%w: task t: %w", envpool.ErrSetup, context.DeadlineExceeded), protocol.CodeSandboxFailed, true, true},
		{"sandbox died and was revived", &branch.RevivedError{Env: "e-1", State: "s-1", Turn: 3, Cause: sandbox.ErrDead},
			protocol.CodeSandboxFailed, true, true},
		{"revive whose restore failed", fmt.Errorf("env e-1: %v; restoring it failed: %w", sandbox.ErrDead, state.ErrRestore),
			protocol.CodeRestoreFailed, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pe := protocol.ErrorOf(wrap(tt.err))
			if pe.Code != tt.code || pe.Infra != tt.infra || pe.Retryable != tt.retryable {
				t.Errorf("protocol.ErrorOf(%v) = {%s infra=%v retryable=%v}, want {%s infra=%v retryable=%v}",
					tt.err, pe.Code, pe.Infra, pe.Retryable, tt.code, tt.infra, tt.retryable)
			}
		})
	}
	if pe := protocol.ErrorOf(state.Errorf(protocol.ErrMalformed, "text frame: %s", "x")); pe.Message != "text frame: x" {
		t.Errorf("a wire marker's message is %q, want the error's own text", pe.Message)
	}
	if protocol.ErrorOf(nil) != nil {
		t.Error("protocol.ErrorOf(nil) is not nil")
	}
	// A busy answer of admission control carries its retry hint, through
	// wrapping; other errors carry none.
	busy := fmt.Errorf("step in env e-1: %w", state.RetryAfterError(1500*time.Millisecond, state.Errorf(state.ErrBusy, "queue full")))
	if pe := protocol.ErrorOf(busy); pe.Code != protocol.CodeTooManyReqs || !pe.Retryable || pe.RetryAfterMS != 1500 || pe.RetryAfter() != 1500*time.Millisecond {
		t.Errorf("protocol.ErrorOf(busy with a hint) = %+v, want too_many_requests, retryable, retry_after_ms 1500", pe)
	}
	if pe := protocol.ErrorOf(state.Errorf(state.ErrBusy, "3 requests in flight")); pe.RetryAfterMS != 0 {
		t.Errorf("busy without a hint got retry_after_ms %d", pe.RetryAfterMS)
	}
}

// TestCodesMadeOnlyHere: no package but this one makes a wire error
// (protocol.Errorf, a protocol.Error literal, a code or flag assigned):
// the layers wrap state's sentinels and ErrorOf's table turns them into
// codes (docs/architecture.md).
func TestCodesMadeOnlyHere(t *testing.T) {
	made := regexp.MustCompile(`protocol\.Errorf\(|protocol\.Error\{|\.(Code|Retryable|Infra) = `)
	root := filepath.Join("..", "..")
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules", "protocol":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		for i, line := range strings.Split(string(b), "\n") {
			if made.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				t.Errorf("%s:%d makes a wire error: %s", p, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("walked %d Go files under %s: not the module", n, root)
	}
}
