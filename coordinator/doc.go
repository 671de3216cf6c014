// Package coordinator is the middle of Arbor's three parts (coordinator,
// inspector, C/R engine; docs/engine.md, The path of a step). It owns:
//
//   - the turn: Turn runs a command, classifies it (the engine's inspector,
//     the one classification entry), queues its checkpoint (the engine
//     makes it full after a failed background checkpoint, the one home
//     of that rule; the turn reports the kind used), verifies skipped
//     checkpoints (VerifySkips) and counts it against the task's MaxTurns.
//     Boundary is a turn without a command (the LLM proxy's).
//   - the life of every env it hands out: Reset (through Tasks: envpool,
//     or Images for bare images), Branch (children inherit task, seed and
//     turn count), Promote, Discard, CloseEnv, the idle TTL, and the
//     per-env FIFO of operations (Ticket). Envs it did not hand out (a task
//     pool's templates and warm copies, throwaway forks) are not in its
//     registry, so no caller can name them.
//   - its errors are state's sentinels (package state), wrapped with
//     what happened; the wire turns them into codes (protocol.ErrorOf).
//   - what a person watching reads (the web view, package server/ui,
//     keeps the read models): every change reported to its Observer as
//     it happens (events.go), the env and state records (records.go) and
//     Health.
//
// Locks: Coordinator.mu guards the registry. The Observer is called with
// no lock of the coordinator held; its own locks are leaves (the web
// view's publishing never waits on a reader).
//
// Package server (protocol v1), package agent (tools, MCP) and package
// llmproxy are adapters over it, their only door to the engine: fork_try
// (ForkTry) and the web view's diff (Compare, StateFiles) included.
// Options.Hooks hear of every env handed out or ended and every state
// made: a cluster node's registry (package cluster) publishes them in etcd.
package coordinator
