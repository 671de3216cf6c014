package criu

import "errors"

// ErrTimeout: a CRIU run did not finish within Checkpointer.Timeout (or a
// CRIU did not exit); that CRIU was killed.
var ErrTimeout = errors.New("criu did not finish in time")
