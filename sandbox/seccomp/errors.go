package seccomp

import "errors"

// ErrUnsupported: this build or host cannot compile seccomp filters (a
// binary built without cgo, or libseccomp missing).
var ErrUnsupported = errors.New("seccomp filters unsupported")
