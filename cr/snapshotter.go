package cr

import (
	"context"
	"io"
)

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

// Quotaer is a Snapshotter that can cap how much a volume may write. Both
// backends implement it; it is a separate interface so that a caller that
// sets no quota works on a backend without one.
//
// The cap counts the data the volume wrote since it was made (a clone
// starts at zero, whatever it shares with its source) that still exists,
// in the volume or in snapshots taken of it (btrfs: simple quotas; zfs: the
// quota property). So deleting a file gives its room back unless a
// snapshot still holds it, and a sandbox cannot make the pool hold more
// than its cap by writing, checkpointing and deleting turn after turn. A
// cap on the tree's total size (btrfs referenced limits, zfs refquota)
// would give the room back on every delete, but btrfs's full qgroup
// accounting that it needs made snapshots and clones 10 times slower with
// 100 states in the pool (docs/sandbox.md, "Disk quota").
type Quotaer interface {
	// SetQuota caps what volume name may write at bytes; writes past the
	// cap fail with EDQUOT ("Disk quota exceeded"). bytes <= 0 removes
	// the cap.
	SetQuota(ctx context.Context, name string, bytes int64) error
	// Quota reports how much more volume name can take, cheaply enough to
	// be read after every command (no process is started).
	Quota(ctx context.Context, name string) (QuotaUsage, error)
}

// QuotaUsage is how full a volume is.
type QuotaUsage struct {
	// Free is how much more can be written before a write fails: the room
	// left under the cap, or in the pool when that is less (or when the
	// volume has no cap).
	Free int64
	// Charged is what the volume wrote since it was made that still
	// exists, in it or in snapshots of it (btrfs: its simple-quota
	// qgroup); 0 when the backend does not tell (zfs here). Between two
	// snapshots of a volume it grows by what the second one holds that
	// the first does not: the engine's size of a file snapshot.
	Charged int64
}

// AheadCloner is a Snapshotter whose clones may run beside its other
// operations (btrfs): the engine clones a branch's roots ahead of their
// restores only on one (docs/engine.md, "Roots cloned ahead"). zfs-fuse,
// the ZFS this kernel runs, once deadlocked on a clone made ahead beside
// two restores' quota changes (a make bench whose zfs clone never
// returned), so the zfs backend is not one.
type AheadCloner interface {
	Snapshotter
	CloneAhead() bool
}

// Streamer is a Snapshotter whose read-only snapshots can be written out
// as a byte stream and made again from it in another pool (another host):
// whole, or as the difference from a parent snapshot both pools hold
// (btrfs send/receive; docs/cluster.md, "State transfer"). The zfs backend
// does not implement it yet.
type Streamer interface {
	// Send writes read-only snapshot name to w, as the difference from
	// read-only snapshot parent when parent is not "" (the receiving pool
	// must hold parent, received from this pool or sent to it).
	Send(ctx context.Context, name, parent string, w io.Writer) error
	// Receive makes read-only snapshot name from a stream Send wrote of a
	// snapshot of the same base name. On failure nothing of name is left.
	Receive(ctx context.Context, name string, r io.Reader) error
}
