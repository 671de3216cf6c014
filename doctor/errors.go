package doctor

import "errors"

// ErrTimeout means a probe did not finish in time (a hung criu dump).
var ErrTimeout = errors.New("timed out")

// ErrUnsupported means the probe cannot run on this operating system.
var ErrUnsupported = errors.New("not supported on this OS")
