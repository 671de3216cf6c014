package cr

import "errors"

// ErrUnavailable is wrapped by a backend that cannot run on this host (tool
// missing, kernel module absent, not root) so callers can pick another.
var ErrUnavailable = errors.New("backend unavailable")

// ErrNotFound is wrapped when a named volume or snapshot does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is wrapped when a volume or snapshot of that name already exists.
var ErrExists = errors.New("already exists")
