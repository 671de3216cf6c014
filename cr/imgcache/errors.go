package imgcache

import "errors"

// ErrNotFound is wrapped when no committed image has the id.
var ErrNotFound = errors.New("image not found")

// ErrExists is wrapped when NewDir or Commit meets an id already in use.
var ErrExists = errors.New("image already exists")

// ErrInvalidID is wrapped when an id is empty, too long, starts with a dot
// (reserved for the cache's own temporary names) or is not a single path
// component.
var ErrInvalidID = errors.New("invalid image id")

// ErrBusy is wrapped when Remove meets a pinned image, or Commit meets an
// image another call is working on.
var ErrBusy = errors.New("image in use")

// ErrUnavailable is wrapped when Open cannot put a tmpfs on HotDir (not
// Linux, not root); set Options.NoMount to use HotDir as it is.
var ErrUnavailable = errors.New("tmpfs unavailable")
