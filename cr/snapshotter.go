package cr

import "context"

// Snapshotter is a copy-on-write filesystem backend. Names are relative,
// slash-separated paths such as "images/busybox" or "sandboxes/a1b2"; each
// backend maps them onto its own objects (btrfs subvolumes, zfs datasets).
// A name's parent "directory" is created on demand.
type Snapshotter interface {
	// Backend names the implementation ("btrfs", "zfs").
	Backend() string
	// CreateVolume makes a new, empty, writable volume.
	CreateVolume(ctx context.Context, name string) error
	// Snapshot makes a read-only, point-in-time copy of src named dst.
	Snapshot(ctx context.Context, src, dst string) error
	// Clone makes a writable copy of src (a volume or a snapshot) named dst.
	Clone(ctx context.Context, src, dst string) error
	// Destroy removes a volume or snapshot. Destroying a missing name
	// returns an error wrapping ErrNotFound.
	Destroy(ctx context.Context, name string) error
	// List returns the volumes and snapshots whose names start with prefix.
	List(ctx context.Context, prefix string) ([]Volume, error)
	// Path is where the volume's files are visible on the host.
	Path(name string) string
	// Changes lists the paths (relative to the volume root, with a leading
	// "/") that differ between the snapshot base and target, which may be
	// a live volume.
	Changes(ctx context.Context, base, target string) ([]Change, error)
}

// Volume describes one volume or snapshot.
type Volume struct {
	Name     string
	ReadOnly bool
	// Parent is the snapshot or volume it was cloned or snapshotted from,
	// when the backend knows it.
	Parent string
}

// ChangeKind says how a path differs between two snapshots.
type ChangeKind string

// Kinds of change.
const (
	Added    ChangeKind = "added"
	Modified ChangeKind = "modified"
	Deleted  ChangeKind = "deleted"
)

// Change is one path that differs between two snapshots.
type Change struct {
	Path string
	Kind ChangeKind
}
