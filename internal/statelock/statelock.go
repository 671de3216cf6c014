// Package statelock keeps one arbor serve per state dir. Two servers on
// one state dir break each other: both mount the same pool, and the one
// that stops unmounts it under the other (docs/security.md, "One server
// per state dir"). The lock is an flock on STATE_DIR/serve.lock, which
// holds the pid of its holder; the kernel drops it when that process
// ends, however it ends, so a crash leaves nothing to clean up.
package statelock

// FileName is the lock file in a state dir.
const FileName = "serve.lock"
