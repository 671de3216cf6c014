package server

import (
	"context"
	"errors"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/server/protocol"
)

// Sentinel errors a Pool wraps so that the server reports the right code.
var (
	// ErrUnknownTask: reset named a task the pool does not have.
	ErrUnknownTask = errors.New("unknown task")
	// ErrBadRequest: the request makes no sense for this env or task.
	ErrBadRequest = errors.New("bad request")
	// ErrNoVerifier: evaluate on an env whose task has no verifier.
	ErrNoVerifier = errors.New("no verifier")
	// ErrInfra: the pool failed for reasons of its own (a fork, a
	// sandbox, a verifier that could not run).
	ErrInfra = errors.New("infrastructure failure")
	// ErrPoolClosed: the pool was closed (the server is stopping).
	ErrPoolClosed = errors.New("pool closed")
)

// protoError turns an error of the engine, the pool or the sandbox into
// the protocol's error object.
func protoError(err error) *protocol.Error {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, branch.ErrUnknownEnv):
		return protocol.Errorf(protocol.CodeUnknownEnv, "%v", err)
	case errors.Is(err, branch.ErrLost):
		return protocol.Errorf(protocol.CodeEnvLost, "%v", err)
	case errors.Is(err, branch.ErrUnknownState):
		return protocol.Errorf(protocol.CodeUnknownState, "%v", err)
	case errors.Is(err, ErrUnknownTask):
		return protocol.Errorf(protocol.CodeUnknownTask, "%v", err)
	case errors.Is(err, branch.ErrBadRequest), errors.Is(err, ErrBadRequest), errors.Is(err, ErrNoVerifier):
		return protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	case errors.Is(err, sandbox.ErrBadCommand):
		return protocol.Errorf(protocol.CodeTooLarge, "%v", err)
	case errors.Is(err, branch.ErrRestore):
		return protocol.Errorf(protocol.CodeRestoreFailed, "%v", err)
	case errors.Is(err, branch.ErrCheckpoint):
		return protocol.Errorf(protocol.CodeCheckpointFail, "%v", err)
	case errors.Is(err, sandbox.ErrDead), errors.Is(err, sandbox.ErrTimeout), errors.Is(err, sandbox.ErrClosed),
		errors.Is(err, sandbox.ErrUnsupported), errors.Is(err, sandbox.ErrImpostor):
		return protocol.Errorf(protocol.CodeSandboxFailed, "%v", err)
	case errors.Is(err, ErrInfra):
		return protocol.Errorf(protocol.CodeSandboxFailed, "%v", err)
	case errors.Is(err, ErrPoolClosed), errors.Is(err, context.Canceled):
		return protocol.Errorf(protocol.CodeShuttingDown, "%v", err)
	case errors.Is(err, branch.ErrClosed):
		// The env was closed under the request (close, TTL) or the
		// engine is stopping.
		return protocol.Errorf(protocol.CodeUnknownEnv, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return protocol.Errorf(protocol.CodeTimeout, "%v", err)
	default:
		return protocol.Errorf(protocol.CodeInternal, "%v", err)
	}
}
