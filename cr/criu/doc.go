// Package criu dumps and restores sandbox process trees with CRIU, driven
// through go-criu in swrk mode. It knows nothing of file systems: the caller
// freezes the tree, snapshots the root, and hands Restore a clone.
package criu
