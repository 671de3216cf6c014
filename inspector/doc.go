// Package inspector tells, at the end of each turn of an environment, what
// the turn changed for good: nothing, files, process state, or both
// (DESIGN.md, "Net change"). It watches the sandbox through the eBPF
// programs of package bpf, then checks the touched paths against the last
// filesystem artifact, the long-lived processes against the last process
// artifact and the managed shell's state against its digest at that
// checkpoint. Where eBPF cannot be used it falls back to the filesystem
// backend's change list and is conservative about processes.
//
// The rules themselves (Classify, EventPaths, CompareProcs,
// NormalizeShellState) are pure functions over facts, testable anywhere.
package inspector
