package coordinator

import (
	"context"
	"errors"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/cr"
	"github.com/arbor-env/arbor/envpool"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server/protocol"
)

// Sentinel errors of the coordinator; test with errors.Is. They sit
// beside the task pool's (envpool), the engine's and the sandbox's
// sentinels, and ProtoError maps all of them to protocol codes
// (docs/protocol.md, Errors).
var (
	// ErrUnknownEnv: no env of that id was handed out (or it was closed).
	ErrUnknownEnv = errors.New("unknown env")
	// ErrUnknownState: no usable state of that id.
	ErrUnknownState = errors.New("unknown state")
	// ErrUnknownTask: reset named a task the task pool does not have.
	ErrUnknownTask = errors.New("unknown task")
	// ErrInvalidParams: a required argument is missing.
	ErrInvalidParams = errors.New("invalid params")
	// ErrBadRequest: the request makes no sense for this env or task
	// (promote of an env with no open origin, an unknown image).
	ErrBadRequest = errors.New("bad request")
	// ErrNoVerifier: evaluate on an env whose task has no verifier.
	ErrNoVerifier = errors.New("no verifier")
	// ErrTooManyEnvs: the env limit would be passed.
	ErrTooManyEnvs = errors.New("too many envs")
	// ErrClosed: the coordinator or its task pool was closed (the server
	// is stopping).
	ErrClosed = errors.New("coordinator closed")
)

// ProtoError maps an error of the coordinator, the task pool (envpool's
// sentinels, tested here directly), the engine or the sandbox to the
// protocol's error object (code, infra, retryable).
// It is the one such mapping: the server answers with it, the agent tools
// and the LLM proxy word their errors from it.
func ProtoError(err error) *protocol.Error {
	var pe *protocol.Error
	code := protocol.CodeInternal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, cr.ErrAgentState), errors.Is(err, sandbox.ErrBroken), errors.Is(err, branch.ErrOverShare):
		// First: whatever operation met it (a checkpoint, a branch's
		// restore, the verifier's fork, a state whose checkpoint failed
		// on it), the agent's own doing is its outcome, never an infra
		// error a trainer would mask.
		code = protocol.CodeEnvError
	case errors.Is(err, branch.ErrUnknownState) && errors.Is(err, branch.ErrCheckpoint):
		// A state whose checkpoint failed, for a reason of the server's:
		// that failure, not an unknown id; no retry brings it back.
		e := protocol.Errorf(protocol.CodeCheckpointFail, "%v", err)
		e.Retryable = false
		return e
	case errors.Is(err, ErrInvalidParams):
		code = protocol.CodeInvalidParams
	case errors.Is(err, ErrUnknownEnv), errors.Is(err, branch.ErrUnknownEnv):
		code = protocol.CodeUnknownEnv
	case errors.Is(err, branch.ErrLost):
		code = protocol.CodeEnvLost
	case errors.Is(err, ErrUnknownState), errors.Is(err, branch.ErrUnknownState):
		code = protocol.CodeUnknownState
	case errors.Is(err, ErrUnknownTask), errors.Is(err, envpool.ErrUnknownTask):
		code = protocol.CodeUnknownTask
	case errors.Is(err, ErrTooManyEnvs):
		code = protocol.CodeTooManyEnvs
	case errors.Is(err, branch.ErrNoSpace):
		code = protocol.CodeNoSpace
	case errors.Is(err, branch.ErrOverBudget):
		code = protocol.CodeOverBudget
	case errors.Is(err, ErrBadRequest), errors.Is(err, branch.ErrBadRequest), errors.Is(err, ErrNoVerifier),
		errors.Is(err, envpool.ErrBadRequest), errors.Is(err, envpool.ErrNoVerifier), errors.Is(err, envpool.ErrInvalidTask), errors.Is(err, image.ErrNotFound), errors.Is(err, image.ErrUnknownRecipe), errors.Is(err, image.ErrInvalidName),
		errors.Is(err, image.ErrPull), errors.Is(err, image.ErrBadLayer), errors.Is(err, image.ErrNoShell):
		// An image that does not exist, that its registry will not serve
		// or that cannot run is the client's mistake, not ours.
		code = protocol.CodeBadRequest
	case errors.Is(err, sandbox.ErrBadCommand):
		code = protocol.CodeTooLarge
	case errors.Is(err, envpool.ErrVerifierOutput):
		code = protocol.CodeVerifierError
	case errors.Is(err, envpool.ErrVerifier), errors.Is(err, envpool.ErrSetup):
		// Before the engine's: a verifier whose fork failed to restore
		// could not run, whatever stopped it; so with a task's setup.
		code = protocol.CodeSandboxFailed
	case errors.Is(err, branch.ErrRestore):
		code = protocol.CodeRestoreFailed
	case errors.Is(err, branch.ErrCheckpoint):
		code = protocol.CodeCheckpointFail
	case errors.Is(err, sandbox.ErrDead), errors.Is(err, sandbox.ErrTimeout), errors.Is(err, sandbox.ErrClosed),
		errors.Is(err, sandbox.ErrUnsupported), errors.Is(err, sandbox.ErrImpostor):
		// An impostor the agent made is ErrBroken too, env_error above.
		code = protocol.CodeSandboxFailed
	case errors.Is(err, ErrClosed), errors.Is(err, envpool.ErrClosed), errors.Is(err, context.Canceled):
		code = protocol.CodeShuttingDown
	case errors.Is(err, branch.ErrClosed):
		// The env was closed under the request (close, idle TTL) or the
		// engine is stopping.
		code = protocol.CodeUnknownEnv
	case errors.Is(err, context.DeadlineExceeded):
		code = protocol.CodeTimeout
	}
	return protocol.Errorf(code, "%v", err)
}
