package agent

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// Sentinel errors of the tools; test with errors.Is. A rollback to a
// state not in the env's history is state.ErrUnknownState; a failure of
// the sandbox or the engine, not the agent's doing, state.ErrInfra.
var (
	// ErrBadArgument: the agent passed arguments that make no sense (an
	// empty command, a negative timeout, a missing path). It is the
	// agent's mistake and is reported to it as such.
	ErrBadArgument = state.New(state.ErrInvalidParams, "bad argument")
	// ErrCommandFailed: read_file or write_file ran but failed (no such
	// file, permission denied); the message carries the shell's words.
	ErrCommandFailed = errors.New("command failed")
)
