// Package criu dumps and restores sandbox process trees with CRIU, driven
// over its swrk RPC socket (go-criu's protobuf types, a client of our own
// that can bound and kill a run). It knows nothing of file systems: the
// caller freezes the tree, snapshots the root, and hands Restore a clone.
package criu
