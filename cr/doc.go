// Package cr is Arbor's checkpoint/restore engine: the filesystem snapshot
// backends (cr/btrfs, cr/zfs) behind the Snapshotter interface, and, from
// issue 2/6 on, process checkpoints through CRIU.
package cr
