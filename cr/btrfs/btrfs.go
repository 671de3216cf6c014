// Package btrfs is the btrfs snapshot backend: every volume and snapshot is
// a subvolume under one pool directory, snapshots and clones are made and
// destroyed with the kernel's ioctls (no process is started on that hot
// path), and Changes reads a metadata-only `btrfs send` stream.
//
// When the state directory is not on btrfs, the pool is a sparse file
// StateDir/pool.img formatted with mkfs.btrfs and loop-mounted (noatime) at
// StateDir/pool. Open reuses an existing file and an existing mount, so it is
// idempotent across restarts; Close leaves the pool mounted, Unmount takes
// it down and frees the loop device.
//
// A name maps to the path of the same name under the pool root; its parent
// directories are plain directories made on demand and pruned when the last
// volume in them is destroyed. Volumes do not nest: a name inside an
// existing volume is refused with cr.ErrInvalidName.
//
// SetQuota caps a volume under btrfs simple quotas, turned on for the pool
// at the first cap (see quota_linux.go and docs/sandbox.md, "Disk quota").
package btrfs

import (
	"log/slog"
	"sync"
	"sync/atomic"
)

// DefaultPoolSize is the size of a new pool file when Options.PoolSize is 0.
const DefaultPoolSize = 16 << 30

// Options configure Open.
type Options struct {
	// StateDir holds the pool: StateDir/pool, and StateDir/pool.img when
	// StateDir is not itself on btrfs.
	StateDir string
	// PoolSize is the apparent size of a new pool file (it is sparse).
	PoolSize int64
	// Logger receives debug records; nil discards them.
	Logger *slog.Logger
}

// Snapshotter is a cr.Snapshotter on btrfs subvolumes.
type Snapshotter struct {
	root    string // pool root; names live below it
	img     string // pool file, "" when StateDir is on btrfs
	mounted bool   // this pool is a loop mount of img
	log     *slog.Logger
	// dirs is held for reading while a volume is being made inside a parent
	// directory and for writing while empty parents are pruned, so a prune
	// cannot remove a directory another call has just made.
	dirs sync.RWMutex

	// quotaMu guards quotaOn: whether this process has turned qgroups on.
	quotaMu sync.Mutex
	quotaOn bool
	// qdir is the pool's qgroups folder in sysfs, found once.
	qdirOnce sync.Once
	qdir     string
	qdirErr  error
	// capped maps the names of the volumes SetQuota capped to their
	// cappedVolume; Destroy forgets them.
	capped sync.Map
	// destroys counts Destroy calls, to sweep stale qgroups now and then.
	destroys atomic.Int64
}

// Backend returns "btrfs".
func (s *Snapshotter) Backend() string { return "btrfs" }
