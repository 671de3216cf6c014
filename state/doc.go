// Package state is the turn's vocabulary, shared by every layer of Arbor:
// the checkpoint kind (what a turn changed, what its checkpoint captured),
// the tools an action names, fresh ids, and one sentinel error per kind of
// failure. It imports only the standard library and sits below every other
// package (docs/architecture.md): a layer wraps these errors with %w (or
// makes one with Errorf) instead of declaring a look-alike, and the wire
// turns them into codes in one table (server/protocol, ErrorOf).
package state
