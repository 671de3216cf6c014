package benchmarks

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

var (
	// ErrBadTrace: a trace file does not parse or names no actions.
	ErrBadTrace = errors.New("bad trace")
	// ErrUnavailable: a baseline cannot run on this host (e.g. no runc);
	// the report says so instead of a figure.
	ErrUnavailable = state.New(state.ErrUnavailable, "baseline unavailable on this host")
	// ErrStep: an action failed to run (not a failing command: an error of
	// the server or sandbox).
	ErrStep = errors.New("step failed")
)
