package agent

import "errors"

// Sentinel errors of the tools; test with errors.Is.
var (
	// ErrBadArgument: the agent passed arguments that make no sense (an
	// empty command, a negative timeout, a missing path). It is the
	// agent's mistake and is reported to it as such.
	ErrBadArgument = errors.New("bad argument")
	// ErrUnknownState: rollback named a state that is not in this
	// environment's history, or one that can no longer be restored.
	ErrUnknownState = errors.New("unknown state")
	// ErrCommandFailed: read_file or write_file ran but failed (no such
	// file, permission denied); the message carries the shell's words.
	ErrCommandFailed = errors.New("command failed")
	// ErrInfra: the sandbox or the checkpoint engine failed; not the
	// agent's doing, and trainers should mask the episode.
	ErrInfra = errors.New("infrastructure error")
)
