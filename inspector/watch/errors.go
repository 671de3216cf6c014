package watch

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// Sentinel errors of the inspector; test with errors.Is.
var (
	// ErrUnavailable: eBPF cannot be used here; NewFallback still works.
	ErrUnavailable = state.New(state.ErrUnavailable, "inspector: eBPF unavailable")
	// ErrUnknownEnv: the environment is not tracked.
	ErrUnknownEnv = errors.New("inspector: unknown environment")
	// ErrClosed: the inspector was closed.
	ErrClosed = state.New(state.ErrUnavailable, "inspector: closed")
)
