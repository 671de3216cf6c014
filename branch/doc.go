// Package branch is Arbor's checkpoint/restore engine as the server sees
// it: environments whose state can be checkpointed (none, fs, proc or full),
// branched into n independent copies restored in parallel, and rolled back
// to any state of their lineage. It ties together the snapshot backend
// (cr.Snapshotter), CRIU (cr/criu), the durable manifest (cr/manifest), the
// image cache (cr/imgcache) and the two-priority queue (cr/queue).
package branch
