package protocol

import (
	"context"
	"errors"

	"github.com/arbor-env/arbor/state"
)

// codes is the one table from errors to wire codes (v1, OpenEnv, MCP, the
// router). The first row whose error err wraps decides, so a precise
// sentinel comes before its category and the order settles errors that
// wrap several (docs/protocol.md, Errors).
var codes = []struct {
	err  error
	code string
}{
	// First: whatever operation met it (a checkpoint, a branch's restore,
	// the verifier's fork, a state whose checkpoint failed on it), the
	// agent's own doing is its outcome, never an infra error a trainer
	// would mask.
	{state.ErrAgent, CodeEnvError},
	// So is state no restore brings back exactly, whether the checkpoint
	// or the restore met it: refused, never masked as infra (a policy
	// could make it on purpose to have its failing branches error out).
	{state.ErrUnrestorableState, CodeUnrestorableState},
	{state.ErrInvalidParams, CodeInvalidParams},
	{state.ErrUnknownEnv, CodeUnknownEnv},
	{state.ErrLost, CodeEnvLost},
	{state.ErrUnknownState, CodeUnknownState},
	{state.ErrUnknownTask, CodeUnknownTask},
	{state.ErrTooManyEnvs, CodeTooManyEnvs},
	{state.ErrNoSpace, CodeNoSpace},
	{state.ErrOverBudget, CodeOverBudget},
	{state.ErrBusy, CodeTooManyReqs},
	{state.ErrTooLarge, CodeTooLarge},
	// A task without a verifier, an image that does not exist, that its
	// registry will not serve or that cannot run: the client's mistake.
	{state.ErrInvalid, CodeBadRequest},
	{state.ErrNotFound, CodeBadRequest},
	{state.ErrVerifierOutput, CodeVerifierError},
	// Before the engine's: a verifier whose fork failed to restore could
	// not run, whatever stopped it; so with a task's setup.
	{state.ErrHarness, CodeSandboxFailed},
	{state.ErrRestore, CodeRestoreFailed},
	{state.ErrCheckpoint, CodeCheckpointFail},
	{state.ErrInfra, CodeSandboxFailed},
	{state.ErrShuttingDown, CodeShuttingDown},
	{context.Canceled, CodeShuttingDown},
	{state.ErrClosed, CodeUnknownEnv},
	{context.DeadlineExceeded, CodeTimeout},
}

// ErrorOf is the error object (code, infra, retryable) the wire answers
// for err; nil for nil. An *Error err wraps is answered as it is (a
// node's answer the router relays); a bare one such as ErrMalformed,
// wrapped with state.Errorf, gives its code to err's message (how the
// wire names failures only it knows: a malformed frame, an unknown
// method, a missing token, a node that is gone). Everything else goes
// through the table above; what it does not name is internal.
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		if pe.Message == "" {
			return Errorf(pe.Code, "%v", err)
		}
		return pe
	}
	if errors.Is(err, state.ErrUnknownState) && errors.Is(err, state.ErrCheckpoint) &&
		!errors.Is(err, state.ErrAgent) && !errors.Is(err, state.ErrUnrestorableState) {
		// A state whose checkpoint failed, for a reason of the server's:
		// that failure, not an unknown id; no retry brings it back.
		e := Errorf(CodeCheckpointFail, "%v", err)
		e.Retryable = false
		return e
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			e := Errorf(c.code, "%v", err)
			if d := state.RetryAfter(err); d > 0 {
				e.RetryAfterMS = max(d.Milliseconds(), 1)
			}
			return e
		}
	}
	return Errorf(CodeInternal, "%v", err)
}

// CodeOf is ErrorOf(err)'s code, "" for nil.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	return ErrorOf(err).Code
}
