package bpf

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// Sentinel errors of the eBPF tracker; test with errors.Is.
var (
	// ErrUnavailable: eBPF cannot be used on this host (not root, no BTF,
	// the verifier refused the programs, not amd64).
	ErrUnavailable = state.New(state.ErrUnavailable, "eBPF tracker unavailable")
	// ErrClosed: the tracker was closed.
	ErrClosed = state.New(state.ErrUnavailable, "eBPF tracker closed")
	// ErrFlushed: Read consumed every event that was pending when Flush
	// was called.
	ErrFlushed = errors.New("eBPF events flushed")
	// ErrShortEvent: a ring buffer record is smaller than an event.
	ErrShortEvent = errors.New("short eBPF event")
)
