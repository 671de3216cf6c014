// Package benchmarks measures Arbor against what a user would do without
// it, in one run and on the same machine: checkpointing everything after
// every turn, snapshotting files only (the "chat + files" recovery),
// replaying actions, and runc's own checkpoint/restore. Workloads are
// agent traces (traces/*.yaml) played through a real server with a
// simulated think time; the report (JSON, markdown, SVG plots) goes to
// benchmarks/results. `arbor bench` runs it.
package benchmarks
