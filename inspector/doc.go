// Package inspector holds the rules of net change (docs/inspector.md,
// "Net change"): what a turn of an environment changed for
// good, nothing, files, process state, or both. The rules (Classify,
// CompareProcs, NormalizeShellState, PathChanged, TreeDiff) are pure
// functions over facts, testable anywhere, and the types (Fact, Target;
// the kind is state.Kind) are what the engine and the Inspector speak. Nothing here uses
// eBPF: the Inspector that gathers the facts through package bpf is
// package inspector/watch.
package inspector
