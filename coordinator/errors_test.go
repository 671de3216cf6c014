package coordinator

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server/protocol"
)

// TestProtoError pins the one mapping of errors to protocol codes: every
// sentinel of the coordinator, the task pool , the
// engine and the sandbox, wrapped as callers wrap them.
func TestProtoError(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("step in env e-1: %w", err) }
	for _, tt := range []struct {
		name             string
		err              error
		code             string
		infra, retryable bool
	}{
		{"protocol error passes", protocol.Errorf(protocol.CodeUnauthorized, "no"), protocol.CodeUnauthorized, false, false},
		{"invalid params", ErrInvalidParams, protocol.CodeInvalidParams, false, false},
		{"unknown env", ErrUnknownEnv, protocol.CodeUnknownEnv, false, false},
		{"engine unknown env", branch.ErrUnknownEnv, protocol.CodeUnknownEnv, false, false},
		{"env lost in a restart", branch.ErrLost, protocol.CodeEnvLost, true, false},
		{"unknown state", ErrUnknownState, protocol.CodeUnknownState, false, false},
		{"engine unknown state", branch.ErrUnknownState, protocol.CodeUnknownState, false, false},
		{"unknown task", ErrUnknownTask, protocol.CodeUnknownTask, false, false},
		{"pool unknown task", envpool.ErrUnknownTask, protocol.CodeUnknownTask, false, false},
		{"too many envs", ErrTooManyEnvs, protocol.CodeTooManyEnvs, false, true},
		{"no space", branch.ErrNoSpace, protocol.CodeNoSpace, true, true},
		{"bad request", ErrBadRequest, protocol.CodeBadRequest, false, false},
		{"pool bad request", envpool.ErrBadRequest, protocol.CodeBadRequest, false, false},
		{"engine bad request", branch.ErrBadRequest, protocol.CodeBadRequest, false, false},
		{"no verifier", envpool.ErrNoVerifier, protocol.CodeBadRequest, false, false},
		{"unknown image", fmt.Errorf("reset image nope: %w", image.ErrNotFound), protocol.CodeBadRequest, false, false},
		{"image without recipe", image.ErrUnknownRecipe, protocol.CodeBadRequest, false, false},
		{"bad image name", image.ErrInvalidName, protocol.CodeBadRequest, false, false},
		{"registry refused", fmt.Errorf("pull x: %w", image.ErrPull), protocol.CodeBadRequest, false, false},
		{"bad layer", fmt.Errorf("pull x: layer 2: %w", image.ErrBadLayer), protocol.CodeBadRequest, false, false},
		{"image without a shell", fmt.Errorf("image x: %w", image.ErrNoShell), protocol.CodeBadRequest, false, false},
		{"command too large", sandbox.ErrBadCommand, protocol.CodeTooLarge, false, false},
		{"restore", branch.ErrRestore, protocol.CodeRestoreFailed, true, true},
		{"pool restore keeps the engine's code", fmt.Errorf("reset: %w", branch.ErrRestore), protocol.CodeRestoreFailed, true, true},
		{"checkpoint", branch.ErrCheckpoint, protocol.CodeCheckpointFail, true, true},
		{"sandbox dead", sandbox.ErrDead, protocol.CodeSandboxFailed, true, true},
		{"sandbox timeout", sandbox.ErrTimeout, protocol.CodeSandboxFailed, true, true},
		{"sandbox closed", sandbox.ErrClosed, protocol.CodeSandboxFailed, true, true},
		{"sandbox unsupported", sandbox.ErrUnsupported, protocol.CodeSandboxFailed, true, true},
		{"sandbox impostor", sandbox.ErrImpostor, protocol.CodeSandboxFailed, true, true},
		{"verifier could not run", envpool.ErrVerifier, protocol.CodeSandboxFailed, true, true},
		{"verifier whose fork failed to restore", fmt.Errorf("%w: fork env e-1: %w", envpool.ErrVerifier, branch.ErrRestore),
			protocol.CodeSandboxFailed, true, true},
		{"task setup", envpool.ErrSetup, protocol.CodeSandboxFailed, true, true},
		{"coordinator closed", ErrClosed, protocol.CodeShuttingDown, true, true},
		{"pool closed", envpool.ErrClosed, protocol.CodeShuttingDown, true, true},
		{"cancelled", context.Canceled, protocol.CodeShuttingDown, true, true},
		{"env closed under the request", branch.ErrClosed, protocol.CodeUnknownEnv, false, false},
		{"deadline", context.DeadlineExceeded, protocol.CodeTimeout, true, true},
		{"anything else", errors.New("boom"), protocol.CodeInternal, true, false},
		// Pairs, where the order of the cases decides.
		{"state whose checkpoint failed (settle)", fmt.Errorf("%w: state s-1: its checkpoint failed: %w", ErrUnknownState, branch.ErrCheckpoint),
			protocol.CodeUnknownState, false, false},
		{"state released under a restore", fmt.Errorf("%w: state s-1 was released: %w", ErrUnknownState, branch.ErrRestore),
			protocol.CodeUnknownState, false, false},
		{"task setup that timed out", fmt.Errorf("%w: task t: %w", envpool.ErrSetup, context.DeadlineExceeded), protocol.CodeSandboxFailed, true, true},
		{"sandbox died and was revived", &branch.RevivedError{Env: "e-1", State: "s-1", Turn: 3, Cause: sandbox.ErrDead},
			protocol.CodeSandboxFailed, true, true},
		{"revived, as a turn words it", revivedError(&branch.RevivedError{Env: "e-1", State: "s-1", Turn: 3, Cause: errors.New("oom")}, &entry{base: 1}),
			protocol.CodeSandboxFailed, true, true},
		{"revive whose restore failed", fmt.Errorf("env e-1: %v; restoring it failed: %w", sandbox.ErrDead, branch.ErrRestore),
			protocol.CodeRestoreFailed, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pe := ProtoError(wrap(tt.err))
			if pe.Code != tt.code || pe.Infra != tt.infra || pe.Retryable != tt.retryable {
				t.Errorf("ProtoError(%v) = {%s infra=%v retryable=%v}, want {%s infra=%v retryable=%v}",
					tt.err, pe.Code, pe.Infra, pe.Retryable, tt.code, tt.infra, tt.retryable)
			}
		})
	}
	if ProtoError(nil) != nil {
		t.Error("ProtoError(nil) is not nil")
	}
}
