package branch

import "errors"

// Sentinel errors of the engine; test with errors.Is.
var (
	// ErrUnknownEnv: no open environment has that id.
	ErrUnknownEnv = errors.New("unknown environment")
	// ErrUnknownState: the manifest has no usable state of that id.
	ErrUnknownState = errors.New("unknown state")
	// ErrClosed: the engine or the environment was closed.
	ErrClosed = errors.New("closed")
	// ErrCheckpoint: the background checkpoint of a turn failed; the
	// environment still runs but that turn's state id is unusable.
	ErrCheckpoint = errors.New("checkpoint failed")
	// ErrRestore: a state could not be restored (artifact missing, CRIU
	// failed); the source is untouched.
	ErrRestore = errors.New("restore failed")
	// ErrBadRequest: the arguments make no sense (n < 1, kind unknown).
	ErrBadRequest = errors.New("bad request")
	// ErrLost: the environment was open when the engine last stopped
	// uncleanly and could not be restored (Engine.Lost says why).
	ErrLost = errors.New("environment lost in a restart")
	// ErrRevived: the environment's sandbox died and was restored at its
	// last committed state (a *RevivedError says which); the operation
	// that found it did not run.
	ErrRevived = errors.New("sandbox died; environment restored")
	// ErrNoSpace: a watched file system (the pool, the image store) is
	// still above its high mark after eviction, so no new env is started
	// (NewEnv, Branch); retry once space is freed (docs/engine.md, "Disk
	// pressure").
	ErrNoSpace = errors.New("no space: disk over its high mark")
	// ErrShellDelta: a shell delta state's script did not bring the
	// restored shell to the state it recorded (its digest differs); the
	// restore fails rather than hand out another state.
	ErrShellDelta = errors.New("shell delta did not reach its state")
	// ErrTransfer: a state shipped from another node could not be
	// imported (the stream was cut short or damaged, an artifact it
	// needs is missing); nothing of it was kept.
	ErrTransfer = errors.New("state transfer failed")
	// ErrUnsupported: the engine's backend cannot do this (a zfs pool
	// cannot stream its snapshots to another node yet).
	ErrUnsupported = errors.New("not supported by this backend")
	// ErrOverBudget: none of the prepared copies a Prepare asked for fit
	// in the budget (Options.PrepareCopies); retry once copies were taken
	// or expired.
	ErrOverBudget = errors.New("over the budget of prepared copies")
	// ErrOverShare: the environment was stopped and closed because it
	// held more than its fair share of a full pool (docs/engine.md,
	// "Fair shares"); the agent's doing, its outcome.
	ErrOverShare = errors.New("environment stopped: over its share of the pool")
)

// errAbandoned is the error of a branch job whose caller stopped waiting
// before the child was handed over (the child is destroyed).
var errAbandoned = errors.New("branch child restored after its caller gave up: destroyed")
