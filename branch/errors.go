package branch

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// Sentinel errors of the engine; test with errors.Is. The engine's other
// failures are state's (state.ErrUnknownEnv, ErrUnknownState, ErrClosed,
// ErrCheckpoint, ErrRestore, ErrInvalid, ErrLost, ErrNoSpace,
// ErrOverBudget), wrapped with what happened.
var (
	// ErrRevived: the environment's sandbox died and was restored at its
	// last committed state (a *RevivedError says which); the operation
	// that found it did not run.
	ErrRevived = state.New(state.ErrInfra, "sandbox died; environment restored")
	// ErrShellDelta: a shell delta state's script did not bring the
	// restored shell to the state it recorded (its digest differs); the
	// restore fails rather than hand out another state.
	ErrShellDelta = state.New(state.ErrUnrestorable, "shell delta did not reach its state")
	// ErrTransfer: a state shipped from another node could not be
	// imported (the stream was cut short or damaged, an artifact it
	// needs is missing); nothing of it was kept.
	ErrTransfer = state.New(state.ErrUnrestorable, "state transfer failed")
	// ErrUnsupported: the engine's backend cannot do this (a zfs pool
	// cannot stream its snapshots to another node yet).
	ErrUnsupported = state.New(state.ErrUnavailable, "not supported by this backend")
	// ErrOverShare: the environment was stopped and closed because it
	// held more than its fair share of a full pool (docs/engine.md,
	// "Fair shares"); the agent's doing, its outcome.
	ErrOverShare = state.New(state.ErrAgent, "environment stopped: over its share of the pool")
)

// errAbandoned is the error of a branch job whose caller stopped waiting
// before the child was handed over (the child is destroyed).
var errAbandoned = errors.New("branch child restored after its caller gave up: destroyed")
