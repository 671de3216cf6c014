package cr

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// ErrUnavailable is wrapped by a backend that cannot run on this host (tool
// missing, kernel module absent, not root) so callers can pick another.
var ErrUnavailable = errors.New("backend unavailable")

// ErrNotFound is wrapped when a named volume or snapshot does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is wrapped when a volume or snapshot of that name already exists.
var ErrExists = errors.New("already exists")

// ErrInvalidName is wrapped when a name is not a clean relative path, uses
// a reserved component, or would place a volume inside another volume.
var ErrInvalidName = errors.New("invalid name")

// ErrNotEmpty is wrapped when Destroy refuses a volume that still contains
// nested volumes (made behind the backend's back, e.g. inside a sandbox).
var ErrNotEmpty = errors.New("contains nested volumes")

// ErrAgentState is wrapped when a checkpoint or restore fails because of
// state the sandbox's own processes made, which no option of CRIU can
// carry (a deleted file held open that is larger than the ghost limit, a
// restore that cannot write that file back under the sandbox's own disk
// quota). The failure is the agent's outcome, not the server's
// (docs/protocol.md, Errors: env_error).
var ErrAgentState = state.New(state.ErrAgent, "the sandbox holds state that cannot be checkpointed")
