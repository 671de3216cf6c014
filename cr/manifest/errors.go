package manifest

import "errors"

// ErrNotFound is wrapped when a state, env or artifact does not exist, or
// when a state names an artifact that is not ready.
var ErrNotFound = errors.New("not found")

// ErrExists is wrapped when a record of that id already exists.
var ErrExists = errors.New("already exists")

// ErrSchema is wrapped when the database was written with a schema this
// version does not know (newer, or not a manifest at all).
var ErrSchema = errors.New("unknown manifest schema")

// ErrInvalid is wrapped when an argument is malformed: an empty id, an
// unknown kind, an artifact of the wrong kind in a state's field.
var ErrInvalid = errors.New("invalid argument")

// ErrClosed is wrapped when a state is committed to, or a head set on, a
// closed env.
var ErrClosed = errors.New("env closed")

// ErrInUse is wrapped when a record cannot be removed because something
// still needs it: ForgetWith of a live state or referenced artifact, or
// AbortArtifact of an artifact already committed.
var ErrInUse = errors.New("in use")

// ErrLocked is wrapped when another opener holds the database file.
var ErrLocked = errors.New("manifest locked by another opener")

// ErrCorrupt is wrapped when a stored record cannot be decoded.
var ErrCorrupt = errors.New("corrupt record")
