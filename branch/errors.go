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
)

// errAbandoned is the error of a branch job whose caller stopped waiting
// before the child was handed over (the child is destroyed).
var errAbandoned = errors.New("branch child restored after its caller gave up: destroyed")
