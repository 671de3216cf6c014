// Package branch is Arbor's checkpoint/restore engine: environments whose
// state can be checkpointed (none, fs, proc or full), branched into n
// independent copies restored in parallel, and rolled back to any state of
// their lineage, with retention, the background GC and disk pressure. It
// builds them from the storage primitives of package cr: the snapshot
// backend (cr.Snapshotter), CRIU (cr/criu), the durable manifest
// (cr/manifest), the image cache (cr/imgcache) and the two-priority queue
// (cr/queue). The adapters (server, agent, llmproxy) reach it only through
// the coordinator (docs/architecture.md).
package branch
