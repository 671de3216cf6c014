package state

import (
	"errors"
	"fmt"
	"time"
)

// The categories of failure, one sentinel each. Every error a layer
// returns for a request's sake wraps one of them (directly or through a
// more precise sentinel below), so that the wire can answer it with a code
// without knowing the layer (server/protocol, ErrorOf). Test with
// errors.Is.
var (
	// ErrNotFound: no such env, state, task or image.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is well formed but makes no sense here.
	ErrInvalid = errors.New("bad request")
	// ErrUnavailable: the server (or the part of it asked) is stopping
	// or cannot be reached; retry elsewhere or later.
	ErrUnavailable = errors.New("unavailable")
	// ErrBusy: a limit on work in flight was reached; retry later.
	ErrBusy = errors.New("busy")
	// ErrQuota: a resource limit was reached (envs, disk, prepared
	// copies); retry once something was freed.
	ErrQuota = errors.New("over quota")
	// ErrUnrestorable: a state cannot be restored or was not recorded.
	ErrUnrestorable = errors.New("unrestorable")
	// ErrInfra: the machinery failed (a sandbox died, a command could not
	// be run); not the agent's doing.
	ErrInfra = errors.New("infrastructure failure")
	// ErrAgent: the agent's own doing (it broke its sandbox, held more
	// than its share, left a state no checkpoint can take): the outcome
	// of its episode, never an infrastructure failure a trainer masks.
	ErrAgent = errors.New("the agent's doing")
)

// The precise sentinels the protocol tells apart, each inside its
// category.
var (
	ErrUnknownEnv   = New(ErrNotFound, "unknown env")
	ErrUnknownState = New(ErrNotFound, "unknown state")
	ErrUnknownTask  = New(ErrNotFound, "unknown task")

	// ErrInvalidParams: a required argument is missing or of the wrong
	// type.
	ErrInvalidParams = New(ErrInvalid, "invalid params")
	// ErrTooLarge: a frame, command or field is over a limit.
	ErrTooLarge = New(ErrInvalid, "too large")

	// ErrShuttingDown: the server or one of its parts (the coordinator,
	// the task pool) was closed.
	ErrShuttingDown = New(ErrUnavailable, "shutting down")
	// ErrClosed: the env was closed under the request (close, idle TTL,
	// its share) or the engine is stopping.
	ErrClosed = New(ErrUnavailable, "closed")

	ErrTooManyEnvs = New(ErrQuota, "too many envs")
	// ErrNoSpace: a watched file system is over its high mark after
	// eviction.
	ErrNoSpace = New(ErrQuota, "no space: disk over its high mark")
	// ErrOverBudget: none of the prepared copies asked for fit the budget.
	ErrOverBudget = New(ErrQuota, "over the budget of prepared copies")

	// ErrRestore: a state could not be restored; its source is untouched.
	ErrRestore = New(ErrUnrestorable, "restore failed")
	// ErrCheckpoint: a turn's checkpoint failed: the env runs on, that
	// turn's state is unusable.
	ErrCheckpoint = New(ErrUnrestorable, "checkpoint failed")
	// ErrUnrestorableState: the sandbox holds state that no restore can
	// bring back exactly (a POSIX message queue, for which CRIU has no
	// image; an attribute the restored task cannot be given back): the
	// state is refused rather than restored different. Not infra and not
	// retryable: it is the env's own state, as the agent's doing is
	// (docs/protocol.md, Errors: unrestorable_state).
	ErrUnrestorableState = New(ErrUnrestorable, "unrestorable state")
	// ErrLost: the env was open when the server last stopped uncleanly
	// and could not be brought back.
	ErrLost = New(ErrUnrestorable, "environment lost in a restart")

	// ErrHarness: the task's own machinery (its setup, its verifier)
	// could not run, whatever stopped it: infra, before any more precise
	// cause (a verifier whose fork failed to restore could not run).
	ErrHarness = New(ErrInfra, "task harness could not run")
	// ErrNoVerifier: evaluate on an env whose task has no verifier.
	ErrNoVerifier = New(ErrInvalid, "task has no verifier")

	// ErrVerifierOutput: the verifier ran but its answer is no reward
	// (garbage where a number or a rubric was due, a reward out of the
	// task's range): the task's fault, neither the agent's nor the
	// machinery's; never a silent 0.
	ErrVerifierOutput = errors.New("verifier_error")
)

// sentinel is an error of fixed text inside a category.
type sentinel struct {
	text string
	in   error
}

func (s *sentinel) Error() string { return s.text }
func (s *sentinel) Unwrap() error { return s.in }

// New returns a new sentinel error with the text given, inside in (which
// errors.Is then finds through it): how a layer names a failure its own
// callers must tell apart, without leaving the categories above.
func New(in error, text string) error { return &sentinel{text: text, in: in} }

// formatted is an error whose text is exactly what Errorf formatted.
type formatted struct {
	msg  string
	errs []error
}

func (f *formatted) Error() string   { return f.msg }
func (f *formatted) Unwrap() []error { return f.errs }

// Errorf formats an error, as fmt.Errorf does (%w included), that also
// wraps kind without adding kind's text: Errorf(ErrInvalidParams, "data:
// want a string") reads "data: want a string" and is ErrInvalidParams.
func Errorf(kind error, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	f := &formatted{msg: err.Error(), errs: []error{kind}}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if w := u.Unwrap(); w != nil {
			f.errs = append(f.errs, w)
		}
	case interface{ Unwrap() []error }:
		f.errs = append(f.errs, u.Unwrap()...)
	}
	return f
}

// retryAfter is an error that says when a retry may succeed.
type retryAfter struct {
	err   error
	after time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

// RetryAfterError is err with a hint of when to retry it (a busy answer's
// retry_after_ms; docs/protocol.md, Errors). Its text is err's.
func RetryAfterError(after time.Duration, err error) error {
	return &retryAfter{err: err, after: after}
}

// RetryAfter is the retry hint err carries (RetryAfterError), 0 for none.
func RetryAfter(err error) time.Duration {
	var r *retryAfter
	if errors.As(err, &r) {
		return r.after
	}
	return 0
}
