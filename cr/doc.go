// Package cr and the packages below it are Arbor's storage primitives,
// from which the engine (package branch) is built: the Snapshotter
// interface here and its filesystem snapshot backends (cr/btrfs, cr/zfs),
// CRIU (cr/criu), the manifest of states and artifacts (cr/manifest), the
// work queue (cr/queue), the image cache (cr/imgcache), delta images
// (cr/imgdelta) and state transfer streams (cr/transfer).
package cr
