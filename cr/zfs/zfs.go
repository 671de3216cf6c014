// Package zfs is the ZFS snapshot backend, driven through go-zfs v3 (the
// zfs command line). Every name is a filesystem dataset below one root
// dataset (Options.Dataset), and its mountpoint is inherited, so Path is
// the root's mountpoint joined with the name.
//
// Mapping onto ZFS objects, marked by the user property arbor:kind:
//
//   - volume ("volume"): a filesystem, made by CreateVolume or Clone.
//   - snapshot ("snapshot"): Snapshot(src, dst) takes the ZFS snapshot
//     src@arbor-<random> and clones it as dst with readonly=on, so a
//     snapshot has a name, a mountpoint and a Path like a volume.
//   - Clone(src, dst) takes src@arbor-<random> and clones it writable.
//   - parent directories of a name ("dir") are plain filesystems made on
//     demand and destroyed when their last child is.
//
// Destroy keeps dependents alive: while a ZFS snapshot of the volume has
// clones, the newest such clone is promoted (`zfs promote`), which moves the
// snapshot and everything it depends on to the clone; then the volume and
// its remaining snapshots are destroyed, and so is the ZFS snapshot it was
// cloned from when no other clone uses it. Volumes do not nest.
//
// Changes walks both trees (zfs-fuse has no `zfs diff`); see
// cr/internal/fsdiff for the rule and docs/zfs.md for what it covers.
//
// SetQuota sets a volume's quota property (see quota_linux.go).
package zfs

import (
	"log/slog"
	"sync"
)

// Options configure Open.
type Options struct {
	// Dataset is the root dataset, e.g. "tank/arbor". Its pool must exist;
	// the dataset is made if missing. Empty: the pool Open makes (or
	// imports) in a file below StateDir, like the btrfs backend's pool.
	Dataset string
	// StateDir, when set, is where Open prepares the host (PrepareHost in
	// StateDir/zfs: zfs-fuse started when ZFS does not answer, the
	// zfs-fuse shim wired in) and, with no Dataset, keeps its own pool:
	// StateDir/zfs/pool.img, mounted at StateDir/zfs/mnt, root dataset
	// <pool>/arbor. Unmount undoes both. Empty: the host must already
	// serve ZFS (OpenZFS, or a process that ran PrepareHost).
	StateDir string
	// PoolSize is the apparent size of a new pool file (it is sparse);
	// 0 means DefaultPoolSize.
	PoolSize int64
	// Logger receives debug records; nil discards them.
	Logger *slog.Logger
}

// Snapshotter is a cr.Snapshotter on ZFS datasets.
type Snapshotter struct {
	root  string // root dataset
	mount string // its mountpoint
	log   *slog.Logger
	host  *Host  // what Open did to the host (StateDir), for Unmount
	pool  string // the pool Open made or imported, for Unmount to export
	// dirs is held for reading while datasets are made below a parent and
	// for writing while empty parents are pruned.
	dirs sync.RWMutex
}

// Property values of arbor:kind.
const (
	kindProp     = "arbor:kind"
	kindVolume   = "volume"
	kindSnapshot = "snapshot"
	kindDir      = "dir"
)

// Backend returns "zfs".
func (s *Snapshotter) Backend() string { return "zfs" }
