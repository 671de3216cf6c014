// Package queue runs the engine's work (package branch) on a bounded pool
// of workers with two priorities: High for work somebody waits on
// (restores, branches, rollbacks, a checkpoint behind the gate) and Low for
// background checkpoints. Workers always take High before Low, FIFO within
// a priority, and a waiter arriving on a queued Low job raises it, so the
// gate never sits behind unrelated background work. It is pure Go and
// makes no syscalls.
package queue
