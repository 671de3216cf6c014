package image

import "errors"

// ErrNotFound is wrapped when the named image does not exist.
var ErrNotFound = errors.New("image not found")

// ErrExists is wrapped when an image of that name already exists.
var ErrExists = errors.New("image already exists")

// ErrInvalidName is wrapped when an image name is not a plain, lower-case
// name (letters, digits, '.', '_', '-', not starting with '.').
var ErrInvalidName = errors.New("invalid image name")

// ErrUnknownRecipe is wrapped when Build is asked for an image it has no
// recipe for.
var ErrUnknownRecipe = errors.New("no build recipe for image")

// ErrMissingTool is wrapped when a host tool a build needs is absent; the
// remedy is "make deps".
var ErrMissingTool = errors.New("host tool missing (run make deps)")
