package criu

import "errors"

// ErrTimeout: a CRIU run did not finish within Checkpointer.Timeout (or a
// CRIU did not exit); that CRIU was killed.
var ErrTimeout = errors.New("criu did not finish in time")

// ErrLazyPages: the lazy-pages daemon of a lazy restore failed, exited
// before the restore ended, or was killed before it had served every page.
var ErrLazyPages = errors.New("criu lazy-pages daemon failed")
