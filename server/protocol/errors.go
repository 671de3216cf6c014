package protocol

import (
	"errors"
	"fmt"
	"time"
)

// Error is the error object of a response: {code, message, retryable,
// infra, retry_after_ms}. Infra marks a failure of Arbor itself (restore,
// checkpoint, sandbox, timeout of the server), which trainers mask instead
// of scoring; everything else is the caller's mistake.
type Error struct {
	Code      string `msgpack:"code" json:"code"`
	Message   string `msgpack:"message" json:"message"`
	Retryable bool   `msgpack:"retryable" json:"retryable"`
	Infra     bool   `msgpack:"infra" json:"infra"`
	// RetryAfterMS, when set, is how long the server suggests waiting
	// before retrying (a busy answer of admission control): absent on
	// other errors and from older servers.
	RetryAfterMS int64 `msgpack:"retry_after_ms,omitempty" json:"retry_after_ms,omitempty"`
}

// RetryAfter is e's retry hint, 0 for none.
func (e *Error) RetryAfter() time.Duration { return time.Duration(e.RetryAfterMS) * time.Millisecond }

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is matches errors of the same code, so errors.Is(err, protocol.ErrUnknownEnv)
// works on what a client got back.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// The error codes of protocol v1.
const (
	// Client errors: fix the request.
	CodeMalformed      = "malformed"         // not a msgpack-rpc frame
	CodeUnknownMethod  = "unknown_method"    // no such method
	CodeInvalidParams  = "invalid_params"    // missing field, wrong type
	CodeBadRequest     = "bad_request"       // well-formed but meaningless here
	CodeTooLarge       = "too_large"         // frame or field over a limit
	CodeUnauthorized   = "unauthorized"      // token missing or wrong
	CodeUnknownEnv     = "unknown_env"       // no open env of that id
	CodeUnknownState   = "unknown_state"     // no usable state of that id
	CodeUnknownTask    = "unknown_task"      // no task of that name
	CodeTooManyReqs    = "too_many_requests" // in-flight limit of the connection (retryable)
	CodeTooManyEnvs    = "too_many_envs"     // env limit of the server (retryable)
	CodeShuttingDown   = "shutting_down"     // server is draining (retryable, infra)
	CodeRestoreFailed  = "restore_failed"    // infra: a state could not be restored
	CodeCheckpointFail = "checkpoint_failed" // infra: a checkpoint failed
	CodeSandboxFailed  = "sandbox_failed"    // infra: the sandbox died or did not answer
	CodeTimeout        = "timeout"           // infra: the server gave up waiting
	CodeEnvLost        = "env_lost"          // infra: the env could not be restored after a crash
	CodeNoSpace        = "no_space"          // infra: disk over its high mark after eviction (reset, branch; retryable)
	CodeInternal       = "internal"          // infra: anything else
	// CodeNodeUnavailable: a cluster router could not reach the node
	// that holds the env or state (gone from the registry, refusing
	// connections, its connection dropped mid-request). Retryable, infra.
	CodeNodeUnavailable = "node_unavailable"
	// CodeOverBudget: none of the copies a prepare asked for fit in the
	// server's budget of prepared copies (retryable: they expire or are
	// taken by branches).
	CodeOverBudget = "over_budget"
	// CodeEnvError: the env cannot go on because of what its agent did
	// (state CRIU cannot dump, its control socket or shell removed).
	// Neither infra nor retryable: the episode failed (docs/protocol.md,
	// Errors).
	CodeEnvError = "env_error"
	// CodeUnrestorableState: the state asked for holds kernel state no
	// restore brings back exactly (a POSIX message queue, an attribute the
	// restored process cannot be given back); the message names it. The
	// checkpoint that met it failed with the same code. Neither infra nor
	// retryable: it is the env's own state, and a retry fails the same.
	CodeUnrestorableState = "unrestorable_state"
	// CodeVerifierError: the task's verifier ran but its result is no
	// reward under the task's rules (garbage where a number was due, a
	// reward outside the task's range). A fault of the task, not of the
	// server nor an outcome of the agent: neither retryable nor infra.
	CodeVerifierError = "verifier_error"
)

// Errorf makes an Error of code; retryable and infra follow from the code.
func Errorf(code, format string, args ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, args...)}
	switch code {
	case CodeTooManyReqs, CodeTooManyEnvs, CodeOverBudget:
		e.Retryable = true
	case CodeShuttingDown, CodeTimeout, CodeSandboxFailed, CodeRestoreFailed, CodeCheckpointFail, CodeNoSpace, CodeNodeUnavailable:
		e.Retryable, e.Infra = true, true
	case CodeInternal, CodeEnvLost:
		e.Infra = true
	}
	return e
}

// Sentinels for errors.Is on errors a client received.
var (
	ErrMalformed         = &Error{Code: CodeMalformed}
	ErrUnknownMethod     = &Error{Code: CodeUnknownMethod}
	ErrInvalidParams     = &Error{Code: CodeInvalidParams}
	ErrBadRequest        = &Error{Code: CodeBadRequest}
	ErrTooLarge          = &Error{Code: CodeTooLarge}
	ErrUnauthorized      = &Error{Code: CodeUnauthorized}
	ErrUnknownEnv        = &Error{Code: CodeUnknownEnv}
	ErrUnknownState      = &Error{Code: CodeUnknownState}
	ErrUnknownTask       = &Error{Code: CodeUnknownTask}
	ErrTooManyReqs       = &Error{Code: CodeTooManyReqs}
	ErrTooManyEnvs       = &Error{Code: CodeTooManyEnvs}
	ErrShuttingDown      = &Error{Code: CodeShuttingDown}
	ErrRestoreFailed     = &Error{Code: CodeRestoreFailed}
	ErrCheckpoint        = &Error{Code: CodeCheckpointFail}
	ErrSandbox           = &Error{Code: CodeSandboxFailed}
	ErrTimeout           = &Error{Code: CodeTimeout}
	ErrEnvLost           = &Error{Code: CodeEnvLost}
	ErrNoSpace           = &Error{Code: CodeNoSpace}
	ErrInternal          = &Error{Code: CodeInternal}
	ErrNodeUnavailable   = &Error{Code: CodeNodeUnavailable}
	ErrOverBudget        = &Error{Code: CodeOverBudget}
	ErrEnvError          = &Error{Code: CodeEnvError}
	ErrUnrestorableState = &Error{Code: CodeUnrestorableState}
	ErrVerifierError     = &Error{Code: CodeVerifierError}
)

// IsInfra reports whether err is an infrastructure failure reported by the
// server (as opposed to a bad request or a task outcome).
func IsInfra(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Infra
}
