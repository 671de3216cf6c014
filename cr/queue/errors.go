package queue

import "errors"

// ErrClosed is the error of a job submitted after Close, or still queued
// when Close was called.
var ErrClosed = errors.New("queue closed")

// ErrPanic is wrapped by the error of a job whose function panicked.
var ErrPanic = errors.New("job panicked")

// ErrNilFunc is the error of a job submitted without a function.
var ErrNilFunc = errors.New("nil job function")
