package envpool

import "errors"

// Sentinel errors of the pool; test with errors.Is. Errors of the engine
// (branch.ErrRestore, branch.ErrClosed, ...) are wrapped, not replaced.
var (
	// ErrInvalidTask: a task file or definition is malformed.
	ErrInvalidTask = errors.New("invalid task")
	// ErrUnknownTask: no task of that name is loaded.
	ErrUnknownTask = errors.New("unknown task")
	// ErrSetup: a task's setup failed (a command exited non-zero, timed
	// out or ended the shell); the message names the command.
	ErrSetup = errors.New("task setup failed")
	// ErrNoVerifier: the task has no verifier, so there is nothing to
	// evaluate.
	ErrNoVerifier = errors.New("task has no verifier")
	// ErrVerifier: the verifier could not be run (fork or sandbox
	// failure). It is an infrastructure failure, never a zero reward.
	ErrVerifier = errors.New("verifier could not run")
	// ErrBadRequest: the arguments make no sense (neither task nor image,
	// a task and a different image, promoting an env with no parent).
	ErrBadRequest = errors.New("bad request")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool closed")
)
