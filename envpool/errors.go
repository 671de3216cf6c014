package envpool

import "github.com/arbor-env/arbor/state"

// Sentinel errors of the pool; test with errors.Is. Its other failures
// are state's (state.ErrUnknownTask, ErrNoVerifier, ErrInvalid,
// ErrShuttingDown, ErrVerifierOutput); errors of the engine are wrapped,
// not replaced.
var (
	// ErrInvalidTask: a task file or definition is malformed.
	ErrInvalidTask = state.New(state.ErrInvalid, "invalid task")
	// ErrSetup: a task's setup failed (a command exited non-zero, timed
	// out or ended the shell); the message names the command.
	ErrSetup = state.New(state.ErrHarness, "task setup failed")
	// ErrVerifier: the verifier could not be run (fork or sandbox
	// failure). It is an infrastructure failure, never a zero reward.
	ErrVerifier = state.New(state.ErrHarness, "verifier could not run")
)
