// Package watch is the Inspector (docs/inspector.md): at the end of each
// turn of an environment it tells what the turn changed for good. It
// watches the sandbox through the eBPF programs of package bpf, then
// checks the touched paths against the last filesystem artifact, the
// long-lived processes against the last process artifact and the managed
// shell's state against its digest at that checkpoint, by the rules of
// package inspector. Where eBPF cannot be used it falls back to the
// filesystem backend's change list and is conservative about processes.
//
// The engine reaches it through branch.Inspector, which *Inspector
// implements; EventPaths is its one rule that reads eBPF events.
package watch
