package image

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

// ErrNotFound is wrapped when the named image does not exist.
var ErrNotFound = state.New(state.ErrNotFound, "image not found")

// ErrExists is wrapped when an image of that name already exists.
var ErrExists = errors.New("image already exists")

// ErrInvalidName is wrapped when an image name is not a plain, lower-case
// name (letters, digits, '.', '_', '-', not starting with '.').
var ErrInvalidName = state.New(state.ErrInvalid, "invalid image name")

// ErrUnknownRecipe is wrapped when Build is asked for an image it has no
// recipe for.
var ErrUnknownRecipe = state.New(state.ErrInvalid, "no build recipe for image")

// ErrMissingTool is wrapped when a host tool a build needs is absent; the
// remedy is "make deps".
var ErrMissingTool = errors.New("host tool missing (run make deps)")

// ErrBadLayer is wrapped when an image layer is not a valid changeset: not
// a tar stream, truncated, its content not matching its digest, or holding
// what an image may not (device nodes).
var ErrBadLayer = state.New(state.ErrInvalid, "bad image layer")

// ErrNoShell is wrapped when an image has no /bin/sh: the persistent shell
// of every sandbox needs one.
var ErrNoShell = state.New(state.ErrInvalid, "image has no shell")

// ErrPull is wrapped when an image cannot be fetched from its registry:
// unknown host, refused credentials, no such repository or tag.
var ErrPull = state.New(state.ErrInvalid, "pull image")
